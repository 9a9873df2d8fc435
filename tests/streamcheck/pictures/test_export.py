"""Chrome Trace Event export: valid for Perfetto, and it shows the race and the missing wait."""
from __future__ import annotations

import json

import numpy as np
import pytest

from streamcheck.core import trace as T
from streamcheck.device import Device
from streamcheck.pictures.export import RACE_PREFIX, to_chrome_trace, write_chrome_trace
from streamcheck.core.hb import Access, Race, format_report, reports_to_json
from streamcheck.pictures.timeline_model import build_model


# --- a Trace Event validator (the format's rules, and what Perfetto needs to bind flows) ------

PHASES = {"X", "B", "E", "i", "I", "s", "t", "f", "M", "C"}
NAME_METADATA = {"process_name", "thread_name"}


def trace_event_errors(data) -> list:
    """Every way `data` breaks the Trace Event format as Perfetto reads it; [] when valid."""
    errors = []
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        return ["top level must be an object with a traceEvents list"]
    try:
        json.loads(json.dumps(data, allow_nan=False))
    except ValueError as exc:
        errors.append(f"not plain JSON: {exc}")
    events = data["traceEvents"]
    for n, e in enumerate(events):
        where = f"event {n} ({e.get('name')!r}, ph={e.get('ph')!r})"
        for key in ("name", "ph", "pid", "tid"):
            if key not in e:
                errors.append(f"{where}: missing {key}")
        if e.get("ph") not in PHASES:
            errors.append(f"{where}: unknown phase")
            continue
        if not isinstance(e.get("name"), str) or not isinstance(e.get("pid"), int) or not isinstance(e.get("tid"), int):
            errors.append(f"{where}: name must be a string, pid and tid integers")
        if e["ph"] == "M":
            if e.get("name") in NAME_METADATA and not (isinstance(e.get("args"), dict) and e["args"].get("name")):
                errors.append(f"{where}: name metadata needs args.name")
            continue
        if not isinstance(e.get("ts"), (int, float)) or e["ts"] < 0:
            errors.append(f"{where}: ts must be a non-negative number")
        if e["ph"] == "X" and not (isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0):
            errors.append(f"{where}: X needs a non-negative dur")
        if e["ph"] in ("s", "t", "f") and ("id" not in e or "cat" not in e):
            errors.append(f"{where}: flow events need id and cat")
        if e["ph"] == "i" and e.get("s", "t") not in ("t", "p", "g"):
            errors.append(f"{where}: instant scope must be t, p or g")
        if "args" in e and not isinstance(e["args"], dict):
            errors.append(f"{where}: args must be an object")

    # Complete events on one thread must nest (Perfetto lays out the rest on overflow tracks).
    by_tid: dict = {}
    for e in events:
        if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float)):
            by_tid.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
    for key, spans in by_tid.items():
        spans.sort()
        for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
            if b0 < a1 and b1 > a1:
                errors.append(f"tid {key[1]}: {an!r} [{a0}, {a1}) and {bn!r} [{b0}, {b1}) overlap without nesting")

    # Flows: one start and one end per (cat, name, id), start first in time, each inside a
    # slice of its thread (Perfetto binds both to the enclosing slice).
    flows: dict = {}
    for e in events:
        if e.get("ph") in ("s", "f"):
            flows.setdefault((e.get("cat"), e["name"], e.get("id")), {}).setdefault(e["ph"], []).append(e)
    for key, ends in flows.items():
        if len(ends.get("s", [])) != 1 or len(ends.get("f", [])) != 1:
            errors.append(f"flow {key}: needs exactly one s and one f")
            continue
        s, f = ends["s"][0], ends["f"][0]
        if f.get("bp") != "e":
            errors.append(f"flow {key}: f must bind to the enclosing slice (bp=e)")
        if not s["ts"] < f["ts"]:
            errors.append(f"flow {key}: s at {s['ts']} must come before f at {f['ts']}")
        for end in (s, f):
            if enclosing(events, end) is None:
                errors.append(f"flow {key}: {end['ph']} at {end['ts']} is inside no slice of tid {end['tid']}")
    return errors


def enclosing(events, point):
    """The innermost complete event on `point`'s thread that contains its timestamp."""
    best = None
    for e in events:
        if e.get("ph") == "X" and e["tid"] == point["tid"] and e["pid"] == point["pid"]:
            if "ts" not in e or "dur" not in e:
                continue
            if e["ts"] <= point["ts"] < e["ts"] + e["dur"] and (best is None or e["dur"] < best["dur"]):
                best = e
    return best


