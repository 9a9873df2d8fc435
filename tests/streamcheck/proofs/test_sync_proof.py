"""The sync audit's proof: on the sim (streamcheck.sync_proof.prove, Device.edit_syncs), and the
recorder's skipping of syncs for the GPU reruns (Recorder.skipped, SyncEdits as JSON), on a fake GPU."""
from __future__ import annotations

import os
import re

import numpy as np
import pytest

from streamcheck.record import recorder as R
from streamcheck.analyses.sync_audit import SyncEdits, audit
from streamcheck.cli import main
from streamcheck.core import trace as T
from streamcheck.device import Device
from streamcheck.proofs.sync_proof import prove
from tests.streamcheck.fake_torch import FAKE_TORCH_DIR, FakeTorch
from tests.streamcheck.record.test_recorder import FakeArray, FakeGpu, FakeStream


def produce(x):
    x[:] = 7


def consume(x, y):
    y[:] = x + 1


def oversynchronized(dev):
    a, b = dev.stream("A"), dev.stream("B")
    x, y = dev.alloc((4,), name="x", fill=0), dev.alloc((4,), name="y", fill=0)
    out = []
    for _ in range(3):
        dev.launch(produce, [x], stream=a, writes=[x], name="produce")
        a.synchronize()  # only orders B after A: replaced by a device-side wait
        dev.launch(consume, [x, y], stream=b, reads=[x], writes=[y], name="consume")
        out.append(dev.get(y, stream=b))  # needed: the host reads y
        dev.synchronize()  # implied by the get
    return out


def test_the_proof_skips_the_removable_syncs_and_confirms_the_needed_ones():
    proof = prove(oversynchronized)
    result = proof.audit
    assert proof.removable is True, proof.format()
    assert len(proof.runs) == 8 and all(problem == "" for _, problem in proof.runs)
    assert result.replaced and result.removed, result.format()
    confirmed = dict(proof.confirmations)
    assert set(confirmed) == {f.number for f in result.findings if f.prevents}
    assert all(c.confirmed for c in confirmed.values()), proof.format()
    assert "removable on this run" in proof.format()


def test_a_skipped_sync_is_not_issued_and_its_replacement_is():
    reference = Device("sim", policy="sequential")
    oversynchronized(reference)
    result = audit(reference.trace)
    dev = Device("sim", policy="sequential")
    edits = result.edits()
    dev.edit_syncs(edits)
    values = oversynchronized(dev)
    assert all((v == 8).all() for v in values)
    kinds = [type(op) for op in dev.trace.ops]
    assert T.DeviceSync not in kinds  # removed
    assert kinds.count(T.StreamSync) == 3  # the gets' only: the host synchronizes of A were replaced
    assert kinds.count(T.StreamWait) == 3 and dev.races == []
    assert edits.met == {f.sync.key for f in result.findings}


def test_a_program_that_takes_another_path_in_the_rerun_is_claimed_nothing_of():
    runs = []

    def program(dev):
        runs.append(1)
        oversynchronized(dev)
        if len(runs) > 1:  # the reruns synchronize somewhere the recorded run did not
            dev.legacy.synchronize()

    proof = prove(program)
    assert proof.removable is None and "not deterministic" in proof.why


def test_edits_travel_as_json_and_bad_json_is_refused():
    reference = Device("sim", policy="sequential")
    oversynchronized(reference)
    edits = audit(reference.trace).edits()
    again = SyncEdits.from_json(edits.to_json())
    assert again.remove == edits.remove and again.swap == edits.swap
    with pytest.raises(ValueError, match="--skip-syncs"):
        SyncEdits.from_json('{"remove": 3}')


class Driver:
    """The CUDA driver calls a replacement makes, recorded."""

    def __init__(self):
        self.calls = []

    def event_create(self):
        return 0xE0

    def event_record(self, event, ptr):
        self.calls.append(("record", event, ptr))

    def stream_wait_event(self, ptr, event):
        self.calls.append(("wait", ptr, event))


