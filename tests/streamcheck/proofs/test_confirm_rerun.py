"""Race confirmation by reruns (streamcheck/proofs/confirm_gpu.py) on the CPU: which operations a rerun
targets, where the probe puts its spin and its events (a fake GPU logs every call in order),
how a rerun's result becomes a verdict, the retry with a longer delay, and the CLI's refusals.
The GPU runs of tests/gpu_programs are in test_confirm_gpu.py."""
from __future__ import annotations

import json

import pytest

from streamcheck.proofs import confirm_gpu
from streamcheck.record import recorder as R
from streamcheck.cli import main
from streamcheck.proofs.confirm_gpu import Probe, ProbeSpec, confirm_races, judge, plan_probe
from streamcheck.record.gpu import MAX_DELAY_US
from tests.streamcheck.record.test_recorder import FakeArray, FakeGpu, FakeStream


class LoggingDriver:
    def __init__(self, log, elapsed_us=0.0):
        self.log, self.elapsed = log, elapsed_us
        self.next = 100

    def event_create(self):
        self.next += 1
        return self.next

    def event_record(self, event, ptr):
        self.log.append(("event", event, ptr))

    def elapsed_us(self, start, end):
        return self.elapsed

    def stream_create(self):
        return 0x99

    def ensure_context(self, ptr):
        pass


class LoggingGpu(FakeGpu):
    def __init__(self, elapsed_us=0.0):
        super().__init__()
        self.log = []
        self.driver = LoggingDriver(self.log, elapsed_us)

    def spin(self, stream, us):
        self.log.append(("spin", stream.ptr, us))


def racy(rec, steps=1):
    """s1 writes x, s2 reads it without a wait, `steps` times (one call site each)."""
    s1, s2 = FakeStream(0x10), FakeStream(0x20)
    rec.alloc(0x1000, 64)
    x = FakeArray(0x1000, 64)
    for _ in range(steps):
        rec.launch("produce", lambda: rec.gpu.log.append("produce"), stream=s1, writes=[x])
        rec.launch("consume", lambda: rec.gpu.log.append("consume"), stream=s2, reads=[x])


def recorded(gpu=None, steps=1, probe=None):
    rec = R.Recorder(gpu or LoggingGpu())
    if probe is not None:
        rec.set_probe(probe)
    previous, R.current = R.current, rec
    try:
        racy(rec, steps)
    finally:
        R.current = previous
    return rec


def test_the_rerun_targets_the_first_access_on_its_stream_and_the_second_on_its_own():
    rec = recorded()
    (race,) = rec.races
    first, second = plan_probe(rec.checker, rec.trace, race)
    assert (first.name, first.label.split()[1], first.occurrence) == ("produce", "s1", 0)
    assert (second.name, second.label.split()[1], second.occurrence) == ("consume", "s2", 0)
    assert first.site == race.first.site and second.site == race.second.site


def test_a_reuse_free_race_is_aimed_at_the_new_owners_first_access_not_at_the_free():
    """A free is not a reuse (issue 37): the rerun times the held use against the first access of
    the allocation that got the bytes; a strict free nothing reused cannot be confirmed."""
    from streamcheck.device import Device
    from tests.streamcheck.proofs.test_confirm import free_in_use, reused_in_use

    dev = Device("sim", policy="sequential")
    reused_in_use(dev)
    (race,) = dev.races
    first, second = plan_probe(dev.checker, dev.trace, race)
    assert race.kind == "FREE" and race.second.name == "free"
    assert (first.name, first.label, second.name, second.label) == ("produce", "stream A", "produce", "stream B")
    assert second.site != race.second.site  # the new owner's write, not the free
    strict = Device("sim", policy="sequential", strict_free=True)
    free_in_use(strict)
    (race,) = strict.races
    assert "no allocation got the freed bytes" in plan_probe(strict.checker, strict.trace, race)


def test_the_probe_spins_right_before_the_first_access_and_times_both_ends():
    reference = recorded()
    (race,) = reference.races
    first, second = plan_probe(reference.checker, reference.trace, race)
    spec = ProbeSpec(first, second, 500.0, tuple(confirm_gpu._race_key(race)))
    gpu = LoggingGpu(elapsed_us=321.0)
    probe = Probe(ProbeSpec.from_json(spec.to_json()))  # what the rerun gets on its command line
    rerun = recorded(gpu, probe=probe)
    a, b = probe.events["first"], probe.events["second"]
    assert gpu.log == [("spin", 0x10, 500.0), "produce", ("event", a, 0x10), ("event", b, 0x20), "consume"]
    result = probe.result(rerun.races)
    assert result["first_issued"] and result["second_issued"] and result["elapsed_us"] == 321.0
    assert result["races"] == [confirm_gpu._race_key(race)]
    verdict, retry = judge(race, spec, result, "streamcheck run ...")
    assert verdict.confirmed and retry is None
    assert verdict.format().startswith("confirmed: `consume` (") and "started 321.0 µs before `produce`" in verdict.text