def test_validator_rejects_what_perfetto_cannot_read():
    good = {"traceEvents": [
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "stream A"}},
        {"name": "k", "ph": "X", "ts": 0, "dur": 2, "pid": 1, "tid": 1},
        {"name": "k2", "ph": "X", "ts": 5, "dur": 2, "pid": 1, "tid": 2},
        {"name": "e", "cat": "event", "ph": "s", "id": 1, "ts": 1, "pid": 1, "tid": 1},
        {"name": "e", "cat": "event", "ph": "f", "bp": "e", "id": 1, "ts": 6, "pid": 1, "tid": 2},
    ]}
    assert trace_event_errors(good) == []

    def broken(n, **change):
        data = json.loads(json.dumps(good))
        data["traceEvents"][n].update(change)
        for key in [k for k, v in change.items() if v is None]:
            del data["traceEvents"][n][key]
        return trace_event_errors(data)

    assert any("missing ts" in e or "ts must" in e for e in broken(1, ts=None))
    assert any("dur" in e for e in broken(1, dur=None))
    assert any("args.name" in e for e in broken(0, args={}))
    assert any("id and cat" in e for e in broken(3, id=None))
    assert any("before" in e for e in broken(3, ts=6.5, tid=2))
    assert any("inside no slice" in e for e in broken(4, ts=9))
    assert any("overlap" in e for e in broken(2, tid=1, ts=1))


# --- the implicit-join pattern (DESIGN.md) ---------------------------------------------------

def matmul(x, w, y):
    y[...] = x @ w.T


def rms(x, r):
    r[...] = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True))


def postscale(y, r, out):
    out[...] = y * r


def implicit_join(post="C", steps=4, join=False):
    """matmul on A writes Y; rms on B; post-scale waits on B only and reads Y (the bug),
    or on both (`join=True`, the fix). Stream A runs late by `steps` host calls."""
    dev = Device("sim", policy="delay", streams=["A"], steps=steps)
    x = dev.alloc((1, 8), name="x", fill=1.0)
    w = dev.alloc((8, 8), name="W", fill=0.5)
    y = dev.alloc((1, 8), name="Y", fill=0.0)
    r = dev.alloc((1, 1), name="r", fill=0.0)
    out = dev.alloc((1, 8), name="out", fill=0.0)
    a, b = dev.stream("A"), dev.stream("B")
    c = dev.legacy if post == "legacy" else dev.stream("C")
    dev.launch(matmul, (x, w, y), stream=a, reads=[x, w], writes=[y])
    dev.launch(rms, (x, r), stream=b, reads=[x], writes=[r])
    c.wait_event(b.record(dev.event("rms_done")))
    if join:
        c.wait_event(a.record(dev.event("mm_done")))
    dev.launch(postscale, (y, r, out), stream=c, reads=[y, r], writes=[out])
    dev.synchronize()
    value = dev.host_read(out)
    return dev, value


def named(events, name, ph="X"):
    return [e for e in events if e["ph"] == ph and e["name"] == name]


def thread_names(events) -> dict:
    return {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}


