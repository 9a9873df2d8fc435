"""Schedule policies: who runs next on the simulated device.

At every decision point the scheduler offers the policy the streams whose next
operation is ready (its stream predecessors and event/legacy dependencies have
executed) and, unless the host is blocked in a synchronize, the host itself.
Choosing the host ends the burst: the program issues its next call while the
remaining work stays pending, which is what a busy GPU looks like to the host.

Every decision is recorded; `Schedule.compact()` prints them so that
`replay:<string>` reproduces the exact interleaving, and a seed reproduces it too.
"""
from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field
from typing import Optional, Sequence

HOST = -1  # the decision "let the host go on"

POLICIES = ("sequential", "eager", "delay", "random", "pct", "replay")


class ScheduleError(ValueError):
    """Bad policy name or parameters, or a replay string that does not fit the program."""


class Policy:
    """Base: eager. Subclasses override `choose`."""

    name = "eager"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def describe(self) -> str:
        return self.name

    def hold(self, op, now: int) -> bool:
        """Whether a ready operation must still wait (injected delay)."""
        return False

    def choose(self, ready: Sequence[int], host_may_continue: bool) -> int:
        # An unloaded GPU: anything ready runs before the host issues more.
        return ready[0] if ready else HOST


class Sequential(Policy):
    """Every operation executes when issued (CUDA_LAUNCH_BLOCKING=1): the reference."""

    name = "sequential"


class Eager(Policy):
    name = "eager"


class Delay(Policy):
    """Hold operations on chosen streams (by name) or chosen launches (by kernel name)
    back for `steps` host calls after they were issued; everything else is eager."""

    name = "delay"

    def __init__(self, seed: int = 0, steps: int = 8, streams: Sequence[str] = (), kernels: Sequence[str] = ()):
        super().__init__(seed)
        if not isinstance(steps, int) or steps < 0:
            raise ScheduleError(f"delay: steps must be a non-negative integer, got {steps!r}")
        self.steps = steps
        self.streams = frozenset(streams)
        self.kernels = frozenset(kernels)

    def describe(self) -> str:
        parts = [f"steps={self.steps}"]
        if self.streams:
            parts.append("streams=" + "+".join(sorted(self.streams)))
        if self.kernels:
            parts.append("kernels=" + "+".join(sorted(self.kernels)))
        return f"delay({', '.join(parts)})"

    def hold(self, op, now: int) -> bool:
        if self.streams or self.kernels:
            targeted = op.stream_name in self.streams or op.name in self.kernels
        else:
            # No target named: the seed picks which streams run late.
            targeted = (zlib.crc32(op.stream_name.encode()) + self.seed) % 2 == 0
        return targeted and now < op.issued_at + self.steps


class Random(Policy):
    """A random ready stream (or the host) at each decision."""

    name = "random"

    def __init__(self, seed: int = 0):
        super().__init__(seed)
        self.rng = random.Random(seed)

    def describe(self) -> str:
        return f"random(seed={self.seed})"

    def choose(self, ready, host_may_continue):
        options = list(ready) + ([HOST] if host_may_continue else [])
        return self.rng.choice(options) if options else HOST


class PCT(Policy):
    """Probabilistic concurrency testing (Burckhardt et al. 2010): random distinct
    priorities for the participants (streams and the host), and depth-1 change
    points at random decisions where the running participant drops to the lowest
    priority. Finds any bug of depth d with probability >= 1/(n k^(d-1))."""

    name = "pct"

    def __init__(self, seed: int = 0, depth: int = 2, horizon: int = 200):
        super().__init__(seed)
        if not isinstance(depth, int) or depth < 1:
            raise ScheduleError(f"pct: depth must be an integer >= 1, got {depth!r}")
        if not isinstance(horizon, int) or horizon < 1:
            raise ScheduleError(f"pct: horizon must be an integer >= 1, got {horizon!r}")
        self.depth = depth
        self.horizon = horizon
        self.rng = random.Random(seed)
        self.priority: dict[int, float] = {}
        self.change_points = set(self.rng.sample(range(1, horizon + 1), min(depth - 1, horizon)))
        self.decisions = 0
        self.lowest = 0.0

    def describe(self) -> str:
        return f"pct(seed={self.seed}, depth={self.depth})"

    def _prio(self, who: int) -> float:
        if who not in self.priority:
            self.priority[who] = self.rng.random() + 1.0
        return self.priority[who]

    def choose(self, ready, host_may_continue):
        options = list(ready) + ([HOST] if host_may_continue else [])
        if not options:
            return HOST
        best = max(options, key=self._prio)
        self.decisions += 1
        if self.decisions in self.change_points:
            self.lowest -= 1.0
            self.priority[best] = self.lowest
            best = max(options, key=self._prio)
        return best


class Replay(Policy):
    """Follow a recorded decision string exactly."""

    name = "replay"

    def __init__(self, decisions: Sequence[int]):
        super().__init__(0)
        self.decisions = list(decisions)
        self.pos = 0

    def describe(self) -> str:
        return "replay"

    def choose(self, ready, host_may_continue):
        if self.pos >= len(self.decisions):
            # The recorded run ended here; drain the rest in a fixed order.
            return ready[0] if ready else HOST
        want = self.decisions[self.pos]
        self.pos += 1
        if want == HOST and not host_may_continue:
            raise ScheduleError(f"replay: decision {self.pos} lets the host go on, but the host is blocked "
                                "in a synchronize; the program changed since the schedule was recorded")
        if want != HOST and want not in ready:
            raise ScheduleError(f"replay: decision {self.pos} runs stream {want}, which is not ready; "
                                "the program changed since the schedule was recorded")
        return want


def make_policy(name: str, seed: int = 0, **params) -> Policy:
    """Build a policy by name: sequential, eager, delay, random, pct, or replay:<string>."""
    if not isinstance(name, str):
        raise ScheduleError(f"policy must be a string, got {name!r}")
    if name.startswith("replay:"):
        return Replay(parse_compact(name[len("replay:"):]))
    if name == "sequential":
        return Sequential(seed)
    if name == "eager":
        return Eager(seed)
    if name == "delay":
        return Delay(seed, **params)
    if name == "random":
        return Random(seed)
    if name == "pct":
        return PCT(seed, **params)
    raise ScheduleError(f"unknown schedule policy {name!r}; choose one of: sequential, eager, delay, random, pct, "
                        "replay:<schedule string>")


def compact(decisions: Sequence[int]) -> str:
    """Run-length encode decisions: stream ids as numbers, the host as `h`, e.g. `2x3.h.1`."""
    out = []
    i = 0
    while i < len(decisions):
        j = i
        while j < len(decisions) and decisions[j] == decisions[i]:
            j += 1
        token = "h" if decisions[i] == HOST else str(decisions[i])
        out.append(token if j - i == 1 else f"{token}x{j - i}")
        i = j
    return ".".join(out)


def parse_compact(text: str) -> list[int]:
    decisions: list[int] = []
    if not text:
        return decisions
    for token in text.split("."):
        who, _, times = token.partition("x")
        try:
            value = HOST if who == "h" else int(who)
            count = int(times) if times else 1
        except ValueError:
            raise ScheduleError(f"bad schedule string token {token!r} (expected e.g. `2x3`, `h`, `1`)") from None
        decisions.extend([value] * count)
    return decisions


@dataclass
class Schedule:
    """What a run did: the policy that chose it and every decision it made."""

    policy: str
    seed: int
    decisions: list = field(default_factory=list)

    def compact(self) -> str:
        return compact(self.decisions)

    def __str__(self) -> str:
        return f"{self.policy} seed={self.seed} schedule={self.compact() or '-'}"
