"""Race-directed confirmation on the GPU: rerun a `streamcheck run` program once per reported
race, delay exactly the race's first access, and prove with CUDA events that the second
access started before the first finished.

The sim's twin is confirm.py (values read on numpy arrays); this module is its GPU half:

- `plan_probe(checker, trace, race)`: which trace operations to target in the rerun, as two
  `core.schedule.Target`s (stream, name, call site, occurrence), or why the race cannot be
  confirmed by a rerun (its first access is the host's own; both are nodes of one graph). A
  captured access is targeted at its graph's launch: no spin and no event is ever put inside
  a capture (CUDA would bake them into the graph).
- `Probe`: what the rerun's recorder runs (Recorder.set_probe). Right before the first
  access is issued it enqueues a bounded spin on the first's stream; right after, it records
  timing event A there. Right before the second is issued it records event B on the second's
  stream (B completes when everything before the second on its stream has: when the second
  can start). A host-side second (a free, a host access) records B on an idle stream of its
  own, i.e. at the host's issue time. elapsed(B → A) > 0 means the second started that many
  microseconds before the first finished: the race struck.
- `confirm_races(...)`: the reruns (fresh processes, same arguments, seed and warm-up,
  nothing else delayed), and `Verdict`s in the words of the report.

A rerun is trusted only if it reports the same race (by its two call sites) and issued both
accesses; otherwise the program is not deterministic between runs and nothing is claimed.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from typing import Optional

from .confirm import MAX_RACES, check_max_races, new_owner_access  # noqa: F401 (MAX_RACES: --confirm-max's default)
from ..core.schedule import HOST, Target
from ..core.trace import CallSite, Free, GraphLaunch
from ..record.gpu import MAX_DELAY_US

FIRST_DELAY_US = 2000.0  # the first try: longer than the host takes between most racing calls
RERUN_TIMEOUT_S = 600
RERUNS_PER_RACE = 5  # the first try, eager loading, the last occurrence, longer delays up to the cap


# --- what to target ----------------------------------------------------------------------
def _graph_of(checker, trace, op) -> Optional[int]:
    """The graph id whose captured nodes include `op`, or None."""
    for gid in {o.graph for o in trace.ops if type(o) is GraphLaunch}:
        graph = checker.captured_graph(gid)
        if graph is not None and any(node.op is op for node in graph.nodes):
            return gid
    return None


def _launches(trace, gid: int) -> list:
    return [i for i, o in enumerate(trace.ops) if type(o) is GraphLaunch and o.graph == gid]


def plan_probe(checker, trace, race, latest: bool = False):
    """(first Target, second Target) to aim a rerun at, or a string: why no rerun can confirm it.
    The first time the race was seen, or with `latest` the last time."""
    witness = checker.witness(race, latest=latest) if checker is not None else None
    if witness is None:
        return "the checker kept no witness of this race"
    index = {id(op): i for i, op in enumerate(trace.ops)}
    graphs = [_graph_of(checker, trace, op) for op in witness]
    if graphs[0] is not None and graphs[0] == graphs[1]:
        return ("both accesses are nodes of one CUDA graph: a delay before its launch delays both, and a spin "
                "inside the capture would change the graph")
    at = [index.get(id(op)) for op in witness]
    # A captured access ran when its graph was launched: the launch that raced is the last one
    # before the other access (first), or the first one after it (second). Nodes of two graphs
    # (graphs sharing one pool): the second graph's first launch after one of the first's (its
    # last, with `latest`), and the first graph's last launch before it.
    if graphs[0] is not None and graphs[1] is not None:
        firsts = _launches(trace, graphs[0])
        seconds = [i for i in _launches(trace, graphs[1]) if firsts and i > firsts[0]]
        at[1] = (seconds[-1] if latest else seconds[0]) if seconds else None
        at[0] = max(i for i in firsts if i < at[1]) if seconds else None
    elif graphs[0] is not None:
        before = [i for i in _launches(trace, graphs[0]) if at[1] is None or i < at[1]]
        at[0] = before[-1] if before else None
    elif graphs[1] is not None:
        after = [i for i in _launches(trace, graphs[1]) if at[0] is None or i > at[0]]
        at[1] = after[0] if after else None
    if None in at:
        return "an access of the race is a captured node whose graph launch is not in the trace"
    if race.kind == "FREE" and type(witness[1]) is Free:
        # A free is not a reuse: what can differ is the new owner's use of the bytes, so the second
        # target is the first access of the allocation that got them (the sim's confirmation does the same).
        at[1] = new_owner_access(trace, at[1], witness[1].buffer)
        if at[1] is None:
            return ("no allocation got the freed bytes and used them in this run (a strict free: --strict-free), so "
                    "no value can differ; the caching allocator may still hand them out in another run")
    first, second = Target.at(trace, at[0]), Target.at(trace, at[1])
    if first.stream == HOST:
        return (f"the first access is the host's own ({first.describe()}): it runs when issued, so no delay can "
                "hold it back")
    return first, second


def _target_json(t: Target) -> dict:
    return {"stream": t.stream, "label": t.label, "name": t.name, "occurrence": t.occurrence,
            "site": [t.site.file, t.site.line, t.site.function]}


def _target_from(d: dict) -> Target:
    file, line, function = d["site"]
    return Target(int(d["stream"]), str(d["label"]), str(d["name"]), CallSite(file, int(line), function),
                  int(d["occurrence"]))


def _race_key(race) -> list:
    return [race.kind, race.first.site.file, race.first.site.line, race.second.site.file, race.second.site.line]


@dataclass(frozen=True)
class ProbeSpec:
    """What one rerun targets: `--confirm-probe` carries it as JSON, so the replay line is whole."""

    first: Target
    second: Target
    delay_us: float
    race_key: tuple
    eager: bool = False  # rerun with CUDA_MODULE_LOADING=EAGER (no kernel loading while the program runs)
    latest: bool = False  # aimed at the race's last occurrence, not its first (not carried: the targets say it)

    def to_json(self) -> str:
        return json.dumps({"first": _target_json(self.first), "second": _target_json(self.second),
                           "delay_us": self.delay_us, "race": list(self.race_key)}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "ProbeSpec":
        try:
            d = json.loads(text)
            spec = cls(_target_from(d["first"]), _target_from(d["second"]), float(d["delay_us"]), tuple(d["race"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"--confirm-probe: not a probe written by streamcheck run --confirm ({exc})") from None
        if not 0 < spec.delay_us <= MAX_DELAY_US:
            raise ValueError(f"--confirm-probe: delay_us must be in (0, {MAX_DELAY_US}] µs, got {spec.delay_us}")
        return spec


# --- in the rerun ------------------------------------------------------------------------
class Probe:
    """Recorder hooks of one rerun (see the module docstring). Never raises into the program:
    a CUDA error here is kept in `error` and the probe stops."""

    def __init__(self, spec: ProbeSpec, driver=None):
        self.spec = spec
        self.driver = driver  # adapters.cuda_device.CudaDriver (timing events); the recorder's if None
        self.targets = (("first", spec.first), ("second", spec.second))
        self.streams = {spec.first.stream, spec.second.stream}
        self.counts = {"first": 0, "second": 0}  # recorded operations of each target's key so far
        self.done = {"first": False, "second": False}
        self.events: dict = {}  # role -> cuEvent
        self.first_stream = None  # where the spin went: event A is recorded there
        self.spun_at = self.first_issued_at = self.second_issued_at = None  # host perf_counter()
        self.error: Optional[str] = None
        self.captured: set = set()  # roles met only inside a capture: nothing recorded for them
        self._idle_stream = None
        self._lock = threading.Lock()

    def _event(self, role: str, ptr: int) -> int:
        if role not in self.events:
            self.driver.ensure_context(ptr)
            self.events[role] = self.driver.event_create()
        return self.events[role]

    def issuing(self, rec, stream, sid: int) -> None:
        """Right before an operation on stream `sid` is issued (Recorder.before_issue)."""
        if sid not in self.streams or self.error is not None:
            return
        if self.driver is None:
            self.driver = rec.gpu.driver
        site = rec.site()
        with self._lock:
            for role, t in self.targets:
                if self.done[role] or t.stream != sid or t.site != site or self.counts[role] != t.occurrence:
                    continue
                # Matched by stream and line, not name: one line may issue several operations
                # (a copy's name is known only once it is recorded). Spinning before an earlier
                # one of them still delays the target, which comes later on the same stream;
                # event B is recorded again before each, so it marks the last one's start.
                try:
                    if stream is None:
                        stream = rec.gpu.current_stream()
                    if rec.gpu.is_capturing(stream):
                        self.captured.add(role)
                        continue  # never inside a capture: the graph's launch is targeted instead
                    self._issuing(role, rec.gpu.stream_ptr(stream), lambda us: rec.gpu.spin(stream, us))
                except Exception as exc:  # noqa: BLE001 - the program must not see our failure
                    self.error = f"{type(exc).__name__}: {exc}"

    def _issuing(self, role: str, ptr: int, spin) -> None:
        """The target `role` is about to be issued on stream `ptr`: the spin before the first
        (once), event B before the second (again before each try: it marks the last)."""
        if role == "first":
            if self.first_stream is None:
                spin(self.spec.delay_us)
                self.first_stream, self.spun_at = ptr, time.perf_counter()
        else:
            self.driver.event_record(self._event("second", ptr), ptr)
            self.second_issued_at = time.perf_counter()

    def issued(self, rec, op) -> None:
        """Right after an operation was recorded (Recorder.record)."""
        if self.error is not None:
            return
        role, t = self._match(op)
        if role is not None:
            with self._lock:
                if self.driver is None:
                    self.driver = rec.gpu.driver
                self._count(role, t)

    def _match(self, op):
        """(role, Target) of the target `op` is one of (its key and site), or (None, None)."""
        stream, name = Target.key_of(op)
        for role, t in self.targets:
            if (stream, name) == (t.stream, t.name) and op.site == t.site:
                return role, t
        return None, None

    def _count(self, role: str, t: Target) -> None:
        """One more operation of target `role`'s key was issued: at its occurrence, time it."""
        if self.counts[role] == t.occurrence and not self.done[role]:
            self.done[role] = True
            try:
                self._issued(role)
            except Exception as exc:  # noqa: BLE001 - the program must not see our failure
                self.error = f"{type(exc).__name__}: {exc}"
        self.counts[role] += 1

    def _issued(self, role: str) -> None:
        driver = self.driver
        if role == "first":
            if self.first_stream is not None:
                driver.event_record(self._event("first", self.first_stream), self.first_stream)
                self.first_issued_at = time.perf_counter()
        elif self.second_issued_at is None and "second" not in self.captured:  # a host-side second: its issue time
            if self._idle_stream is None:
                self._idle_stream = driver.stream_create()
            driver.event_record(self._event("second", self._idle_stream), self._idle_stream)
            self.second_issued_at = time.perf_counter()

    def result(self, races) -> dict:
        """What the parent needs, JSON-ready (the rerun's races by call sites included)."""
        out = {"first_issued": self.first_issued_at is not None, "second_issued": self.second_issued_at is not None,
               "delay_us": self.spec.delay_us, "error": self.error,
               "races": [_race_key(r) for r in races]}
        if self.spun_at is not None and self.first_issued_at is not None:
            out["first_issue_us"] = (self.first_issued_at - self.spun_at) * 1e6  # how long issuing it held the host
        if self.first_issued_at is not None and self.second_issued_at is not None:
            out["host_gap_us"] = (self.second_issued_at - self.first_issued_at) * 1e6
        if self.error is None and out["first_issued"] and out["second_issued"]:
            try:
                out["elapsed_us"] = self.driver.elapsed_us(self.events["second"], self.events["first"])
            except Exception as exc:  # noqa: BLE001
                out["error"] = f"{type(exc).__name__}: {exc}"
        return out


