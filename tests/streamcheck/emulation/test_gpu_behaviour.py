"""The emulation behaves as a GPU does where PyTorch's own CUDA tests (test/test_cuda.py) say what a GPU
does: an emulated memory capacity and torch's out-of-memory error, the caching allocator's statistics
under torch's names, torch's exception types and messages, random numbers in graph replays, device
properties, and `torch.empty` that launches nothing. One test per behaviour, each asserting the values,
types and messages a GPU gives."""
from __future__ import annotations

import resource
import textwrap
import uuid
import warnings
from pathlib import Path

import pytest
import torch

from streamcheck import cli
from streamcheck.core import trace as T
from streamcheck.device import Device
from streamcheck.emulation.memory_stats import CAPACITY_ENV, format_size, parse_size
from streamcheck.emulation.torch_cuda import Emulation, EmulationError

MiB = 1 << 20
HERE = Path(__file__)
_LINES = HERE.read_text(encoding="utf-8").splitlines()


def line(tag: str) -> int:
    """The line of this file that ends with the comment `# <tag>`."""
    hits = [n for n, text in enumerate(_LINES, 1) if text.rstrip().endswith(f"# {tag}")]
    assert len(hits) == 1, f"tag {tag!r} marks {len(hits)} lines"
    return hits[0]


def emulate(program, *, capacity=None, devices: int = 1, policy: str = "sequential", **params):
    """Run `program()` on a fresh sim device under the emulation: (device, what it returned)."""
    dev = Device("sim", policy=policy, devices=devices, **params)
    with Emulation(dev, memory_capacity=capacity):
        value = program()
    return dev, value


# --- memory capacity and torch's out-of-memory error ----------------------------------------------

def test_an_allocation_beyond_the_capacity_empties_the_cache_retries_then_raises_torchs_oom():
    def program():
        a = torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
        del a  # cached: still reserved
        cached = torch.cuda.memory_reserved()
        b = torch.empty(50 * MiB, dtype=torch.uint8, device="cuda")  # fits once the cache is emptied
        stats = torch.cuda.memory_stats()
        retried = (stats["num_alloc_retries"], stats["num_ooms"], torch.cuda.memory_reserved())
        x = torch.zeros(4, device="cuda")
        with pytest.raises(torch.OutOfMemoryError) as raised:
            torch.empty(30 * MiB, dtype=torch.uint8, device="cuda")
        x.fill_(1)  # an out-of-memory error leaves the device usable
        return cached, retried, str(raised.value), torch.cuda.memory_stats()["num_ooms"], x.tolist(), b.shape

    _, (cached, retried, message, ooms, x, shape) = emulate(program, capacity=64 * MiB)
    assert cached == 40 * MiB and retried == (1, 0, 50 * MiB) and shape == (50 * MiB,)
    assert isinstance(torch.OutOfMemoryError("x"), RuntimeError) and ooms == 1 and x == [1.0] * 4
    # The small block of x reserved a 2 MiB segment: 64 - 50 - 2 MiB are free.
    assert message.startswith("CUDA out of memory. Tried to allocate 30.00 MiB. GPU 0 has a total capacity of "
                              "64.00 MiB of which 12.00 MiB is free. Including non-PyTorch memory, this process has "
                              "52.00 MiB memory in use. Of the allocated memory 50.00 MiB is allocated by PyTorch, "
                              "and 2.00 MiB is reserved by PyTorch but unallocated."), message


def test_huge_allocations_fail_with_torchs_messages_before_using_host_memory():
    def program():
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        with pytest.raises(torch.OutOfMemoryError, match=r"Tried to allocate 800000000\.00 GiB\. GPU 0 has a total "
                                                         r"capacity of 8\.00 GiB"):
            torch.empty(1024 * 1024 * 1024 * 800000000, dtype=torch.int8, device="cuda")
        with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate 4096.00 GiB"):
            torch.full((1 << 40,), 1.0, device="cuda")  # computed on the host first, it would need 4 TiB there
        with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate more than 1EB memory"):
            torch.empty(1024 * 1024 * 1024 * 8000000000, dtype=torch.int8, device="cuda")
        with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate 5.00 GiB"):
            torch.empty(5 << 30, dtype=torch.uint8, device="cuda") + 1  # the output does not fit beside its input
        grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        return grown_kib, torch.cuda.memory_stats()["num_ooms"]

    _, (grown_kib, ooms) = emulate(program)
    assert grown_kib < 256 * 1024 and ooms == 3  # the 1 EB check comes before the allocator's