def test_the_recorder_skips_a_sync_and_issues_its_replacement_through_the_driver(monkeypatch):
    def program(rec):
        a, b = FakeStream(0x10), FakeStream(0x20)
        rec.sid(a), rec.sid(b)  # known from their creation, as CuPy's and torch's streams are
        rec.gpu.current = a
        rec.alloc(0x1000, 256)
        x = FakeArray(0x1000, 256)
        made = []
        rec.launch("produce", lambda: None, stream=a, writes=[x])
        rec.stream_sync(a, lambda: made.append("sync"))
        rec.launch("consume", lambda: None, stream=b, reads=[x])
        return made

    first = R.Recorder(FakeGpu())
    monkeypatch.setattr(R, "current", first)
    assert program(first) == ["sync"]
    result = audit(first.trace)
    (finding,) = result.findings
    assert result.replaced == (finding.number,)

    rerun = R.Recorder(FakeGpu())
    rerun.gpu.driver = Driver()
    rerun.edits = result.edits()
    rerun.edits.start(rerun.trace.ops)
    monkeypatch.setattr(R, "current", rerun)
    assert program(rerun) == []  # the synchronize was not made
    assert rerun.gpu.driver.calls == [("record", 0xE0, 0x10), ("wait", 0x20, 0xE0)]
    assert rerun.edits.met == {finding.sync.key} and not rerun.edits.unskipped
    assert rerun.races == []  # the replacement is in the trace too: the checker sees the edge
    assert [type(op) for op in rerun.trace.ops if type(op) in (T.StreamSync, T.EventRecord, T.StreamWait)] == [
        T.EventRecord, T.StreamWait]


def test_a_sync_reported_after_it_ran_is_marked_unskipped(monkeypatch):
    rec = R.Recorder(FakeGpu())
    monkeypatch.setattr(R, "current", rec)
    a = FakeStream(0x10)
    sid = rec.sid(a)
    op = T.StreamSync(rec.tid(), rec.site(), stream=sid)
    edits = SyncEdits()
    edits.start(rec.trace.ops)
    key = ("stream synchronize", op.site.file, op.site.line, op.site.function, edits.names.stream(sid), "")
    rec.edits = SyncEdits(remove={key})
    rec.edits.start(rec.trace.ops)
    rec.record(op)  # as torch's GPU-trace callback records it: after the call
    assert rec.edits.unskipped == {key}


def test_prove_needs_the_audit_and_a_bad_edit_list_is_a_usage_error(tmp_path, capsys):
    script = tmp_path / "s.py"
    script.write_text("print(1)\n")
    assert main(["run", "--prove", str(script)]) == 2
    assert "add --audit-syncs" in capsys.readouterr().err
    assert main(["run", "--skip-syncs", "{bad", str(script)]) == 2
    assert "--skip-syncs" in capsys.readouterr().err


def test_a_replacement_wait_on_a_stream_first_seen_later_is_still_checked(monkeypatch):
    from streamcheck.core.hb import check

    rec = R.Recorder(FakeGpu())
    monkeypatch.setattr(R, "current", rec)
    a, b = FakeStream(0x10), FakeStream(0x20)
    rec.gpu.current = a
    rec.alloc(0x1000, 256)
    x = FakeArray(0x1000, 256)
    rec.launch("produce", lambda: None, stream=a, writes=[x])
    rec.stream_sync(a, lambda: None)
    rec.launch("consume", lambda: None, stream=b, reads=[x])  # b is recorded only here (an external stream)
    ops = list(rec.trace.ops)
    result = audit(ops)
    assert result.replaced, result.format()
    assert check(result.apply(ops)) == [] and check(result.apply(ops, drop=result.replaced))


def test_the_perfetto_trace_marks_the_removable_synchronizations():
    from streamcheck.pictures.export import to_chrome_trace

    dev = Device("sim", policy="sequential")
    oversynchronized(dev)
    result = audit(dev.trace)
    events = to_chrome_trace(dev, audit=result)["traceEvents"]
    marked = [e for e in events if "sync audit" in e.get("args", {})]
    removable = {f.number: f for f in result.findings if f.number in result.removed + result.replaced}
    assert {e["args"]["sync audit"]["number"] for e in marked} == set(removable)
    for e in marked:
        finding = removable[e["args"]["sync audit"]["number"]]
        assert e["name"].startswith(f"[{finding.verdict.value} #{finding.number}]") and e["cname"] == "yellow"
        assert len([m for m in marked if m["args"]["sync audit"]["number"] == finding.number]) == finding.sync.count
    replaced = [e for e in marked if e["args"]["sync audit"]["verdict"] == "device-side suffices"]
    assert replaced and all("wait on it" in e["args"]["sync audit"]["replacement"][0] for e in replaced)


# --- torch's syncs, skipped at their Python entry point (adapters/torch_runtime.py) -----------

