"""Kernels that torch.compile generates: Inductor's Triton kernels, recorded like any launch.

A compiled graph runs as a generated Python wrapper (in Inductor's cache folder) that calls
`kernel.run(*args, stream=raw_stream)` on a `CachingAutotuner` per kernel; the autotuner
launches a compiled binary, not `JITFunction.run`, so triton_launch.py never sees it. We wrap
`CachingAutotuner.run`:
- the stream: the raw cudaStream_t the wrapper passes (torch's current stream when the compiled
  function was called, so a compiled region called under `torch.cuda.stream(s)` is on s);
- reads and writes, per argument: written if Inductor's own record says the kernel mutates it
  (`mutated_arg_names`, and `reset_to_zero_arg_names`, zeroed before the launch), or if it is one
  of the generated kernel's outputs (`out_ptr*`, `in_out_ptr*`, `ws_ptr`: Inductor names its
  parameters by their use); read otherwise. A user's @triton.jit kernel inside a compiled function
  goes through triton_launch's source analysis, plus Inductor's mutated_arg_names. Exact as to
  which tensors; the bytes are each argument's view (`reinterpret_tensor` of a buffer), so a kernel
  that touches only part of its view is recorded as touching all of it (conservative);
- the call site: the compiled function's `def` line in the user's file (the frame Dynamo runs);
  the wrapper's frames are library frames (cuda_device.inductor_code_dir).
The wrapper's other calls (`extern_kernels.mm`, fallback ATen ops, allocations) reach the
recording TorchDispatchMode (torch_ops.py), which lets Dynamo compile (`ignore_compile_internals`;
a torch without it falls back to eager under the recording, and a notice says so).

Autotuning runs inside `run` at a kernel's first launch: its benchmark launches, clones and
cache clears are streamcheck-quiet (nested in the recorded launch), and the device-wide
synchronizations they make are noted as one implicit synchronization, never an edge.
`run(..., benchmark_run=True)` (Inductor benchmarking fused kernels while it compiles) passes
through unrecorded. Not seen: AOTInductor and the C++ wrapper (`cpp_wrapper=True`: launches from
C++), and Inductor's CUDA/CUTLASS templates.
"""
from __future__ import annotations

import importlib
import weakref

from .. import recorder as R
from . import triton_launch
from .patching import Patch, forwarding, quiet
from .torch_ops import register

MODULE = "torch._inductor.runtime.triton_heuristics"
_PLANS = weakref.WeakKeyDictionary()  # CachingAutotuner -> (triton_launch's plan, with Inductor's writes)


# Inductor's code generator names a kernel's pointer parameters by what the kernel does with
# them: in_ptrN loaded, out_ptrN stored, in_out_ptrN both, ws_ptr a workspace it writes.
_GENERATED_WRITES = ("out_ptr", "in_out_ptr", "ws_ptr")


def plan_of(autotuner):
    """Per argument, read or written. A kernel Inductor generated: by its parameter names and
    Inductor's mutated_arg_names (its own record; the generated source is often gone by the
    launch: a kernel compiled in a worker process or loaded from the cache keeps no Python
    function). A user's @triton.jit kernel called from compiled code: triton_launch's analysis
    of its source, with Inductor's mutated_arg_names written too."""
    jit = autotuner.fn
    user_kernel = getattr(autotuner, "custom_kernel", False) and getattr(jit, "fn", None) is not None
    base = triton_launch.plan_of(jit) if user_kernel else None  # the same object while source and declarations stay
    found = _PLANS.get(autotuner)
    if found is not None and found[0] is base:  # every launch after the first: no work
        return found[1]
    stated = set(getattr(autotuner, "mutated_arg_names", None) or ())
    stated |= set(getattr(autotuner, "reset_to_zero_arg_names", None) or ())
    if base is not None:
        plan = base.with_writes(stated)
    else:
        params = tuple(getattr(jit, "arg_names", None) or ())
        plan = triton_launch.Plan.by_names(getattr(jit, "__name__", None) or "triton kernel", params,
                                            {p for p in params if p in stated or p.startswith(_GENERATED_WRITES)})
    _PLANS[autotuner] = (base, plan)
    return plan


def _register(rec, tensors) -> None:
    """File the caching-allocator blocks of the wrapper's buffers (allocated in C++ by
    `empty_strided_cuda`, never through an operator) under their allocating stream, so their
    frees and reuse are checked like those of eager tensors."""
    for t in tensors:
        if getattr(t, "is_cuda", False) and hasattr(t, "untyped_storage"):
            register(rec, rec.gpu.torch, t, "cuda")


def _run(orig):
    def run(self, *args, stream, benchmark_run=False, **kwargs):
        if benchmark_run or quiet():
            return orig(self, *args, stream=stream, benchmark_run=benchmark_run, **kwargs)
        rec = R.current
        try:
            plan = plan_of(self)
            reads, writes = triton_launch.accesses(rec, plan, args, kwargs)
            _register(rec, reads + writes)
            raw = int(stream)
        except Exception as exc:  # never into the program: this launch goes unrecorded
            rec.errors.append(f"torch.compile kernel `{getattr(self.fn, '__name__', self)}`: "
                              f"{type(exc).__name__}: {exc}; not recorded")
            return orig(self, *args, stream=stream, **kwargs)
        first = len(getattr(self, "launchers", ()) or ()) != 1
        result = rec.launch(plan.name, lambda: orig(self, *args, stream=stream, **kwargs), stream=raw,
                            reads=reads, writes=writes)
        if first:
            rec.implicit(f"compile, load and autotune of torch.compile kernel `{plan.name}` (its first launch: "
                         "benchmarking synchronizes the device)")
        return result
    return forwarding(orig, run)


def install(rec, patcher) -> None:
    if "torch" not in rec.state:  # torch_runtime refused this torch (notice given)
        return

    # Inductor's runtime is imported at the first compile, maybe after the recording started.
    def loaded(module) -> None:
        patcher.apply(Patch(f"{MODULE}.CachingAutotuner.run", _run))
        refresh = getattr(rec.gpu, "refresh_library_dirs", None)
        if refresh is not None:
            importlib.import_module("torch._inductor.runtime.cache_dir_utils")  # small; Inductor's own
            if refresh():  # the generated wrapper's folder: its frames are not the user's
                rec.refresh_library_dirs()
    patcher.after_import(MODULE, loaded)
    patcher.after_import("torch._dynamo", lambda module: _eager_fallback(rec))


def _eager_fallback(rec) -> None:
    """A torch whose dispatch modes cannot say `ignore_compile_internals` (before 2.8): Dynamo
    skips every frame while the recording's mode is on, so compiled functions run eagerly."""
    from torch.utils._python_dispatch import TorchDispatchMode

    if not hasattr(TorchDispatchMode, "ignore_compile_internals"):
        rec.notice(f"torch {rec.gpu.torch.__version__}: torch.compile falls back to eager under the recording (Dynamo "
                   "skips frames while a TorchDispatchMode is active; torch >= 2.8 lets the recording's mode step "
                   "aside): compiled functions are checked as the eager operators they run, not as Inductor's kernels")


def patches() -> tuple:
    return ()
