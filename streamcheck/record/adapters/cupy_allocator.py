"""CuPy's allocators: every device allocation through CuPy is recorded, so any pointer maps to
(buffer, byte offset), and a free is recorded when CuPy drops the last reference.

The program's own allocator stays the program's: the global one (`cupy.cuda.set_allocator`,
the default pool or a MemoryPool of its own) and a thread-local one (`cupy.cuda.using_allocator`)
are wrapped where CuPy stores them, and `get_allocator` hands back what the program set.
A free is ordered on the stream that allocated the bytes: CuPy's pool reuses them for later
allocations on that stream.
"""
from __future__ import annotations

from .. import recorder as R
from ..gpu import is_suppressed
from .patching import Patch, forwarding


class _Owner:
    """Owns a pooled allocation handed to CuPy as UnownedMemory: when CuPy drops the last
    reference, the allocation is freed - record it, then let the pool have the bytes back."""

    __slots__ = ("recorder", "alloc", "memptr", "__weakref__")

    def __init__(self, rec, alloc, memptr):
        self.recorder = rec
        self.alloc = alloc
        self.memptr = memptr

    def __del__(self):
        rec = self.recorder
        if rec is not None and rec is R.current:
            rec.free(self.alloc)


def unwrap(allocator):
    """The program's allocator behind a recording wrapper (itself if not wrapped)."""
    while getattr(allocator, "_streamcheck_recorder", None) is not None:
        allocator = allocator.__wrapped__
    return allocator


def wrap(rec, allocator):
    """A CuPy allocator that records each allocation and hands CuPy memory whose last
    reference records the free (UnownedMemory owned by an _Owner holding the real pointer)."""
    if allocator is None or getattr(allocator, "_streamcheck_recorder", None) is rec:
        return allocator
    allocator = unwrap(allocator)
    import cupy

    MemoryPointer, UnownedMemory = cupy.cuda.memory.MemoryPointer, cupy.cuda.memory.UnownedMemory
    pool = getattr(allocator, "__self__", None)
    total = getattr(pool, "total_bytes", None)

    def malloc(size):
        if R.current is not rec or is_suppressed():
            return allocator(size)
        before = total() if total is not None else 0
        try:
            memptr = allocator(size)
        except Exception as exc:  # the program's allocator: what it raises, the program gets unchanged
            rec.notice(f"the program's allocator raised {type(exc).__name__} for {size} bytes at {rec.site()}; "
                       "the program got the exception, nothing was recorded for that allocation")
            raise
        if size == 0 or not getattr(memptr, "ptr", 0):
            return memptr
        try:
            alloc = rec.alloc(memptr.ptr, size, what="cupy array")
            if total is not None and total() > before:
                rec.implicit(f"memory pool growth by {total() - before} bytes (cudaMalloc)")
            owner = _Owner(rec, alloc, memptr)
            return MemoryPointer(UnownedMemory(memptr.ptr, size, owner, getattr(memptr, "device_id", -1)), 0)
        except Exception as exc:  # recording must never break the program's allocation
            rec.errors.append(f"allocation of {size} bytes: {exc}")
            return memptr

    malloc._streamcheck_recorder = rec
    malloc.__wrapped__ = allocator
    return malloc


def _set_allocator(orig_set):
    import cupy

    orig_get = cupy.cuda.memory.get_allocator

    def set_allocator(allocator=None):
        orig_set(allocator)  # CuPy resolves None to its raw allocator
        rec = R.current
        if rec is not None:
            orig_set(wrap(rec, orig_get()))
    return forwarding(orig_set, set_allocator)


def _unwrapped(orig_get):
    """get_allocator / _get_thread_local_allocator: what the program set, not our wrapper."""
    def getter():
        return unwrap(orig_get())
    return forwarding(orig_get, getter)


def _set_thread_local(orig_set):
    def _set_thread_local_allocator(allocator):
        rec = R.current
        return orig_set(wrap(rec, allocator) if rec is not None else allocator)
    return forwarding(orig_set, _set_thread_local_allocator)


def install(rec, patcher) -> None:
    """Wrap the allocator in use now; on undo, leave the program's current one unwrapped."""
    import cupy

    memory = cupy.cuda.memory
    set_, get = memory.set_allocator, memory.get_allocator
    set_(wrap(rec, get()))
    patcher.on_undo(lambda: set_(unwrap(get())))


def patches() -> tuple:
    """The entry points this adapter intercepts."""
    return (
        Patch("cupy.cuda.memory.set_allocator", _set_allocator, also=("cupy.cuda.set_allocator",)),
        Patch("cupy.cuda.memory.get_allocator", _unwrapped, also=("cupy.cuda.get_allocator",)),
        Patch("cupy.cuda.memory._set_thread_local_allocator", _set_thread_local),
        Patch("cupy.cuda.memory._get_thread_local_allocator", _unwrapped),
    )
