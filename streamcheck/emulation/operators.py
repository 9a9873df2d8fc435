"""ATen operators on emulated tensors: each is one sim launch on torch's current stream, reading and
writing the byte ranges the torch adapter derives from the schema (`operator_accesses`: the same
rule as on a GPU), executed when the scheduler runs it. A view is metadata; advanced indexing is
a gather or scatter kernel; a result the host needs (a scalar, a data-dependent shape) is read
through staging memory after the host's wait.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..device.objects import Region, caller_site
from ..record.adapters.torch_ops import hands_host_a_value, operator_accesses, operator_schema
from .generators import CapturedDraw, EmulatedGenerator, is_seeded, takes_generator
from .running import EmulationError
from .tensors import (CudaTensor, PinnedTensor, byte_region, contiguous_strides, cpu_view, is_emulated,
                      layout_span, same_view)


def flatten_call(args, kwargs) -> tuple:
    """The leaves of an operator call (tensors, scalars, None, ...; one level into the lists of
    `Tensor[]` and `int[]` arguments, the only nesting ATen schemas have), and how to rebuild it.
    A plain function rather than torch's pytree: it runs for every operator."""
    flat, shape = [], []
    keys = tuple(kwargs)
    for v in (*args, *kwargs.values()):
        if type(v) is list or type(v) is tuple:
            flat.extend(v)
            shape.append((type(v), len(v)))
        else:
            flat.append(v)
            shape.append(None)
    return flat, (tuple(shape), keys)


def unflatten_call(flat, spec) -> tuple:
    """(args, kwargs) from _flatten's leaves (or leaves in their place) and its spec."""
    shape, keys = spec
    values, i = [], 0
    for item in shape:
        if item is None:
            values.append(flat[i])
            i += 1
        else:
            kind, n = item
            values.append(kind(flat[i:i + n]))
            i += n
    cut = len(shape) - len(keys)
    return tuple(values[:cut]), dict(zip(keys, values[cut:]))


def result_leaves(out) -> tuple:
    """An operator's result as (leaves, rebuild kind): a tensor or value alone, or a tuple/list."""
    if type(out) is tuple or type(out) is list:
        return list(out), type(out)
    return [out], None


def rebuild_result(leaves, kind):
    return leaves[0] if kind is None else kind(leaves)




def cpu_index(index, to_meta: bool = False):
    """An index with emulated tensors replaced by their CPU views (or meta stand-ins)."""
    def one(v):
        if is_emulated(v) or isinstance(v, torch.Tensor):
            inner = cpu_view(v)
            return torch.empty_strided(inner.shape, inner.stride(), dtype=inner.dtype, device="meta") if to_meta \
                else inner
        if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
            return type(v)(one(x) for x in v)
        return v
    return tuple(one(v) for v in index) if isinstance(index, tuple) else one(index)


def is_basic_index(index) -> bool:
    """Ints, slices, None and Ellipsis only: indexing makes a view."""
    items = index if isinstance(index, tuple) else (index,)
    return all(v is None or v is Ellipsis or isinstance(v, (int, slice)) and not isinstance(v, bool)
               for v in items)


def index_tensors(index) -> list:
    items = index if isinstance(index, tuple) else (index,)
    return [v for v in items if isinstance(v, torch.Tensor)]