def test_only_the_occurrence_that_raced_is_delayed():
    reference = recorded(steps=3)
    (race,) = [r for r in reference.races if r.kind == "RAW"]  # (and a WAR: `consume` k against `produce` k + 1)
    first, second = plan_probe(reference.checker, reference.trace, race)
    assert first.occurrence == 0 and second.occurrence == 0  # the first time the race was seen
    later = ProbeSpec(type(first)(first.stream, first.label, first.name, first.site, 2),
                      type(second)(second.stream, second.label, second.name, second.site, 2), 500.0, ())
    gpu = LoggingGpu()
    recorded(gpu, steps=3, probe=Probe(later))
    spins = [i for i, entry in enumerate(gpu.log) if entry[0] == "spin"]
    produced = [i for i, entry in enumerate(gpu.log) if entry == "produce"]
    assert len(spins) == 1 and produced[1] < spins[0] < produced[2]  # before the third `produce` only


def test_the_probe_never_puts_a_spin_or_an_event_inside_a_capture():
    reference = recorded()
    first, second = plan_probe(reference.checker, reference.trace, reference.races[0])
    gpu = LoggingGpu()
    gpu.capturing = {0x10, 0x20}
    probe = Probe(ProbeSpec(first, second, 500.0, ()))
    recorded(gpu, probe=probe)
    assert gpu.log == ["produce", "consume"]
    assert not probe.result([])["first_issued"]


def test_a_failing_driver_never_reaches_the_program():
    reference = recorded()
    first, second = plan_probe(reference.checker, reference.trace, reference.races[0])
    gpu = LoggingGpu()

    def broken(*args):
        raise RuntimeError("CUDA driver cuEventRecord failed with CUresult 400")

    gpu.driver.event_record = broken
    probe = Probe(ProbeSpec(first, second, 500.0, ()))
    recorded(gpu, probe=probe)  # the program ran to its end
    assert "produce" in gpu.log and "consume" in gpu.log
    verdict, _ = judge(reference.races[0], probe.spec, probe.result(reference.races), "r")
    assert not verdict.confirmed and "cuEventRecord failed" in verdict.text


def _spec(race, delay=2000.0, rec=None):
    rec = rec or recorded()
    first, second = plan_probe(rec.checker, rec.trace, race)
    return ProbeSpec(first, second, delay, tuple(confirm_gpu._race_key(race)))


@pytest.mark.parametrize("result, words", [
    (None, "did not report back (killed)"),
    ({"first_issued": False, "second_issued": False, "races": []}, "was never issued in the rerun (the program is not"),
    ({"first_issued": True, "second_issued": False, "races": []}, "the second access (`consume`"),
    ({"first_issued": True, "second_issued": True, "races": [], "elapsed_us": 10.0}, "call sites differ in the rerun"),
])
def test_a_race_is_not_claimed_without_proof(result, words):
    rec = recorded()
    race = rec.races[0]
    spec = _spec(race, rec=rec)
    if result is not None and result["races"] == "SAME":
        result = dict(result, races=[list(spec.race_key)])
    verdict, retry = judge(race, spec, result, "r", failure="killed")
    assert not verdict.confirmed and words in verdict.text and retry is None


@pytest.mark.parametrize("steps", [1, 3])
def test_a_call_that_held_the_host_is_rerun_with_eager_loading_then_at_its_last_occurrence_then_explained(steps):
    rec = recorded(steps=steps)
    race = next(r for r in rec.races if r.kind == "RAW")
    runs = []

    def rerun(spec, script, args, seed, warm_up):
        runs.append((spec.eager, spec.first.occurrence, spec.second.occurrence))
        return ["python", "-m", "streamcheck", "run", "p.py"], {
            "first_issued": True, "second_issued": True, "races": [list(spec.race_key)], "elapsed_us": -5.0,
            "first_issue_us": 2400.0, "host_gap_us": 10.0}, ""

    (verdict,) = confirm_races(rec.checker, rec.trace, [race], "p.py", rerun=rerun)
    last = steps - 1
    assert runs == [(False, 0, 0), (True, 0, 0)] + ([(True, last, last)] if steps > 1 else [])
    assert not verdict.confirmed and "a host synchronize between them held the host" in verdict.text
    assert "neither eager module loading nor the race's last occurrence removed it" in verdict.text
    assert verdict.replay.startswith("CUDA_MODULE_LOADING=EAGER streamcheck run")


