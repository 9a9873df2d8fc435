"""torch.cuda's memory statistics on the sim: the caching allocator's counters under torch's names
(`memory_stats()`'s full key set), its out-of-memory message, and the `torch.cuda` / `torch.cuda.memory`
/ `torch.accelerator` functions that read and reset them.

The counters are those of torch's DeviceStats (c10/cuda/CUDACachingAllocator.h): for allocations,
segments, active blocks and their bytes, one Stat (current, peak, allocated, freed) per pool type
(all, small_pool, large_pool), plus event counts (retries, OOMs, cudaMalloc/cudaFree calls). The
emulated allocator keeps every one it knows (allocator.py); the ones it does not model stay 0:
`inactive_split*` (it does not split freed blocks the way torch does), `oversize_*` (no
max_split_size is set, as by default: `max_split_size` is -1, torch's "unlimited"),
`num_oom_rejections`. torch's own Python functions (`memory_stats`, `memory_allocated`,
`max_memory_reserved`, `memory_summary`, ...) run unchanged over the nested dict given here.
Imports no torch (the pytest plugin parses sizes with it at start-up).
"""
from __future__ import annotations

import os
from collections import OrderedDict

POOL_TYPES = ("all", "small_pool", "large_pool")
_STAT_ARRAYS = ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes", "allocation", "segment",
                "active", "inactive_split", "inactive_split_bytes")
_COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free",
             "num_oom_rejections")
UNLIMITED_SPLIT = -1  # torch reports max_split_size's default (SIZE_MAX) cast to int64


class Stat:
    """One statistic as torch keeps it: its current value, its peak since the last reset, and the
    totals it increased and decreased by since the last reset of the accumulated stats
    (DeviceStats.changed moves them)."""

    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self):
        self.current = self.peak = self.allocated = self.freed = 0

    def as_dict(self) -> dict:
        return {"current": self.current, "peak": self.peak, "allocated": self.allocated, "freed": self.freed}


class DeviceStats:
    """One device's counters. `arrays[name][k]` is the Stat of pool type POOL_TYPES[k]."""

    def __init__(self):
        self.arrays = {name: [Stat() for _ in POOL_TYPES] for name in _STAT_ARRAYS}
        self.oversize_allocations = Stat()
        self.oversize_segments = Stat()
        self.counters = dict.fromkeys(_COUNTERS, 0)

    def changed(self, small: bool, changes) -> None:
        """Statistics of the small or the large pool, and of all, by (name, amount) pairs: a positive
        amount increases, a negative one decreases (a block handed out or given back moves five)."""
        pool = 1 if small else 2
        arrays = self.arrays
        for name, amount in changes:
            stats = arrays[name]
            for stat in (stats[0], stats[pool]):
                stat.current += amount
                if amount >= 0:
                    stat.allocated += amount
                    if stat.current > stat.peak:
                        stat.peak = stat.current
                else:
                    stat.freed -= amount

    def current(self, name: str) -> int:
        return self.arrays[name][0].current

    def count(self, counter: str) -> None:
        self.counters[counter] += 1

    def _stats(self):
        for stats in self.arrays.values():
            yield from stats
        yield self.oversize_allocations
        yield self.oversize_segments

    def reset_peaks(self) -> None:
        for stat in self._stats():
            stat.peak = stat.current

    def reset_accumulated(self) -> None:
        for stat in self._stats():
            stat.allocated = stat.freed = 0
        for counter in self.counters:
            self.counters[counter] = 0

    def nested(self) -> dict:
        """torch.cuda.memory_stats_as_nested_dict's shape."""
        result = dict(self.counters)
        result["max_split_size"] = UNLIMITED_SPLIT
        for name, stats in self.arrays.items():
            result[name] = {pool: stat.as_dict() for pool, stat in zip(POOL_TYPES, stats)}
        result["oversize_allocations"] = self.oversize_allocations.as_dict()
        result["oversize_segments"] = self.oversize_segments.as_dict()
        return result


# --- sizes ------------------------------------------------------------------------------------

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000 ** 2, "mb": 1000 ** 2, "g": 1000 ** 3, "gb": 1000 ** 3,
          "t": 1000 ** 4, "tb": 1000 ** 4, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
CAPACITY_ENV = "STREAMCHECK_MEMORY_CAPACITY"
DEFAULT_CAPACITY = 8 << 30  # what a CPU runner can hold; GPU tests that size tensors by total_memory stay small


def parse_size(text) -> int:
    """Bytes from `8GiB`, `512MiB`, `80GB`, `1.5G`, `4096` (k/M/G/T are powers of 1000, KiB/MiB/GiB/TiB
    of 1024); ValueError naming what is accepted."""
    value = str(text).strip()
    number = value.rstrip("bBiIkKmMgGtT ")
    unit = value[len(number):].strip().lower()
    try:
        amount = float(number)
    except ValueError:
        amount = -1.0
    if unit not in _UNITS or not amount > 0 or amount == float("inf"):
        raise ValueError(f"{text!r} is not a memory size; give bytes (4096) or a size with a unit: 512MiB, 8GiB, "
                         "80GB")
    return int(amount * _UNITS[unit])


