"""Schedule policies: who runs next on the simulated device.

At every decision point the scheduler offers the policy the streams whose next
operation is ready (its stream predecessors and event/legacy dependencies have
executed) and, unless the host is blocked in a synchronize, the host itself.
Choosing the host ends the burst: the program issues its next call while the
remaining work stays pending, which is what a busy GPU looks like to the host.

Every decision is recorded, forced ones included, so that `replay:<string>`
(from `Schedule.compact()`) reproduces the exact interleaving; the same policy,
seed and parameters reproduce it too. Policies are plain Python: no cupy, no torch.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Optional, Sequence

from .trace import stream_label

HOST = -1  # the decision "let the host go on"

POLICIES = ("sequential", "eager", "delay", "random", "pct", "replay")  # by name; `Confirm` is built, not named

_TOKEN = re.compile(r"(h|[0-9]+)(?:x([0-9]+))?")


class ScheduleError(ValueError):
    """Bad policy name or parameters, or a replay string that does not fit the program."""


def _check_int(policy: str, what: str, value, minimum: int) -> int:
    # bool is an int subclass; `steps=True` is a typo, not a count.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ScheduleError(f"{policy}: {what} must be an integer >= {minimum}, got {value!r}")
    return value


def check_strike_pattern(after, every) -> tuple:
    """Validate a delay's `after`/`every` (shared by the sim and the cupy backend)."""
    return _check_int("delay", "after", after, 0), _check_int("delay", "every", every, 1)


def strikes(k: int, after: int, every: int) -> bool:
    """Whether the k-th targeted operation (from 0) is delayed: the after-th and every every-th after it."""
    return k >= after and (k - after) % every == 0


def seed_delays(seed: int, stream_name: str) -> bool:
    """The one delay-choice rule, for the sim and the GPU alike: with no target named, whether
    `seed` delays the stream called `stream_name`. An independent fair coin per (seed, stream),
    stable across runs and machines (str seeds hash with SHA-512, not PYTHONHASHSEED; CRC
    parities would be correlated between similar names and repeat every two seeds)."""
    return random.Random(f"delay:{seed}:{stream_name}").random() < 0.5


GRAPH_LAUNCH_NAME = "cudaGraphLaunch"  # what `kernels=` names to delay graph launches


def graph_delay_name(node_names, kernels) -> str:
    """The name a graph launch is matched against `kernels=` with: the first captured kernel
    named there (so naming a kernel also delays the graphs that contain it), else
    GRAPH_LAUNCH_NAME."""
    for name in node_names:
        if name in kernels:
            return name
    return GRAPH_LAUNCH_NAME


def directed_delay(race) -> Optional[tuple]:
    """The race-directed delay for a reported race (a core.hb.Race): (stream name, kernel name
    or None) of its first access, which a delay there makes run after the second; None where the
    first access is the host's (nothing to delay). Stream names as delay targets take them:
    `A` for "stream A", `legacy` for the legacy default stream. Copies are delayed by stream."""
    actor = race.first.actor
    if actor.startswith("stream "):
        stream = actor[len("stream "):].split(" (")[0]  # `streamcheck run` adds "(created at f.py:3)"
    elif actor == "legacy default stream":
        stream = "legacy"
    elif actor.startswith("per-thread default stream of thread "):
        stream = "ptds" + actor.rsplit(" ", 1)[1]  # `streamcheck run`'s name for it
    else:  # a host thread
        return None
    name = race.first.name
    return stream, (None if name.startswith("copy ") or name == "free" else name)


def describe_delay(amount: str, streams, kernels, after: int, every: int) -> str:
    """`delay(steps=8, streams=A, kernels=matmul, after=4, every=97)`, the same on both backends."""
    parts = [amount]
    if streams:
        parts.append("streams=" + "+".join(sorted(streams)))
    if kernels:
        parts.append("kernels=" + "+".join(sorted(kernels)))
    if after or every != 1:
        parts.append(f"after={after}, every={every}")
    return f"delay({', '.join(parts)})"


def _check_names(policy: str, what: str, value) -> frozenset:
    names = (value,) if isinstance(value, str) else value
    try:
        names = tuple(names)
    except TypeError:
        raise ScheduleError(f"{policy}: {what} must be a name or a list of names, got {value!r}") from None
    for name in names:
        if not isinstance(name, str) or not name:
            raise ScheduleError(f"{policy}: {what} must be non-empty strings, got {name!r}")
    return frozenset(names)