class DeviceProbe(Probe):
    """The probe of a device-API rerun on Device("cupy", confirm_probe=...): the device records
    each operation before the backend issues it, so operations are matched exactly (their key,
    site and occurrence), not by line."""

    def __init__(self, spec: ProbeSpec):
        from ..record.adapters.cuda_device import CudaDriver

        super().__init__(spec, CudaDriver())

    def before_op(self, op, stream_ptr: int, spin) -> None:
        """Right before the backend issues the recorded `op` on `stream_ptr` (never inside a
        capture: the backend asks first); `spin(us)` enqueues the bounded spin there."""
        role, t = self._match(op)
        if role is None or self.error is not None or self.done[role] or self.counts[role] != t.occurrence:
            return
        try:
            self._issuing(role, stream_ptr, spin)
        except Exception as exc:  # noqa: BLE001 - the program must not see our failure
            self.error = f"{type(exc).__name__}: {exc}"

    def after_op(self, op) -> None:
        """Right after the backend issued `op` (or, for a host-side operation, did it)."""
        role, t = self._match(op)
        if role is not None and self.error is None:
            self._count(role, t)


def probe_line(result: dict) -> str:
    """The rerun's own one-line account (stderr), for a user replaying it by hand."""
    if "elapsed_us" in result:
        e = result["elapsed_us"]
        how = f"started {e:.1f} µs before the first finished" if e > 0 else f"started {-e:.1f} µs after it finished"
        return f"streamcheck: probe: delay {result['delay_us']:g} µs before the first access; the second {how}"
    return f"streamcheck: probe: no timing (first issued: {result['first_issued']}, second issued: " \
           f"{result['second_issued']}{', error: ' + result['error'] if result.get('error') else ''})"