def torch_recording(monkeypatch, torch, edits=None):
    """A recording with torch_runtime's patch table applied to `torch` (a FakeTorch)."""
    from streamcheck.record.adapters import torch_runtime as TR
    from streamcheck.record.adapters.patching import Patcher

    gpu = FakeGpu()
    gpu.library_dirs = (FAKE_TORCH_DIR,)  # its frames are torch's: call sites are the program's lines
    rec = R.Recorder(gpu)
    rec.gpu.torch = torch.module
    rec.gpu.driver = Driver()
    rec.state["torch"] = TR.TorchState()  # what install() sets up; the callbacks record for it
    patcher = Patcher(rec.unpatched)
    syncs = [p for p in TR.patches() if p.target.rpartition(".")[2] in ("synchronize", "wait")]
    assert len(syncs) == 5 and all(patcher.apply(patch) for patch in syncs), rec.unpatched
    monkeypatch.setattr(R, "current", rec)
    if edits is not None:
        rec.edits = edits
        rec.edits.start(rec.trace.ops)
    return rec, patcher


def torch_program(rec, torch, cxx=False):
    """A on 0x10 produces x, B on 0x20 copies it into y, A overwrites x, the host reads y (`.item()`).
    `cxx`: the last synchronize is one torch makes inside C++ (no Python entry point)."""
    from streamcheck.record.adapters import torch_runtime as TR

    t = torch.module
    a, b = torch.stream(0x10), torch.stream(0x20)
    rec.register_stream(0x10, rec.site()), rec.register_stream(0x20, rec.site())  # as Stream.__new__ does
    rec.alloc(0x1000, 256), rec.alloc(0x2000, 256)
    x, y = FakeArray(0x1000, 256), FakeArray(0x2000, 256)
    rec.launch("produce", lambda: None, stream=a, writes=[x])
    t.cuda.synchronize()  # only orders B after A: a device-side wait suffices
    rec.launch("copy", lambda: None, stream=b, reads=[x], writes=[y])
    done = t.cuda.streams.Event()
    done.record(b)
    done.wait(a)  # A overwrites what B reads: needed
    done.wait(a)  # the same wait twice: redundant
    rec.launch("overwrite", lambda: None, stream=a, writes=[x])
    done.synchronize()  # implied by the host read's own sync: redundant
    rec.host_read("aten._local_scalar_dense", y, b, True, lambda: None)
    if cxx:
        TR._stream_synchronized(0x20)  # `.nonzero()` and the like: c10 reports it after it ran
    else:
        b.synchronize()  # implied by the host read's sync: redundant
    return torch.made


def test_torch_syncs_are_recorded_once_by_their_callbacks_when_nothing_is_skipped(monkeypatch):
    torch = FakeTorch(monkeypatch)
    rec, patcher = torch_recording(monkeypatch, torch)
    made = torch_program(rec, torch)
    patcher.restore()
    assert made == ["device synchronize", "wait 0x10", "wait 0x10", "event synchronize", "synchronize 0x20"]
    syncs = [op for op in rec.trace.ops if type(op) in (T.DeviceSync, T.StreamWait, T.EventSync, T.StreamSync)]
    assert [(type(op), getattr(op, "cause", "")) for op in syncs] == [
        (T.DeviceSync, ""), (T.StreamWait, ""), (T.StreamWait, ""), (T.EventSync, ""),
        (T.StreamSync, "aten._local_scalar_dense"), (T.StreamSync, "")]
    assert rec.races == []
    assert torch.module.cuda.synchronize.__name__ == "synchronize"  # restored (the fake's own again)


def test_a_torch_rerun_skips_the_removable_syncs_and_issues_the_replacement(monkeypatch):
    torch = FakeTorch(monkeypatch)
    first, patcher = torch_recording(monkeypatch, torch)
    torch_program(first, torch)
    patcher.restore()
    result = audit(first.trace)
    kinds = {f.number: f.sync.kind for f in result.findings}
    assert [kinds[n] for n in result.replaced] == ["device synchronize"], result.format()
    assert sorted(kinds[n] for n in result.removed) == ["event synchronize", "stream synchronize", "wait_event"]
    first_wait, second_wait = sorted((f for f in result.findings if f.sync.kind == "wait_event"),
                                     key=lambda f: f.sync.site.line)
    assert second_wait.number in result.removed and first_wait.number in result.keep, result.format()

    torch = FakeTorch(monkeypatch)
    rerun, patcher = torch_recording(monkeypatch, torch, edits=result.edits())
    made = torch_program(rerun, torch)
    patcher.restore()
    assert made == ["wait 0x10"]  # the first wait alone is made
    assert rerun.gpu.driver.calls == [("record", 0xE0, 0x10), ("wait", 0x20, 0xE0)]
    edits = rerun.edits
    assert not edits.unskipped and set(edits.remove) | set(edits.swap) <= edits.met
    assert T.DeviceSync not in [type(op) for op in rerun.trace.ops]
    assert rerun.races == []  # the replacement wait is in the trace: the checker sees the edge


