"""Copies between host and device, factories and pinned memory on the sim: what crosses the PCIe bus
and when the host waits for it (CUDA's rules: from pageable memory synchronous, from or to
pinned memory with non_blocking pending on the stream).
"""
from __future__ import annotations

import warnings

import torch

from .autograd import HostToDevice
from .operators import Kernel
from .tensors import PinnedTensor, byte_region, contiguous_strides


_RANDOM_FACTORIES = frozenset({"rand", "randn", "randint", "randperm", "normal", "rand_like", "randn_like",
                               "randint_like", "bernoulli", "multinomial"})
_COPYING_FACTORIES = frozenset({"tensor", "as_tensor", "asarray", "from_numpy"})
_EMPTY_FACTORIES = frozenset({"empty", "empty_like", "empty_strided", "empty_permuted"})


def _meta_result(func, args, cpu_kwargs):
    """What the factory makes (a meta tensor: shape, strides, dtype), computed without memory; None
    if its meta call fails (then the host computes it and raises torch's own error, if any)."""
    meta_kwargs = dict(cpu_kwargs, device="meta")
    if meta_kwargs.get("generator") is not None:
        meta_kwargs["generator"] = None
    try:
        out = func(*args, **meta_kwargs)
    except Exception:
        return None
    return out if isinstance(out, torch.Tensor) and out.device.type == "meta" else None



class _Copies:
    """Copies into host staging memory, as one kernel (a `.item()`'s or a mask's read-back)."""

    __slots__ = ("pairs", "__name__")

    def __init__(self, pairs):
        self.pairs = pairs
        self.__name__ = "copy to host"

    def __call__(self, *_):
        for dst, src in self.pairs:
            dst.copy_(src)