def test_a_delay_too_short_is_retried_longer_and_the_cap_says_what_it_would_take():
    rec = recorded()
    race = rec.races[0]
    delays = []

    def rerun(spec, script, args, seed, warm_up, late_by=60_000.0):
        delays.append(spec.delay_us)
        return ["python", "-m", "streamcheck", "run", "p.py"], {
            "first_issued": True, "second_issued": True, "races": [list(spec.race_key)],
            "elapsed_us": spec.delay_us - late_by, "first_issue_us": 3.0, "host_gap_us": 100.0}, ""

    (verdict,) = confirm_races(rec.checker, rec.trace, [race], "p.py", rerun=rerun)
    assert delays[0] == confirm_gpu.FIRST_DELAY_US and delays[-1] == MAX_DELAY_US and delays == sorted(delays)
    assert not verdict.confirmed and "within the delay cap" in verdict.text and "about 60100 µs" in verdict.text

    delays.clear()
    (verdict,) = confirm_races(rec.checker, rec.trace, [race], "p.py",
                               rerun=lambda *a: rerun(*a, late_by=2500.0))
    assert delays == [confirm_gpu.FIRST_DELAY_US, 5200.0] and verdict.confirmed  # 2 × (2000 + 500 + 100)


def test_races_over_the_cap_are_listed_not_attempted():
    rec = recorded()
    (verdict,) = confirm_races(rec.checker, rec.trace, rec.races, "p.py", max_races=0,
                               rerun=lambda *a: pytest.fail("no rerun over the cap"))
    assert not verdict.confirmed and verdict.text == "not attempted (over --confirm-max 0)"


def test_a_race_whose_first_access_is_the_hosts_cannot_be_delayed():
    rec = R.Recorder(LoggingGpu())
    previous, R.current = R.current, rec
    try:
        from streamcheck.core import trace as T

        s1 = FakeStream(0x10)
        rec.alloc(0x1000, 64)
        x = FakeArray(0x1000, 64)
        child = rec.thread_starting()  # a host thread that writes x while the main thread launches
        rec.record(T.HostAccess(child, rec.site(), writes=rec.ranges([x]), name="host write"))
        rec.launch("consume", lambda: None, stream=s1, reads=[x])
    finally:
        R.current = previous
    (race,) = rec.races
    assert "the host's own" in plan_probe(rec.checker, rec.trace, race)


def test_the_probe_spec_round_trips_and_a_bad_one_is_refused():
    rec = recorded()
    spec = _spec(rec.races[0])
    assert ProbeSpec.from_json(spec.to_json()) == spec
    with pytest.raises(ValueError, match="not a probe written by streamcheck run --confirm"):
        ProbeSpec.from_json("{}")
    with pytest.raises(ValueError, match="delay_us must be in"):
        ProbeSpec.from_json(json.dumps(dict(json.loads(spec.to_json()), delay_us=MAX_DELAY_US + 1)))


@pytest.mark.parametrize("argv, words", [
    (["--confirm-max", "3"], "--confirm-max limits --confirm"),
    (["--confirm-probe", "not json"], "not a probe written by streamcheck run --confirm"),
])
def test_confirm_usage_errors_exit_2(argv, words, tmp_path, capsys):
    script = tmp_path / "p.py"
    script.write_text("pass\n")
    assert main(["run", *argv, str(script)]) == 2
    assert words in capsys.readouterr().err


def test_a_bad_confirm_max_is_a_usage_error(tmp_path, capsys):
    script = tmp_path / "p.py"
    script.write_text("pass\n")
    with pytest.raises(SystemExit) as exc:
        main(["run", "--confirm", "--confirm-max", "-1", str(script)])
    assert exc.value.code == 2 and "must be an integer >= 0" in capsys.readouterr().err