# --- in the parent -----------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    """The outcome of confirming one race on the GPU."""

    race: object  # core.hb.Race
    confirmed: bool
    text: str  # the line after "confirmed: " / "not confirmed: "
    elapsed_us: Optional[float] = None
    delay_us: Optional[float] = None
    replay: str = ""

    def format(self) -> str:
        head = "confirmed" if self.confirmed else "not confirmed"
        return f"{head}: {self.text}"

    def to_dict(self) -> dict:
        return {"kind": self.race.kind, "first": str(self.race.first.site), "second": str(self.race.second.site),
                "confirmed": self.confirmed, "text": self.text, "elapsed_us": self.elapsed_us,
                "delay_us": self.delay_us, "replay": self.replay}


def judge(race, spec: ProbeSpec, result: Optional[dict], replay: str, failure: str = "",
          eager_reruns: bool = True) -> tuple:
    """(Verdict, what to change for another rerun — {"delay_us": longer}, {"eager": True} (only
    with `eager_reruns`: a fresh process) or {"latest": True} (aim at the race's last occurrence)
    — or None) from one rerun's probe result."""
    first, second = spec.first.describe(), spec.second.describe()
    d = spec.delay_us

    def no(text, retry=None):
        return Verdict(race, False, text, result.get("elapsed_us") if result else None, d, replay), retry

    if result is None:
        return no(f"the rerun did not report back ({failure or 'it exited without a result'})")
    if result.get("error"):
        return no(f"the probe failed in the rerun ({result['error']})")
    if not result["first_issued"]:
        return no(f"the first access ({first}) was never issued in the rerun (the program is not deterministic "
                  "between runs); not claimed")
    if not result["second_issued"]:
        return no(f"the second access ({second}) was never issued in the rerun")
    if list(spec.race_key) not in [list(k) for k in result["races"]]:
        return no("the race's call sites differ in the rerun (the program is not deterministic between runs); "
                  "not claimed")
    elapsed = result["elapsed_us"]
    if elapsed > 0:
        return Verdict(race, True, f"`{spec.second.name}` ({spec.second.site}) started {elapsed:.1f} µs before "
                                   f"`{spec.first.name}` ({spec.first.site}) finished (delay {d:g} µs before "
                                   f"{first}, replay: {replay})", elapsed, d, replay), None
    held = result.get("first_issue_us", 0.0)
    if held >= 0.8 * d:
        # The call waited for the spin: an implicit synchronization inside it. Lazy kernel
        # loading is the usual one (a kernel's first launch loads its module, which waits for
        # the device); a rerun with eager loading takes it out of the program.
        why = (f"a host synchronize between them held the host: issuing {first} returned only after it ran "
               f"({held:.0f} µs, the delay was {d:g} µs), so {second} was issued after it finished")
        # The first occurrence is also where allocators grow (cudaMalloc, cudaHostAlloc): the
        # race's last occurrence may find its memory cached.
        if eager_reruns and not spec.eager:
            return no(why, retry={"eager": True})
        if not spec.latest:
            return no(why, retry={"latest": True})
        tried = "eager module loading nor the race's last occurrence" if spec.eager else "the race's last occurrence"
        return no(why + f" (neither {tried} removed it: an implicit synchronization inside the call, such as a "
                        "memory allocation or a module load)"
                  + ("" if eager_reruns else "; rerun the process with CUDA_MODULE_LOADING=EAGER to rule out lazy "
                                             "kernel loading"))
    needed = d - elapsed + result.get("host_gap_us", 0.0)  # what the delay lacked, plus the host's own time
    if d >= MAX_DELAY_US:
        return no(f"the inversion was not observed within the delay cap: with {d:g} µs (the cap) before {first}, "
                  f"{second} still started {-elapsed:.1f} µs after it finished; it would take about "
                  f"{needed:.0f} µs")
    return no(f"the inversion was not observed: with {d:g} µs before {first}, {second} started {-elapsed:.1f} µs "
              f"after it finished", retry={"delay_us": min(float(MAX_DELAY_US), max(2 * d, 2 * needed))})