class HostTransfers:
    """Emulation's host<->device half (a mixin of torch_cuda.Emulation): needs its device, current
    streams, `empty`, `pinned`, `generators` and `enter`."""

    def to_device(self, source, index: int, dtype=None, non_blocking: bool = False):
        """A host tensor copied to cuda:index on the current stream (`.cuda()`, `.to("cuda")`,
        a factory's `device="cuda"`): from pageable memory, staged now and waited for."""
        self.enter()
        if source.requires_grad and self.autograd.enabled and torch.is_grad_enabled():
            return HostToDevice.apply(source, self, index, dtype, non_blocking)  # a graph node, as torch's copy
        if dtype is not None and dtype != source.dtype:
            source = source.to(dtype)
        src = source.contiguous() if not source.is_contiguous() else source
        s = self.current_stream(index)
        t = self.empty(tuple(src.shape), tuple(src.stride()), src.dtype, index, s)
        region = byte_region(t)
        if type(source) is PinnedTensor:
            read = byte_region(source)
            self.device.launch(Kernel(torch.Tensor.copy_, (t._inner, source._inner), {}, (), None),
                               stream=s.device_stream, reads=[read] if read else [],
                               writes=[region] if region else [], name="aten._to_copy.default")
            if not non_blocking:
                self.host_waits(s, name="aten._to_copy.default")
        else:
            staged = src.detach().clone()
            self.device.launch(Kernel(torch.Tensor.copy_, (t._inner, staged), {}, (), None),
                               stream=s.device_stream, writes=[region] if region else [],
                               name="aten._to_copy.default")
            # From pageable memory: synchronous, as on CUDA.
            self.host_waits(s, name="aten._to_copy.default")
        if source.requires_grad:  # no autograd here (autograd.py): a leaf that requires grad
            t.requires_grad_(True)
        return t

    def factory(self, func, args, kwargs, index: int):
        """`torch.zeros(..., device="cuda")` & co. The result's block is allocated first (a request the
        device cannot hold fails before any host memory is used, as on a GPU); `empty` launches
        nothing; a random factory is a kernel drawing from the device's generator at issue (in a
        capture, at each replay); the others are computed on the host now and written into the block by
        a kernel on the current stream (`torch.tensor(data)` copies from pageable memory: the host waits)."""
        self.enter()
        cpu_kwargs = dict(kwargs, device="cpu")
        cpu_kwargs.pop("pin_memory", None)
        requires_grad = bool(cpu_kwargs.pop("requires_grad", False))
        name = getattr(func, "__name__", "")
        s = self.current_stream(index)
        meta = None if name in _COPYING_FACTORIES else _meta_result(func, args, cpu_kwargs)
        if meta is None:
            return self._factory_on_host(func, args, cpu_kwargs, index, s, requires_grad)
        t = self.empty(tuple(meta.shape), tuple(meta.stride()), meta.dtype, index, s)
        region = byte_region(t)
        given = cpu_kwargs.get("generator")
        if name in _EMPTY_FACTORIES:
            pass  # no kernel: its bytes are whatever the block held
        elif name in _RANDOM_FACTORIES or given is not None:
            # Computed when the kernel runs, with the generator taken now (a fork given at the call, or
            # the device's next draw).
            generator = given if given is not None else self.draw(self.generators[index], s)
            self.device.launch(Kernel(func, args, dict(cpu_kwargs, generator=None), [t._inner], generator),
                               stream=s.device_stream, writes=[region] if region else [], name=f"aten.{name}")
        else:
            value = func(*args, **cpu_kwargs)
            self.device.launch(Kernel(torch.Tensor.copy_, (t._inner, value), {}, (), None), stream=s.device_stream,
                               writes=[region] if region else [], name=f"aten.{name}")
        if requires_grad:
            t.requires_grad_(True)
        return t

    def _factory_on_host(self, func, args, cpu_kwargs, index: int, s, requires_grad: bool):
        """A factory whose result's layout only its host computation tells (`torch.tensor(data)`, or
        one with no meta kernel): computed now, then copied into a fresh block on the current stream."""
        generator = cpu_kwargs.get("generator")
        if generator is None and getattr(func, "__name__", "") in _RANDOM_FACTORIES:
            cpu_kwargs["generator"] = self.generators[index].next_cpu_generator()
            try:
                value = func(*args, **cpu_kwargs)
            except TypeError:  # a factory without a generator argument: the global CPU one
                cpu_kwargs.pop("generator")
                value = func(*args, **cpu_kwargs)
        else:
            value = func(*args, **cpu_kwargs)
        if not isinstance(value, torch.Tensor):
            return value
        value = value.contiguous()
        t = self.empty(tuple(value.shape), tuple(value.stride()), value.dtype, index, s)
        region = byte_region(t)
        self.device.launch(Kernel(torch.Tensor.copy_, (t._inner, value), {}, (), None), stream=s.device_stream,
                           writes=[region] if region else [], name=f"aten.{func.__name__}")
        if func.__name__ in _COPYING_FACTORIES:  # torch.tensor(data, device=...) copies from pageable memory
            self.host_waits(s, name=f"aten.{func.__name__}")
        if requires_grad:
            t.requires_grad_(True)
        return t

    def pinned_factory(self, func, args, kwargs):
        """A factory with pin_memory=True: pinned host memory, written by the host now."""
        cpu_kwargs = dict(kwargs)
        cpu_kwargs.pop("pin_memory", None)
        value = func(*args, **cpu_kwargs)
        return self.pin(value)

    def pin(self, value) -> PinnedTensor:
        value = value.contiguous()
        t = self.pinned(tuple(value.shape), tuple(value.stride()), value.dtype)
        region = byte_region(t)
        if region is not None:
            self.device.host_access(writes=[region], name="pin_memory")
        t._inner.copy_(value)
        return t


    def stage_for_host(self, s, tensors, name: str) -> list:
        """CPU tensors holding what `tensors` hold once stream `s` reached this call: copies into
        staging host memory on `s`, then the host's wait for `s` and its read of the staging bytes."""
        staging = [self.pinned(tuple(t.shape), contiguous_strides(t.shape), t.dtype, s.device_index) for t in tensors]
        reads = [r for r in (byte_region(t) for t in tensors) if r is not None]
        writes = [r for r in (byte_region(t) for t in staging) if r is not None]
        if reads:
            self.device.launch(_Copies([(h._inner, t._inner) for h, t in zip(staging, tensors)]),
                               stream=s.device_stream, reads=reads, writes=writes, name=name)
        self.host_waits(s, reads=writes, name=name)
        return [h._inner for h in staging]

    def host_waits(self, s, name: str, reads=()) -> None:
        """An operator's implicit wait for stream `s` (then the host's `reads`): what
        torch.cuda.set_sync_debug_mode warns of (1) or refuses (2), as torch does on a GPU."""
        if self.sync_debug_mode == 2:
            raise RuntimeError("called a synchronizing CUDA operation")
        if self.sync_debug_mode == 1:
            warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=2)
        self.device.host_access(reads=reads, name=name, sync=s.device_stream)

