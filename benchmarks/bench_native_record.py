"""What observing torch's operators costs per operator, on this machine's torch (CPU tensors: the
observation is host work, the same for CUDA tensors), side by side in one process:

    python benchmarks/bench_native_record.py [--steps 2000] [--repeats 7]

- plain: the operators alone;
- python-mode: a TorchDispatchMode that only forwards (what the recorder's Python path pays before
  doing any work of its own);
- rf-noop-local / rf-noop-global: a C++ RecordFunction callback that does nothing, thread-local or
  global, on operators only (RecordScope::FUNCTION);
- rf-record: a thread-local callback that records what the recorder needs (benchmarks/
  native_record_probe.cpp): the operator, each tensor argument's byte span and storage and whether
  the schema writes it, the outputs, the current stream, the calling Python frame (code, offset);
- python-path: the recorder's Python path, the dispatch mode turning each operator into trace
  records (torch_ops.make_mode; CPU tensors standing in for CUDA ones, into a recorder on a
  stand-in GPU, with no checker: the checker's cost is the same for both paths);
- native-path: the native observer (streamcheck/record/native/observer.cpp) and its drain
  (observer.cpp's streamcheck_native_drain, and record/adapters/torch_native.py for what it hands
  to Python) into the same kind of recorder, drained after each step (at a synchronization, as in a
  program); observer-only: the C++ side alone (the records drained after the timing);
  native+checker: the native path feeding the recorder's checker (the native one where it is built),
  as `streamcheck run` does.

The step is a small decode-like mix of operators on small tensors (in place, out=, fresh outputs, a
view written through, a TensorList, a reduction); each mode runs it `--steps` times per repeat, the
modes interleaved in each repeat. Per-operator cost: (mode - plain) / operators the dispatch mode
sees per step. The C++ is built with streamcheck/native_build.py (g++, cached).

The last lines: torch's GPU-trace callbacks fired through its registries as c10 fires them (one
`wait_stream`'s four event callbacks; one temporary's allocation and free around an operator that
first uses its block), into torch_runtime's Python callbacks with the call sites walked in Python or
in C, and taken by the native observer (callbacks_us).
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

PROBE = HERE / "native_record_probe.cpp"


def make_step(torch):
    x = torch.zeros(64)
    y = torch.ones(64)
    out = torch.empty(64)
    a = torch.randn(8, 8)
    b = torch.randn(8, 8)
    c = torch.empty(8, 8)
    buf = torch.empty(128)
    kept = []

    def step():
        x.add_(1.0)
        torch.mul(x, y, out=out)
        z = x + y
        torch.mm(a, b, out=c)
        x[2:6].fill_(0.5)
        torch.cat([x, y], out=buf)
        r = torch.rsqrt(z.pow(2).mean(dim=-1, keepdim=True) + 1e-6)
        kept[:] = [z, r]
    return step


def operators_per_step(torch, step) -> int:
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Count():
        step()
    return len(seen)


def python_mode(torch):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Forward(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))
    return Forward()


class Probe:
    """The probe library's callbacks as context managers."""

    def __init__(self, path):
        self.lib = ctypes.PyDLL(str(path))  # PyDLL: the GIL stays held across the calls

    def mode(self, full: bool, global_: bool):
        lib = self.lib

        class On:
            def __enter__(self):
                lib.probe_clear()
                lib.probe_enable(int(full), int(global_))

            def __exit__(self, *exc):
                lib.probe_disable()
        return On()


class Recording:
    """A recorder on a stand-in GPU, its operators recorded through `path` ("python" or "native"),
    CPU tensors standing in for CUDA tensors on one stream; `drain`: after each step (native)."""

    STREAM = 0x10

    def __init__(self, torch, path: str, drain: bool = True, check: bool = False):
        self.torch, self.path, self.drain, self.check = torch, path, drain, check
        self.after_step = None

    def __enter__(self):
        from streamcheck.record import native, recorder as R
        from streamcheck.record.adapters import torch_native, torch_ops, torch_runtime
        from streamcheck.record.adapters.cuda_device import CudaGpu

        class CpuAsDevice(torch_ops.Ops):
            def _kind(self, t):
                return "cuda" if t.numel() else ""

        # one stand-in stream
        torch_ops.current_stream_ptr = torch_runtime.current_stream_ptr = lambda torch, device=None: self.STREAM
        gpu = CudaGpu(torch=self.torch)
        gpu.driver.lib = None
        rec = self.rec = R.Recorder(gpu, check=self.check)
        R.current = rec
        rec.state["torch"] = torch_runtime.TorchState()
        rec.register_stream(self.STREAM, rec.site(), fresh=True, short="stand-in")
        ops = CpuAsDevice(rec, self.torch)
        if self.path == "python":
            self.mode = torch_ops.make_mode(rec, self.torch, ops, backend="CPU")
            self.mode.__enter__()
        else:
            self.recording = torch_native.start(rec, self.torch, native.load(), ops, device="cpu",
                                                stream_pointer=lambda handle: self.STREAM)
            self.after_step = rec.flush if self.drain else None
        return self

    def __exit__(self, *exc):
        from streamcheck.record import recorder as R
        from streamcheck.record.adapters import torch_native

        if self.path == "python":
            self.mode.__exit__(*exc)
        else:
            torch_native.stop(self.recording)
        R.current = None