class OperatorDispatch:
    """Emulation's operator half (a mixin of torch_cuda.Emulation): needs its device, current streams,
    `empty`, `pinned`, `stage_for_host`, `generators`, `enter` and `adopt_earlier`."""

    def dispatch(self, func, args, kwargs):
        if self.autograd.calls:  # maybe on torch's autograd thread: recorded as the backward() caller's
            with self.autograd.engine_thread(), caller_site.held(caller_site()):
                return self._dispatch(func, args, kwargs)
        with caller_site.held(caller_site()):  # one user call: its allocations, launch and frees share the site
            return self._dispatch(func, args, kwargs)

    def _dispatch(self, func, args, kwargs):
        self.enter()
        flat, spec = flatten_call(args, kwargs)
        self.adopt_earlier(flat)
        schema = operator_schema(func)
        if schema.view:
            return self._view(func, args, kwargs)
        name = schema.name
        if name == "aten.record_stream.default":
            return self.record_stream(args[0], args[1])
        cuda = next((v for v in flat if type(v) is CudaTensor), None)
        target = _target_device(kwargs)
        if cuda is None and (target is None or target.type != "cuda"):
            return self._host_op(func, name, args, kwargs, flat, spec)
        index = cuda.device.index if cuda is not None else self.device_index(target)
        return self._device_op(func, name, flat, spec, index, args, kwargs, target)

    def _view(self, func, args, kwargs):
        """A view shares its base's block: metadata only, no kernel."""
        base = args[0] if args else next(v for v in kwargs.values() if is_emulated(v))
        flat, spec = flatten_call(args, kwargs)
        inner_args, inner_kwargs = unflatten_call([cpu_view(v) for v in flat], spec)
        out = func(*inner_args, **inner_kwargs)
        cls, block, dev = type(base), base._block, base.device
        leaves, kind = result_leaves(out)
        return rebuild_result([cls(v, block, dev) if isinstance(v, torch.Tensor) else v for v in leaves], kind)

    def record_stream(self, tensor, s) -> None:
        """`tensor.record_stream(s)`: the block's free waits for `s` (torch's allocator rule)."""
        if type(tensor) is not CudaTensor:
            return
        used_on = tensor._block.used_on
        if all(existing is not s.device_stream for existing in used_on):
            used_on.append(s.device_stream)

    def _host_op(self, func, name, args, kwargs, flat, spec):
        """Only host tensors (pinned ones among them): the host does it now."""
        reads, writes = [], []
        accesses = list(operator_accesses(func, args, kwargs))
        for t, written in accesses:
            if type(t) is PinnedTensor:
                region = byte_region(t)
                if region is not None:
                    (writes if written else reads).append(region)
        if reads or writes:
            self.device.host_access(reads=reads, writes=writes, name=name)
        inner_args, inner_kwargs = unflatten_call([cpu_view(v) for v in flat], spec)
        out = func(*inner_args, **inner_kwargs)
        return self._returned(out, accesses)

    def _returned(self, out, accesses):
        """The inner result of an in-place/out= operator as the emulated argument it wrote."""
        written = [t for t, w in accesses if w and is_emulated(t)]
        if not written:
            return out
        leaves, kind = result_leaves(out)
        mapped = []
        for v in leaves:
            if isinstance(v, torch.Tensor):
                same = next((w for w in written if w._inner is v or same_view(w._inner, v)), None)
                mapped.append(same if same is not None else v)
            else:
                mapped.append(v)
        return rebuild_result(mapped, kind)

    def _device_op(self, func, name, flat, spec, index, args, kwargs, target):
        if name == "aten._to_copy.default" and target is not None and target.type == "cuda":
            there = self.device_index(target)
            if there != index:  # to another GPU: a peer copy, ordered on both devices' current streams
                return self._to_other_device(args[0], there, kwargs.get("dtype"))
        if name == "aten.copy_.default" and type(args[0]) is CudaTensor and type(args[1]) is CudaTensor and \
                args[0].device != args[1].device:
            return self._copy_between_devices(args[0], args[1])
        s = self.current_stream(index)
        non_blocking = bool(kwargs.get("non_blocking", False)) or (
            name == "aten.copy_.default" and len(args) > 2 and bool(args[2]))
        reads, writes, host_sides, written_host = [], [], [], set()
        call = self._call(func, flat, spec, args, kwargs)
        accesses = [(flat[i], written) for i, written in call.accesses]
        for (t, written), span in zip(accesses, call.spans):
            kind = type(t)
            if kind is CudaTensor or kind is PinnedTensor:
                if span is not None:  # byte_region(t), its layout's part kept with the signature
                    shift = t.storage_offset() * span[2]
                    (writes if written else reads).append(Region(t._block.buffer, span[0] + shift, span[1] + shift))
                if kind is PinnedTensor:
                    host_sides.append("pinned")
            elif t.device.type == "cpu" and t.dim() > 0:
                if name not in _HOST_TENSORS_ALLOWED:
                    _check_same_device(name, flat)  # raises, as torch does
                host_sides.append("pageable")
                if written:
                    written_host.add(id(t))
        to_host = name == "aten._to_copy.default" and target is not None and target.type == "cpu"
        if to_host:
            host_sides.append("pinned" if non_blocking else "pageable")
        # The torch adapter's rule says which operators hand the host a value (as on a GPU); an
        # operator whose meta kernel cannot say what it returns is computed for the host too.
        if call.host_value is None:
            call.host_value = hands_host_a_value(func, args, kwargs)
        if call.host_value:
            layout = None
        else:
            if call.layout is _MISSING:
                call.layout = self._meta_layout(func, flat, spec)
            layout = call.layout
        # What the kernel gets: the CPU views; a pageable source staged now, a pageable destination itself.
        inner_flat = [v._inner if type(v) is CudaTensor else v if written_host and id(v) in written_host
                      else self._staged(v) for v in flat]
        inner_args, inner_kwargs = unflatten_call(inner_flat, spec)
        if target is not None:
            inner_kwargs = dict(inner_kwargs, device=torch.device("cpu"))
            inner_kwargs.pop("pin_memory", None)
        pageable_destination = (to_host and not non_blocking) or (name == "aten.copy_.default" and written_host)
        if layout is None or pageable_destination:
            if target is not None:
                inner_flat = [torch.device("cpu") if isinstance(v, torch.device) else v for v in inner_flat]
            result = self._host_result(func, name, s, flat, inner_flat, spec)
            return args[0] if name == "aten.copy_.default" else result
        fresh, out_leaves = [], []
        for item, span in zip(layout.leaves, layout.spans):
            if item is None or not isinstance(item, tuple):
                out_leaves.append(item)
                continue
            shape, stride, dtype = item
            if to_host:
                t = self.pinned(shape, stride, dtype, index) if non_blocking else torch.empty_strided(
                    shape, stride, dtype=dtype)
            else:
                t = self.empty(shape, stride, dtype, index, s)
            fresh.append(t)
            out_leaves.append(t)
            if span is not None and type(t) is not torch.Tensor:  # byte_region(t): a fresh block's view at offset 0
                writes.append(Region(t._block.buffer, span[0], span[1]))
        if reads and len(writes) > len(fresh):  # an argument both read and written (in place) counts as written
            written = {(r.buffer.id, r.start, r.stop) for r in writes}
            reads = [r for r in reads if (r.buffer.id, r.start, r.stop) not in written]
        if name in EMPTY_OPERATORS:  # no kernel: the bytes are whatever the block held, as CUDA's empty
            return rebuild_result(out_leaves, layout.spec)
        generator = self._generator_for(call.seeded, inner_kwargs, index, s)
        targets = [cpu_view(t) for t in fresh]
        self.device._launch_regions(Kernel(func, inner_args, inner_kwargs, targets, generator), s.device_stream,
                                    reads, writes, name)
        if host_sides and not (non_blocking and all(side == "pinned" for side in host_sides)):
            self.device.host_access(name=name, sync=s.device_stream)  # pageable memory, or a blocking copy: the host waits
        if layout.in_place:
            return self._written_result(accesses, layout, out_leaves)
        return rebuild_result(out_leaves, layout.spec)

    def _to_other_device(self, source, index: int, dtype):
        if dtype is not None and dtype != source.dtype:
            source = torch.Tensor.to(source, dtype=dtype)  # converted on its own device first
        out = self.empty(tuple(source.shape), contiguous_strides(source.shape), source.dtype, index)
        return self._copy_between_devices(out, source)

    def _copy_between_devices(self, dst, src):
        """torch's copy between two GPUs: on the destination's current stream, after the source's
        current stream reached the call, and the source's stream waits for the copy (both
        devices' streams stay in order)."""
        if not src.is_contiguous() or not dst.is_contiguous() or src.dtype != dst.dtype or src.shape != dst.shape:
            src = torch.Tensor.to(torch.Tensor.contiguous(src), dtype=dst.dtype).expand(dst.shape).contiguous()
        dst_stream, src_stream = self.current_stream(dst.device.index), self.current_stream(src.device.index)
        before = self.device.event(name="copy_peer")
        before.record(src_stream.device_stream)
        dst_stream.device_stream.wait_event(before)
        read, write = byte_region(src), byte_region(dst)
        if read is not None and write is not None:
            self.device.copy_peer(write, read, stream=dst_stream.device_stream)
        after = self.device.event(name="copy_peer")
        after.record(dst_stream.device_stream)
        src_stream.device_stream.wait_event(after)
        return dst

    def _written_result(self, accesses, layout, out_leaves):
        written = iter([t for t, w in accesses if w])
        leaves = [next(written) if item == "written" else leaf for item, leaf in zip(layout.leaves, out_leaves)]
        return rebuild_result(leaves, layout.spec)

    def _staged(self, value):
        """What a kernel gets for an argument: emulated tensors' CPU views; a pageable host
        tensor copied now (cudaMemcpyAsync stages pageable memory before it returns)."""
        if type(value) is CudaTensor or type(value) is PinnedTensor:
            return value._inner
        if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dim() > 0:
            return value.clone()
        return value

    def _generator_for(self, seeded: bool, inner_kwargs, index, s):
        """The CPU generator a random operator (`seeded`: is_seeded) on stream `s` runs with, taken now
        (issue order)."""
        given = inner_kwargs.get("generator")
        if type(given) is EmulatedGenerator:  # not isinstance: torch.Generator's metaclass checks in Python
            return self.draw(given, s)
        if given is not None:  # a CUDA generator's fork, taken when the call was made (_FactoryMode)
            return given
        if seeded:
            return self.draw(self.generators[index], s)
        return None

    def _host_result(self, func, name, s, flat, inner_flat, spec):
        """An operator whose result the host needs now (`.item()`, `nonzero`, `equal`, a blocking
        copy into pageable memory), as CUDA does it: a copy of its device inputs to host staging
        memory on the current stream (in stream order), the host waiting for that stream, then the
        host reading the staging bytes and computing the result itself."""
        staged = list(inner_flat)
        positions = [i for i, v in enumerate(flat) if type(v) is CudaTensor]
        for i, host in zip(positions, self.stage_for_host(s, [flat[i] for i in positions], name)):
            staged[i] = host
        args, kwargs = unflatten_call(staged, spec)
        result = func(*args, **kwargs)
        leaves, kind = result_leaves(result)
        if not any(type(v) is torch.Tensor for v in leaves) or name in ("aten._to_copy.default", "aten.copy_.default"):
            return result
        # A data-dependent shape (nonzero, masked_select): the result lands in device memory.
        out = []
        for v in leaves:
            if isinstance(v, torch.Tensor):
                t = self.empty(tuple(v.shape), tuple(v.stride()), v.dtype, s.device_index, s)
                self.device.launch(Kernel(torch.Tensor.copy_, (t._inner, v), {}, (), None), stream=s.device_stream,
                                   writes=[r for r in [byte_region(t)] if r is not None], name=name)
                out.append(t)
            else:
                out.append(v)
        return rebuild_result(out, kind)

    def _call(self, func, flat, spec, args, kwargs) -> "_Call":
        """What an operator call's signature decides (_signature), kept per signature: the same for
        every call of one operator on tensors of one layout and the same other arguments."""
        key = _signature(func, flat, spec)
        try:
            found = self._calls.get(key)
        except TypeError:  # an argument of no hashable value (a list of lists): not kept
            key = found = None
        if found is None:
            position = {id(v): i for i, v in enumerate(flat)}
            accesses = tuple((position[id(t)], written) for t, written in operator_accesses(func, args, kwargs))
            found = _Call(accesses, tuple(_span(flat[i]) for i, _ in accesses), is_seeded(func))
            if key is not None:
                self._calls[key] = found
        return found

    def _meta_layout(self, func, flat, spec):
        """What the operator returns, from its meta kernel: (shape, stride, dtype) per fresh tensor,
        "written" for an argument it returns, a plain value otherwise. None: the host needs the
        result (a scalar, a data-dependent shape)."""
        meta_flat = []
        for v in flat:
            if is_emulated(v):
                meta_flat.append(torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta"))
            elif isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.dim() > 0:
                meta_flat.append(torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta"))
            elif isinstance(v, torch.device) and v.type in ("cuda", "cpu"):
                meta_flat.append(torch.device("meta"))
            elif type(v) is EmulatedGenerator:
                meta_flat.append(None)
            else:
                meta_flat.append(v)
        meta_args, meta_kwargs = unflatten_call(meta_flat, spec)
        meta_kwargs = {k: v for k, v in meta_kwargs.items() if k != "pin_memory"}
        try:
            out = func(*meta_args, **meta_kwargs)
        except NotImplementedError:
            self._require_cpu_kernel(func)
            return None
        except RuntimeError as exc:
            if "data-dependent" in str(exc) or "meta" in str(exc).lower() or "item()" in str(exc):
                self._require_cpu_kernel(func)
                return None
            raise
        written_metas = [m for m in meta_flat if isinstance(m, torch.Tensor)]
        leaves, out_spec = result_leaves(out)
        items, in_place = [], False
        schema = func._schema
        returns = list(schema.returns)
        for i, v in enumerate(leaves):
            if isinstance(v, torch.Tensor):
                ret = returns[i] if i < len(returns) else None
                aliased = ret is not None and ret.alias_info is not None and ret.alias_info.is_write
                if aliased or any(v is m for m in written_metas):
                    items.append("written")
                    in_place = True
                else:
                    items.append((tuple(v.shape), tuple(v.stride()), v.dtype))
            else:
                return None  # a value the host reads: the stream must have produced it
        spans = [layout_span(item[0], item[1], item[2].itemsize) if isinstance(item, tuple) else None
                 for item in items]
        return _Layout(items, spans, out_spec, in_place)

    def _require_cpu_kernel(self, func) -> None:
        name = func.name()
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU") or \
                torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeExplicitAutograd") or \
                torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd"):
            return
        raise EmulationError(f"operator `{name}` at {caller_site()} has no CPU implementation, so the sim cannot "
                             "run it (a custom CUDA kernel or extension); register a CPU implementation of it "
                             "(torch.library's register_kernel(..., 'cpu')) or check this program on a GPU "
                             "(streamcheck run --backend gpu)")

    def whole_function(self, func, flat, spec, failure):
        """`func` as one kernel on the current stream: it reads its CUDA arguments and writes the fresh
        tensors it returns, computed on their CPU views when the scheduler runs it. For composite
        functions whose own C++ needs a CUDA kernel a CPU-only build lacks; one that returns one of its
        arguments (in place) is refused in one line."""
        cuda = [v for v in flat if type(v) is CudaTensor]
        s = self.current_stream(cuda[0].device.index)
        meta_flat = [torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta") if type(v) is CudaTensor
                     else v for v in flat]
        meta_args, meta_kwargs = unflatten_call(meta_flat, spec)
        name = getattr(func, "__qualname__", None) or getattr(func, "__name__", "function")
        try:
            shapes = func(*meta_args, **meta_kwargs)
        except Exception as exc:
            raise EmulationError(f"{name} at {caller_site()} has no CPU path under the emulation ({failure}; its meta "
                                 f"kernel: {type(exc).__name__}: {exc}); check this program on a GPU "
                                 "(streamcheck run --backend gpu)") from None
        leaves, kind = result_leaves(shapes)
        if any(any(v is m for m in meta_flat) for v in leaves):
            raise EmulationError(f"{name} at {caller_site()} writes one of its arguments in C++ code a CPU-only build "
                                 "cannot run for CUDA tensors; check this program on a GPU")
        out = [self.empty(tuple(v.shape), tuple(v.stride()), v.dtype, s.device_index, s) if isinstance(v, torch.Tensor)
               else v for v in leaves]
        inner_args, inner_kwargs = unflatten_call([self._staged(v) for v in flat], spec)
        targets = [t._inner for t in out if type(t) is CudaTensor]
        self.device.launch(Kernel(func, inner_args, inner_kwargs, targets, None), stream=s.device_stream,
                           reads=[r for r in (byte_region(v) for v in cuda) if r is not None],
                           writes=[r for r in (byte_region(t) for t in out if type(t) is CudaTensor) if r is not None],
                           name=name)
        return rebuild_result(out, kind)

    # --- advanced indexing --------------------------------------------------------------
    def gather(self, source, index):
        """`x[tensor index]`: a gather kernel on the current stream. A boolean mask has a
        data-dependent shape: the host waits for the stream first, as CUDA's nonzero does."""
        s = self.current_stream(source.device.index)
        reads = [r for r in [byte_region(source)] + [byte_region(t) for t in index_tensors(index) if is_emulated(t)] if r]
        inner_index = cpu_index(index)
        if hands_host_a_value(torch.ops.aten.index.Tensor, (source, list(index_tensors(index))), {}):
            # A data-dependent shape: the host waits for the stream and reads (CUDA's nonzero does).
            masks = [t for t in index_tensors(index) if type(t) is CudaTensor]
            host = self.stage_for_host(s, [source] + masks, "aten.index.Tensor")
            replaced = dict(zip(map(id, masks), host[1:]))
            items = index if isinstance(index, tuple) else (index,)
            host_index = tuple(replaced.get(id(v), cpu_view(v)) for v in items)
            value = host[0][host_index if isinstance(index, tuple) else host_index[0]]
            out = self.empty(tuple(value.shape), tuple(value.stride()), value.dtype, s.device_index, s)
            self.device.launch(Kernel(torch.Tensor.copy_, (out._inner, value), {}, (), None),
                               stream=s.device_stream, writes=[r for r in [byte_region(out)] if r], name="aten.index.Tensor")
            return out
        meta = torch.empty_strided(source.shape, source.stride(), dtype=source.dtype, device="meta")
        shape = meta[cpu_index(index, to_meta=True)]
        out = self.empty(tuple(shape.shape), tuple(shape.stride()), shape.dtype, s.device_index, s)
        self.device.launch(Kernel(torch.Tensor.__getitem__, (source._inner, inner_index), {}, [out._inner], None),
                           stream=s.device_stream, reads=reads, writes=[r for r in [byte_region(out)] if r],
                           name="aten.index.Tensor")
        return out

    def scatter(self, target, index, value):
        """`x[tensor index] = value`: an index_put_ kernel on the current stream."""
        s = self.current_stream(target.device.index)
        inner_index, staged = cpu_index(index), set()
        masks = [t for t in index_tensors(index) if type(t) is CudaTensor]
        if masks and hands_host_a_value(torch.ops.aten.index_put_.default, (target, list(index_tensors(index)), value),
                                        {}):
            # A mask becomes indices on the host first (ATen's nonzero: the host waits for the stream);
            # the kernel then reads those indices, not the mask.
            replaced = dict(zip(map(id, masks), self.stage_for_host(s, masks, "aten.index_put_.default")))
            staged = set(replaced)
            items = index if isinstance(index, tuple) else (index,)
            host_index = tuple(replaced.get(id(v), cpu_view(v) if isinstance(v, torch.Tensor) else v) for v in items)
            inner_index = host_index if isinstance(index, tuple) else host_index[0]
        reads = [r for r in [byte_region(t) for t in index_tensors(index) if is_emulated(t) and id(t) not in staged]
                 if r]
        if is_emulated(value):
            reads += [r for r in [byte_region(value)] if r]
        inner_value = self._staged(value) if isinstance(value, torch.Tensor) else value
        self.device.launch(Kernel(torch.Tensor.__setitem__, (target._inner, inner_index, inner_value), {},
                                   (), None), stream=s.device_stream, reads=reads,
                           writes=[r for r in [byte_region(target)] if r], name="aten.index_put_.default")


_MISSING = object()



# Operators that only allocate: torch launches no kernel for them.
EMPTY_OPERATORS = frozenset({"aten.empty.memory_format", "aten.empty_like.default", "aten.empty_strided.default",
                             "aten.new_empty.default", "aten.new_empty_strided.default",
                             "aten.empty_permuted.default"})


# Operators that take host tensors beside device ones as torch does: copies, and indices.
_HOST_TENSORS_ALLOWED = frozenset({"aten.copy_.default", "aten._to_copy.default", "aten._copy_from.default",
                                   "aten._copy_from_and_resize.default", "aten.index.Tensor", "aten.index_put_.default",
                                   "aten.index_put.default", "aten._index_put_impl_.default"})


def _check_same_device(name: str, flat) -> None:
    """torch's device check: a host tensor (other than a 0-d one) beside CUDA ones is an error."""
    devices = set()
    for v in flat:
        if type(v) is CudaTensor:
            devices.add(str(v.device))
        elif isinstance(v, torch.Tensor) and v.dim() > 0:
            devices.add("cpu")
    if len(devices) > 1:
        first, second = sorted(devices, key=lambda d: (d == "cpu", d))[:2]
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, {first} "
                           f"and {second}! (when checking argument for {name})")




