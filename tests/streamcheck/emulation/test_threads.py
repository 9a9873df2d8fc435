"""Host threads under the emulation (streamcheck/emulation/threads.py), on the sim: every thread makes
and uses emulated tensors, streams and events, with its own current stream; queues, thread start and
join are hand-offs; DataLoader's pin-memory thread gives pinned batches.

Each racy program sits beside its fixed twin: the racy one is reported (its kind, both accesses at lines
of this file found by their `# <tag>` comments) and, under a schedule that holds the producer's stream,
really reads stale bytes; the twin is clean and right under the same schedules.
"""
from __future__ import annotations

import queue
import textwrap
import threading

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from streamcheck.emulation.script import run_script
from streamcheck.emulation.tensors import CudaTensor, PinnedTensor
from tests.streamcheck.emulation.tagged import emulate, races_at, tagged_lines

line = tagged_lines(__file__)
races = races_at(__file__)
DELAY_S1 = dict(policy="delay", streams=["s1"], steps=8)  # s1: the first torch.cuda.Stream() of a run
DELAY_LEGACY = dict(policy="delay", streams=["legacy"], steps=8)
SCHEDULES = [dict(policy="random", seed=k) for k in range(2)] + [dict(policy="pct", seed=0), DELAY_S1]


def started(target, *args) -> threading.Thread:
    thread = threading.Thread(target=target, args=args)
    thread.start()
    return thread


# --- a producer thread, a consumer thread -----------------------------------------------------------

ROWS = 3
RIGHT = [[float(k)] * 4 for k in range(1, ROWS + 1)]


def _producer_consumer(waits: bool):
    """A producer thread makes each row on its own stream and queues it (with an event recorded
    after it); the main thread reads each row on its own current stream, after waiting for the
    event or not."""
    def program():
        side = torch.cuda.Stream()  # s1
        rows = queue.Queue()

        def producer():
            with torch.cuda.stream(side):
                for k in range(1, ROWS + 1):
                    row = torch.full((4,), float(k), device="cuda")  # produce
                    rows.put((row, side.record_event()))

        thread = started(producer)
        seen = []
        for _ in range(ROWS):
            row, ready = rows.get(timeout=30)
            if waits:
                torch.cuda.current_stream().wait_event(ready)
            seen.append((row * 1).tolist())  # consume
        thread.join()
        return seen
    return program


def test_a_consumer_thread_that_skips_the_producers_event_races_and_reads_stale_rows():
    dev, seen, _ = emulate(_producer_consumer(waits=False))
    assert seen == RIGHT  # the sequential reference: right, and the race found all the same
    assert races(dev) == {("RAW", line("produce"), line("consume"))}
    # s1 held for longer than the whole program: however far the producer thread runs ahead, every read is early.
    dev, seen, _ = emulate(_producer_consumer(waits=False), **dict(DELAY_S1, steps=1000))
    assert seen == [[0.0] * 4] * ROWS and races(dev) == {("RAW", line("produce"), line("consume"))}


def test_a_consumer_thread_that_waits_for_the_producers_event_is_clean_and_right_under_every_schedule():
    for schedule in [{}] + SCHEDULES:
        dev, seen, _ = emulate(_producer_consumer(waits=True), **schedule)
        assert seen == RIGHT and races(dev) == set(), schedule


def test_a_queue_carries_cuda_and_pinned_tensors_and_the_same_tensor_twice():
    def program():
        q = queue.Queue()
        made = {}

        def producer():
            made["cuda"] = torch.arange(4.0, device="cuda")
            made["pinned"] = torch.arange(3.0, pin_memory=True)
            for item in (made["cuda"], made["pinned"], made["cuda"]):
                q.put(item)

        started(producer).join()
        got = [q.get_nowait() for _ in range(3)]
        return [g is made[k] for g, k in zip(got, ("cuda", "pinned", "cuda"))], type(got[0]), type(got[1]), \
            got[0].tolist(), got[1].tolist()

    dev, (same, cuda_type, pinned_type, cuda_values, pinned_values), _ = emulate(program)
    assert same == [True, True, True] and (cuda_type, pinned_type) == (CudaTensor, PinnedTensor)
    assert cuda_values == [0.0, 1.0, 2.0, 3.0] and pinned_values == [0.0, 1.0, 2.0]
    assert races(dev) == set()