EAGER = {"CUDA_MODULE_LOADING": "EAGER"}


def rerun_command(spec: ProbeSpec, script: str, script_args, seed: int, warm_up: bool) -> list:
    cmd = [sys.executable, "-m", "streamcheck", "run", "--confirm-probe", spec.to_json(), "--seed", str(seed)]
    if not warm_up:
        cmd.append("--no-warm-up")
    return cmd + [script, *script_args]


def _replay(cmd: list, spec: ProbeSpec) -> str:
    env = [f"{k}={v}" for k, v in EAGER.items()] if spec.eager else []
    return " ".join(shlex.quote(w) for w in [*env, "streamcheck", *cmd[3:]])


def _rerun(spec: ProbeSpec, script: str, script_args, seed: int, warm_up: bool) -> tuple:
    cmd = rerun_command(spec, script, script_args, seed, warm_up)
    fd, path = tempfile.mkstemp(prefix="streamcheck-probe-", suffix=".json")
    os.close(fd)
    env = dict(os.environ, STREAMCHECK_PROBE_RESULT=path, **(EAGER if spec.eager else {}))
    env.pop("STREAMCHECK_RUN", None)
    try:
        proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              errors="replace", timeout=RERUN_TIMEOUT_S)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if not text:
            tail = proc.stderr.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
            return cmd, None, tail[0]
        return cmd, json.loads(text), ""
    except subprocess.TimeoutExpired:
        return cmd, None, f"no result within {RERUN_TIMEOUT_S} s"
    finally:
        os.unlink(path)