def _target_device(kwargs):
    value = kwargs.get("device")
    if value is None:
        return None
    return value if isinstance(value, torch.device) else torch.device(value)


def _signature(func, flat, spec) -> tuple:
    """The key of an operator call's facts (_Call): tensors by layout, the rest by value (unhashable
    if a value is)."""
    key = [func, spec]
    for v in flat:
        kind = type(v)
        if kind is CudaTensor or kind is PinnedTensor:  # their kind says their device's type
            key.append((kind, v.shape, v.stride(), v.dtype))
        elif isinstance(v, torch.Tensor):
            key.append((kind, v.shape, v.stride(), v.dtype, v.device.type))
        elif type(v) is EmulatedGenerator:
            key.append("generator")
        else:
            key.append((type(v), v))
    return tuple(key)


class _Call:
    """One signature's facts: its accesses by the schema as (position among the call's leaves,
    written), and for each an emulated tensor's bytes at offset 0 with its item size (_span);
    whether it draws random numbers (is_seeded); whether it hands the host a value, and
    its layout (_meta_layout), found when the first such call needs them (None and _MISSING until
    then), in the order the call asks (a call torch refuses raises where it did)."""

    __slots__ = ("accesses", "spans", "seeded", "host_value", "layout")

    def __init__(self, accesses, spans, seeded: bool):
        self.accesses = accesses
        self.spans = spans
        self.seeded = seeded
        self.host_value = None
        self.layout = _MISSING