@pytest.mark.parametrize("post", ["C", "legacy"])
def test_implicit_join_export_is_valid_and_shows_the_race(post):
    dev, _ = implicit_join(post)
    race = dev.races[0]
    data = to_chrome_trace(dev)
    events = data["traceEvents"]
    assert trace_event_errors(data) == []

    lanes = thread_names(events)
    consumer_lane = "stream C (non_blocking)" if post == "C" else "legacy default stream"
    assert {"host thread 0", "stream A (non_blocking)", "stream B (non_blocking)", consumer_lane} <= set(lanes.values())

    # The racing pair: prefixed, red, on their streams, with call sites and byte ranges.
    (producer,) = named(events, RACE_PREFIX + "matmul")
    (consumer,) = named(events, RACE_PREFIX + "postscale")
    assert lanes[producer["tid"]] == "stream A (non_blocking)"
    assert lanes[consumer["tid"]] == consumer_lane
    for event, role, access in ((producer, "first", race.first), (consumer, "second", race.second)):
        assert event["cname"] == "terrible" and event["args"]["race"] is True
        # Paths relative to the rootdir, and the stack: the device call's line in implicit_join, then
        # this test's call of it; pytest's frames beyond are not the user's.
        assert event["args"]["site"] == T.site_path(access.site)
        assert event["args"]["stack"][0] == f"{T.site_path(access.site)} in implicit_join"
        assert [frame.rpartition(" in ")[2] for frame in event["args"]["stack"]] == [
            "implicit_join", "test_implicit_join_export_is_valid_and_shows_the_race"]
        (info,) = event["args"]["races"]
        assert (info["kind"], info["buffer"], info["role"]) == ("RAW", "Y", role)
    assert "Y bytes [0, 32)" in producer["args"]["writes"]
    assert "Y bytes [0, 32)" in consumer["args"]["reads"]
    assert "x bytes [0, 32)" in producer["args"]["reads"]
    assert not named(events, RACE_PREFIX + "rms") and len(named(events, "rms")) == 1

    # The missing edge: an instant on the consumer's stream at its start, and a flow
    # joining exactly the producer and the consumer.
    (mark,) = [e for e in events if e["ph"] == "i" and e["name"].startswith("missing wait:")]
    assert mark["tid"] == consumer["tid"] and mark["ts"] == consumer["ts"]
    assert "stream A" in mark["name"] and "`matmul`" in mark["name"]
    ends = [e for e in events if e["ph"] in "sf" and e["cat"] == "race"]
    assert {e["ph"] for e in ends} == {"s", "f"}
    assert {enclosing(events, e)["tid"] for e in ends} == {producer["tid"], consumer["tid"]}
    assert {enclosing(events, e)["name"] for e in ends} == {producer["name"], consumer["name"]}

    # record -> wait of the edge the program does have.
    (record,) = named(events, "record rms_done")
    (wait,) = named(events, "wait rms_done")
    (start,) = [e for e in events if e["ph"] == "s" and e["name"] == "event rms_done"]
    (end,) = [e for e in events if e["ph"] == "f" and e["name"] == "event rms_done"]
    assert enclosing(events, start) is record and enclosing(events, end) is wait

    # The device synchronize is a slice on the host track that ends when the device is idle.
    (sync,) = named(events, "device synchronize")
    assert lanes[sync["tid"]] == "host thread 0"
    device_end = max(e["ts"] + e["dur"] for e in events if e["ph"] == "X" and lanes[e["tid"]] != "host thread 0")
    assert sync["ts"] + sync["dur"] == pytest.approx(device_end)


def test_sim_steps_are_microseconds():
    dev, _ = implicit_join("C")
    data = to_chrome_trace(dev)
    assert "1 step = 1 µs" in data["otherData"]["clock"]
    assert str(dev.schedule) == data["otherData"]["schedule"]
    times = dev.backend.op_times
    for e in data["traceEvents"]:
        if e["ph"] == "X" and e["cat"] in ("kernel", "kernel,race", "record", "wait"):
            start, end = times[e["args"]["trace index"]]
            assert (e["ts"], e["dur"]) == (start, end - start)
            assert e["args"]["time"] == "scheduler step"


def test_struck_race_arrow_runs_from_the_consumer_that_ran_first():
    # A held back long enough: post-scale runs before the matmul, and reads the stale Y.
    dev, value = implicit_join("C", steps=8)
    assert np.all(value == 0.0)
    events = to_chrome_trace(dev)["traceEvents"]
    (producer,) = named(events, RACE_PREFIX + "matmul")
    (consumer,) = named(events, RACE_PREFIX + "postscale")
    assert consumer["ts"] < producer["ts"]
    (start,) = [e for e in events if e["ph"] == "s" and e["cat"] == "race"]
    (end,) = [e for e in events if e["ph"] == "f" and e["cat"] == "race"]
    assert enclosing(events, start)["tid"] == consumer["tid"]  # Perfetto needs the start first in time
    assert enclosing(events, end) is producer
    (mark,) = [e for e in events if e["ph"] == "i"]
    assert mark["args"]["struck in this run"] is True
    model = build_model(dev)
    assert model.struck(model.races[0]) is True


def test_fixed_program_has_no_race_marks():
    dev, value = implicit_join("C", steps=8, join=True)
    assert np.allclose(value, 4.0)
    data = to_chrome_trace(dev)
    assert trace_event_errors(data) == []
    events = data["traceEvents"]
    assert not [e for e in events if e["name"].startswith(RACE_PREFIX) or e["name"].startswith("missing")]
    assert {e["name"] for e in events if e["ph"] == "s"} >= {"event rms_done", "event mm_done"}