def _confirm_each(checker, trace, races, rerun, max_races: int, over_cap: str, eager_reruns: bool) -> list:
    """The loop both entry points share: plan, rerun, judge, retry (eager loading only where
    `eager_reruns`: a fresh process), at most RERUNS_PER_RACE reruns per race."""
    verdicts = []
    for i, race in enumerate(races):
        if i >= max_races:
            verdicts.append(Verdict(race, False, f"not attempted (over {over_cap})"))
            continue
        planned = plan_probe(checker, trace, race)
        if isinstance(planned, str):
            verdicts.append(Verdict(race, False, planned))
            continue
        spec = ProbeSpec(planned[0], planned[1], FIRST_DELAY_US, tuple(_race_key(race)))
        for _ in range(RERUNS_PER_RACE):
            replay, result, failure = rerun(spec)
            verdict, retry = judge(race, spec, result, replay, failure, eager_reruns)
            if retry is None:
                break
            if retry.get("latest"):
                last = plan_probe(checker, trace, race, latest=True)
                if isinstance(last, str) or last == (spec.first, spec.second):  # seen once: nothing else to aim at
                    verdict, _ = judge(race, replace(spec, latest=True), result, replay, failure, eager_reruns)
                    break
                spec = replace(spec, first=last[0], second=last[1], latest=True)
            else:
                spec = replace(spec, **retry)
        verdicts.append(verdict)
    return verdicts


