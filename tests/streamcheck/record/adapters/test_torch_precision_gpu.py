"""Issue 37's precision rules under the GPU recorder, on a real GPU (they cannot run without one):

    pytest -m gpu tests/streamcheck/record/adapters/test_torch_precision_gpu.py

- operators that hand the host a value (torch.equal, allclose, tolist, item, bool(), nonzero,
  masked_select, unique, repeat_interleave without output_size, a boolean mask) make the host wait
  for their stream: a write on another stream issued after them is ordered (on an H100, equal,
  allclose and tolist followed by such a write were reported as races);
- torch's CachingHostAllocator: a fresh pinned staging tensor per step is never a race, one staging
  tensor rewritten while its upload is pending is;
- a free is not a reuse: the allocation that gets a block too early is the FREE race, a free that
  nothing reuses a hazard (a race with strict_free);
- a numpy view of a pinned tensor read before the non_blocking copy into it is synchronized.
The programs of tests/gpu_programs/torch/ (run by test_torch_programs_gpu.py) cover the same rules
as whole scripts under `streamcheck run`.
"""
from __future__ import annotations

import importlib.util

import pytest

N = 1 << 20


def _gpu_torch():
    if importlib.util.find_spec("torch") is None:
        pytest.skip("needs torch with CUDA (torch is not installed)")
    import torch

    if not torch.cuda.is_available():
        pytest.skip(f"needs an NVIDIA GPU that torch can use (torch {torch.__version__} sees no CUDA device)")
    return torch


def _recorded(program, **options):
    torch = _gpu_torch()
    from streamcheck.record import instrument

    with instrument.instrument(**options) as session:
        program(torch)
        torch.cuda.synchronize()
    return session


HOST_VALUED = {
    "equal": lambda torch, x: torch.equal(x, x),
    "allclose": lambda torch, x: torch.allclose(x, x),
    "tolist": lambda torch, x: x[:4].tolist(),
    "item": lambda torch, x: x.sum().item(),
    "bool": lambda torch, x: bool(x[0]),
    "nonzero": lambda torch, x: torch.nonzero(x),
    "masked_select": lambda torch, x: torch.masked_select(x, x > 0),
    "unique": lambda torch, x: torch.unique(x),
    "repeat_interleave": lambda torch, x: torch.repeat_interleave(x[:4].long()),
    "boolean-mask": lambda torch, x: x[x > 0],
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(HOST_VALUED))
def test_an_operator_that_hands_the_host_a_value_orders_a_write_on_another_stream(name):
    def program(torch):
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        x = torch.ones(N, device="cuda")
        torch.cuda.synchronize()
        with torch.cuda.stream(s1):
            x.mul_(2)
            HOST_VALUED[name](torch, x)  # the host waits for s1 inside
        with torch.cuda.stream(s2):
            x.zero_()  # issued after that wait: ordered
    session = _recorded(program)
    assert session.races == [], session.report()


@pytest.mark.gpu
def test_without_a_host_value_the_same_write_races():
    def program(torch):
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        x = torch.ones(N, device="cuda")
        torch.cuda.synchronize()
        with torch.cuda.stream(s1):
            x.mul_(2)
            torch.eq(x, x).all()  # stays on the device
        with torch.cuda.stream(s2):
            x.zero_()
    session = _recorded(program)
    assert {r.kind for r in session.races} >= {"WAR"}, session.report()


@pytest.mark.gpu
@pytest.mark.parametrize("fresh", [True, False], ids=["fresh-staging-per-step", "one-staging-rewritten"])
def test_pinned_staging_reuse_follows_the_caching_host_allocator(fresh):
    def program(torch):
        upload = torch.cuda.Stream()
        rows = torch.zeros(8, N, device="cuda")
        staging = torch.empty(N, pin_memory=True)
        torch.cuda.synchronize()
        for step in range(8):
            if fresh:
                staging = torch.empty(N, pin_memory=True)
            staging.fill_(float(step))
            with torch.cuda.stream(upload):
                rows[step].copy_(staging, non_blocking=True)
    session = _recorded(program)
    if fresh:
        assert session.races == [], session.report()
    else:
        assert [r.kind for r in session.races] == ["WAR"], session.report()


def _prefetch(torch, wait: bool) -> None:
    prefetch, compute = torch.cuda.Stream(), torch.cuda.Stream()
    sums = torch.zeros(8, N, device="cuda")
    torch.cuda.synchronize()
    for step in range(8):
        if wait:
            prefetch.wait_stream(compute)
        with torch.cuda.stream(prefetch):
            batch = torch.full((N,), float(step), device="cuda")
        compute.wait_stream(prefetch)
        with torch.cuda.stream(compute):
            torch.add(batch, 0.0, out=sums[step])
        del batch
    torch.cuda.current_stream().wait_stream(compute)  # before `sums` is freed (its writes are compute's)


@pytest.mark.gpu
@pytest.mark.parametrize("wait", [False, True], ids=["reused-too-early", "prefetch-waits-before-allocating"])
def test_a_free_is_a_race_only_once_an_allocation_gets_the_block_too_early(wait):
    session = _recorded(lambda torch: _prefetch(torch, wait))
    if wait:
        assert session.races == [], session.report()
        assert [h.race.kind for h in session.hazards] == ["FREE"]  # the last batch: nothing reuses it
    else:
        assert "FREE" in {r.kind for r in session.races}, session.report()


@pytest.mark.gpu
def test_strict_free_reports_the_last_batchs_free_as_a_race():
    session = _recorded(lambda torch: _prefetch(torch, True), strict_free=True)
    assert [r.kind for r in session.races] == ["FREE"] and session.hazards == [], session.report()


@pytest.mark.gpu
@pytest.mark.parametrize("synchronized", [False, True], ids=["read-before-sync", "read-after-sync"])
def test_a_numpy_view_of_pinned_memory_read_before_the_copy_is_synchronized_races(synchronized):
    def program(torch):
        s1 = torch.cuda.Stream()
        counts = torch.ones(N, device="cuda")
        pinned = torch.zeros(N, pin_memory=True)
        view = pinned.numpy()
        torch.cuda.synchronize()
        with torch.cuda.stream(s1):
            counts.mul_(2)
            pinned.copy_(counts, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
            if synchronized:
                ready.synchronize()
            float(view[0])
    session = _recorded(program)
    if synchronized:
        assert session.races == [], session.report()
    else:
        assert [(r.kind, r.second.name) for r in session.races] == [("RAW", "host view read")], session.report()
