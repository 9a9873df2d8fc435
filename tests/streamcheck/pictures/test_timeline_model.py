"""The timeline model both views draw: pure, importable where it was, and whole for any trace."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamcheck.pictures import export, timeline_model
from streamcheck.pictures.export import to_chrome_trace
from streamcheck.pictures.timeline_model import build_model
from tests.streamcheck.pictures.test_export import captured_missing_join, implicit_join, trace_event_errors

MODEL_SOURCE = Path(timeline_model.__file__)


def test_the_model_imports_only_the_core_and_the_standard_library():
    # It is built wherever a run is checked; drawing (matplotlib) and writing (json) are the views'.
    tree = ast.parse(MODEL_SOURCE.read_text(encoding="utf-8"))
    outside = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            package = timeline_model.__name__.split(".")[:-node.level] if node.level else []
            names = [".".join(package + ([node.module] if node.module else []))]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            core = name == "streamcheck.core" or name.startswith("streamcheck.core.")
            if not core and (top not in sys.stdlib_module_names or top == "json"):
                outside.append(name)
    assert outside == []


@pytest.mark.parametrize("name", ["build_model", "Model", "Lane", "Slice", "Edge", "LocatedRace",
                                  "STEPS", "MICROSECONDS", "ISSUE_ORDER"])
def test_the_model_is_still_importable_from_export_where_it_lived(name):
    assert getattr(export, name) is getattr(timeline_model, name)


# Runs whose traces are cut below: a race between streams, the post-scale on the legacy
# stream, the fixed program, and a graph captured without its join (timed per node).
RUNS = [implicit_join()[0], implicit_join(post="legacy")[0], implicit_join(join=True)[0],
        captured_missing_join()]


@st.composite
def cut_runs(draw):
    """A run with operations left out (often a malformed trace: a wait on an event never
    created, a launch on an unknown stream), its times and graph node times kept."""
    dev = draw(st.sampled_from(RUNS))
    ops = list(dev.trace)
    keep = sorted(draw(st.sets(st.integers(0, len(ops) - 1), min_size=1)))
    new = {old: n for n, old in enumerate(keep)}
    times = {new[i]: t for i, t in dev.backend.op_times.items() if i in new}
    node_times = {(new[launch], node): t for (launch, node), t in dev.backend.node_times.items() if launch in new}
    return {"trace": [ops[i] for i in keep], "op_times": times, "node_times": node_times,
            "backend": draw(st.sampled_from(["sim", "cupy", ""]))}


@settings(max_examples=80, deadline=None)
@given(cut_runs())
def test_the_model_of_any_cut_trace_is_whole_and_exports_valid_json(source):
    model = build_model(source)
    lanes = {lane.key for lane in model.lanes}
    assert all(s.lane in lanes for s in model.slices.values())
    assert all(d.lane in lanes and d.index in model.slices for d in model.delays)
    assert all(e.src in model.slices and e.dst in model.slices for e in model.edges)
    assert all(index in model.slices for index, _text in model.notes)
    assert all(i in model.slices for loc in model.races for i in (loc.first, loc.second) if i is not None)
    # The views rely on it: the export draws every edge and note without looking them up.
    assert trace_event_errors(to_chrome_trace(model)) == []


@settings(max_examples=40, deadline=None)
@given(cut_runs(), st.integers(0, 6))
def test_the_part_around_the_races_is_whole_and_keeps_every_located_pair(source, context):
    from streamcheck.pictures.timeline_model import around_races

    whole = build_model(source)
    model = around_races(whole, context)
    lanes = {lane.key for lane in model.lanes}
    assert set(model.slices) <= set(whole.slices) and lanes <= {lane.key for lane in whole.lanes}
    assert all(s.lane in lanes for s in model.slices.values())
    assert all(d.lane in lanes and d.index in model.slices for d in model.delays)
    assert all(e.src in model.slices and e.dst in model.slices for e in model.edges)
    assert all(index in model.slices for index, _text in model.notes)
    assert model.races == whole.races
    assert all(i in model.slices for loc in model.races for i in (loc.first, loc.second) if i is not None)
    assert [e for e in whole.edges if e.kind == "missing"] == [e for e in model.edges if e.kind == "missing"]
    assert trace_event_errors(to_chrome_trace(model)) == []


def test_around_races_keeps_the_neighbourhood_of_each_access_only():
    from streamcheck.device import Device
    from streamcheck.pictures.timeline_model import around_races

    dev = Device("sim")
    a, b = dev.stream("A"), dev.stream("B")
    y, z = dev.alloc(4, name="Y", fill=0.0), dev.alloc(4, name="Z", fill=0.0)
    for _ in range(30):
        dev.launch(lambda v: None, (z,), stream=a, writes=[z], name="busy")
    dev.launch(lambda v: None, (y,), stream=a, writes=[y], name="produce")
    dev.launch(lambda v: None, (y,), stream=b, reads=[y], name="consume")
    for _ in range(30):
        dev.launch(lambda v: None, (z,), stream=a, writes=[z], name="busy")
    whole = build_model(dev)
    model = around_races(whole, context=3)
    names = [s.name for s in sorted(model.slices.values(), key=lambda s: s.start)]
    assert {"produce", "consume"} <= set(names) and names.count("busy") <= 2 * 3 + 2
    assert len(model.slices) < len(whole.slices) / 4
    alone = Device("sim")
    buffer = alone.alloc(4, fill=0.0)
    alone.launch(lambda v: None, (buffer,), writes=[buffer], name="alone")
    quiet = build_model(alone)
    assert around_races(quiet) is quiet  # no race: nothing to narrow to