def test_a_sync_torch_makes_inside_cxx_is_unskipped_and_the_proof_names_it(monkeypatch):
    from streamcheck.proofs.sync_proof_gpu import unskipped_line

    torch = FakeTorch(monkeypatch)
    first, patcher = torch_recording(monkeypatch, torch)
    torch_program(first, torch, cxx=True)
    patcher.restore()
    result = audit(first.trace)
    (late,) = [f for f in result.findings if f.sync.kind == "stream synchronize"]
    assert late.number in result.removed, result.format()

    torch = FakeTorch(monkeypatch)
    rerun, patcher = torch_recording(monkeypatch, torch, edits=result.edits())
    torch_program(rerun, torch, cxx=True)
    patcher.restore()
    assert rerun.edits.unskipped == {late.sync.key}
    line = unskipped_line(result, map(str, rerun.edits.unskipped))
    assert line.startswith(f"not claimed: the rerun could not skip #{late.number} (stream synchronize at ")
    assert f":{late.sync.site.line})" in line and "inside C++" in line


# --- the proof revokes "removable" (issue 31 §5's rule) -------------------------------------

def test_the_proof_revokes_removable_when_an_edited_rerun_races_though_its_values_agree():
    """The recorded run consumes on A (the synchronize orders nothing anything needs); the
    reruns consume on B, so with the synchronize skipped B reads `x` unordered. The values do
    not show it (the program returns a constant): the race alone must revoke "removable"."""
    runs = []

    def program(dev):
        runs.append(None)
        a, b = dev.stream("A"), dev.stream("B")
        x, z = dev.alloc((4,), name="x", fill=0), dev.alloc((4,), name="z", fill=0)
        dev.launch(produce, [x], stream=a, writes=[x], name="produce")
        a.synchronize()
        dev.launch(consume, [x, z], stream=a if len(runs) == 1 else b, reads=[x], writes=[z], name="consume")
        dev.synchronize()
        return [1.0]

    proof = prove(program, schedules=2)
    assert proof.audit.removed, proof.format()
    assert proof.removable is False, proof.format()
    assert all("new race(s): RAW race on `x`" in problem for _, problem in proof.runs), proof.runs
    assert "NOT removable: 2 of 2 edited reruns went wrong" in proof.format()


def test_the_proof_revokes_removable_when_an_edited_reruns_values_differ_without_a_race():
    """The reruns return another value than the sequential reference (the program's result
    depends on how often it ran): no race, but the values alone must revoke "removable"."""
    runs = []

    def program(dev):
        runs.append(None)
        a = dev.stream("A")
        x = dev.alloc((4,), name="x", fill=0)
        dev.launch(produce, [x], stream=a, writes=[x], name="produce")
        a.synchronize()
        a.synchronize()  # the second is redundant: the rerun skips it
        return [float(len(runs) > 1)]

    proof = prove(program, schedules=2)
    assert proof.audit.removed, proof.format()
    assert proof.removable is False, proof.format()
    assert all(problem and "race" not in problem for _, problem in proof.runs), proof.runs


# --- occurrences -----------------------------------------------------------------------------

def advance(x):
    x[:] = x + 1


def decode_loop(dev):
    """Synchronizes after every step; the host reads after the last one only."""
    s = dev.stream("S")
    x, out = dev.alloc((4,), name="x", fill=0), dev.alloc((4,), name="out", fill=0)
    for _ in range(3):
        dev.launch(advance, [x], stream=s, reads=[x], writes=[x], name="step")
        dev.launch(consume, [x, out], stream=s, reads=[x], writes=[out], name="consume")
        s.synchronize()
    return dev.host_read(out)