def _span(v) -> Optional[tuple]:
    """(start, stop, item size) of an emulated tensor's bytes at storage offset 0 (its layout is part of
    the signature), None if it is empty or not emulated."""
    if not is_emulated(v):
        return None
    item = v.element_size()
    span = layout_span(v.shape, v.stride(), item)
    return None if span is None else (span[0], span[1], item)


class _Layout:
    """What an operator returns (_meta_layout): `leaves`, and for each fresh tensor its bytes at offset 0."""

    __slots__ = ("leaves", "spans", "spec", "in_place")

    def __init__(self, leaves, spans, spec, in_place):
        self.leaves = leaves
        self.spans = spans
        self.spec = spec
        self.in_place = in_place




class Kernel:
    """One operator's execution, run by the scheduler: on the CPU views of its blocks, writing its
    fresh results into the blocks allocated for them."""

    __slots__ = ("func", "call", "args", "kwargs", "targets", "generator", "__name__")

    def __init__(self, func, args, kwargs, targets, generator):
        self.func, self.args, self.kwargs = func, args, kwargs
        # An ATen operator overload is called through its C++ function (OpOverload.__call__ only forwards).
        self.call = func._op if type(func) is torch._ops.OpOverload else func
        self.targets, self.generator = targets, generator
        self.__name__ = getattr(func, "__name__", "kernel")

    def __call__(self, *_):
        kwargs = self.kwargs
        generator = self.generator
        if type(generator) is CapturedDraw:
            generator = generator.take()  # a graph replay's: drawn when the replay was launched
        if generator is not None:
            if "generator" in kwargs or takes_generator(self.func):
                kwargs = dict(kwargs, generator=generator)
                out = self.call(*self.args, **kwargs)
            else:
                # An operator with no generator argument (dropout) draws from the global CPU generator.
                state = torch.default_generator.get_state()
                torch.default_generator.set_state(generator.get_state())
                try:
                    out = self.call(*self.args, **kwargs)
                finally:
                    torch.default_generator.set_state(state)
        else:
            out = self.call(*self.args, **kwargs)
        if self.targets:
            if type(out) is torch.Tensor and len(self.targets) == 1:
                self.targets[0].copy_(out)
                return
            leaves = [v for v in result_leaves(out)[0] if isinstance(v, torch.Tensor)]
            fresh = [v for v in leaves if not any(v is a for a in self.args)]
            for dst, src in zip(self.targets, fresh if len(fresh) == len(self.targets) else leaves):
                dst.copy_(src)


