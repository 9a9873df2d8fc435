"""Race-directed confirmation on the sim: make a reported race strike, and show the values.

A happens-before report says two accesses are unordered, not that the program went wrong.
`confirm(program, race)` reruns a device-API program (a callable taking a Device, as
run_schedules' programs are) twice from the start: sequentially (the reference), and under
`core.schedule.Confirm`, which holds the race's first access (at the occurrence that raced)
until its second access has started, everything else as the original policy. The sim runs
kernels on numpy arrays, so the values are read, not inferred:

- RAW: what the second (the reader) read of the raced bytes, against what it read in the
  sequential run;
- WAR: what the first (the reader, now run after the overwrite) read, against the sequential run;
- WAW: the raced bytes once both writes ran, against the sequential run;
- FREE: the use held past the free, while the allocation that got the bytes (`alloc(reuse=)`,
  the emulated caching allocator) writes them: a read shows what the new owner wrote (what the
  use read, against the sequential run), a write clobbers the new owner's bytes (the bytes at
  the end of the run). A strict FREE whose bytes nothing reused cannot change a value: reported
  as not confirmed, with that reason.

What it proves: the reported order can be inverted by a legal schedule and the inversion
changes a value. What it does not: that a GPU would pick that schedule (docs/confirm.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ..core.hb import Race
from ..core.schedule import HOST, Confirm, Sequential, Target, make_policy
from ..core.trace import Alloc, Free
from ..device import Device

MAX_RACES = 8  # distinct races confirmed per call (here and on the GPU); the rest are listed as not attempted


def check_max_races(who: str, max_races) -> int:
    if isinstance(max_races, bool) or not isinstance(max_races, int) or max_races < 0:
        raise ValueError(f"{who}: max_races must be an integer >= 0, got {max_races!r}")
    return max_races


@dataclass(frozen=True)
class Confirmation:
    """The outcome of confirming one race on the sim."""

    race: Race
    confirmed: bool
    why: str = ""  # why not, when not confirmed
    reader: str = ""  # who read the values shown ("" for WAW: the bytes after both writes)
    element: str = ""  # the first differing element, e.g. "x[3]"
    got: object = None  # its value in the directed rerun
    expected: object = None  # and in the sequential run
    held: str = ""  # "held <first> until <second> ran"
    replay: str = ""  # a Device(...) line that repeats the directed rerun decision by decision

    def to_dict(self) -> dict:
        """As the GPU's verdicts (confirm_gpu.Verdict.to_dict), for `streamcheck run --json`."""
        return {"kind": self.race.kind, "first": str(self.race.first.site), "second": str(self.race.second.site),
                "confirmed": self.confirmed, "text": self.format(), "replay": self.replay, "backend": "sim"}

    def format(self) -> str:
        tail = f" ({self.held}; replay: {self.replay})" if self.held else ""
        if not self.confirmed:
            return f"not confirmed on the sim: {self.why}{tail}"
        if self.reader:
            return (f"confirmed on the sim: {self.reader} read {self.element} = {self.got!r}, "
                    f"the sequential run read {self.expected!r}{tail}")
        return (f"confirmed on the sim: after both writes {self.element} = {self.got!r}, "
                f"the sequential run left {self.expected!r}{tail}")


