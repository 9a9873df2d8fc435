"""Each surface of the CUDA emulation (streamcheck/emulation/torch_cuda.py), one at a time, on the sim.

Every racy pattern sits beside its safe twin: the racy one is reported (its kind, and both accesses at
lines of this file, found by their `# <tag>` comments) and, under a schedule that holds the producer,
really reads stale bytes; the twin is clean and right under the same schedules. Values are compared with
the same operators on plain CPU tensors.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from streamcheck.core.capture import CaptureError
from streamcheck.emulation import native
from streamcheck.emulation.torch_cuda import EmulationError, active
from tests.streamcheck.emulation.tagged import emulate, races_at, tagged_lines

HERE = Path(__file__)
line = tagged_lines(__file__)
races = races_at(__file__)
DELAY_S1 = dict(policy="delay", streams=["s1"], steps=8)  # s1: the first torch.cuda.Stream() of a run
DELAY_LEGACY = dict(policy="delay", streams=["legacy"], steps=8)
RACE_FREE_SCHEDULES = [dict(policy="delay", seed=k) for k in range(3)] + \
    [dict(policy="random", seed=k) for k in range(3)] + [dict(policy="pct", seed=k) for k in range(2)] + [DELAY_S1]


# --- the device: availability, cuda:N, properties ---------------------------------------------------

def test_cuda_is_available_and_tensors_report_the_device_they_were_put_on():
    def program():
        t0 = torch.zeros(2, device="cuda")
        t1 = torch.ones(2, device="cuda:1")
        with torch.cuda.device(1):
            t_default = torch.zeros(2, device="cuda")  # "cuda" is the current device's
            current = torch.cuda.current_device()
        with pytest.raises(RuntimeError, match="invalid device ordinal"):
            torch.zeros(1, device="cuda:2")
        return (torch.cuda.is_available(), torch.cuda.device_count(), torch.cuda.current_device(), current,
                [(t.device, t.device.type, t.is_cuda, t.get_device()) for t in (t0, t1, t_default)],
                t1.tolist())

    _, got, _ = emulate(program, devices=2)
    available, count, current_outside, current_inside, devices, values = got
    assert (available, count, current_outside, current_inside) == (True, 2, 0, 1)
    assert devices == [(torch.device("cuda", 0), "cuda", True, 0), (torch.device("cuda", 1), "cuda", True, 1),
                       (torch.device("cuda", 1), "cuda", True, 1)]
    assert values == [1.0, 1.0]


def test_device_properties_describe_an_emulated_sm90_device():
    def program():
        p = torch.cuda.get_device_properties(0)
        return (p.name, p.major, p.minor, p.total_memory, torch.cuda.get_device_capability(),
                torch.cuda.get_device_name(), torch.cuda.get_device_properties("cuda:1").index)

    _, (name, major, minor, total, capability, device_name, index1), _ = emulate(program, devices=2)
    assert "sim" in name and "emulated" in name and device_name == name
    assert (major, minor, capability, total, index1) == (9, 0, (9, 0), 8 * (1 << 30), 1)  # the default capacity


# --- factories and conversions ------------------------------------------------------------------------

FACTORIES = {
    "zeros": lambda d: torch.zeros(2, 3, device=d),
    "ones_f16": lambda d: torch.ones(4, dtype=torch.float16, device=d),
    "full_int": lambda d: torch.full((3,), 7, dtype=torch.int32, device=d),
    "arange": lambda d: torch.arange(1, 10, 2, device=d),
    "tensor": lambda d: torch.tensor([[1.5, -2.0], [3.25, 4.0]], device=d),
    "eye": lambda d: torch.eye(3, device=d),
    "linspace": lambda d: torch.linspace(0, 1, 5, device=d),
    "bf16": lambda d: torch.tensor([1.0, 2.5, -3.0], dtype=torch.bfloat16, device=d),
}


@pytest.mark.parametrize("name", list(FACTORIES))
def test_factories_on_cuda_hold_what_the_cpu_factory_makes(name):
    make = FACTORIES[name]
    expected = make("cpu")

    def program():
        t = make("cuda")
        return t.device.type, t.dtype, tuple(t.shape), t.cpu()

    dev, (kind, dtype, shape, values), _ = emulate(program)
    assert (kind, dtype, shape) == ("cuda", expected.dtype, tuple(expected.shape))
    assert torch.equal(values, expected) and races(dev) == set()


def test_cuda_to_and_like_conversions_copy_the_host_values_with_the_asked_dtype_and_device():
    src = torch.tensor([[1.0, 2.5], [-3.0, 4.75]])

    def program():
        a = src.cuda()
        b = src.to("cuda")
        c = src.to("cuda", torch.float16)
        d = src.to(device="cuda:1")
        e = src.T.cuda()  # a non-contiguous source
        like = [torch.zeros_like(a), torch.ones_like(a, dtype=torch.int64), a.new_full((2,), 3.0)]
        src_after = src.clone()
        return [(t.device, t.dtype, t.cpu()) for t in (a, b, c, d, e, *like)], src_after

    dev, (got, src_after), _ = emulate(program, devices=2)
    expected = [(0, src), (0, src), (0, src.half()), (1, src), (0, src.T), (0, torch.zeros_like(src)),
                (0, torch.ones_like(src, dtype=torch.int64)), (0, torch.full((2,), 3.0))]
    for (device, dtype, values), (index, want) in zip(got, expected):
        assert device == torch.device("cuda", index) and dtype == want.dtype and torch.equal(values, want)
    assert torch.equal(src_after, src) and races(dev) == set()


def test_a_tensor_moved_or_copied_to_another_device_is_there_with_its_values():
    def program():
        x = torch.arange(3.0, device="cuda")
        into = torch.zeros(3, device="cuda:1")
        into.copy_(x)
        return x.to("cuda:1").device, x.cuda(1).device, x.to("cuda:1").tolist(), into.tolist()

    _, (to_device, cuda_device, values, copied), _ = emulate(program, devices=2)
    assert to_device == cuda_device == torch.device("cuda", 1) and values == copied == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("where", [
    "cuda:0", "x.device",
    "cuda",
    "torch.device('cuda')",
])
def test_to_the_device_a_tensor_is_already_on_returns_the_tensor_itself(where):
    def program():
        x = torch.arange(3.0, device="cuda")
        target = {"cuda:0": "cuda:0", "x.device": x.device, "cuda": "cuda",
                  "torch.device('cuda')": torch.device("cuda")}[where]
        return x.to(target) is x, x.cuda() is x, x.to(target).tolist()

    _, got, _ = emulate(program)
    assert got == (True, True, [0.0, 1.0, 2.0])


def test_an_operator_may_take_a_cpu_scalar_tensor_beside_cuda_tensors():
    def program():
        x = torch.ones(3, device="cuda")
        return (x + torch.tensor(2.0)).tolist(), (x * torch.tensor(3, dtype=torch.int64)).tolist()

    dev, got, _ = emulate(program)
    assert got == ([3.0] * 3, [3.0] * 3) and races(dev) == set()


@pytest.mark.parametrize("op", ["add", "mul_"])
def test_an_operator_mixing_a_cuda_tensor_with_a_cpu_vector_fails_as_on_a_gpu(op):
    def program():
        x = torch.ones(3, device="cuda")
        with pytest.raises(RuntimeError, match="same device|expected device|on device"):
            x + torch.ones(3) if op == "add" else x.mul_(torch.ones(3))
        return x.tolist()

    _, values, _ = emulate(program)
    assert values == [1.0] * 3


def test_a_module_moved_to_cuda_computes_what_it_computes_on_the_cpu():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    x = torch.tensor([[1.0, -2.0, 0.5]])
    with torch.no_grad():
        expected = model(x)

    def program():
        with torch.no_grad():
            moved = model.to("cuda")
            return moved.weight.device, moved(x.cuda()).cpu()

    _, (device, values), _ = emulate(program)
    assert device == torch.device("cuda", 0) and torch.allclose(values, expected)


# --- generators ----------------------------------------------------------------------------------------

def _random_program(seed: int):
    """Random operators issued on two streams, joined properly: race-free."""
    def program():
        torch.cuda.manual_seed(seed)
        main = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        a = torch.randn(8, device="cuda")
        side.wait_stream(main)
        with torch.cuda.stream(side):
            b = torch.rand(8, device="cuda") + a
            c = torch.empty(8, device="cuda").normal_()
        main.wait_stream(side)
        d = torch.randint(0, 100, (8,), device="cuda")
        return [a.tolist(), b.tolist(), c.tolist(), d.tolist()]
    return program


def test_cuda_manual_seed_gives_the_same_values_under_every_schedule_of_a_race_free_program():
    dev, reference, _ = emulate(_random_program(5))
    assert races(dev) == set()
    _, again, _ = emulate(_random_program(5))
    assert again == reference
    for schedule in RACE_FREE_SCHEDULES:
        dev, got, _ = emulate(_random_program(5), **schedule)
        assert got == reference, f"values changed under {schedule}"
    _, other, _ = emulate(_random_program(6))
    assert all(x != y for x, y in zip(other, reference))  # another seed draws other values
    a, b, c, d = reference
    assert a != c and all(0 <= v < 100 and v == int(v) for v in d)


def test_a_cuda_generator_is_a_torch_generator_whose_seed_and_state_round_trip():
    def program():
        g = torch.Generator(device="cuda")
        seeded = g.manual_seed(3) is g and g.initial_seed() == 3
        state = g.get_state()
        g.manual_seed(4)
        moved = not torch.equal(g.get_state(), state)
        g.set_state(state)
        return isinstance(g, torch.Generator), g.device, seeded, moved, torch.equal(g.get_state(), state), \
            g.initial_seed()

    _, got, _ = emulate(program)
    assert got == (True, torch.device("cuda", 0), True, True, True, 3)


def test_seeding_all_devices_and_restoring_the_rng_state_replays_the_draws():
    def program():
        torch.cuda.manual_seed_all(7)
        on0 = torch.rand(3, device="cuda:0").tolist()
        on1 = torch.rand(3, device="cuda:1").tolist()
        torch.cuda.manual_seed(7)
        again0 = torch.rand(3, device="cuda:0").tolist()
        state = torch.cuda.get_rng_state()
        drawn = torch.rand(3, device="cuda").tolist()
        torch.cuda.set_rng_state(state)
        redrawn = torch.rand(3, device="cuda").tolist()
        return on0, on1, again0, drawn, redrawn, torch.cuda.initial_seed()

    _, (on0, on1, again0, drawn, redrawn, seed), _ = emulate(program, devices=2)
    assert on0 == again0 == on1 and drawn == redrawn and drawn != on0 and seed == 7


def test_a_cuda_generator_passed_to_random_operators_replays_its_values():
    def program():
        g = torch.Generator(device="cuda")
        g.manual_seed(3)
        first = torch.randn(4, device="cuda", generator=g).tolist()
        g.manual_seed(3)
        again = torch.randn(4, device="cuda", generator=g).tolist()
        g.manual_seed(3)
        in_place = torch.empty(4, device="cuda").normal_(generator=g).tolist()
        return first, again, in_place

    _, (first, again, in_place), _ = emulate(program)
    assert first == again == in_place


# --- memory APIs ----------------------------------------------------------------------------------------

def test_memory_allocated_follows_live_tensors_and_empty_cache_gives_cached_blocks_back():
    def program():
        start = torch.cuda.memory_allocated()
        x = torch.empty(1000, device="cuda")  # 4000 bytes: 4096 with the allocator's rounding
        with_x = torch.cuda.memory_allocated()
        reserved = torch.cuda.memory_reserved()
        free, total = torch.cuda.mem_get_info()
        del x
        after_del = torch.cuda.memory_allocated()
        cached = torch.cuda.memory_reserved()
        peak = torch.cuda.max_memory_allocated()
        torch.cuda.empty_cache()
        emptied = torch.cuda.memory_reserved()
        free_after, _ = torch.cuda.mem_get_info()
        return start, with_x, reserved, free, total, after_del, cached, peak, emptied, free_after

    _, got, _ = emulate(program)
    start, with_x, reserved, free, total, after_del, cached, peak, emptied, free_after = got
    assert with_x - start == 4096 and after_del == start
    assert cached == reserved == 2 << 20  # a small block's segment (2 MiB), cached until empty_cache
    assert peak >= with_x and emptied == 0
    assert total == 8 << 30 and free == total - reserved and free_after == total


def test_memory_statistics_are_per_device():
    def program():
        kept = torch.empty(1000, device="cuda:1")
        return (torch.cuda.memory_allocated(0), torch.cuda.memory_allocated(1), torch.cuda.memory_allocated("cuda:1"),
                torch.cuda.memory_stats(1)["allocated_bytes.all.current"], kept.device.index)

    _, got, _ = emulate(program, devices=2)
    assert got == (0, 4096, 4096, 4096, 1)


# --- printing ---------------------------------------------------------------------------------------------

REPRS = [
    (lambda: torch.tensor([1.0, 2.0], device="cuda"), "tensor([1., 2.], device='cuda:0')"),
    (lambda: torch.tensor(3.0, device="cuda"), "tensor(3., device='cuda:0')"),
    (lambda: torch.arange(3, device="cuda", dtype=torch.int32),
     "tensor([0, 1, 2], device='cuda:0', dtype=torch.int32)"),
    (lambda: torch.tensor([1.5, 2.0], device="cuda", dtype=torch.float16),
     "tensor([1.5000, 2.0000], device='cuda:0', dtype=torch.float16)"),
    (lambda: torch.arange(6.0, device="cuda").reshape(2, 3),
     "tensor([[0., 1., 2.],\n        [3., 4., 5.]], device='cuda:0')"),
    (lambda: torch.tensor([True, False], device="cuda"), "tensor([ True, False], device='cuda:0')"),
    (lambda: torch.zeros(0, 3, device="cuda"), "tensor([], device='cuda:0', size=(0, 3))"),
]


@pytest.mark.parametrize("make, expected", REPRS)
def test_a_cuda_tensor_prints_as_torch_prints_it(make, expected):
    def program():
        t = make()
        return repr(t), str(t)

    _, (text, printed), _ = emulate(program)
    assert text == printed == expected


def test_printing_a_tensor_made_on_an_unjoined_side_stream_is_a_race_on_the_current_stream():
    def program(join):
        side = torch.cuda.Stream()
        x = torch.zeros(3, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            x.fill_(4.0)  # print-producer
        if join:
            torch.cuda.current_stream().wait_stream(side)
        text = repr(x)  # print-reader
        torch.cuda.synchronize()
        return text

    dev, text, _ = emulate(lambda: program(False), **DELAY_S1)
    assert text == "tensor([0., 0., 0.], device='cuda:0')"
    assert races(dev) == {("RAW", line("print-producer"), line("print-reader"))}
    dev, text, _ = emulate(lambda: program(True), **DELAY_S1)
    assert text == "tensor([4., 4., 4.], device='cuda:0')" and races(dev) == set()


# --- streams and events --------------------------------------------------------------------------------

def _producer_consumer(join: str):
    def program():
        main = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        buf = torch.zeros(4, device="cuda")
        src = torch.arange(4.0, device="cuda")
        side.wait_stream(main)
        with torch.cuda.stream(side):
            buf.copy_(src * 10)  # producer
        if join == "wait_stream":
            main.wait_stream(side)
        elif join == "event":
            done = torch.cuda.Event()
            done.record(side)
            done.wait()  # the current stream waits
        elif join == "wait_event":
            main.wait_event(side.record_event())
        out = buf + 1  # consumer
        values = out.tolist()
        torch.cuda.synchronize()
        return values
    return program


RIGHT = [1.0, 11.0, 21.0, 31.0]


def test_a_consumer_on_another_stream_with_no_wait_reads_stale_bytes_and_the_raw_is_reported():
    dev, values, _ = emulate(_producer_consumer("none"))
    assert values == RIGHT  # the sequential reference: right, and the race found all the same
    assert races(dev) == {("RAW", line("producer"), line("consumer"))}
    dev, values, _ = emulate(_producer_consumer("none"), **DELAY_S1)
    assert values == [1.0, 1.0, 1.0, 1.0]  # read before the held producer wrote
    assert races(dev) == {("RAW", line("producer"), line("consumer"))}


@pytest.mark.parametrize("join", ["wait_stream", "event", "wait_event"])
def test_a_consumer_that_waits_for_the_producer_is_right_and_clean_under_every_schedule(join):
    dev, values, _ = emulate(_producer_consumer(join))
    assert values == RIGHT and races(dev) == set()
    for schedule in RACE_FREE_SCHEDULES:
        dev, values, _ = emulate(_producer_consumer(join), **schedule)
        assert values == RIGHT and races(dev) == set(), schedule


def test_a_random_schedule_that_made_the_race_strike_replays_from_its_seed_and_its_schedule_string():
    struck = []
    for seed in range(12):
        dev, values, _ = emulate(_producer_consumer("none"), policy="random", seed=seed)
        if values != RIGHT:
            struck.append((seed, values, dev.schedule))
    assert struck, "no random seed made the consumer read before the producer"
    seed, values, schedule = struck[0]
    dev, again, _ = emulate(_producer_consumer("none"), policy="random", seed=seed)
    assert again == values and dev.schedule.compact() == schedule.compact()
    dev, replayed, _ = emulate(_producer_consumer("none"), policy=schedule.replay_policy())
    assert replayed == values and races(dev) == {("RAW", line("producer"), line("consumer"))}


def _ranges(lo: int, hi: int):
    def program():
        side = torch.cuda.Stream()
        buf = torch.zeros(8, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            buf[:4].fill_(1.0)  # slice-producer
        values = (buf[lo:hi] * 1).tolist()  # slice-consumer
        torch.cuda.synchronize()
        return values
    return program


def test_views_are_byte_ranges_of_their_storage_so_only_overlapping_slices_race():
    dev, values, _ = emulate(_ranges(4, 8), **DELAY_S1)
    assert values == [0.0] * 4 and races(dev) == set()  # the other half: right whatever the order
    dev, values, _ = emulate(_ranges(3, 6), **DELAY_S1)
    assert values == [0.0] * 3  # buf[3] read before the held fill
    assert races(dev) == {("RAW", line("slice-producer"), line("slice-consumer"))}


def test_wait_stream_covers_only_the_work_issued_before_it():
    def program():
        main = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        early = torch.zeros(4, device="cuda")
        late = torch.zeros(4, device="cuda")
        side.wait_stream(main)
        with torch.cuda.stream(side):
            early.fill_(1.0)
        main.wait_stream(side)
        with torch.cuda.stream(side):
            late.fill_(2.0)  # issued-after-the-wait
        values = (early + late).tolist()  # reads-both
        torch.cuda.synchronize()
        return values

    dev, values, _ = emulate(program, **DELAY_S1)
    assert values == [1.0] * 4  # early waited for, late still held
    assert races(dev) == {("RAW", line("issued-after-the-wait"), line("reads-both"))}


def test_an_event_wait_orders_after_the_record_it_saw_not_a_later_one():
    def program():
        main = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        a = torch.zeros(4, device="cuda")
        b = torch.zeros(4, device="cuda")
        side.wait_stream(main)
        done = torch.cuda.Event()
        with torch.cuda.stream(side):
            a.fill_(1.0)
            done.record()
        main.wait_event(done)
        with torch.cuda.stream(side):
            b.fill_(2.0)  # after-the-waited-record
            done.record()  # recording again replaces what the event captures, not what was waited for
        values = (a + b).tolist()  # reads-a-and-b
        torch.cuda.synchronize()
        never = torch.cuda.Event()
        side.wait_event(never)  # a never-recorded event: a no-op
        return values, never.query()

    dev, (values, never_done), _ = emulate(program, **DELAY_S1)
    assert values == [1.0] * 4 and never_done
    assert races(dev) == {("RAW", line("after-the-waited-record"), line("reads-a-and-b"))}


def test_current_stream_follows_set_stream_and_the_stream_context_and_defaults_to_the_legacy_stream():
    def program():
        s = torch.cuda.Stream()
        default = torch.cuda.current_stream()
        torch.cuda.set_stream(s)
        after_set = torch.cuda.current_stream()
        torch.cuda.set_stream(default)
        with torch.cuda.stream(s):
            inside = torch.cuda.current_stream()
        return (default == torch.cuda.default_stream(), default.device_stream.name, after_set == s, inside == s,
                torch.cuda.current_stream() == default)

    _, got, _ = emulate(program)
    assert got == (True, "legacy", True, True, True)


def test_the_current_stream_is_per_host_thread():
    import threading

    def program():
        s = torch.cuda.Stream()
        seen = {}

        def worker():
            seen["worker starts on the default stream"] = torch.cuda.current_stream() == torch.cuda.default_stream()
            with torch.cuda.stream(s):
                seen["worker sets its own"] = torch.cuda.current_stream() == s

        with torch.cuda.stream(s):
            t = threading.Thread(target=worker)
            t.start()
            t.join()
            seen["main keeps its own"] = torch.cuda.current_stream() == s
        return seen

    _, seen, _ = emulate(program)
    assert seen == dict.fromkeys(["worker starts on the default stream", "worker sets its own",
                                  "main keeps its own"], True)


def test_a_side_stream_of_cuda_1_races_with_cuda_1s_default_stream():
    def program(join):
        s = torch.cuda.Stream(device=1)
        x = torch.zeros(3, device="cuda:1")
        s.wait_stream(torch.cuda.current_stream(1))
        with torch.cuda.stream(s):
            inside = torch.cuda.current_device()
            x.fill_(4.0)  # cuda1-producer
        if join:
            torch.cuda.current_stream(1).wait_stream(s)
        values = (x * 1).tolist()  # cuda1-consumer
        torch.cuda.synchronize()
        return s.device, inside, torch.cuda.current_device(), values

    dev, got, _ = emulate(lambda: program(False), devices=2, **DELAY_S1)
    assert got == (torch.device("cuda", 1), 1, 0, [0.0] * 3)
    assert races(dev) == {("RAW", line("cuda1-producer"), line("cuda1-consumer"))}
    dev, got, _ = emulate(lambda: program(True), devices=2, **DELAY_S1)
    assert got[3] == [4.0] * 3 and races(dev) == set()


def test_event_and_stream_queries_say_whether_the_work_ran():
    def program():
        side = torch.cuda.Stream()
        unrecorded = torch.cuda.Event()
        before = (unrecorded.query(), side.query())  # torch: an event never recorded is complete
        x = torch.ones(4, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y = x * 2
            done = torch.cuda.Event()
            done.record()
        pending = (done.query(), side.query())
        done.synchronize()
        after = (done.query(), side.query())
        return before, pending, after, y.tolist()

    _, (before, pending, after, y), _ = emulate(program, **DELAY_S1)
    assert before == (True, True) and pending == (False, False) and after == (True, True) and y == [2.0] * 4
    _, (_, pending, _, _), _ = emulate(program)
    assert pending == (True, True)  # sequential: the work ran when issued


def test_elapsed_time_is_sim_time_between_completed_timing_events_and_refuses_as_torch_does():
    def program():
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        side = torch.cuda.Stream()
        x = torch.ones(4, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            start.record()
            for _ in range(5):
                x = x + 1
            end.record()
        with pytest.raises(RuntimeError, match="Both events must be completed"):
            start.elapsed_time(end)  # the held stream has not reached `end`
        end.synchronize()
        five = start.elapsed_time(end)
        start.record(side)
        end.record(side)
        end.synchronize()
        none = start.elapsed_time(end)
        with pytest.raises(ValueError, match="enable_timing=True"):
            torch.cuda.Event().elapsed_time(torch.cuda.Event())
        with pytest.raises(ValueError, match="recorded"):
            torch.cuda.Event(enable_timing=True).elapsed_time(end)
        torch.cuda.synchronize()
        return five, none, x.tolist()

    _, (five, none, x), _ = emulate(program, **DELAY_S1)
    assert isinstance(five, float) and five >= 0.005 and 0 <= none < five  # 1 µs per scheduler step
    assert x == [6.0] * 4


# --- host reads synchronize the current stream only ------------------------------------------------------

HOST_READS = {
    "item": lambda x: x[0].item(),  # host-read-item
    "float": lambda x: float(x[0]),  # host-read-float
    "int": lambda x: int(x.sum()),  # host-read-int
    "tolist": lambda x: x.tolist(),  # host-read-tolist
    "cpu": lambda x: x.cpu().tolist(),  # host-read-cpu
    "bool": lambda x: bool(x[0] > 1),  # host-read-bool
}




@pytest.mark.parametrize("read", HOST_READS)
def test_a_host_read_waits_for_the_current_stream_only(read):
    def program(read_on_side):
        side = torch.cuda.Stream()
        x = torch.zeros(4, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            x.add_(5)  # side-producer
        with torch.cuda.stream(side if read_on_side else None):
            value = HOST_READS[read](x)
        torch.cuda.synchronize()
        return value

    stale = {"item": 0.0, "float": 0.0, "int": 0, "tolist": [0.0] * 4, "cpu": [0.0] * 4, "bool": False}[read]
    right = {"item": 5.0, "float": 5.0, "int": 20, "tolist": [5.0] * 4, "cpu": [5.0] * 4, "bool": True}[read]
    dev, value, _ = emulate(lambda: program(False), **DELAY_S1)
    assert value == stale
    assert races(dev) == {("RAW", line("side-producer"), line(f"host-read-{read}"))}
    dev, value, _ = emulate(lambda: program(True), **DELAY_S1)  # the producer's stream is the current one
    assert value == right and races(dev) == set()


def test_a_boolean_mask_and_nonzero_wait_for_the_current_stream_only():
    def program():
        side = torch.cuda.Stream()
        x = torch.zeros(4, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            x[1:3].fill_(2.0)  # mask-producer
        picked = x[x > 1]  # mask-reader
        where = torch.nonzero(x)  # nonzero-reader
        torch.cuda.synchronize()
        return picked.tolist(), where.shape

    # A long hold: each read-back is several host calls (staging, the copy, the wait, the read).
    dev, (picked, shape), _ = emulate(program, policy="delay", streams=["s1"], steps=40)
    assert picked == [] and shape == (0, 1)  # sized from the stale zeros
    assert races(dev) == {("RAW", line("mask-producer"), line("mask-reader")),
                          ("RAW", line("mask-producer"), line("nonzero-reader"))}
    dev, (picked, shape), _ = emulate(program)
    assert picked == [2.0, 2.0] and shape == (2, 1)


@pytest.mark.parametrize("sync", ["device", "stream", "event", "query-loop"])
def test_a_host_synchronize_on_the_producer_orders_a_later_read_on_any_stream(sync):
    def program():
        side = torch.cuda.Stream()
        x = torch.zeros(4, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            x.add_(5)
        if sync == "device":
            torch.cuda.synchronize()
        elif sync == "stream":
            side.synchronize()
        elif sync == "event":
            side.record_event().synchronize()
        else:
            while not side.query():  # a query that says done orders the host, as CUDA's does
                pass
        return x.tolist()  # read on the default stream, which never waited for `side`

    dev, values, _ = emulate(program, **DELAY_S1)
    assert values == [5.0] * 4 and races(dev) == set()


# --- pinned memory and non_blocking copies ---------------------------------------------------------------

def _upload(kind: str):
    def program():
        src = torch.full((4,), 1.0, pin_memory=kind != "pageable")
        pinned = src.is_pinned()
        dst = src.to("cuda", non_blocking=True)  # upload
        if kind == "synchronized":
            torch.cuda.current_stream().synchronize()
        src.fill_(7.0)  # host-rewrites-source
        return pinned, src.device.type, dst.tolist()
    return program


def test_a_host_write_to_a_pinned_source_before_its_copy_ran_is_a_war_that_strikes():
    dev, (pinned, where, values), _ = emulate(_upload("racy"), **DELAY_LEGACY)
    assert pinned and where == "cpu"
    assert values == [7.0] * 4  # the held copy read the new value
    assert races(dev) == {("WAR", line("upload"), line("host-rewrites-source"))}


@pytest.mark.parametrize("kind", ["synchronized", "pageable"])
def test_an_upload_waited_for_or_from_pageable_memory_is_clean_and_right(kind):
    for schedule in [dict(policy="sequential"), DELAY_LEGACY]:
        dev, (pinned, _, values), _ = emulate(_upload(kind), **schedule)
        assert pinned == (kind != "pageable")
        assert values == [1.0] * 4 and races(dev) == set(), schedule


def _download(kind: str):
    def program():
        side = torch.cuda.Stream()
        x = torch.zeros(4, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            x.add_(3)
            if kind == "into-pinned":
                host = torch.zeros(4, pin_memory=True)
                host.copy_(x, non_blocking=True)  # download-copy
            elif kind == "pageable":
                host = torch.zeros(4)
                host.copy_(x, non_blocking=True)  # pageable: the host waits anyway
            else:
                host = x.to("cpu", non_blocking=True)  # download-to
            done = torch.cuda.Event()
            done.record()
        if kind in ("synchronized", "pageable"):
            done.synchronize()
        values = host.tolist()  # host-reads-download
        torch.cuda.synchronize()
        return host.is_pinned(), values
    return program


@pytest.mark.parametrize("kind, copy", [("to", "download-to"), ("into-pinned", "download-copy")])
def test_a_pinned_download_read_before_its_event_synchronized_is_a_raw_that_strikes(kind, copy):
    dev, (pinned, values), _ = emulate(_download(kind), **DELAY_S1)
    assert pinned and values == [0.0] * 4
    assert races(dev) == {("RAW", line(copy), line("host-reads-download"))}


@pytest.mark.parametrize("kind", ["synchronized", "pageable"])
def test_a_download_synchronized_or_into_pageable_memory_is_clean_and_right(kind):
    dev, (pinned, values), _ = emulate(_download(kind), **DELAY_S1)
    assert pinned == (kind == "synchronized") and values == [3.0] * 4 and races(dev) == set()


PINNED_HOST_WRITES = {
    "setitem": lambda src: src.__setitem__(0, 7.0),  # pinned-write-setitem
    "copy_": lambda src: src.copy_(torch.full((4,), 7.0)),  # pinned-write-copy_
    "add_": lambda src: src.add_(6.0),  # pinned-write-add_
}


@pytest.mark.parametrize("write", list(PINNED_HOST_WRITES))
def test_every_host_write_to_a_pinned_source_is_an_access_the_pending_copy_races_with(write):
    def program():
        src = torch.ones(4, pin_memory=True)
        dst = src.to("cuda", non_blocking=True)  # pinned-upload
        PINNED_HOST_WRITES[write](src)
        doubled = (src * 2).tolist()  # a host read of the source: no race with the copy's read
        return dst.tolist(), doubled

    dev, (values, doubled), _ = emulate(program, **DELAY_LEGACY)
    assert values != [1.0] * 4 and values[0] == 7.0 and doubled[0] == 14.0
    assert races(dev) == {("WAR", line("pinned-upload"), line(f"pinned-write-{write}"))}


PINNED_HOST_READS = {
    "item": lambda host: host[0].item(),  # pinned-read-item
    "sum": lambda host: host.sum().item(),  # pinned-read-sum
    "repr": lambda host: repr(host),  # pinned-read-repr
}


@pytest.mark.parametrize("read", list(PINNED_HOST_READS))
def test_every_host_read_of_a_pending_pinned_download_is_a_raw(read):
    def program():
        x = torch.full((4,), 3.0, device="cuda")
        host = x.to("cpu", non_blocking=True)  # pinned-download
        value = PINNED_HOST_READS[read](host)
        torch.cuda.synchronize()
        return value, PINNED_HOST_READS[read](host)

    dev, (early, late), _ = emulate(program, **DELAY_LEGACY)
    assert (early, late) == {"item": (0.0, 3.0), "sum": (0.0, 12.0),
                             "repr": ("tensor([0., 0., 0., 0.])", "tensor([3., 3., 3., 3.])")}[read]
    assert races(dev) == {("RAW", line("pinned-download"), line(f"pinned-read-{read}"))}


def test_a_pinned_tensors_numpy_view_holds_its_values_or_is_refused_in_one_line():
    def program():
        src = torch.arange(4.0, pin_memory=True)
        try:
            return src.numpy().tolist()
        except EmulationError as exc:
            return str(exc)

    _, got, _ = emulate(program)
    assert got == [0.0, 1.0, 2.0, 3.0] or ("numpy" in got and "\n" not in got)


@pytest.mark.parametrize("synchronized", [False, True], ids=["written-while-upload-pending", "after-sync"])
def test_a_write_through_a_pinned_numpy_view_is_the_hosts_write_of_those_bytes(synchronized):
    """A host view (record/host_views.py): the host writes the staging tensor through its numpy view
    while the upload from it may be pending; only the bytes it writes count."""
    def program():
        side = torch.cuda.Stream()
        staging = torch.zeros(8, pin_memory=True)
        view = staging.numpy()
        out = torch.zeros(8, device="cuda")
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            out.copy_(staging, non_blocking=True)  # view-upload
        if synchronized:
            side.synchronize()
        view[2:4] = 7.0  # view-write
        view[6]  # a read: no race with the upload's read
        torch.cuda.synchronize()
        return out.tolist()

    dev, got, _ = emulate(program)
    assert got == [0.0] * 8
    if synchronized:
        assert races(dev) == set()
    else:
        assert races(dev) == {("WAR", line("view-upload"), line("view-write"))}
        (race,) = dev.races
        assert (race.start, race.stop) == (8, 16)


@pytest.mark.parametrize("masked", [True, False], ids=["boolean-mask", "integer-index"])
def test_an_assignment_through_a_boolean_mask_makes_the_host_wait_as_cudas_nonzero_does(masked):
    """`x[mask] = v` turns the mask into indices on the host (ATen's expandTensors: nonzero), so the
    host waited for the stream: a later write on another stream is ordered; an integer index is not."""
    def program():
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        x = torch.arange(4.0, device="cuda")
        index = x > 1 if masked else torch.tensor([2, 3], device="cuda")
        torch.cuda.synchronize()
        with torch.cuda.stream(s1):
            x[index] = 0.0  # mask-assign
        with torch.cuda.stream(s2):
            index.zero_()  # index-overwritten
        torch.cuda.synchronize()
        return x.tolist()

    dev, got, _ = emulate(program)
    assert got == [0.0, 1.0, 0.0, 0.0]
    assert races(dev) == (set() if masked else {("WAR", line("mask-assign"), line("index-overwritten"))})


# --- the caching allocator -------------------------------------------------------------------------------

def _reuse(record: bool):
    def program():
        main = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        a = torch.full((256,), 1.0, device="cuda")
        side.wait_stream(main)
        with torch.cuda.stream(side):
            doubled = a * 2  # side-reads-block
        if record:
            a.record_stream(side)
        freed_ptr = a.data_ptr()
        del a  # block-freed
        b = torch.full((256,), 9.0, device="cuda")  # next-owner
        reused = b.data_ptr() == freed_ptr
        main.wait_stream(side)
        values = doubled.tolist()
        side.synchronize()
        c = torch.full((256,), 5.0, device="cuda")  # b still lives: only a's block can be reused
        return reused, values[0], c.data_ptr() == freed_ptr
    return program


def test_a_block_freed_without_record_stream_is_reused_at_once_and_the_pending_read_sees_the_new_owner():
    dev, (reused, value, _), _ = emulate(_reuse(False))
    assert reused and value == 2.0  # sequential: the reuse happened, the read came first
    assert races(dev) == {("FREE", line("side-reads-block"), line("block-freed"))}
    dev, (reused, value, _), _ = emulate(_reuse(False), **DELAY_S1)
    assert reused and value == 18.0  # the held read ran after the next owner's fill: 9 * 2
    assert races(dev) == {("FREE", line("side-reads-block"), line("block-freed"))}


def test_record_stream_defers_the_reuse_until_the_other_stream_passed_the_free():
    dev, (reused, value, reused_later), _ = emulate(_reuse(True), **DELAY_S1)
    assert not reused and value == 2.0 and reused_later  # other bytes while pending; the same once it passed
    assert races(dev) == set()
    dev, (reused, value, _), _ = emulate(_reuse(True))
    assert reused and value == 2.0 and races(dev) == set()  # sequential: the event had passed already
    for schedule in RACE_FREE_SCHEDULES:
        dev, (_, value, _), _ = emulate(_reuse(True), **schedule)
        assert value == 2.0 and races(dev) == set(), schedule


def test_resizing_a_storage_to_zero_frees_its_block_now_as_fsdp_does():
    def program():
        main = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        a = torch.ones(256, device="cuda")
        side.wait_stream(main)
        with torch.cuda.stream(side):
            doubled = a * 2  # resize-reader
        a.untyped_storage().resize_(0)  # resize-free
        b = torch.full((256,), 9.0, device="cuda")
        main.wait_stream(side)
        return a.untyped_storage().nbytes(), doubled[0].item(), b[0].item()

    dev, got, _ = emulate(program, **DELAY_S1)
    assert got == (0, 18.0, 9.0)  # the held read saw the next owner's bytes
    assert races(dev) == {("FREE", line("resize-reader"), line("resize-free"))}


def test_blocks_allocated_in_a_capture_stay_the_graphs_and_eager_allocations_never_get_them():
    def program():
        x = torch.ones(256, device="cuda")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            tmp = x * 2
            y = tmp + 1
            graph_ptrs = {tmp.data_ptr(), y.data_ptr()}
            del tmp  # freed in the capture: still the graph's, its replays write it
        g.replay()
        z = torch.full((256,), 5.0, device="cuda")
        w = torch.full((256,), 6.0, device="cuda")
        x.fill_(3.0)
        g.replay()
        return y.tolist()[:2], {z.data_ptr(), w.data_ptr()} & graph_ptrs, z[0].item(), w[0].item()

    for schedule in [dict(policy="sequential"), dict(policy="random", seed=3), dict(policy="pct", seed=1)]:
        dev, got, _ = emulate(program, **schedule)
        assert got == ([7.0, 7.0], set(), 5.0, 6.0) and races(dev) == set(), schedule


# --- torch.cuda._sleep -------------------------------------------------------------------------------------

def _sleeper(join: bool):
    def program():
        main = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        buf = torch.zeros(4, device="cuda")
        side.wait_stream(main)
        with torch.cuda.stream(side):
            torch.cuda._sleep(50_000_000)
            buf.fill_(1.0)  # slept-producer
        if join:
            main.wait_stream(side)
        values = (buf * 1).tolist()  # slept-consumer
        torch.cuda.synchronize()
        return values
    return program


def test_sleep_makes_the_programs_own_race_strike_under_eager_and_never_under_sequential():
    dev, values, _ = emulate(_sleeper(False), policy="eager")
    assert values == [0.0] * 4
    assert races(dev) == {("RAW", line("slept-producer"), line("slept-consumer"))}
    dev, values, _ = emulate(_sleeper(False))
    assert values == [1.0] * 4 and races(dev) == {("RAW", line("slept-producer"), line("slept-consumer"))}
    for policy in ("eager", "sequential"):
        dev, values, _ = emulate(_sleeper(True), policy=policy)
        assert values == [1.0] * 4 and races(dev) == set()


# --- CUDA graphs ------------------------------------------------------------------------------------------

def test_a_captured_graph_computes_nothing_until_replayed_and_then_reads_the_current_inputs():
    def program():
        x = torch.ones(4, device="cuda")
        y = torch.zeros(4, device="cuda")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            capturing = torch.cuda.is_current_stream_capturing()
            y.copy_(x * 3 + 1)
        after_capture = y.tolist()
        x.fill_(2.0)
        g.replay()
        first = y.tolist()
        x.fill_(-1.0)
        g.replay()
        return capturing, torch.cuda.is_current_stream_capturing(), after_capture, first, y.tolist()

    for schedule in [dict(policy="sequential"), dict(policy="random", seed=1), dict(policy="delay", seed=0)]:
        dev, got, emulation = emulate(program, **schedule)
        assert got == (True, False, [0.0] * 4, [7.0] * 4, [-2.0] * 4), schedule
        assert races(dev) == set() and emulation.capture_errors == []


def test_a_capture_that_forks_a_stream_and_never_joins_it_is_refused_as_cuda_does():
    def program(join):
        x = torch.ones(4, device="cuda")
        g = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        with torch.cuda.graph(g):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                y = x * 2
            if join:
                torch.cuda.current_stream().wait_stream(side)
        g.replay()
        torch.cuda.synchronize()
        return y.tolist()

    def unjoined():
        with pytest.raises(torch.AcceleratorError) as caught:  # torch's exception on a GPU
            program(False)
        return caught.value

    _, error, emulation = emulate(unjoined)
    assert str(error).startswith("CUDA error: capturing stream has unjoined work")  # as torch says it on a GPU
    assert error.capture_error.code == "cudaErrorStreamCaptureUnjoined"
    assert [e.code for e in emulation.capture_errors] == ["cudaErrorStreamCaptureUnjoined"]
    dev, values, emulation = emulate(lambda: program(True))
    assert values == [2.0] * 4 and emulation.capture_errors == [] and races(dev) == set()


@pytest.mark.parametrize("sync", ["device", "stream", "item"])
def test_a_synchronize_inside_a_capture_fails_there_and_invalidates_the_capture(sync):
    def program():
        x = torch.ones(4, device="cuda")
        g = torch.cuda.CUDAGraph()
        reached = []
        with pytest.raises(torch.AcceleratorError) as caught:
            with torch.cuda.graph(g):
                y = x * 2
                if sync == "device":
                    torch.cuda.synchronize()  # sync-in-capture-device
                elif sync == "stream":
                    torch.cuda.current_stream().synchronize()  # sync-in-capture-stream
                else:
                    y.sum().item()  # sync-in-capture-item
                reached.append(True)
        after = (x + 1).tolist()  # the device works on after the refused capture
        return caught.value, reached, after

    _, (error, reached, after), emulation = emulate(program)
    assert error.capture_error.code == "cudaErrorStreamCaptureInvalidated" and reached == []  # raised at the sync
    cause = error.capture_error.__context__  # the sync CUDA refused inside the capture
    assert isinstance(cause, CaptureError) and cause.code == "cudaErrorStreamCaptureUnsupported"
    assert f"{HERE.name}:{line(f'sync-in-capture-{sync}')}" in str(cause)
    assert [e.code for e in emulation.capture_errors] == ["cudaErrorStreamCaptureInvalidated"] and after == [2.0] * 4


def test_graphs_sharing_a_pool_replay_in_order_and_a_replay_on_a_side_stream_is_that_streams_work():
    def shared():
        x = torch.ones(256, device="cuda")
        g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(g1):
            y = x * 2
        with torch.cuda.graph(g2, pool=g1.pool()):
            z = y + 1
        x.fill_(3.0)
        g1.replay()
        g2.replay()
        return y[0].item(), z[0].item()

    for schedule in [dict(policy="sequential"), dict(policy="random", seed=2)]:
        dev, got, _ = emulate(shared, **schedule)
        assert got == (6.0, 7.0) and races(dev) == set(), schedule

    def side_replay():
        x = torch.ones(4, device="cuda")
        out = torch.zeros(4, device="cuda")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):  # torch's own capture stream: it numbers none of the program's
            out.copy_(x * 5)  # captured-writer
        side = torch.cuda.Stream()  # s1
        with torch.cuda.stream(side):
            g.replay()
        values = out.tolist()  # reads-replayed
        torch.cuda.synchronize()
        return values

    dev, values, _ = emulate(side_replay, policy="delay", streams=["s1"], steps=8)
    assert values == [0.0] * 4
    assert races(dev) == {("RAW", line("captured-writer"), line("reads-replayed"))}


# --- refusals ------------------------------------------------------------------------------------------------

def _refuse_backward():
    y = torch.ones(3, device="cuda").sum()
    y.backward()  # refused-backward


def _refuse_autograd_backward():
    torch.autograd.backward(torch.ones(3, device="cuda").sum())  # refused-autograd-backward


def _refuse_autograd_grad():
    x = torch.ones(3, device="cuda")
    torch.autograd.grad(x.sum(), x)  # refused-autograd-grad


def _refuse_external_stream():
    torch.cuda.ExternalStream(0x1234)  # refused-external-stream


def _refuse_graphed_callables():
    torch.cuda.make_graphed_callables(torch.nn.Identity(), (torch.ones(2, device="cuda"),))  # refused-graphed


def _refuse_cupy():
    import cupy  # noqa: F401  # refused-cupy


_CUDA_ONLY = torch.library.Library("streamcheck_emulation_test", "DEF")
_CUDA_ONLY.define("twice(Tensor x) -> Tensor")
_CUDA_ONLY.impl("twice", lambda x: x * 2, "CUDA")


def _refuse_cuda_only_operator():
    torch.ops.streamcheck_emulation_test.twice(torch.ones(2, device="cuda"))  # refused-operator


# Refused where this process has no native CUDA guard (it runs them where it has: test_autograd.py).
_WITHOUT_GUARD = pytest.mark.skipif(native.loaded(), reason="this process has the native CUDA guard: autograd runs")
REFUSALS = [
    pytest.param(_refuse_backward, "refused-backward", "backward()", marks=_WITHOUT_GUARD),
    pytest.param(_refuse_autograd_backward, "refused-autograd-backward", "torch.autograd.backward",
                 marks=_WITHOUT_GUARD),
    pytest.param(_refuse_autograd_grad, "refused-autograd-grad", "torch.autograd.grad", marks=_WITHOUT_GUARD),
    (_refuse_external_stream, "refused-external-stream", "torch.cuda.ExternalStream"),
    (_refuse_graphed_callables, "refused-graphed", "make_graphed_callables"),
    (_refuse_cupy, "refused-cupy", "import cupy"),
    (_refuse_cuda_only_operator, "refused-operator", "streamcheck_emulation_test::twice"),
]


@pytest.mark.parametrize("program, tag, named", REFUSALS, ids=[
    "backward", "autograd.backward", "autograd.grad", "ExternalStream", "make_graphed_callables", "cupy",
    "cuda-only-operator"])
def test_a_surface_the_sim_does_not_model_is_refused_in_one_line_naming_it_and_the_callers_line(program, tag, named):
    def run():
        with pytest.raises(EmulationError) as caught:
            program()
        return str(caught.value)

    _, message, _ = emulate(run)
    assert "\n" not in message and named in message, message
    assert f"{HERE.name}:{line(tag)}" in message, message


def test_import_cupy_under_the_sim_is_an_import_error_so_a_fallback_path_runs():
    def program():
        try:
            import cupy as xp  # noqa: F401
        except ImportError:
            xp = torch
        return xp is torch, (torch.ones(2, device="cuda") * 3).tolist()

    _, (fell_back, values), _ = emulate(program)
    assert fell_back and values == [3.0, 3.0]


def test_stream_id_streams_are_refused_and_streams_are_named_in_creation_order():
    def program():
        with pytest.raises(EmulationError, match=r"stream_id"):
            torch.cuda.Stream(stream_id=3)
        return [torch.cuda.Stream().device_stream.name for _ in range(3)]

    _, names, _ = emulate(program)
    assert names == ["s1", "s2", "s3"]


# A CPU-only torch aborts the whole process (c10::Error, terminate) when autograd asks for a CUDA device
# guard: this runs in a child process, so an abort fails one test instead of ending the session.
_GRAD_MODE = textwrap.dedent("""
    import torch
    from streamcheck.device import Device
    from streamcheck.emulation.torch_cuda import Emulation, EmulationError


    def forward():
        x = torch.ones(3, device="cuda", requires_grad=True)
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2, device="cuda")  # its parameters require grad
        return (x * 2).sum().item(), model(x[None]).sum().item()


    with Emulation(Device("sim", policy="sequential")):
        try:
            print(*forward())
            with torch.no_grad():
                print(*forward())
        except EmulationError as exc:
            print("refused:", exc)