def run(step, context, steps: int) -> tuple:
    """(wall, this thread's CPU time) in µs per step of `steps` steps inside `context` (None: plain).
    The CPU time is what the neighbours of a shared machine cannot inflate."""
    if context is None:
        context = contextlib.nullcontext()
    with context:
        after = getattr(context, "after_step", None)
        t0, c0 = time.perf_counter(), time.thread_time()
        if after is None:
            for _ in range(steps):
                step()
        else:
            for _ in range(steps):
                step()
                after()
        t1, c1 = time.perf_counter(), time.thread_time()
    return (t1 - t0) / steps * 1e6, (c1 - c0) / steps * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)

    import torch
    from streamcheck import native_build

    probe = Probe(native_build.build(native_build.NativeLibrary("libstreamcheck_probe.so", PROBE, python=True)))
    step = make_step(torch)
    ops = operators_per_step(torch, step)
    modes = {
        "plain": lambda: None,
        "python-mode": lambda: python_mode(torch),
        "rf-noop-local": lambda: probe.mode(full=False, global_=False),
        "rf-noop-global": lambda: probe.mode(full=False, global_=True),
        "rf-record": lambda: probe.mode(full=True, global_=False),
    }
    from streamcheck.record import native

    modes["python-path"] = lambda: Recording(torch, "python")
    modes["python+checker"] = lambda: Recording(torch, "python", check=True)
    if native.load() is not None:
        modes["native-path"] = lambda: Recording(torch, "native")
        modes["observer-only"] = lambda: Recording(torch, "native", drain=False)
        modes["native+checker"] = lambda: Recording(torch, "native", check=True)
    else:
        print(f"(no native observer here: {native.unavailable_reason()})")
    for make in modes.values():  # warm-up: builds, caches, first calls
        run(step, make(), 50)
    probe.lib.probe_clear()
    probe.lib.probe_enable(1, 0)
    step()
    probe.lib.probe_disable()
    callbacks, with_gil = probe.lib.probe_records(), probe.lib.probe_with_gil()
    probe.lib.probe_clear()
    times = {name: [] for name in modes}
    for _ in range(args.repeats):
        for name, make in modes.items():
            times[name].append(run(step, make(), args.steps))
    wall = {name: statistics.median(w for w, _ in values) for name, values in times.items()}
    cpu = {name: statistics.median(c for _, c in values) for name, values in times.items()}
    print(f"per-operator cost of observing torch operators: torch {torch.__version__}, Python "
          f"{sys.version.split()[0]}, {os.cpu_count()} CPUs; {ops} operators per step as a dispatch mode sees them "
          f"({callbacks} RecordFunction callbacks, {with_gil} of them with the GIL held); {args.steps} steps, median "
          f"of {args.repeats} repeats")
    print(f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'mode':<16}{'wall µs/step':>13}{'CPU µs/step':>13}{'wall µs/op':>12}{'CPU µs/op':>11}   (over plain)")
    for name in modes:
        print(f"{name:<16}{wall[name]:>13.2f}{cpu[name]:>13.2f}{(wall[name] - wall['plain']) / ops:>12.3f}"
              f"{(cpu[name] - cpu['plain']) / ops:>11.3f}")
    if "native-path" in modes:
        print(f"a flush with nothing waiting (the recorder flushes before each record it makes): "
              f"{empty_flush_us(torch, args.repeats):.2f} µs CPU, median of {args.repeats}")
        cycles = callbacks_us(torch, args.repeats)
        for cycle, what in (("wait_stream", "a wait_stream's four GPU-trace callbacks (created, recorded, waited, "
                                            "deleted: three records)"),
                            ("temporary", "a temporary: its two allocator callbacks (allocated, deallocated) around an "
                                          "operator that first uses it (an Alloc, a Launch, a Free)")):
            us = cycles[cycle]
            print(f"{what}, fired through torch's registries, checker on, µs CPU: {us['python']:.2f} into "
                  f"torch_runtime with the call sites walked in Python, {us['c walk']:.2f} walked in C, "
                  f"{us['observer']:.2f} taken by the native observer (its C++ drain makes the records); median of "
                  f"{args.repeats}")
    return 0


