"""torch's CUDA generators on the sim: values depend on issue order only, never on the schedule."""
from __future__ import annotations

import collections
import functools

import torch

from .running import active

CUDA_DEFAULT_SEED = 67280421310721  # torch's default seed of a CUDA generator


_REAL_GENERATOR = torch.Generator


class EmulatedGenerator(_REAL_GENERATOR):
    """torch.Generator(device="cuda") on the sim: a CPU generator (so torch's argument parser takes
    it) that says it is on cuda:N. Each random operator issued with it gets a generator forked
    from its state when the operator is *issued*, and the state moves on one draw: values depend
    on issue order only, never on the schedule, as CUDA's Philox offsets are taken at launch."""

    def __new__(cls, device_index: int = 0, seed: int = CUDA_DEFAULT_SEED):
        return super().__new__(cls)  # a CPU generator underneath

    def __init__(self, device_index: int = 0, seed: int = CUDA_DEFAULT_SEED):
        super().__init__()
        self._index = device_index
        self.manual_seed(seed)

    @property
    def device(self):
        return torch.device("cuda", self._index)

    def graphsafe_get_state(self):
        return self.get_state()

    def next_cpu_generator(self):
        """The generator one random operator runs with, taken now."""
        child = _REAL_GENERATOR()
        child.set_state(self.get_state())
        torch.randint(1 << 62, (1,), generator=self)  # the next operator gets the next state
        return child


class CapturedDraw:
    """A random operator captured into a CUDA graph: the generator it draws from, and the generator
    each replay took for it. A replay draws at *replay* time, in capture order, as CUDA graphs read
    the generator's seed and offset when they are replayed (each replay gives new numbers; a
    manual_seed before replays makes them repeat). Replays of one graph that write the same output
    are ordered (or their race is reported), so its kernel runs once per replay in launch order."""

    __slots__ = ("generator", "replays")

    def __init__(self, generator: EmulatedGenerator):
        self.generator = generator
        self.replays = collections.deque()

    def draw_for_replay(self) -> None:
        self.replays.append(self.generator.next_cpu_generator())

    def take(self):
        """The generator of the replay whose kernel runs now."""
        return self.replays.popleft()


class _GeneratorType(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, _REAL_GENERATOR)

    def __subclasscheck__(cls, sub):
        return issubclass(sub, _REAL_GENERATOR)


class Generator(metaclass=_GeneratorType):
    """torch.Generator while emulating: `device="cuda"` makes an EmulatedGenerator."""

    def __new__(cls, device="cpu"):
        device = torch.device(device)
        if device.type == "cuda":
            emulation = active()
            return EmulatedGenerator(emulation.device_index(device))
        return _REAL_GENERATOR(device)



@functools.lru_cache(maxsize=None)
def is_seeded(func) -> bool:
    """A random operator: it draws from a generator (torch tags them)."""
    return torch.Tag.nondeterministic_seeded in func.tags


@functools.lru_cache(maxsize=None)
def takes_generator(func) -> bool:
    schema = getattr(func, "_schema", None)
    return schema is not None and any(a.name == "generator" for a in schema.arguments)