def test_unchecked_device_races_are_found_by_replaying_the_trace():
    dev = Device("sim", check=False)
    buf = dev.alloc((4,), name="buf", fill=0.0)
    a, b = dev.stream("A"), dev.stream("B")
    dev.launch(lambda v: v.fill(1.0), (buf,), stream=a, writes=[buf], name="produce")
    dev.launch(lambda v: None, (buf,), stream=b, reads=[buf], name="consume")
    dev.synchronize()
    assert dev.races == []
    names = {e["name"] for e in to_chrome_trace(dev)["traceEvents"] if e["ph"] == "X"}
    assert {RACE_PREFIX + "produce", RACE_PREFIX + "consume"} <= names


def test_host_read_without_sync_marks_a_missing_sync_on_the_host_track():
    dev = Device("sim", policy="delay", streams=["A"], steps=4)
    buf = dev.alloc((4,), name="buf", fill=0.0)
    a = dev.stream("A")
    dev.launch(lambda v: v.fill(1.0), (buf,), stream=a, writes=[buf], name="produce")
    dev.host_read(buf)
    data = to_chrome_trace(dev)
    assert trace_event_errors(data) == []
    events = data["traceEvents"]
    lanes = thread_names(events)
    (read,) = named(events, RACE_PREFIX + "host read")
    assert lanes[read["tid"]] == "host thread 0"
    (mark,) = [e for e in events if e["ph"] == "i" and e["name"].startswith("missing sync:")]
    assert mark["tid"] == read["tid"]


def test_wait_before_record_is_noted_as_a_no_op():
    dev = Device("sim")
    a, b = dev.stream("A"), dev.stream("B")
    ev = dev.event("late")
    b.wait_event(ev)  # CUDA: a wait on a never-recorded event does nothing
    a.record(ev)
    events = to_chrome_trace(dev)["traceEvents"]
    (note,) = [e for e in events if e["ph"] == "i" and e["name"].startswith("no-op wait")]
    assert "`late`" in note["name"]
    assert not [e for e in events if e["ph"] == "s" and e["name"] == "event late"]


def test_gpu_times_in_microseconds_and_untimed_ops_placed_by_issue_order():
    dev, _ = implicit_join("C", steps=8)
    ops = dev.trace.ops
    launches = [i for i, op in enumerate(ops) if isinstance(op, T.Launch)]
    # As a GPU backend reports them: kernels only, measured in µs from an arbitrary origin.
    measured = {launches[0]: (5000.0, 5200.0), launches[1]: (5010.0, 5030.0), launches[2]: (5040.0, 5045.0)}
    data = to_chrome_trace({"trace": dev.trace, "races": dev.races, "op_times": measured,
                            "clock": "us", "backend": "cupy"})
    assert trace_event_errors(data) == []
    assert "measured" in data["otherData"]["clock"]
    events = data["traceEvents"]
    by_index = {e["args"]["trace index"]: e for e in events if e["ph"] == "X"}
    for index, (start, end) in measured.items():
        assert (by_index[index]["ts"], by_index[index]["dur"]) == (start - 5000.0, end - start)
        assert by_index[index]["args"]["time"] == "measured with CUDA events"
    # The untimed record/wait sit between the rms and the post-scale, in stream order.
    (record,) = named(events, "record rms_done")
    (wait,) = named(events, "wait rms_done")
    assert record["args"]["time"].startswith("placed by issue order")
    rms_end = by_index[launches[1]]["ts"] + by_index[launches[1]]["dur"]
    assert rms_end <= record["ts"] <= wait["ts"] + wait["dur"] <= by_index[launches[2]]["ts"]
    # The sync waits for the matmul (the last work to finish).
    (sync,) = named(events, "device synchronize")
    assert sync["ts"] + sync["dur"] == pytest.approx(200.0)


def test_plain_trace_without_times_lays_ops_out_in_issue_order(tmp_path):
    dev, _ = implicit_join("C")
    path = write_chrome_trace(dev.trace, tmp_path / "run.json")
    data = json.loads(open(path, encoding="utf-8").read())
    assert trace_event_errors(data) == []
    slices = [e for e in data["traceEvents"] if e["ph"] == "X"]
    order = [e["args"]["trace index"] for e in sorted(slices, key=lambda e: e["ts"])]
    assert order == sorted(order)
    assert {RACE_PREFIX + "matmul", RACE_PREFIX + "postscale"} <= {e["name"] for e in slices}