def test_confirm_on_the_gpu_backend_without_a_gpu_exits_2_and_says_the_reruns_need_one(tmp_path, capsys,
                                                                                       monkeypatch):
    import streamcheck.record.gpu as gpu

    monkeypatch.setattr(gpu, "cuda_device_present", lambda: False)
    script = tmp_path / "p.py"
    script.write_text("pass\n")
    assert main(["run", "--backend", "gpu", "--confirm", str(script)]) == 2
    assert "--confirm reruns the script on the GPU" in capsys.readouterr().err


class FakeEvent:
    pass


def _graph_program(rec, second_in_graph=False):
    """A graph on s1 writes x; s2 reads x after the launch without a wait (or, with
    `second_in_graph`, a forked node of the same graph reads it without a join)."""
    from streamcheck.record.adapters import cupy_graphs
    from streamcheck.core import trace as T
    from tests.streamcheck.record.test_recorder import FakeGraph

    gpu = rec.gpu
    origin, side, other = FakeStream(0x10), FakeStream(0x30), FakeStream(0x20)
    rec.alloc(0x1000, 64, stream=origin)
    x = FakeArray(0x1000, 64)
    rec.capture_begin(origin, None, lambda: gpu.capturing.update({origin.ptr, side.ptr}))
    if second_in_graph:
        fork = FakeEvent()
        rec.record(T.EventRecord(rec.tid(), rec.site(), event=rec.eid(fork), stream=rec.sid(origin)))
        rec.record(T.StreamWait(rec.tid(), rec.site(), stream=rec.sid(side), event=rec.eid(fork)))
        rec.launch("read_in_graph", lambda: None, stream=side, reads=[x])
    rec.launch("fill", lambda: None, stream=origin, writes=[x])
    if second_in_graph:
        join = FakeEvent()
        rec.record(T.EventRecord(rec.tid(), rec.site(), event=rec.eid(join), stream=rec.sid(side)))
        rec.record(T.StreamWait(rec.tid(), rec.site(), stream=rec.sid(origin), event=rec.eid(join)))
    graph = cupy_graphs.wrap_end_capture(lambda _s: (gpu.capturing.clear(), FakeGraph())[1])(origin)
    graph.launch(origin)
    graph.launch(origin)
    if not second_in_graph:
        rec.launch("read_after", lambda: None, stream=other, reads=[x])
    return graph


def test_a_captured_first_access_is_targeted_at_the_graph_launch_that_raced():
    from streamcheck.core.trace import GraphLaunch

    rec = R.Recorder(LoggingGpu())
    previous, R.current = R.current, rec
    try:
        graph = _graph_program(rec)
    finally:
        R.current = previous
    race = next(r for r in rec.races if r.second.name == "read_after")
    first, second = plan_probe(rec.checker, rec.trace, race)
    launches = [op for op in rec.trace.ops if type(op) is GraphLaunch]
    assert (first.name, first.site) == ("GraphLaunch", launches[1].site)  # the last launch before the read
    assert second.name == "read_after"
    del graph


def test_two_nodes_of_one_graph_cannot_be_inverted_by_a_delay_before_its_launch():
    rec = R.Recorder(LoggingGpu())
    previous, R.current = R.current, rec
    try:
        graph = _graph_program(rec, second_in_graph=True)
    finally:
        R.current = previous
    (race,) = rec.races
    assert "both accesses are nodes of one CUDA graph" in plan_probe(rec.checker, rec.trace, race)
    del graph


@pytest.mark.parametrize("latest", [False, True])
def test_nodes_of_two_graphs_sharing_bytes_are_targeted_at_the_two_launches_that_raced(latest):
    """Graphs sharing one pool: both accesses are captured nodes, of two graphs. The rerun delays
    the first graph's launch right before the second graph's launch that raced with it."""
    from streamcheck.core.trace import GraphLaunch
    from streamcheck.device import Device
    from tests.streamcheck.device.backends.test_capture_sim import STEPS, graphs_sharing_bytes_replayed_on_two_streams

    dev = Device("sim")
    graphs_sharing_bytes_replayed_on_two_streams(dev, fixed=False)
    race = next(r for r in dev.races if r.kind == "WAW")
    first, second = plan_probe(dev.checker, dev.trace, race, latest=latest)
    launches = [op for op in dev.trace.ops if type(op) is GraphLaunch]
    side, compute = launches[0].stream, launches[1].stream
    assert (first.name, first.stream, second.name, second.stream) == ("GraphLaunch", side, "GraphLaunch", compute)
    assert (first.site, second.site) == (launches[0].site, launches[1].site)
    assert first.occurrence == second.occurrence == (STEPS - 1 if latest else 0)