# --- per-thread current device and stream ------------------------------------------------------------

def test_each_thread_starts_on_device_0s_default_stream_and_its_settings_are_its_own():
    def program():
        main_side, worker_side = torch.cuda.Stream(), torch.cuda.Stream()
        torch.cuda.set_device(1)
        torch.cuda.set_stream(main_side)  # main's own current stream of cuda:0... once it is on cuda:0 again
        seen = {}
        worker_set = threading.Event()
        main_checked = threading.Event()

        def worker():
            seen["worker device"] = torch.cuda.current_device()
            seen["worker starts on default"] = torch.cuda.current_stream() == torch.cuda.default_stream(0)
            torch.cuda.set_stream(worker_side)
            seen["worker's own"] = torch.cuda.current_stream() == worker_side
            worker_set.set()
            main_checked.wait(30)
            seen["worker's kept"] = torch.cuda.current_stream() == worker_side

        thread = started(worker)
        worker_set.wait(30)
        seen["main device"] = torch.cuda.current_device()
        seen["main's kept"] = torch.cuda.current_stream(0) == main_side
        main_checked.set()
        thread.join()
        return seen

    _, seen, _ = emulate(program, devices=2)
    assert seen == {"worker device": 0, "worker starts on default": True, "worker's own": True,
                    "worker's kept": True, "main device": 1, "main's kept": True}


def test_a_thread_that_gets_an_ended_threads_ident_starts_fresh():
    def program():
        side = torch.cuda.Stream()
        setters, fresh = set(), []

        def setter():
            setters.add(threading.get_ident())
            torch.cuda.set_device(1)
            torch.cuda.set_stream(side)

        def checker():
            fresh.append((threading.get_ident() in setters, torch.cuda.current_device(),
                          torch.cuda.current_stream() == torch.cuda.default_stream(0)))

        for _ in range(4):
            started(setter).join()
            started(checker).join()  # Python (glibc) usually hands it the ended setter's ident
        return fresh

    _, fresh, _ = emulate(program, devices=2)
    if not any(reused for reused, _, _ in fresh):
        pytest.skip("no thread got an ended thread's ident here")
    assert [(device, default) for _, device, default in fresh] == [(0, True)] * 4


# --- start and join -----------------------------------------------------------------------------------

def _worker_then_join(synchronizes: bool):
    """A worker thread writes a tensor on its own stream (and synchronizes the device, or not); the
    main thread joins it and reads the tensor on its default stream."""
    def program():
        side = torch.cuda.Stream()  # s1
        out = torch.zeros(4, device="cuda")
        torch.cuda.synchronize()

        def worker():
            with torch.cuda.stream(side):
                out.fill_(7.0)  # worker writes
            if synchronizes:
                torch.cuda.synchronize()

        thread = started(worker)
        thread.join()
        values = (out + 0).tolist()  # joiner reads
        torch.cuda.synchronize()  # before `out` is freed
        return values
    return program


def test_a_worker_that_synchronized_is_ordered_before_its_joiner():
    for schedule in [{}] + SCHEDULES:
        dev, seen, _ = emulate(_worker_then_join(synchronizes=True), **schedule)
        assert seen == [7.0] * 4 and races(dev) == set(), schedule


def test_a_join_orders_the_host_not_the_workers_stream():
    dev, seen, _ = emulate(_worker_then_join(synchronizes=False), **DELAY_S1)
    assert seen == [0.0] * 4  # read before the held side stream wrote
    assert races(dev) == {("RAW", line("worker writes"), line("joiner reads"))}


def test_what_the_parent_did_before_start_is_ordered_before_the_child():
    def program():
        x = torch.zeros(4, device="cuda")
        x.fill_(3.0)  # parent writes
        torch.cuda.synchronize()
        got = []

        def child():
            side = torch.cuda.Stream()  # s1: nothing orders it with the legacy stream but the host's sync
            with torch.cuda.stream(side):
                got.append((x * 2).tolist())  # child reads

        started(child).join()
        return got[0]

    for schedule in [{}, DELAY_LEGACY]:
        dev, got, _ = emulate(program, **schedule)
        assert got == [6.0] * 4 and races(dev) == set(), schedule


# --- DataLoader(pin_memory=True) ---------------------------------------------------------------------