def test_bad_source_is_named():
    with pytest.raises(TypeError, match="expected a Device"):
        to_chrome_trace(42)


def test_shown_instance_is_the_first_that_struck_else_the_last():
    dev = Device("sim")  # eager: the producer always happens to run first
    buf = dev.alloc((4,), name="buf", fill=0.0)
    a, b = dev.stream("A"), dev.stream("B")
    for _ in range(3):
        dev.launch(lambda v: v.fill(1.0), (buf,), stream=a, writes=[buf], name="produce")
        dev.launch(lambda v: None, (buf,), stream=b, reads=[buf], name="consume")
        dev.synchronize()
    (race,) = dev.races
    assert race.count == 3
    produces = [i for i, op in enumerate(dev.trace.ops) if getattr(op, "name", "") == "produce"]
    consumes = [i for i, op in enumerate(dev.trace.ops) if getattr(op, "name", "") == "consume"]

    # None struck: the last instance (on a GPU the first is the cold one).
    model = build_model(dev)
    (located,) = model.races
    assert (located.first, located.second) == (produces[-1], consumes[-1])
    assert model.struck(located) is False

    # The middle producer ran late: that instance is the one shown.
    times = dict(dev.backend.op_times)
    times[produces[1]] = (1000.0, 1001.0)
    model = build_model({"trace": dev.trace, "op_times": times, "backend": "sim"})
    (located,) = model.races
    assert (located.first, located.second) == (produces[1], consumes[1])
    assert model.struck(located) is True


def test_injected_gpu_delays_become_slices_before_the_delayed_work():
    dev, _ = implicit_join("C", steps=8)
    launches = [i for i, op in enumerate(dev.trace.ops) if isinstance(op, T.Launch)]
    measured = {launches[0]: (2300.0, 2310.0), launches[1]: (100.0, 120.0), launches[2]: (140.0, 145.0)}
    parts = {"trace": dev.trace, "op_times": measured, "clock": "us", "backend": "cupy",
             "delays": [(launches[0], "A", 2000.0)]}
    data = to_chrome_trace(parts)
    assert trace_event_errors(data) == []
    events = data["traceEvents"]
    (delay,) = [e for e in events if e["ph"] == "X" and e["cat"] == "delay"]
    (matmul_slice,) = named(events, RACE_PREFIX + "matmul")
    assert delay["name"] == "injected delay 2000 µs" and delay["tid"] == matmul_slice["tid"]
    assert delay["ts"] + delay["dur"] == matmul_slice["ts"] and delay["dur"] == 2000.0
    # The sim's delays hold work back without taking time: nothing to draw.
    assert build_model(dict(parts, clock="steps")).delays == ()


def captured_missing_join(policy="random", seed=1, launches=3):
    """fill on A, use on main, captured into one graph whose join comes after `use`."""
    dev = Device("sim", policy=policy, seed=seed)
    y = dev.alloc((4,), "float32", name="Y", fill=0.0)
    out = dev.alloc((4,), "float32", name="out", fill=0.0)
    a, main = dev.stream("A"), dev.stream("main")
    main.begin_capture()
    a.wait_event(main.record(dev.event("fork")))
    dev.launch(lambda v: v.fill(1.0), (y,), stream=a, writes=[y], name="fill")
    filled = a.record(dev.event("filled"))
    dev.launch(lambda v, o: o.__setitem__(..., v), (y, out), stream=main, reads=[y], writes=[out], name="use")
    main.wait_event(filled)
    graph = main.end_capture()
    for _ in range(launches):
        graph.launch(main)
    main.synchronize()
    return dev


def test_graph_export_draws_captured_work_on_graph_lanes_at_a_launch_that_struck():
    # Some launch under some seed runs `use` before `fill`; the export shows that launch.
    for seed in range(20):
        dev = captured_missing_join(seed=seed)
        model = build_model(dev)
        (located,) = model.races
        if model.struck(located):
            break
    else:
        pytest.fail("no seed ran `use` before `fill` in any launch")
    data = to_chrome_trace(dev)
    events = data["traceEvents"]
    assert trace_event_errors(data) == []
    lanes = thread_names(events)
    assert {"graph 1 on stream A (non_blocking)", "graph 1 on stream main (non_blocking)"} <= set(lanes.values())
    launches = named(events, "launch graph 1")
    assert len(launches) == 3 and {lanes[e["tid"]] for e in launches} == {"stream main (non_blocking)"}
    (fill,) = named(events, RACE_PREFIX + "fill [graph 1]")
    (use,) = named(events, RACE_PREFIX + "use [graph 1]")
    assert fill["cat"] == use["cat"] == "captured,race"
    # Drawn where one launch ran them, and inside that launch.
    (launch,) = [e for e in launches if e["ts"] <= use["ts"] < e["ts"] + e["dur"]]
    assert launch["ts"] <= fill["ts"] < launch["ts"] + launch["dur"]
    assert use["ts"] < fill["ts"] + fill["dur"]  # it struck: use started before fill ended