""")


def test_a_forward_pass_with_tensors_that_require_grad_never_aborts_the_process():
    done = subprocess.run([sys.executable, "-c", _GRAD_MODE], capture_output=True, text=True, timeout=120,
                          cwd=HERE.parents[3])
    assert done.returncode == 0, done.stderr[-400:]
    lines = done.stdout.strip().splitlines()
    if lines and lines[0].startswith("refused:"):
        assert len(lines) == 1 and "autograd" in lines[0], lines  # one line, before anything could abort
        return
    grad_mode, no_grad = lines  # the same values with and without grad mode
    assert grad_mode == no_grad and float(grad_mode.split()[0]) == 6.0, lines


# --- torch.compile -----------------------------------------------------------------------------------------

def test_compiled_functions_run_as_eager_operators_with_a_notice_and_graph_trees_add_theirs():
    def scaled(a):
        return a * 2 + 1

    def program():
        eager = torch.compile(scaled)(torch.ones(2, device="cuda")).tolist()
        first = list(active().notices)

        @torch.compile(mode="reduce-overhead")
        def trees(a):
            return scaled(a)

        return eager, first, trees(torch.full((2,), 3.0, device="cuda")).tolist()

    _, (eager, first, trees), emulation = emulate(program)
    assert eager == [3.0, 3.0] and trees == [7.0, 7.0]
    assert len(first) == 1 and "eager operators" in first[0]
    assert emulation.notices[0] == first[0] and len(emulation.notices) == 2
    assert "reduce-overhead" in emulation.notices[1] and "graph trees are not emulated" in emulation.notices[1]


def test_a_compiled_function_with_a_missing_wait_is_still_reported_between_the_users_lines():
    def consume(t):
        return t + 1  # compiled-consumer

    def program():
        compiled = torch.compile(consume)
        side = torch.cuda.Stream()
        buf = torch.zeros(4, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            buf.fill_(2.0)  # compiled-producer
        values = compiled(buf).tolist()
        torch.cuda.synchronize()
        return values

    dev, values, _ = emulate(program, **DELAY_S1)
    assert values == [1.0] * 4
    assert races(dev) == {("RAW", line("compiled-producer"), line("compiled-consumer"))}


# --- dtypes: values as torch's CPU kernels compute them ------------------------------------------------------

def _dtype_ops(device: str):
    torch.manual_seed(0)
    a = torch.randn(8, 8).to(device)
    b = torch.randn(8, 8).to(device)
    out = {}
    for dtype in (torch.float16, torch.bfloat16):
        x, y = a.to(dtype), b.to(dtype)
        out[f"{dtype} matmul"] = (x @ y).cpu()
        out[f"{dtype} softmax"] = torch.softmax(x, dim=-1).cpu()
        out[f"{dtype} sum"] = x.sum(dim=0).cpu()
        out[f"{dtype} to f32"] = (x.float() * 3).cpu()
    i = torch.arange(-7, 9, dtype=torch.int32).to(device)
    out["int div"] = torch.div(i, 3, rounding_mode="floor").cpu()
    out["int remainder"] = (i % 5).cpu()
    out["int bitwise"] = ((i << 2) ^ 0x5).cpu()
    out["int8 wrap"] = (i.to(torch.int8) * 40).cpu()
    out["int64 cumsum"] = i.long().cumsum(0).cpu()
    return out


def test_half_bfloat16_and_integer_values_are_torch_cpu_kernels_values():
    expected = _dtype_ops("cpu")
    dev, got, _ = emulate(lambda: _dtype_ops("cuda"))
    assert got.keys() == expected.keys()
    for name in expected:
        assert got[name].dtype == expected[name].dtype and torch.equal(got[name], expected[name]), name
    assert races(dev) == set()


# --- composite functions whose C++ needs a CUDA kernel ------------------------------------------------

def test_scaled_dot_product_attention_is_one_kernel_with_the_cpu_values_and_its_reads_checked():
    torch.manual_seed(0)
    q0 = torch.randn(1, 2, 5, 8)
    want = torch.nn.functional.scaled_dot_product_attention(q0 + 1, q0 + 1, q0 + 1, is_causal=True)

    def program(wait: bool):
        side = torch.cuda.Stream()
        q = q0.cuda()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            q.add_(1.0)  # sdpa-producer
        if wait:
            torch.cuda.current_stream().wait_stream(side)
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)  # sdpa-reader
        return out.cpu()

    dev, got, _ = emulate(lambda: program(wait=True))
    assert dev.races == [] and torch.allclose(got, want)
    dev, _, _ = emulate(lambda: program(wait=False))
    assert ("RAW", line("sdpa-producer"), line("sdpa-reader")) in races(dev)


# --- the run and the garbage collector ----------------------------------------------------------------------

def test_a_run_freezes_what_existed_collects_its_own_cycles_and_leaves_nothing_frozen():
    import gc
    import weakref

    class Node:
        pass

    assert gc.get_freeze_count() == 0

    def program():
        assert gc.get_freeze_count() > 0  # torch's objects and this test's, not walked by the run's collections
        t = torch.ones(4, device="cuda")
        node = Node()
        node.self, node.tensor = node, t  # the program's own cyclic garbage, holding a CUDA tensor
        gone = weakref.ref(node)
        held = torch.cuda.memory_allocated()
        del node, t
        gc.collect()
        return gone() is None, held, torch.cuda.memory_allocated()

    dev, (collected_in_run, held, after), emulation = emulate(program)
    assert collected_in_run and held == 512 and after == 0  # its block went back to the allocator
    assert gc.get_freeze_count() == 0  # ordinary again afterwards


def test_a_run_leaves_a_freeze_the_process_made_itself():
    import gc

    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        emulate(lambda: torch.ones(2, device="cuda").tolist())
        assert gc.get_freeze_count() > frozen // 2  # still frozen (a few died meanwhile), not unfrozen by the run
    finally:
        gc.unfreeze()


def test_a_missing_wait_stream_is_reported_at_the_users_lines():
    def program():
        main = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        a = torch.ones(8, device="cuda") * 2
        side.wait_stream(main)  # joined
        with torch.cuda.stream(side):
            b = a + 1  # side-consumer
        c = b * 3  # reader-without-wait
        main.wait_stream(side)  # too late
        return c.tolist()

    dev, _, _ = emulate(program)
    assert races(dev) == {("RAW", line("side-consumer"), line("reader-without-wait"))}
    waits = [op for op in dev.trace if type(op).__name__ == "StreamWait"]
    assert [op.site.line for op in waits] == [line("joined"), line("too late")]