class _Rows(Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, index):
        return torch.full((4,), float(index))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_pinning_data_loader_gives_pinned_batches_whose_non_blocking_copies_are_right(workers):
    def program():
        loader = DataLoader(_Rows(), batch_size=2, pin_memory=True, num_workers=workers)
        kinds, sums = set(), []
        for batch in loader:
            kinds.add((type(batch), batch.is_pinned()))
            on_device = batch.to("cuda", non_blocking=True)
            sums.append(on_device.sum().item())
        return kinds, sums

    dev, (kinds, sums), _ = emulate(program)
    assert kinds == {(PinnedTensor, True)} and sums == [4.0, 20.0, 36.0] and races(dev) == set()


def _rewrites_pinned_batch(waits: bool):
    """Each pinned batch is sent with a non_blocking copy on a side stream, then the host scales it
    in place (reusing the batch's memory): before the copy ran, unless the host waited for it."""
    def program():
        loader = DataLoader(_Rows(), batch_size=2, pin_memory=True)
        side = torch.cuda.Stream()  # s1
        sent = []
        for batch in loader:
            with torch.cuda.stream(side):
                sent.append(batch.to("cuda", non_blocking=True))  # upload
                copied = side.record_event()
            if waits:
                copied.synchronize()
            batch.mul_(-1.0)  # host rewrites
        torch.cuda.synchronize()
        return [row.tolist() for t in sent for row in t]
    return program


RIGHT_ROWS = [[float(k)] * 4 for k in range(6)]


def test_a_pinned_batch_rewritten_by_the_host_before_its_upload_ran_is_a_war():
    dev, rows, _ = emulate(_rewrites_pinned_batch(waits=False))
    assert races(dev) == {("WAR", line("upload"), line("host rewrites"))}
    dev, rows, _ = emulate(_rewrites_pinned_batch(waits=False), **DELAY_S1)
    assert rows != RIGHT_ROWS and races(dev) == {("WAR", line("upload"), line("host rewrites"))}


def test_a_pinned_batch_rewritten_after_its_upload_completed_is_clean():
    for schedule in [{}, DELAY_S1]:
        dev, rows, _ = emulate(_rewrites_pinned_batch(waits=True), **schedule)
        assert rows == RIGHT_ROWS and races(dev) == set(), schedule


# --- threads that were running before; threads that raise ---------------------------------------------

def test_a_thread_running_before_the_emulation_uses_it_from_its_first_emulated_call():
    work, results = queue.Queue(), queue.Queue()

    def pool_worker():  # a pool's worker: started before the emulation, serving it
        while (task := work.get()) is not None:
            results.put(task())

    thread = started(pool_worker)
    try:
        def program():
            x = torch.arange(4.0, device="cuda")
            work.put(lambda: (x * 2).tolist())  # an operator on an emulated tensor: its first emulated call
            first = results.get(timeout=30)
            work.put(lambda: torch.full((2,), 5.0, device="cuda").tolist())  # then a factory works there too
            return first, results.get(timeout=30)

        _, (first, made), _ = emulate(program)
        assert first == [0.0, 2.0, 4.0, 6.0] and made == [5.0, 5.0]
        work.put(lambda: (torch.ones(2) + 1).tolist())  # after the emulation its mode passes calls through
        assert results.get(timeout=30) == [2.0, 2.0]
    finally:
        work.put(None)
        thread.join(30)


# The shape error in a thread is reported by threading, as without the emulation (pytest: a warning).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_thread_that_raises_does_not_hang_the_run_and_a_refusal_there_is_the_runs(tmp_path):
    script = tmp_path / "threads_raise.py"
    script.write_text(textwrap.dedent("""\
        import threading
        import torch

        def broken():
            torch.ones(2, device="cuda") + torch.ones(3, device="cuda")  # a shape error inside an operator

        def refused():
            torch.cuda.ExternalStream(1234)

        t = threading.Thread(target=broken)
        t.start()
        t.join()
        print("after", torch.arange(3.0, device="cuda").sum().item())  # the emulation still serves
        t = threading.Thread(target=refused)
        t.start()
        t.join()
        print("done")
        """), encoding="utf-8")
    run = run_script(str(script), timeout=60)
    assert run.timed_out == "" and run.stdout.splitlines() == ["after 3.0", "done"]
    assert run.status == 2 and run.error == "" and "\n" not in run.refused
    assert "torch.cuda.ExternalStream" in run.refused and f"{script.name}:8" in run.refused, run.refused