def test_the_capacity_is_reported_as_total_memory_and_set_by_parameter_or_environment(monkeypatch):
    def program():
        props = torch.cuda.get_device_properties(0)
        return props.total_memory, torch.cuda.mem_get_info(), torch.accelerator.get_memory_info(0)

    _, (total, info, accelerator_info) = emulate(program)
    assert total == 8 << 30 and info == (8 << 30, 8 << 30) == accelerator_info  # the default a CPU runner holds
    _, (total, info, _) = emulate(program, capacity=3 * MiB)
    assert total == 3 * MiB and info == (3 * MiB, 3 * MiB)
    monkeypatch.setenv(CAPACITY_ENV, "16GiB")
    assert emulate(program)[1][0] == 16 << 30
    monkeypatch.setenv(CAPACITY_ENV, "lots")
    with pytest.raises(EmulationError, match=f"^{CAPACITY_ENV}: 'lots' is not a memory size; give bytes"):
        Emulation(Device("sim"))


def test_sizes_parse_and_print_as_torch_prints_them():
    assert [parse_size(s) for s in ("4096", "512MiB", "8GiB", "80GB", "1.5G", "2 kib")] == \
        [4096, 512 * MiB, 8 << 30, 80 * 10 ** 9, 1_500_000_000, 2048]
    for bad in ("", "-1GiB", "0", "8 parsecs", "inf"):
        with pytest.raises(ValueError, match="is not a memory size"):
            parse_size(bad)
    assert [format_size(n) for n in (512, 1024, 1536, MiB, 3 * MiB // 2, 1 << 30, 3 << 30)] == \
        ["512 bytes", "1024 bytes", "1.50 KiB", "1024.00 KiB", "1.50 MiB", "1024.00 MiB", "3.00 GiB"]


def test_set_per_process_memory_fraction_limits_the_device_as_torch_does():
    def program():
        with pytest.raises(TypeError, match="Invalid type for fraction argument, must be `float`"):
            torch.cuda.set_per_process_memory_fraction(1)
        with pytest.raises(ValueError, match="Invalid fraction value: 2.0. Allowed range: 0~1"):
            torch.cuda.set_per_process_memory_fraction(2.0)
        torch.cuda.set_per_process_memory_fraction(0.5, 0)
        kept = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda")
        with pytest.raises(torch.OutOfMemoryError) as raised:
            torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
        return torch.cuda.get_per_process_memory_fraction(), str(raised.value), kept.shape

    _, (fraction, message, _) = emulate(program, capacity=64 * MiB)
    assert fraction == 0.5 and "32.00 MiB allowed; Of the allocated memory 30.00 MiB" in message


def test_blocks_held_back_by_record_stream_are_freed_when_memory_runs_out():
    # torch's test_caching_allocator_record_stream_oom: before it gives up, the allocator waits for the
    # streams record_stream named and frees those blocks.
    def program():
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            y = torch.zeros(2 * MiB, device="cuda")
        for _ in range(12):
            x = torch.empty(2 * MiB, device="cuda")  # 8 MiB; capacity for four beside y
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                y += x
            x.record_stream(side)
            del x
        stats = torch.cuda.memory_stats()
        return stats["num_alloc_retries"], stats["num_sync_all_streams"], stats["num_ooms"]

    # `side` held back: its events have not passed when the default stream allocates again.
    dev, (retries, syncs, ooms) = emulate(program, capacity=48 * MiB, policy="delay", streams=["s1"], steps=64)
    assert retries >= 2 and syncs == retries and ooms == 0 and dev.races == []


# --- memory statistics ------------------------------------------------------------------------------

_ARRAYS = ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes", "allocation", "segment", "active",
           "inactive_split", "inactive_split_bytes")
TORCH_KEYS = {f"{name}.{pool}.{metric}" for name in _ARRAYS for pool in ("all", "small_pool", "large_pool")
              for metric in ("current", "peak", "allocated", "freed")} | \
    {f"{name}.{metric}" for name in ("oversize_allocations", "oversize_segments")
     for metric in ("current", "peak", "allocated", "freed")} | \
    {"num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free",
     "num_oom_rejections", "max_split_size"}


def test_memory_stats_have_torchs_keys_and_count_blocks_segments_and_pools():
    def program():
        small = torch.randn(256, device="cuda")  # 1 KiB: the small pool, a 2 MiB segment
        large = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")  # the large pool, a 20 MiB segment
        with_both = dict(torch.cuda.memory_stats())
        del small, large
        freed = dict(torch.cuda.memory_stats())
        torch.cuda.empty_cache()
        emptied = dict(torch.cuda.memory_stats())
        return with_both, freed, emptied, torch.accelerator.memory_stats(), torch.cuda.memory_stats_as_nested_dict()

    _, (with_both, freed, emptied, accelerator, nested) = emulate(program)
    assert set(with_both) == TORCH_KEYS and accelerator == emptied
    assert nested["allocated_bytes"]["small_pool"]["freed"] == 1024 and nested["max_split_size"] == -1
    assert {k: with_both[k] for k in ("allocation.all.current", "allocation.small_pool.current",
                                      "allocation.large_pool.current", "allocated_bytes.small_pool.current",
                                      "allocated_bytes.large_pool.current", "requested_bytes.small_pool.current",
                                      "segment.all.current", "reserved_bytes.small_pool.current",
                                      "reserved_bytes.large_pool.current", "active_bytes.all.current",
                                      "num_device_alloc")} == {
        "allocation.all.current": 2, "allocation.small_pool.current": 1, "allocation.large_pool.current": 1,
        "allocated_bytes.small_pool.current": 1024, "allocated_bytes.large_pool.current": 3 * MiB,
        "requested_bytes.small_pool.current": 1024, "segment.all.current": 2,
        "reserved_bytes.small_pool.current": 2 * MiB, "reserved_bytes.large_pool.current": 20 * MiB,
        "active_bytes.all.current": 1024 + 3 * MiB, "num_device_alloc": 2}
    assert (freed["allocated_bytes.all.current"], freed["allocated_bytes.all.freed"], freed["active.all.freed"],
            freed["reserved_bytes.all.current"]) == (0, 1024 + 3 * MiB, 2, 22 * MiB)
    assert (emptied["reserved_bytes.all.current"], emptied["segment.all.freed"], emptied["num_device_free"],
            emptied["num_sync_all_streams"], emptied["reserved_bytes.all.peak"]) == (0, 2, 2, 1, 22 * MiB)
    assert all(with_both[k] == 0 for k in with_both if k.startswith(("inactive_split", "oversize")))


def test_resets_and_torchs_own_readers_and_summary_work_over_the_stats():
    def program():
        x = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
        del x
        y = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        peak_before = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        peak_after = (torch.cuda.max_memory_allocated(), torch.accelerator.max_memory_allocated())
        torch.cuda.reset_accumulated_memory_stats()
        accumulated = torch.cuda.memory_stats()
        summary = torch.cuda.memory_summary()
        return peak_before, peak_after, accumulated, summary, torch.cuda.memory_allocated(), y.shape

    _, (peak_before, peak_after, accumulated, summary, allocated, _) = emulate(program)
    assert peak_before == 4 * MiB and peak_after == (MiB, MiB) and allocated == MiB
    assert accumulated["allocated_bytes.all.allocated"] == 0 and accumulated["num_device_alloc"] == 0
    assert accumulated["allocated_bytes.all.current"] == MiB and accumulated["allocated_bytes.all.peak"] == MiB
    assert "PyTorch CUDA memory summary, device ID 0" in summary and "CUDA OOMs: 0" in summary
    assert any(row.startswith("| Allocated memory") and "1024 KiB" in row for row in summary.splitlines())


def test_caching_allocator_alloc_and_delete_count_as_allocated_memory():
    def program():
        before = torch.cuda.memory_allocated()
        pointer = torch.cuda.caching_allocator_alloc(1)
        during = torch.cuda.memory_allocated()
        torch.cuda.caching_allocator_delete(pointer)
        with pytest.raises(RuntimeError, match="invalid device pointer"):
            torch.cuda.caching_allocator_delete(pointer)
        return before, during, torch.cuda.memory_allocated()

    assert emulate(program)[1] == (0, 512, 0)


def test_peaks_count_device_blocks_only_never_the_cpu_kernels_copies():
    def program():
        x = torch.ones(MiB // 4, device="cuda")  # 1 MiB
        torch.cuda.reset_peak_memory_stats()
        y = x * 2 + 1  # the temporary x * 2 and y: 3 MiB at the peak, as on a GPU
        total = y.sum().item()  # read back through staging host memory, which is no device block
        host = y.cpu()
        return torch.cuda.max_memory_allocated(), total, host[0].item()

    _, (peak, total, first) = emulate(program)
    assert peak == 3 * MiB and total == 3.0 * (MiB // 4) and first == 3.0


# --- exceptions torch raises on a GPU ----------------------------------------------------------------

def test_event_elapsed_time_raises_torchs_errors():
    def program():
        plain = torch.cuda.Event(), torch.cuda.Event()
        with pytest.raises(ValueError, match=r"^Both events must be created with argument 'enable_timing=True'\.$"):
            plain[0].elapsed_time(plain[1])
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with pytest.raises(ValueError, match=r"^Both events must be recorded before calculating elapsed time\.$"):
            start.elapsed_time(end)
        start.record()
        torch.cuda._sleep(8_000_000)
        end.record()
        with pytest.raises(RuntimeError, match=r"^Both events must be completed before calculating elapsed time\.$"):
            start.elapsed_time(end)
        end.synchronize()
        return start.elapsed_time(end)

    _, elapsed = emulate(program, policy="delay", streams=["legacy"], steps=4)
    assert elapsed > 0


def test_torch_cuda_functions_given_a_cpu_device_raise_torchs_value_error():
    def program():
        for call in (torch.cuda.synchronize, torch.cuda.get_device_properties, torch.cuda.memory_allocated,
                     torch.cuda.current_stream):
            with pytest.raises(ValueError, match=r"^Expected a cuda device, but got: cpu$"):
                call("cpu")
        return True

    assert emulate(program)[1]


def test_cuda_graph_misuse_raises_torchs_errors_and_warnings():
    def program():
        g = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match=r"^CUDA graphs must be captured on a non-default stream\. \(However, "
                                               r"after capture, it's ok to replay them on the default stream\.\)$"):
            g.capture_begin()
        with pytest.raises(RuntimeError, match=r"^capture_end\(\) called before capture_begin\(\)\.$"):
            g.capture_end()
        with pytest.raises(RuntimeError, match=r"^Called CUDAGraph::replay without a preceding successful capture"):
            g.replay()
        side = torch.cuda.Stream()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.cuda.stream(side):
                g.capture_begin()
                g.capture_end()
        empty = [str(w.message) for w in caught if w.category is UserWarning]
        with torch.cuda.stream(side), pytest.raises(RuntimeError, match="^This CUDAGraph instance already owns a "
                                                                        "captured graph"):
            g.capture_begin()
        torch.cuda.manual_seed(3)
        x = torch.zeros(4, device="cuda")
        with pytest.raises(RuntimeError, match=r"^CUDAGeneratorImpl::set_current_seed can be called during stream "
                                               r"capture only if new seed is the same as the original seed\.$"):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                x.add_(1)
                torch.manual_seed(4)
        same = torch.cuda.CUDAGraph()
        with torch.cuda.graph(same):
            x.add_(1)
            torch.cuda.manual_seed(3)  # the seed it has: allowed, as torch allows it
        return empty

    _, empty = emulate(program)
    assert empty == ["The CUDA Graph is empty. This usually means that the graph was attempted to be captured on "
                     "wrong device or stream."]


def test_an_out_of_memory_in_a_capture_raises_torchs_error():
    def program():
        with pytest.raises(torch.OutOfMemoryError, match="out of memory"), \
                pytest.warns(UserWarning, match="The CUDA Graph is empty"):  # nothing was captured, as torch says
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                torch.zeros(2 ** 40, device="cuda")
        return True

    assert emulate(program)[1]


# --- random numbers in graph replays -------------------------------------------------------------------

def test_graph_replays_draw_from_the_generator_at_replay_time_as_philox_offsets_do():
    def program():
        n = 64
        torch.cuda.manual_seed(5)
        eager = [torch.rand(n, device="cuda") for _ in range(6)]  # six draws in a row
        eager_dropout = torch.nn.functional.dropout(torch.ones(n, device="cuda"), p=0.5)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        torch.cuda.manual_seed(5)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(side):
            g.capture_begin()
            a, b = torch.rand(n, device="cuda"), torch.rand(n, device="cuda")
            g.capture_end()
        torch.cuda.current_stream().wait_stream(side)
        seen = []
        g.replay()  # draws 1 and 2
        seen += [a.clone(), b.clone()]
        seen += [torch.rand(n, device="cuda"), torch.rand(n, device="cuda")]  # eager: draws 3 and 4
        g.replay()  # draws 5 and 6
        seen += [a.clone(), b.clone()]
        torch.cuda.manual_seed(5)
        g.replay()  # reseeded: draws 1 and 2 again
        again = [a.clone(), b.clone()]
        torch.cuda.manual_seed(5)
        for _ in range(6):
            torch.rand(n, device="cuda")
        dropped = torch.nn.functional.dropout(torch.ones(n, device="cuda"), p=0.5)
        return [[t.tolist() for t in ts] for ts in (eager, seen, again, [eager_dropout, dropped])]

    dev, (eager, seen, again, (eager_dropout, dropped)) = emulate(program)
    assert seen == eager  # graphed, eager, graphed: the six eager draws
    assert again == eager[:2] and seen[0] != seen[4]  # reseeded, the same; each replay, new numbers
    assert dropped == eager_dropout and 0 < dropped.count(0.0) < 64
    assert dev.races == []


def test_random_operators_on_tensors_in_a_graph_match_their_eager_twins_after_a_reseed():
    # torch's test_graph_rng_distributions: what a replay draws equals the eager draws from the same state.
    def program():
        base = torch.full((32,), 0.5, device="cuda")
        torch.cuda.manual_seed(7)
        control = [base.clone().uniform_(), torch.bernoulli(base)]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        g = torch.cuda.CUDAGraph()
        t1 = base.clone()
        with torch.cuda.stream(side):
            g.capture_begin()
            t1.uniform_()
            t2 = torch.bernoulli(base)
            g.capture_end()
        torch.cuda.current_stream().wait_stream(side)
        untouched = t1.tolist()  # the capture ran nothing
        torch.cuda.manual_seed(7)
        g.replay()
        return [c.tolist() for c in control], [t1.tolist(), t2.tolist()], untouched

    _, (control, replayed, untouched) = emulate(program)
    assert untouched == [0.5] * 32 and replayed == control and control[0] != untouched


def test_a_cuda_generator_given_to_a_captured_operator_is_refused_in_one_line():
    def program():
        gen = torch.Generator(device="cuda")
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            g = torch.cuda.CUDAGraph()
            g.capture_begin()
            try:
                torch.rand(4, device="cuda", generator=gen)  # generator-in-capture
            finally:
                g.capture_end()

    with pytest.raises(EmulationError) as raised, pytest.warns(UserWarning, match="The CUDA Graph is empty"):
        emulate(program)  # the refused operator left the capture empty
    assert f"{HERE.name}:{line('generator-in-capture')}" in str(raised.value) and "\n" not in str(raised.value)


# --- device properties --------------------------------------------------------------------------------

def test_device_properties_compare_equal_hash_alike_and_carry_a_uuid_of_the_real_form():
    def program():
        return (torch.cuda.get_device_properties(0), torch.cuda.get_device_properties(None),
                torch.cuda.get_device_properties("cuda:1"))

    _, (p0, p0_again, p1) = emulate(program, devices=2)
    _, (q0, _, q1) = emulate(program, devices=2)
    assert p0 == p0_again and hash(p0) == hash(p0_again) and len({p0, p0_again}) == 1 and p0 != p1
    assert isinstance(p0.uuid, uuid.UUID) and len(str(p0.uuid)) == 36 and len(p0.uuid.bytes) == 16
    assert (q0.uuid, q1.uuid) == (p0.uuid, p1.uuid) and p0.uuid != p1.uuid  # fixed per device index


# --- torch.empty launches nothing ---------------------------------------------------------------------

def test_empty_and_its_kin_launch_no_kernel():
    def program(dev):
        base = torch.ones(8, device="cuda")
        launches = len([op for op in dev.trace.ops if isinstance(op, T.Launch)])
        made = [torch.empty(8, device="cuda"), torch.empty_like(base), torch.empty_strided((2, 4), (4, 1),
                                                                                           device="cuda"),
                base.new_empty((3,)), torch.zeros(2, device="cuda")]
        added = [op.name for op in dev.trace.ops if isinstance(op, T.Launch)][launches:]
        return added, [(t.device.type, tuple(t.shape)) for t in made]

    dev = Device("sim")
    with Emulation(dev):
        added, made = program(dev)
    assert added == ["aten.zeros"]  # only the zeros write their block
    assert made == [("cuda", (8,)), ("cuda", (8,)), ("cuda", (2, 4)), ("cuda", (3,)), ("cuda", (2,))]


def test_an_empty_tensor_on_a_reused_block_adds_no_race_of_its_own():
    # A block freed while another stream still reads it (no record_stream): the free races with the read
    # (reported). torch.empty on the same bytes writes nothing, so it adds no race.
    def program():
        side = torch.cuda.Stream()
        x = torch.ones(1 << 12, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y = x * 2  # read-on-side
        del x  # freed-too-early
        fresh = torch.empty(1 << 12, device="cuda")  # empty-on-reused-block
        torch.cuda.current_stream().wait_stream(side)
        return y.sum().item(), fresh.shape

    dev, (total, _) = emulate(program, policy="delay", streams=["s1"], steps=8)
    lines = {access.site.line for race in dev.races for access in (race.first, race.second)}
    assert dev.races and line("empty-on-reused-block") not in lines
    assert lines == {line("read-on-side"), line("freed-too-early")} and total == 2.0 * (1 << 12)


# --- the options ----------------------------------------------------------------------------------------

def test_streamcheck_run_takes_a_memory_capacity_and_refuses_a_bad_one(tmp_path, capsys):
    script = tmp_path / "big.py"
    script.write_text(textwrap.dedent('''\
        import torch
        print(torch.cuda.get_device_properties(0).total_memory)
        torch.empty(4 << 20, dtype=torch.uint8, device="cuda")
    '''))
    status = cli.main(["run", "--backend", "sim", "--schedules", "0", "--memory-capacity", "3MiB", str(script)])
    captured = capsys.readouterr()
    assert status == 1 and captured.out == f"{3 * MiB}\n"
    # A 4 MiB request reserves a 20 MiB segment, as torch's allocator does: that is what it tried to allocate.
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity " \
           "of 3.00 MiB" in captured.err
    with pytest.raises(SystemExit) as exited:
        cli.main(["run", "--backend", "sim", "--memory-capacity", "huge", str(script)])
    assert exited.value.code == 2 and "argument --memory-capacity: 'huge' is not a memory size" in \
        capsys.readouterr().err
    import os
    assert CAPACITY_ENV not in os.environ  # the run's setting went away with it


def test_the_pytest_option_sets_the_capacity_and_refuses_a_bad_value(pytester):
    pytester.makepyfile(textwrap.dedent('''\
        import torch

        def test_capacity():
            assert torch.cuda.get_device_properties(0).total_memory == 16 << 20
            try:
                torch.empty(20 << 20, dtype=torch.uint8, device="cuda")
            except torch.OutOfMemoryError as exc:
                assert "GPU 0 has a total capacity of 16.00 MiB" in str(exc)
            else:
                raise AssertionError("no out-of-memory error")
    '''))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--streamcheck-emulate-cuda",
                                           "--streamcheck-memory-capacity", "16MiB")
    result.assert_outcomes(passed=1)
    bad = pytester.runpytest("-p", "no:cacheprovider", "--streamcheck-memory-capacity", "much")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--streamcheck-memory-capacity='much' is not valid; accepted values: a memory size*"])


def test_graphs_sharing_a_pool_reserve_one_small_segment_less_and_give_it_back_when_gone():
    # torch's test_graph_two_successive: two graphs with small temporaries reserve a 2 MiB segment each,
    # or one between them when the second captures into the first's pool.
    def program(share: bool):
        def with_temporaries(t):
            return (t.clone() + 1) + (t.clone() + 1)

        a = torch.ones(1000, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        g0, g1 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.stream(side):
            g0.capture_begin()
            b = with_temporaries(a)
            g0.capture_end()
            g1.capture_begin(*((g0.pool(),) if share else ()))
            b = with_temporaries(b)
            g1.capture_end()
        torch.cuda.current_stream().wait_stream(side)
        g0.replay()
        g1.replay()
        reserved = torch.cuda.memory_reserved()
        value = b[0].item()
        del a, b, g0, g1
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return reserved, value, torch.cuda.memory_reserved()

    _, (separate, value, after) = emulate(lambda: program(False))
    _, (shared, shared_value, shared_after) = emulate(lambda: program(True))
    assert separate - shared == 2 * MiB and value == shared_value == 10.0 and after == shared_after == 0