class Policy:
    """Base: eager. Subclasses override `choose`, and `hold` to inject delays (a policy
    whose delays end at a fixed step can also define `release_at(op, now)`, which the
    sim asks once per operation instead of asking `hold` at every decision).

    `choose(ready, host_may_continue)` gets the ids of streams whose next operation
    may execute now, in stream creation order, and returns one of them or HOST
    (only when `host_may_continue`). The scheduler asks at every decision except when
    nothing is ready and the host may go on (HOST is then recorded without asking;
    only Replay is asked there, to consume the recorded `h`)."""

    name = "eager"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def describe(self) -> str:
        return self.name

    def params(self) -> dict:
        """The keyword arguments that rebuild this policy with make_policy(name, seed, **params)."""
        return {}

    def hold(self, op, now: int) -> bool:
        """Whether a ready operation must still wait (injected delay)."""
        return False

    def choose(self, ready: Sequence[int], host_may_continue: bool) -> int:
        # An unloaded GPU: anything ready runs before the host issues more.
        return ready[0] if ready else HOST

    def starting(self, op) -> None:
        """Optional: called just before an operation executes, for a policy whose holds end
        when some operation has run (Confirm). `op` has `stream` (HOST for the host's own
        accesses and frees, which execute when issued), `stream_name`, `name`, `kind`, `site`
        and `trace_index`. The sim executes one operation at a time, so whatever is chosen
        after this call runs after `op`. The sim calls it only if a policy overrides it."""


class Sequential(Policy):
    """Every operation executes when issued (CUDA_LAUNCH_BLOCKING=1): the reference.

    On the sim this orders work exactly as `eager` does (nothing is ever left
    pending, so every operation is ready the moment it is issued); on a GPU backend
    it means synchronizing after every operation."""

    name = "sequential"


class Eager(Policy):
    """Every operation executes as soon as it is ready: an unloaded GPU. Missing
    joins (the implicit-join bug) hide here, because the producer always finished."""

    name = "eager"


class Delay(Policy):
    """Hold operations on chosen streams (by name) or chosen launches (by kernel
    name) back until `steps` more host calls have been issued after them; everything
    else is eager. Streams and kernels together mean those launches on those streams.
    With no target named, the seed picks the streams (each stream, the legacy one
    included, is held with probability 1/2, decided from seed and stream name).
    `after` and `every` pick which targeted operations strike: the after-th (from 0,
    counted as they reach the head of their stream) and every `every`-th one after
    it; by default all. A host synchronize still completes: the work it waits for
    runs regardless of the delay."""

    name = "delay"

    def __init__(self, seed: int = 0, steps: int = 8, streams: Sequence[str] = (), kernels: Sequence[str] = (),
                 after: int = 0, every: int = 1):
        super().__init__(seed)
        self.steps = _check_int("delay", "steps", steps, 0)
        self.streams = _check_names("delay", "streams", streams)
        self.kernels = _check_names("delay", "kernels", kernels)
        self.after, self.every = check_strike_pattern(after, every)
        self._occurrence: dict[int, int] = {}  # trace index -> how many targeted ops came before
        self._targeted: dict[str, bool] = {}  # stream name -> held (cache of the seeded choice)
        self.matched: set = set()  # target names that held something: the rest are probably typos

    def describe(self) -> str:
        return describe_delay(f"steps={self.steps}", self.streams, self.kernels, self.after, self.every)

    def params(self) -> dict:
        params: dict = {"steps": self.steps}
        if self.streams:
            params["streams"] = sorted(self.streams)
        if self.kernels:
            params["kernels"] = sorted(self.kernels)
        if self.after or self.every != 1:
            params.update(after=self.after, every=self.every)
        return params

    def unmatched(self) -> list:
        """Named targets that never held an operation (a misspelt stream or kernel name)."""
        return sorted((self.streams | self.kernels) - self.matched)

    def _stream_targeted(self, stream_name: str) -> bool:
        held = self._targeted.get(stream_name)
        if held is None:
            if self.streams or self.kernels:
                held = stream_name in self.streams
            else:
                held = seed_delays(self.seed, stream_name)
            self._targeted[stream_name] = held
        return held

    def _targeted_op(self, op) -> bool:
        on_stream = self._stream_targeted(op.stream_name)
        if self.kernels:
            named = op.kind == "launch" and op.name in self.kernels
            return named and (on_stream or not self.streams)
        return on_stream

    def release_at(self, op, now: int) -> Optional[int]:
        """The host step from which a ready `op` may execute, or None if it is not held.
        The sim asks once per operation, when it first reaches the head of its stream
        ready to run, instead of asking `hold` again at every decision."""
        if now - op.issued_at >= self.steps or not self._targeted_op(op):
            return None
        k = self._occurrence.setdefault(op.trace_index, len(self._occurrence))
        if not strikes(k, self.after, self.every):
            return None
        if op.stream_name in self.streams:
            self.matched.add(op.stream_name)
        if op.name in self.kernels:
            self.matched.add(op.name)
        return op.issued_at + self.steps

    def hold(self, op, now: int) -> bool:
        release = self.release_at(op, now)
        return release is not None and now < release