class _Watch:
    """Reads the raced bytes at the moment that matters for the race's kind (see the module
    docstring); `observe` of the Confirm policy."""

    def __init__(self, kind: str, buffer_id: int, start: int, stop: int, first_writes: bool = False):
        self.kind, self.buffer_id, self.start, self.stop = kind, buffer_id, start, stop
        self.first_writes = first_writes  # FREE: the held use writes (read the bytes at the end)
        self._at_end = False
        self.lo = 0  # the first element read (the raced bytes widened to whole elements)
        self.device: Optional[Device] = None
        self.buffer = None  # kept alive from the first snapshot on: the program may drop it
        self.value: Optional[np.ndarray] = None
        self._roles: set = set()
        self._armed = False  # WAW: both writes started; read at the next operation or the end

    def _read(self) -> Optional[np.ndarray]:
        buf = self.buffer if self.buffer is not None else self.device.buffer(self.buffer_id)
        if buf is None or buf.storage is None:
            return None
        self.buffer = buf
        size = buf.storage.dtype.itemsize
        self.lo = self.start // size
        data = np.ascontiguousarray(buf.storage).reshape(-1)
        return data[self.lo:-(-self.stop // size)].copy()

    def __call__(self, op, role) -> None:
        if self._armed:
            self.value, self._armed = self._read(), False
        if role is None:
            return
        self._roles.add(role)
        if self.kind == "RAW" and role == "second" or self.kind == "WAR" and role == "first":
            self.value = self._read()
        elif self.kind == "FREE" and role == "first":
            # The freed bytes, as the held use finds them: a read sees them now; a write's effect
            # on the new owner shows at the end (the buffer is kept alive until then).
            self.value = self._read()
            self._at_end = self.first_writes
        elif self.kind == "WAW" and len(self._roles) == 2:
            self._armed = True

    def finish(self) -> None:
        if self._armed or self._at_end:
            self.value, self._armed = self._read(), False


def _raced_buffer(trace, race: Race, ops) -> Optional[int]:
    names = {op.buffer: op.name for op in trace.ops if type(op).__name__ == "Alloc"}
    for op in ops:
        ranges = [*getattr(op, "reads", ()), *getattr(op, "writes", ())]
        if type(op) is Free:
            return op.buffer
        for rng in ranges:
            if names.get(rng.buffer) == race.buffer and rng.start < race.stop and race.start < rng.stop:
                return rng.buffer
    return None


def new_owner_access(trace, free_index: int, buffer_id: int) -> Optional[int]:
    """The trace index of the first stream access to the bytes of freed buffer `buffer_id` by the
    allocation that got them after the free at `free_index`; None if none got and used them."""
    owners = set()
    for i in range(free_index + 1, len(trace.ops)):
        op = trace.ops[i]
        if type(op) is Alloc and any(r.buffer == buffer_id for r in op.reuses):
            owners.add(op.buffer)
        elif owners and hasattr(op, "stream") and any(r.buffer in owners for r in (*getattr(op, "reads", ()),
                                                                                  *getattr(op, "writes", ()))):
            return i
    return None


def _differ(got: np.ndarray, expected: np.ndarray) -> Optional[int]:
    """The first element whose bytes differ (NaN equals NaN: the bytes are what was read)."""
    a = got.view(np.uint8).reshape(len(got), -1)
    b = expected.view(np.uint8).reshape(len(expected), -1)
    rows = np.nonzero((a != b).any(axis=1))[0]
    return int(rows[0]) if len(rows) else None


def _run(program: Callable, device: Device) -> None:
    program(device)
    device.synchronize()  # whatever is still held or pending runs: the final contents


def confirm(program: Callable, race: Race, *, policy: str = "eager", seed: int = 0, reference: Optional[Device] = None,
            strict_free: bool = False, **params) -> Confirmation:
    """Rerun `program` (a callable taking a sim Device) to make `race` strike; see the module
    docstring. `policy`, `seed`, `params`: the original schedule, which the directed rerun
    follows except for the held access. `reference`: a sim Device that already ran the
    program (its checker saw the race), to save one run. `strict_free`: the devices' free rule
    (Device(strict_free=)), as the run that reported the race had it."""
    if not callable(program):
        raise TypeError(f"confirm: program must be a callable taking a Device, got {type(program).__name__}")
    if not isinstance(race, Race):
        raise TypeError(f"confirm: race must be a streamcheck Race (from device.races), got {type(race).__name__}")
    base = make_policy(policy, seed, **params)  # a bad policy fails here, before any run
    if reference is None:
        reference = Device("sim", policy="sequential", strict_free=strict_free)
        _run(program, reference)
    witness = reference.checker.witness(race) if reference.checker is not None else None
    if witness is None:
        return Confirmation(race, False, "the race is not reported when the program runs again (the program is "
                                         "not deterministic between runs: its race sites differ); not claimed")
    trace = reference.trace
    index = {id(op): i for i, op in enumerate(trace.ops)}
    if id(witness[0]) not in index or id(witness[1]) not in index:
        return Confirmation(race, False, "an access of the race is a captured graph node; confirmation of races "
                                         "inside CUDA graphs is not built on the sim")
    first, second = (Target.at(trace, index[id(op)]) for op in witness)
    if first.stream == HOST:
        return Confirmation(race, False, f"the first access is the host's own ({first.describe()}): it executes "
                                         "when issued, so no schedule can hold it")
    buffer_id = _raced_buffer(trace, race, witness)
    if race.kind == "FREE":
        owner = new_owner_access(trace, index[id(witness[1])], buffer_id)
        if owner is None:
            return Confirmation(race, False, "no allocation got the freed bytes and used them in this run (a strict "
                                             "free: --strict-free), so no value can differ; a GPU allocator may hand "
                                             "them out")
        second = Target.at(trace, owner)  # held until the new owner's first use: the bytes it clobbers or sees

    def run(hold: bool, base_policy):
        watch = _Watch(race.kind, buffer_id, race.start, race.stop, race.first.write)
        device = Device("sim", policy=Confirm(first, second, base_policy, hold=hold, observe=watch),
                        strict_free=reference.strict_free)
        watch.device = device
        _run(program, device)
        watch.finish()
        return device, watch

    held = f"held {first.describe()} until {second.describe()} ran"
    _, expected = run(False, Sequential())
    try:
        device, got = run(True, base)
    except Exception as exc:
        return Confirmation(race, False, f"the directed rerun raised {type(exc).__name__}: {exc}")
    directed = device.backend.policy
    replay = f"Device(\"sim\", policy={device.schedule.replay_policy()!r})"
    if directed.second_started is None:
        return Confirmation(race, False, f"the second access was never issued in the rerun ({second.describe()})",
                            held=held, replay=replay)
    if race.key not in {r.key for r in device.races}:
        return Confirmation(race, False, "the race's call sites differ in the directed rerun (the program is not "
                                         "deterministic between runs); not claimed", held=held, replay=replay)
    if not directed.second_before_first:
        return Confirmation(race, False, f"a host synchronize between them held the host: it waited for "
                                         f"{first.describe()}, which therefore ran before {second.describe()} was "
                                         "issued", held=held, replay=replay)
    if got.value is None or expected.value is None:
        return Confirmation(race, False, "the raced buffer was gone before its bytes could be read",
                            held=held, replay=replay)
    k = _differ(got.value, expected.value)
    reader = {"RAW": second.describe(), "WAR": first.describe()}.get(race.kind, "")
    if race.kind == "FREE" and not race.first.write:
        reader = first.describe()
    if k is None:
        what = f"{reader} read" if reader else "both writes left"
        return Confirmation(race, False, f"the inversion was forced, but {what} the same values as in the sequential "
                                         "run (the raced bytes held equal values either way)", held=held, replay=replay)
    buf = got.buffer
    flat = got.lo + k
    at = np.unravel_index(flat, buf.shape) if buf.shape else ()
    element = f"{race.buffer}[{', '.join(str(int(i)) for i in at)}]"
    return Confirmation(race, True, reader=reader, element=element, got=got.value[k].item(),
                        expected=expected.value[k].item(), held=held, replay=replay)


def confirm_races(program: Callable, races=None, *, max_races: int = MAX_RACES, policy: str = "eager",
                  seed: int = 0, strict_free: bool = False, **params) -> tuple:
    """Confirm each distinct race of `program` (all the sequential run reports when `races` is
    None), up to `max_races`; the rest come back not attempted."""
    check_max_races("confirm_races", max_races)
    reference = Device("sim", policy="sequential", strict_free=strict_free)
    _run(program, reference)
    races = list(reference.races if races is None else races)
    out = []
    for i, race in enumerate(races):
        if i >= max_races:
            out.append(Confirmation(race, False, f"not attempted (over the cap of {max_races} races per test)"))
        else:
            out.append(confirm(program, race, policy=policy, seed=seed, reference=reference, **params))
    return tuple(out)