def test_captured_work_without_times_does_not_claim_to_have_struck():
    dev = captured_missing_join()
    model = build_model({"trace": dev.trace, "races": dev.races, "backend": "cupy"})
    (located,) = model.races
    assert model.struck(located) is None
    assert model.slices[located.first].category == "captured"


# --- race reports as JSON and as text -----------------------------------------------------------


def _race(first_file: str, second_file: str) -> Race:
    return Race("RAW", "Y", T.CallSite(first_file, 3, "setup"), 0, 16,
                Access("stream A", "fill", T.CallSite(first_file, 7, "step"), True),
                Access("stream B", "use", T.CallSite(second_file, 9, "step"), False),
                "stream B never waited for an event recorded on stream A", "record, then wait")


def test_json_reports_name_files_relative_to_the_root_not_by_basename(tmp_path, monkeypatch):
    inside_a, inside_b = str(tmp_path / "pkg" / "kernels.py"), str(tmp_path / "tests" / "kernels.py")
    outside = "/elsewhere/kernels.py"
    [data] = json.loads(reports_to_json([_race(inside_a, inside_b)], root=str(tmp_path)))
    # Two files of one name stay two files.
    assert (data["buffer_site"], data["first"]["site"], data["second"]["site"]) == (
        "pkg/kernels.py:3", "pkg/kernels.py:7", "tests/kernels.py:9")
    [data] = json.loads(reports_to_json([_race(inside_a, outside)], root=str(tmp_path / "pkg")))
    assert (data["first"]["site"], data["second"]["site"]) == ("kernels.py:7", "/elsewhere/kernels.py:9")
    [data] = json.loads(reports_to_json([_race("<string>", outside)], root=str(tmp_path)))
    assert data["first"]["site"] == "<string>:7"
    # The default root: the one set_site_settings chose (the plugin's: the rootdir), else the working directory.
    previous = T.set_site_settings(T.SiteSettings(root=str(tmp_path / "tests")))
    try:
        [data] = json.loads(reports_to_json([_race(inside_a, inside_b)]))
        assert (data["first"]["site"], data["second"]["site"]) == (f"{tmp_path}/pkg/kernels.py:7", "kernels.py:9")
        T.set_site_settings(T.SiteSettings(root=None))
        monkeypatch.chdir(tmp_path)
        [data] = json.loads(reports_to_json([_race(inside_a, inside_b)]))
        assert (data["first"]["site"], data["second"]["site"]) == ("pkg/kernels.py:7", "tests/kernels.py:9")
    finally:
        T.set_site_settings(previous)


def test_format_report_wraps_at_a_width_and_keeps_lines_whole_without_one():
    dev = Device("sim")
    y = dev.alloc((4,), name="a_buffer_with_a_long_name", fill=0.0)
    a, b = dev.stream("producer_stream_with_a_long_name"), dev.stream("consumer_stream_with_a_long_name")
    dev.launch(lambda y: None, (y,), stream=a, writes=[y], name="fill")
    dev.launch(lambda y: None, (y,), stream=b, reads=[y], name="use")
    whole = format_report(dev.races)
    assert whole == "\n\n".join(["streamcheck: 1 race found", dev.races[0].format()])
    assert max(len(line) for line in whole.splitlines()) > 150
    wrapped = format_report(dev.races, width=60)
    assert all(len(line) <= 60 for line in wrapped.splitlines()), wrapped
    assert wrapped.split() == whole.split()  # the same words in the same order
    lines = wrapped.splitlines()
    edge = next(i for i, line in enumerate(lines) if line.startswith("  missing edge: "))
    assert lines[edge + 1].startswith("      ") and not lines[edge + 1][6].isspace()  # 4 past its line's indent
    assert "`fill`" in wrapped and "test_export.py:" in wrapped  # names and call sites are never split