def test_the_proof_skips_occurrences_and_says_which():
    proof = prove(decode_loop)
    (finding,) = proof.audit.findings
    assert (finding.kept, finding.removed_at) == ((3,), (1, 2)), proof.format()
    assert proof.removable is True and len(proof.runs) == 8, proof.format()
    assert "with #1 skipped at occurrences 1, 2 of 3, 8 reruns" in proof.format()
    # Its needed occurrence skipped alone strikes: the host reads `out` before the stream wrote it.
    ((number, confirmation),) = proof.confirmations
    assert number == 1 and confirmation.confirmed, proof.format()


def test_a_rerun_that_issues_a_sync_another_number_of_times_is_claimed_nothing_of():
    runs = []

    def program(dev):
        runs.append(None)
        s = dev.stream("S")
        x = dev.alloc((4,), name="x", fill=0)
        for _ in range(3 if len(runs) == 1 else 2):  # the reruns take one step less
            dev.launch(produce, [x], stream=s, writes=[x], name="produce")
            s.synchronize()
        return dev.host_read(x)

    proof = prove(program, schedules=2)
    assert proof.removable is None and "counts differ" in proof.why, proof.format()
    assert re.search(r"the rerun issued #1 \(stream synchronize at \S+:\d+\) 2 time\(s\), the recorded run 3 ",
                     proof.why), proof.why


def test_the_recorder_skips_occurrences_of_a_sync(monkeypatch):
    """The GPU proof's reruns: the recorder counts each sync's occurrences as the program makes
    them and skips only those the minimal set drops (here all but the last of three)."""
    def program(rec):
        a = FakeStream(0x10)
        rec.sid(a)
        rec.gpu.current = a
        rec.alloc(0x1000, 256)
        x = FakeArray(0x1000, 256)
        made = []
        for step in range(3):
            rec.launch("produce", lambda: None, stream=a, writes=[x])
            rec.stream_sync(a, lambda step=step: made.append(step))
        # The host reads `x` (pinned memory, say) after the loop: only the last synchronize orders it.
        rec.record(T.HostAccess(rec.tid(), rec.site(), reads=(rec.range_of(x),), name="host read"))
        return made

    first = R.Recorder(FakeGpu())
    monkeypatch.setattr(R, "current", first)
    assert program(first) == [0, 1, 2]
    result = audit(first.trace)
    (finding,) = result.findings
    assert (finding.kept, finding.removed_at) == ((3,), (1, 2)), result.format()

    rerun = R.Recorder(FakeGpu())
    rerun.gpu.driver = Driver()
    rerun.edits = SyncEdits.from_json(result.edits().to_json())  # as `streamcheck run --skip-syncs` gets it
    rerun.edits.start(rerun.trace.ops)
    monkeypatch.setattr(R, "current", rerun)
    assert program(rerun) == [2]  # the first two synchronizes were not made, the last was
    assert rerun.edits.every_edit_met and not rerun.edits.unskipped
    assert rerun.races == []


def three_synchronizes(rec, torch):
    """A fake-torch program: a step on stream 0x10 then its synchronize, three times, then the host
    reads what the steps wrote (only the last synchronize is needed). Returns the calls torch made."""
    a = torch.stream(0x10)
    rec.register_stream(0x10, rec.site())
    rec.alloc(0x1000, 256)
    x = FakeArray(0x1000, 256)
    for _ in range(3):
        rec.launch("step", lambda: None, stream=a, reads=[x], writes=[x])
        a.synchronize()
    rec.record(T.HostAccess(rec.tid(), rec.site(), reads=(rec.range_of(x),), name="host read"))
    return torch.made


def test_a_torch_rerun_skips_occurrences_and_counts_a_made_call_once(monkeypatch):
    """torch decides at the Python entry point and reports a call that was made through its
    callback afterwards: the occurrence is counted once, so the rerun skips the first two of
    three synchronizes and makes the last."""
    torch = FakeTorch(monkeypatch)
    first, patcher = torch_recording(monkeypatch, torch)
    assert three_synchronizes(first, torch) == ["synchronize 0x10"] * 3
    patcher.restore()
    result = audit(first.trace)
    (finding,) = result.findings
    assert (finding.kept, finding.removed_at) == ((3,), (1, 2)), result.format()

    torch = FakeTorch(monkeypatch)
    rerun, patcher = torch_recording(monkeypatch, torch, edits=result.edits())
    assert three_synchronizes(rerun, torch) == ["synchronize 0x10"]
    patcher.restore()
    assert rerun.edits.issued == {finding.sync.key: 3} and rerun.edits.every_edit_met
    assert not rerun.edits.unskipped and rerun.races == []


