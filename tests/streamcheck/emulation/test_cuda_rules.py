"""CUDA's and torch's rules that programs rely on without seeing them, each checked where it shows:
whether the host waited (a stream `query()` right after the call, under a schedule that holds the
stream), which stream waits for which, which allocation gets a freed block, how sizes round.
Each test fails if its rule is dropped or bent (issue 37's surviving mutants)."""
from __future__ import annotations

import pytest
import torch

from tests.streamcheck.emulation.tagged import emulate, tagged_lines

line = tagged_lines(__file__)
HELD_LEGACY = dict(policy="delay", streams=["legacy"], steps=50)  # the default stream's work stays pending


def races(dev) -> set:
    return {(r.kind, r.first.site.line, r.second.site.line) for r in dev.races}


def _pending_work_then(copy):
    """Work left pending on the default stream, then `copy(x)`: whether the stream was done right after."""
    def program():
        x = torch.zeros(1024, device="cuda")
        x.add_(1)  # pending under HELD_LEGACY
        copy(x)
        done = torch.cuda.current_stream().query()
        torch.cuda.synchronize()
        return done
    return program


@pytest.mark.parametrize("copy, host_waits", [
    # From pageable memory the copy is staged and synchronous, non_blocking or not.
    (lambda x: x.copy_(torch.ones(1024), non_blocking=True), True),
    (lambda x: x.copy_(torch.ones(1024)), True),
    (lambda x: torch.ones(1024).cuda(), True),
    (lambda x: torch.ones(1024).to("cuda", non_blocking=True), True),
    # From pinned memory only a blocking copy waits; a non_blocking one stays pending on the stream.
    (lambda x: torch.ones(1024).pin_memory().cuda(), True),
    (lambda x: torch.ones(1024).pin_memory().to("cuda", non_blocking=True), False),
    (lambda x: x.copy_(torch.ones(1024).pin_memory(), non_blocking=True), False),
], ids=["copy_-pageable-non_blocking", "copy_-pageable", "cuda()-pageable", "to-pageable-non_blocking",
        "cuda()-pinned", "to-pinned-non_blocking", "copy_-pinned-non_blocking"])
def test_the_host_waits_for_an_upload_unless_it_is_non_blocking_from_pinned_memory(copy, host_waits):
    _, done, _ = emulate(_pending_work_then(copy), **HELD_LEGACY)
    assert done is host_waits
    _, done, _ = emulate(_pending_work_then(lambda x: None), **HELD_LEGACY)
    assert done is False  # the schedule does hold the stream: `done` above is the copy's doing


def test_a_peer_copy_makes_the_source_stream_wait_for_it():
    def program():
        x = torch.full((256,), 3.0, device="cuda:0")
        y = x.to("cuda:1")  # peer-copy
        x.fill_(5.0)  # source-rewritten: after the copy read x, on cuda:0's stream
        return y.tolist(), x.tolist()

    for schedule in (dict(policy="sequential"), dict(policy="delay", streams=["legacy:1"], steps=20),
                     dict(policy="delay", streams=["legacy"], steps=20)):
        dev, (y, x), _ = emulate(program, devices=2, **schedule)
        assert races(dev) == set(), schedule
        assert y == [3.0] * 256 and x == [5.0] * 256, schedule


def test_a_freed_block_is_reused_only_by_an_allocation_on_its_own_stream():
    def program():
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            a = torch.ones(1000, device="cuda")
        ptr = a.data_ptr()
        del a
        on_default = torch.empty(1000, device="cuda")  # another stream: never the freed block
        with torch.cuda.stream(side):
            on_side = torch.empty(1000, device="cuda")  # its own stream: the freed block at once
        return ptr, on_default.data_ptr(), on_side.data_ptr()

    _, (ptr, on_default, on_side), _ = emulate(program)
    assert on_default != ptr and on_side == ptr


@pytest.mark.parametrize("nbytes, reserved", [(1, 512), (511, 512), (512, 512), (513, 1024), (4096, 4096),
                                              (4097, 4608)])
def test_allocations_round_to_whole_512_byte_units(nbytes, reserved):
    def program():
        t = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        return torch.cuda.memory_allocated(), t

    _, (allocated, _), _ = emulate(program)
    assert allocated == reserved


def test_event_wait_makes_the_current_stream_wait():
    def program(consume_on_waiter: bool):
        producer, waiter = torch.cuda.Stream(), torch.cuda.Stream()
        x = torch.zeros(64, device="cuda")
        producer.wait_stream(torch.cuda.current_stream())
        waiter.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(producer):
            x.fill_(1.0)  # ev-producer
            ev = torch.cuda.Event()
            ev.record()
        with torch.cuda.stream(waiter):
            ev.wait()  # the waiter is current here: it, not the default stream, waits
            if consume_on_waiter:
                y = x * 2  # ev-consumer-waited
        if not consume_on_waiter:
            y = x * 2  # ev-consumer-unwaited
        main = torch.cuda.current_stream()
        main.wait_stream(producer)  # joined before the read-back and the frees
        main.wait_stream(waiter)
        return y.tolist()

    held = dict(policy="delay", streams=["s1"], steps=20)
    dev, y, _ = emulate(lambda: program(True), **held)
    assert races(dev) == set() and y == [2.0] * 64
    dev, y, _ = emulate(lambda: program(False), **held)
    assert races(dev) == {("RAW", line("ev-producer"), line("ev-consumer-unwaited"))}
    assert y == [0.0] * 64  # the default stream never waited: it read before the held producer wrote


@pytest.mark.parametrize("start_timed, end_timed", [(True, False), (False, True), (False, False)])
def test_elapsed_time_needs_both_events_created_with_timing(start_timed, end_timed):
    def program():
        start, end = torch.cuda.Event(enable_timing=start_timed), torch.cuda.Event(enable_timing=end_timed)
        start.record()
        end.record()
        torch.cuda.synchronize()
        with pytest.raises(ValueError, match="enable_timing=True"):  # torch's CUDAEvent: a ValueError
            start.elapsed_time(end)
        return True

    assert emulate(program)[1] is True


@pytest.mark.parametrize("factory", [lambda: torch.zeros(3, device="cuda", requires_grad=True),
                                     lambda: torch.randn(3, device="cuda", requires_grad=True),
                                     lambda: torch.ones(3).to("cuda").requires_grad_()])
def test_a_cuda_tensor_made_to_require_grad_does(factory):
    def program():
        t = factory()
        return t.requires_grad, t.is_leaf, t.device.type

    assert emulate(program)[1] == (True, True, "cuda")