def callbacks_us(torch, repeats: int, cycles: int = 5000) -> dict:
    """CPU µs of torch's GPU-trace callbacks for one `Stream.wait_stream` (an event created, recorded, waited on,
    deleted), and of one temporary: its block allocated, an operator's first use of it (the native observer's
    record; its drain registers the block), deallocated; fired through torch's registries as c10 fires them, checker on, the recording drained every
    other cycle (as a sync would): {cycle: {"python": torch_runtime's callbacks with the call sites walked in
    Python, "c walk": walked in C, "observer": taken by the native observer, its C++ drain making the
    records}}, taking turns."""
    from torch.cuda import _gpu_trace

    from streamcheck.record.adapters import torch_runtime

    registries = {name: getattr(_gpu_trace, name) for name, _, _ in torch_runtime.TRACE_CALLBACKS}
    added = [(registries[name].callback_list, callback) for name, callback, _ in torch_runtime.TRACE_CALLBACKS
             if callback not in registries[name].callback_list]  # as torch_runtime._activate does where CUDA is
    for callbacks, callback in added:
        callbacks.append(callback)
    other = 0x20

    def wait_stream(rec, i):
        event, source, waiter = 0xE0 + i % 4, Recording.STREAM if i % 2 else other, other if i % 2 else Recording.STREAM
        registries["EventCreationCallbacks"].fire_callbacks(event)
        registries["EventRecordCallbacks"].fire_callbacks(event, source)
        registries["EventWaitCallbacks"].fire_callbacks(event, waiter)
        registries["EventDeletionCallbacks"].fire_callbacks(event)

    blocks = [torch.zeros(64) for _ in range(4)]

    def temporary(rec, i):
        block = blocks[i % 4]
        ptr = block.untyped_storage().data_ptr()
        registries["MemoryAllocationCallbacks"].fire_callbacks(ptr)
        block.add_(1.0)  # its first use: the allocation's Alloc, then the operator's Launch
        registries["MemoryDeallocationCallbacks"].fire_callbacks(ptr)

    times: dict = {cycle: {"python": [], "c walk": [], "observer": []} for cycle in ("wait_stream", "temporary")}
    try:
        with Recording(torch, "native", check=True) as recording:
            rec, native_recording = recording.rec, recording.recording
            rec.register_stream(other, rec.site(), fresh=True, short="other")
            resolver, walker = rec.site, rec.site.walker
            native_recording.give_back_trace_callbacks()
            for _ in range(repeats):
                for cycle, run_cycle in (("wait_stream", wait_stream), ("temporary", temporary)):
                    for name, into in times[cycle].items():
                        resolver.walker = None if name == "python" else walker
                        if name == "observer":
                            native_recording.take_trace_callbacks()
                        c0 = time.thread_time()
                        for i in range(cycles):
                            run_cycle(rec, i)
                            if i % 2:
                                rec.flush()
                        into.append((time.thread_time() - c0) / cycles * 1e6)
                        native_recording.give_back_trace_callbacks()
                        rec.flush()
            resolver.walker = walker
    finally:
        for callbacks, callback in added:
            callbacks.remove(callback)
    return {cycle: {name: statistics.median(values) for name, values in by_way.items()}
            for cycle, by_way in times.items()}


def empty_flush_us(torch, repeats: int, flushes: int = 20000) -> float:
    """CPU µs of Recorder.flush with the native observer on and no record waiting."""
    times = []
    with Recording(torch, "native") as recording:
        flush = recording.rec.flush
        flush()
        for _ in range(repeats):
            c0 = time.thread_time()
            for _ in range(flushes):
                flush()
            times.append((time.thread_time() - c0) / flushes * 1e6)
    return statistics.median(times)


if __name__ == "__main__":
    sys.exit(main())