def capacity_from_environment() -> int:
    """STREAMCHECK_MEMORY_CAPACITY's size (for an emulation the process starts), else the default."""
    value = os.environ.get(CAPACITY_ENV)
    if not value:
        return DEFAULT_CAPACITY
    from .running import EmulationError

    try:
        return parse_size(value)
    except ValueError as exc:
        raise EmulationError(f"{CAPACITY_ENV}: {exc}") from None


def format_size(size: int) -> str:
    """Bytes as torch's allocator prints them in its messages (two decimals, binary units)."""
    if size <= 1024:
        return f"{size} bytes"
    if size <= 1 << 20:
        return f"{size / 1024:.2f} KiB"
    if size <= 1 << 30:
        return f"{size / (1 << 20):.2f} MiB"
    return f"{size / (1 << 30):.2f} GiB"


def out_of_memory_message(index: int, alloc_size: int, total: int, free: int, allowed, allocated: int,
                          reserved: int, in_private_pools: int) -> str:
    """torch's "CUDA out of memory." message (CUDACachingAllocator's malloc), for the emulated device."""
    allowed_info = f"{format_size(allowed)} allowed; " if allowed is not None else ""
    private = (f"with {format_size(in_private_pools)} allocated in private pools (e.g., CUDA Graphs), "
               if in_private_pools else "")
    return (f"CUDA out of memory. Tried to allocate {format_size(alloc_size)}. GPU {index} has a total capacity of "
            f"{format_size(total)} of which {format_size(free)} is free. Including non-PyTorch memory, this process "
            f"has {format_size(total - free)} memory in use. {allowed_info}Of the allocated memory "
            f"{format_size(allocated + in_private_pools)} is allocated by PyTorch, {private}and "
            f"{format_size(reserved - allocated - in_private_pools)} is reserved by PyTorch but unallocated. If "
            "reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
            "to avoid fragmentation.  See documentation for Memory Management  "
            "(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)")


# --- the functions the emulation puts in place -----------------------------------------------------

def memory_functions(emu) -> tuple:
    """(torch.cuda names, torch.accelerator names): the memory statistics functions of the emulated
    device, each to be put in place in its module (and in torch.cuda.memory / torch.accelerator.memory,
    where torch's own functions look them up). Each call reads the emulation's allocator of the moment:
    an emulation that lasts a pytest session gets a new one for each test (Emulation.reset)."""

    def index_of(device) -> int:
        emu.enter()
        return emu.current_device() if device is None else emu.device_index(device)

    def memory_stats_as_nested_dict(device=None) -> dict:
        return emu.allocator.stats(index_of(device)).nested()

    def reset_accumulated_memory_stats(device=None) -> None:
        emu.allocator.stats(index_of(device)).reset_accumulated()

    def reset_peak_memory_stats(device=None) -> None:
        emu.allocator.stats(index_of(device)).reset_peaks()

    def mem_get_info(device=None) -> tuple:
        index = index_of(device)
        return emu.allocator.free_memory(index), emu.allocator.capacity

    def empty_cache() -> None:
        emu.enter()
        emu.allocator.empty_cache()

    def set_per_process_memory_fraction(fraction, device=None) -> None:
        index = index_of(device)
        if not isinstance(fraction, float):
            raise TypeError("Invalid type for fraction argument, must be `float`")
        if fraction < 0 or fraction > 1:
            raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
        emu.allocator.fractions[index] = fraction

    def get_per_process_memory_fraction(device=None) -> float:
        return emu.allocator.fractions.get(index_of(device), 1.0)

    raw_blocks: dict = {}  # pointer -> block of caching_allocator_alloc, until caching_allocator_delete

    def caching_allocator_alloc(size, device=None, stream=None) -> int:
        index = index_of(device)
        on = stream if stream is not None else emu.current_stream(index)
        block = emu.allocator.allocate(int(size), on.device_stream)
        pointer = block.bytes.ctypes.data
        raw_blocks[pointer] = block
        return pointer

    def caching_allocator_delete(mem_ptr) -> None:
        emu.enter()
        block = raw_blocks.pop(mem_ptr, None)
        if block is None:
            raise RuntimeError("invalid device pointer: " + hex(mem_ptr))  # torch's allocator's check
        emu.allocator.release(block)

    def accelerator_memory_stats(device_index=None, /) -> OrderedDict:
        import torch.cuda.memory

        return torch.cuda.memory.memory_stats(device_index)  # torch's flattening of the nested dict

    cuda = {
        "memory_stats_as_nested_dict": memory_stats_as_nested_dict,
        "reset_accumulated_memory_stats": reset_accumulated_memory_stats,
        "reset_peak_memory_stats": reset_peak_memory_stats,
        "mem_get_info": mem_get_info, "empty_cache": empty_cache,
        "set_per_process_memory_fraction": set_per_process_memory_fraction,
        "get_per_process_memory_fraction": get_per_process_memory_fraction,
        "caching_allocator_alloc": caching_allocator_alloc, "caching_allocator_delete": caching_allocator_delete,
    }
    accelerator = {
        "memory_stats": accelerator_memory_stats, "empty_cache": empty_cache,
        "reset_accumulated_memory_stats": lambda device_index=None, /: reset_accumulated_memory_stats(device_index),
        "reset_peak_memory_stats": lambda device_index=None, /: reset_peak_memory_stats(device_index),
        "get_memory_info": lambda device_index=None, /: mem_get_info(device_index),
    }
    return cuda, accelerator