class Random(Policy):
    """A random ready stream, or the host going on, at each decision."""

    name = "random"

    def __init__(self, seed: int = 0):
        super().__init__(seed)
        self.rng = random.Random(seed)

    def describe(self) -> str:
        return f"random(seed={self.seed})"

    def choose(self, ready, host_may_continue):
        n = len(ready)
        if not n:
            return HOST
        # int(random() * k) rather than randrange(k): a third of the cost, same determinism.
        if host_may_continue:
            pick = int(self.rng.random() * (n + 1))
            return HOST if pick == n else ready[pick]
        return ready[int(self.rng.random() * n)] if n > 1 else ready[0]


class PCT(Policy):
    """Probabilistic concurrency testing (Burckhardt et al. 2010): random distinct
    priorities for the participants (streams and the host), and depth-1 change
    points at random decisions among the first `horizon`, where the running
    participant drops to the lowest priority. Finds any bug of depth d with
    probability >= 1/(n k^(d-1)) for n participants and k decisions."""

    name = "pct"

    def __init__(self, seed: int = 0, depth: int = 2, horizon: int = 200):
        super().__init__(seed)
        self.depth = _check_int("pct", "depth", depth, 1)
        self.horizon = _check_int("pct", "horizon", horizon, 1)
        self.rng = random.Random(seed)
        self.priority: dict[int, float] = {}
        self.change_points = set(self.rng.sample(range(1, horizon + 1), min(depth - 1, horizon)))
        self.decisions = 0
        self.lowest = 0.0

    def describe(self) -> str:
        return f"pct(seed={self.seed}, depth={self.depth})"

    def params(self) -> dict:
        return {"depth": self.depth, "horizon": self.horizon}

    def _prio(self, who: int) -> float:
        prio = self.priority.get(who)
        if prio is None:
            prio = self.priority[who] = self.rng.random() + 1.0
        return prio

    def choose(self, ready, host_may_continue):
        options = list(ready)
        if host_may_continue:
            options.append(HOST)
        if len(options) == 1:
            return options[0]  # forced: not a decision PCT counts
        best = max(options, key=self._prio)
        self.decisions += 1
        if self.decisions in self.change_points:
            self.lowest -= 1.0
            self.priority[best] = self.lowest
            best = max(options, key=self._prio)
        return best


@dataclass(frozen=True)
class Target:
    """One access of a reported race as the scheduler sees it: the operation named `name`
    issued at `site` on stream id `stream` (HOST: the host), the `occurrence`-th such one
    (from 0) in stream order. `label` is how reports name the stream ("stream A")."""

    stream: int
    label: str
    name: str
    site: object  # a CallSite
    occurrence: int = 0

    @property
    def key(self) -> tuple:
        return (self.stream, self.name, self.site)

    def describe(self) -> str:
        nth = f" (occurrence {self.occurrence + 1})" if self.occurrence else ""
        return f"`{self.name}` on {self.label} at {self.site}{nth}"

    @staticmethod
    def key_of(op) -> tuple:
        """(stream, name) by which an operation is targeted: host accesses and host frees by
        HOST, graph launches by the name "GraphLaunch"."""
        kind = type(op).__name__
        if kind == "HostAccess":
            return HOST, op.name
        if kind == "Free":
            return (HOST if op.stream is None else op.stream), "free"
        return getattr(op, "stream", HOST), getattr(op, "name", kind)

    @classmethod
    def at(cls, trace, index: int) -> "Target":
        """The Target of the trace operation at `index`: its stream, name and site, and how many
        operations of that stream, name and site came before it (what a rerun counts)."""
        op = trace.ops[index]
        stream, name = cls.key_of(op)
        occurrence = sum(1 for other in trace.ops[:index]
                         if other.site == op.site and cls.key_of(other) == (stream, name))
        if stream == HOST:
            label = f"host thread {op.thread}"
        else:
            label = next((stream_label(o.kind, o.name, o.stream, o.thread) for o in trace.ops
                          if type(o).__name__ == "StreamCreate" and o.stream == stream), f"stream{stream}")
        return cls(stream, label, name, op.site, occurrence)