def confirm_races(checker, trace, races, script: str, script_args=(), *, seed: int = 0, warm_up: bool = True,
                  max_races: int = MAX_RACES, rerun=_rerun) -> list:
    """`streamcheck run --confirm`: one Verdict per race, up to `max_races` confirmed by reruns of
    the script in fresh processes (again with eager kernel loading if a call held the host, with
    longer delays if one was too short), the rest not attempted. `rerun(spec, script, args, seed,
    warm_up)` -> (command, result dict or None, failure text): a parameter so the logic is
    testable without a GPU."""
    def one(spec):
        cmd, result, failure = rerun(spec, script, list(script_args), seed, warm_up)
        return _replay(cmd, spec), result, failure

    return _confirm_each(checker, trace, races, one, max_races, f"--confirm-max {max_races}", eager_reruns=True)


def confirm_device_races(program, races=None, *, max_races: int = MAX_RACES, **device_options) -> list:
    """Device-API programs on the GPU: run `program` (a callable taking a Device) on
    Device("cupy", **device_options), then once more per reported race (`races`: a subset) with
    the race's first access delayed and timed as `streamcheck run --confirm` does; one Verdict
    per race. Reruns are in this process, so a call that holds the host is explained, not
    rerun with eager kernel loading (CUDA reads that setting once per process)."""
    from ..device import Device

    check_max_races("confirm_device_races", max_races)
    if "confirm_probe" in device_options:
        raise ValueError("confirm_device_races: confirm_probe is set per rerun; do not pass it")

    def run(**extra):
        device = Device("cupy", **device_options, **extra)
        program(device)
        device.synchronize()
        return device

    reference = run()
    races = list(reference.races if races is None else races)

    def rerun(spec):
        device = run(confirm_probe=spec)
        return f"Device('cupy', confirm_probe={spec.to_json()!r})", device.backend.probe.result(device.races), ""

    return _confirm_each(reference.checker, reference.trace, races, rerun, max_races, f"max_races={max_races}",
                         eager_reruns=False)


def write_result(result: dict) -> None:
    """The rerun's result, where the parent asked for it (STREAMCHECK_PROBE_RESULT)."""
    path = os.environ.get("STREAMCHECK_PROBE_RESULT")
    if path:
        from ..atomic_files import write_text

        write_text(path, json.dumps(result))  # a rerun killed while writing leaves no half a result


__all__ = ["MAX_RACES", "DeviceProbe", "Probe", "ProbeSpec", "Verdict", "confirm_device_races", "confirm_races",
           "judge", "plan_probe", "probe_line", "write_result"]