def test_the_perfetto_trace_marks_only_the_occurrences_the_minimal_set_drops():
    from streamcheck.pictures.export import to_chrome_trace

    dev = Device("sim", policy="sequential")
    decode_loop(dev)
    result = audit(dev.trace)
    (finding,) = result.findings
    assert finding.removed_at == (1, 2)
    events = to_chrome_trace(dev, audit=result)["traceEvents"]
    marked = [e for e in events if "sync audit" in e.get("args", {})]
    # The two dropped occurrences, each with its own verdict; the kept last one unmarked.
    assert len(marked) == 2 and all(e["name"].startswith("[redundant #1]") for e in marked), marked
    assert all(e["args"]["sync audit"]["reason"] == finding.others for e in marked)


def test_a_call_let_through_is_counted_once_though_other_records_come_before_its_callback(monkeypatch):
    """Between torch's entry point and the callback that reports the call, other operations may
    be recorded (an event torch creates on the way): the occurrence is still counted once."""
    from streamcheck.record.adapters import torch_runtime as TR

    torch = FakeTorch(monkeypatch)
    first, patcher = torch_recording(monkeypatch, torch)
    three_synchronizes(first, torch)
    patcher.restore()
    result = audit(first.trace)

    torch = FakeTorch(monkeypatch)
    rerun, patcher = torch_recording(monkeypatch, torch, edits=result.edits())
    # c10's callback, after an event record of torch's own; compiled as torch's code (a frame in the
    # fake torch's folder), so that the sites it records are the program's line, as torch's are.
    scope = {"rerun": rerun, "T": T, "reported": TR._stream_synchronized}
    exec(compile("def later(stream):\n"
                 "    rerun.record(T.EventCreate(rerun.tid(), rerun.site(), event=999, name=\"torch's own\"))\n"
                 "    reported(stream)\n", os.path.join(FAKE_TORCH_DIR, "c10_callbacks.py"), "exec"), scope)
    later = scope["later"]
    monkeypatch.setattr(TR, "_stream_synchronized", later)
    assert three_synchronizes(rerun, torch) == ["synchronize 0x10"]
    patcher.restore()
    (finding,) = result.findings
    assert rerun.edits.issued == {finding.sync.key: 3} and rerun.edits.every_edit_met, rerun.edits.issued


def test_the_gpu_proof_names_a_sync_the_rerun_issued_another_number_of_times():
    from streamcheck.proofs.sync_proof_gpu import other_path_line

    dev = Device("sim", policy="sequential")
    decode_loop(dev)
    result = audit(dev.trace)
    edits = SyncEdits.from_json(result.edits().to_json())
    rerun = Device("sim", policy="sequential")
    rerun.edit_syncs(edits)
    s = rerun.stream("S")
    for _ in range(2):  # another program: none of the recorded run's three synchronizes, two of its own
        s.synchronize()
    (finding,) = result.findings
    assert not edits.every_edit_met and edits.edit_differences() == [(finding.sync.key, 0, 3)]
    line = other_path_line(result, [[str(k), got, n] for k, got, n in edits.edit_differences()])
    assert line.startswith("not claimed: the rerun issued #1 (stream synchronize at "), line
    assert line.endswith(") 0 time(s), the recorded run 3 (not deterministic between runs, or a call the recorder "
                         "counted twice)"), line


def test_an_entry_point_reached_inside_another_decides_its_call_once(monkeypatch):
    """On the H100 (torch 2.11) the decode loop's rerun counted a wait_stream twice per call: an entry
    point reached from inside another (or a method wrapped twice) must not count the occurrence again."""
    from streamcheck.record.adapters import torch_runtime as TR


    torch = FakeTorch(monkeypatch)
    first, patcher = torch_recording(monkeypatch, torch)
    three_synchronizes(first, torch)
    patcher.restore()
    result = audit(first.trace)

    torch = FakeTorch(monkeypatch)
    rerun, patcher = torch_recording(monkeypatch, torch, edits=result.edits())
    stream_class = torch.module.cuda.streams.Stream  # the same entry point once more around itself
    monkeypatch.setattr(stream_class, "synchronize", TR._skippable(TR._synchronize_stream)(stream_class.synchronize))
    assert three_synchronizes(rerun, torch) == ["synchronize 0x10"]
    patcher.restore()
    (finding,) = result.findings
    assert rerun.edits.issued == {finding.sync.key: 3} and rerun.edits.every_edit_met, rerun.edits.issued