class Confirm(Policy):
    """Race-directed scheduling (RaceFuzzer, Sen 2008) for the sim: hold the race's `first`
    access until its `second` has started, everything else as `base` (eager by default).

    Bounded without a timer: a host synchronize that waits for the first releases it (the
    sim never holds what the host waits for), so the program cannot deadlock; if the second
    is never issued, the first stays pending until such a synchronize (the program's own,
    or the one after it). Afterwards `second_before_first` says whether the inversion
    happened. `hold=False` only watches (the sequential reference run: where the accesses
    executed, for the values). `observe(op, role)` is called before every operation
    executes, role "first", "second" or None, so a caller can read the memory involved."""

    name = "confirm"

    def __init__(self, first: Target, second: Target, base: Optional[Policy] = None, hold: bool = True,
                 observe=None):
        base = base if base is not None else Eager()
        super().__init__(base.seed)
        self.base = base
        self.first, self.second = first, second
        self.holding = hold
        self.observe = observe
        self._seen: dict = {}  # (stream, name, site) -> how many such operations started
        self._started = 0
        self.first_started: Optional[int] = None  # how many operations started before it
        self.second_started: Optional[int] = None
        self.first_held = False  # the first reached the head of its stream and was held
        self._second_at = None  # the host clock while a host second access is being made

    def describe(self) -> str:
        verb = "hold" if self.holding else "watch"
        return f"confirm({verb} {self.first.describe()} until {self.second.describe()}; {self.base.describe()})"

    def params(self) -> dict:
        return {}

    @property
    def second_before_first(self) -> bool:
        return self.second_started is not None and (self.first_started is None
                                                    or self.second_started < self.first_started)

    def _is(self, target: Target, op) -> bool:
        return (op.stream == target.stream and op.name == target.name and op.site == target.site
                and self._seen.get(target.key, 0) == target.occurrence)

    def hold(self, op, now: int) -> bool:
        # Asked for operations at the head of their stream: every earlier one on it has started,
        # so `_seen` counts exactly the occurrences before this one.
        if self.holding and self._is(self.first, op) and (self.second_started is None or self._host_busy(now)):
            self.first_held = True
            return True
        return self.base.hold(op, now)

    def _host_busy(self, now: int) -> bool:
        """The second access is the host's own and it is still making it: the host's read or write
        of the bytes happens after the call that recorded it returns, so the device side is held
        until the host's next call (a later host clock)."""
        if self.second.stream != HOST:
            return False
        if self._second_at is None:
            self._second_at = now
        return now == self._second_at

    def choose(self, ready, host_may_continue):
        return self.base.choose(ready, host_may_continue)

    def starting(self, op) -> None:
        role = None
        if self.second_started is None and self._is(self.second, op):
            self.second_started, role = self._started, "second"
        elif self.first_started is None and self._is(self.first, op):
            self.first_started, role = self._started, "first"
        key = (op.stream, op.name, op.site)
        self._seen[key] = self._seen.get(key, 0) + 1
        self._started += 1
        if self.observe is not None:
            self.observe(op, role)


class Replay(Policy):
    """Follow a recorded decision string exactly; raise ScheduleError where it does not fit."""

    name = "replay"

    def __init__(self, decisions: Sequence[int], text: str = ""):
        super().__init__(0)
        self.decisions = list(decisions)
        self.text = text
        self.pos = 0

    def describe(self) -> str:
        return "replay"

    @property
    def remaining(self) -> int:
        """Decisions not used yet; non-zero after the program ended means it changed (or ended early)."""
        return len(self.decisions) - self.pos

    def choose(self, ready, host_may_continue):
        if self.pos >= len(self.decisions):
            raise ScheduleError(
                f"replay: the schedule string has {len(self.decisions)} decisions and the program needs more; "
                "it does not fit this program (the program changed since it was recorded, or the string "
                "was cut off). Record it again with the original policy and seed.")
        want = self.decisions[self.pos]
        self.pos += 1
        if want == HOST:
            if not host_may_continue:
                raise ScheduleError(
                    f"replay: decision {self.pos} lets the host go on, but the host is blocked in a synchronize "
                    "there; the schedule does not fit this program (it changed since it was recorded)")
        elif want not in ready:
            have = ", ".join(map(str, ready)) or "none"
            raise ScheduleError(
                f"replay: decision {self.pos} runs stream {want}, which has no ready operation there "
                f"(ready: {have}); the schedule does not fit this program (it changed since it was recorded)")
        return want


_PARAMS = {
    "sequential": (),
    "eager": (),
    "delay": ("steps", "streams", "kernels", "after", "every"),
    "random": (),
    "pct": ("depth", "horizon"),
}


def make_policy(name: str, seed: int = 0, **params) -> Policy:
    """Build a policy by name: sequential, eager, delay, random, pct, or replay:<string>.

    Parameters that are None take their defaults; a parameter the policy does not
    take raises ScheduleError (a silently ignored `steps=` would make a test pass
    without the delay it asked for)."""
    if not isinstance(name, str):
        raise ScheduleError(f"policy must be a string, got {name!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ScheduleError(f"policy {name!r}: seed must be an integer, got {seed!r}")
    params = {k: v for k, v in params.items() if v is not None}
    if name.startswith("replay:"):
        if params:
            raise ScheduleError(f"replay takes no parameters (got {', '.join(sorted(params))}); "
                                "the schedule string fixes every decision")
        text = name[len("replay:"):]
        return Replay(parse_compact(text), text)
    if name == "replay":
        raise ScheduleError("policy 'replay' needs the schedule string: policy='replay:<string>', "
                            "where <string> is what Schedule.compact() printed")
    allowed = _PARAMS.get(name)
    if allowed is None:
        raise ScheduleError(f"unknown schedule policy {name!r}; choose one of: sequential, eager, delay, random, "
                            "pct, replay:<schedule string>")
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        takes = ", ".join(allowed) if allowed else "no parameters"
        raise ScheduleError(f"policy {name!r} does not take {', '.join(unknown)}; it takes: {takes}")
    if name == "sequential":
        return Sequential(seed)
    if name == "eager":
        return Eager(seed)
    if name == "delay":
        return Delay(seed, **params)
    if name == "random":
        return Random(seed)
    return PCT(seed, **params)


def compact(decisions: Sequence[int]) -> str:
    """Run-length encode decisions: stream ids as numbers, the host as `h`, e.g. `2x3.h.1`."""
    out = []
    i = 0
    n = len(decisions)
    while i < n:
        who = decisions[i]
        j = i + 1
        while j < n and decisions[j] == who:
            j += 1
        token = "h" if who == HOST else str(who)
        out.append(token if j - i == 1 else f"{token}x{j - i}")
        i = j
    return ".".join(out)


def parse_compact(text: str) -> list[int]:
    """The inverse of compact(). Also accepts a whole printed Schedule (`... schedule=<string>`)."""
    if not isinstance(text, str):
        raise ScheduleError(f"schedule string must be a string, got {text!r}")
    text = text.strip()
    _, marker, rest = text.partition("schedule=")
    if marker:
        text = rest.split()[0] if rest.split() else ""
    if text in ("", "-"):
        return []
    decisions: list[int] = []
    for token in text.split("."):
        match = _TOKEN.fullmatch(token)
        if match is None or (match.group(2) is not None and int(match.group(2)) < 1):
            raise ScheduleError(f"bad schedule string token {token!r} in {text[:60]!r}: expected a stream id "
                                "or `h` (the host), optionally repeated, e.g. `2x3`, `h`, `1`")
        who, times = match.groups()
        decisions.extend([HOST if who == "h" else int(who)] * (int(times) if times else 1))
    return decisions


@dataclass
class Schedule:
    """What a run did: the policy that chose it and every decision it made."""

    policy: str  # the policy's description, e.g. "delay(steps=8, streams=A)"
    seed: int
    decisions: list = field(default_factory=list)
    name: str = ""  # the policy's name for make_policy
    params: dict = field(default_factory=dict)  # its parameters for make_policy

    def compact(self) -> str:
        return compact(self.decisions)

    def replay_policy(self) -> str:
        """`replay:<string>`: the policy that repeats this exact interleaving."""
        return "replay:" + self.compact()

    def replay_args(self) -> dict:
        """Keyword arguments for Device(...) that repeat this run decision by decision."""
        return {"policy": self.replay_policy()}

    def seed_args(self) -> Optional[dict]:
        """Keyword arguments for Device(...) that rebuild the policy from its seed (None for a replay)."""
        if not self.name or self.name in ("replay", Confirm.name):  # Confirm is built, not named
            return None
        return {"policy": self.name, "seed": self.seed, **self.params}

    def replay_hint(self) -> str:
        """A paste-able line that reproduces this run."""
        replay = f'Device("sim", policy={self.replay_policy()!r})'
        args = self.seed_args()
        if args is None:
            return replay
        kwargs = ", ".join(f"{k}={v!r}" for k, v in args.items())
        return f'Device("sim", {kwargs})  # or, decision by decision: {replay}'

    def __str__(self) -> str:
        return f"{self.policy} seed={self.seed} schedule={self.compact() or '-'}"
