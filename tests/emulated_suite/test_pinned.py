"""Pinned host memory: non_blocking copies both ways, a staging buffer, a DataLoader with
pin_memory=True."""
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

N = 1 << 14
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@requires_cuda
def test_non_blocking_round_trip_through_pinned_memory():
    host = torch.arange(N, dtype=torch.float32).pin_memory()
    assert host.is_pinned()
    on_gpu = host.to("cuda", non_blocking=True)
    back = torch.empty(N, pin_memory=True)
    back.copy_(on_gpu * 2, non_blocking=True)
    torch.cuda.current_stream().synchronize()
    assert torch.equal(back, host * 2)


@requires_cuda
def test_race_pinned_read_before_sync():
    x = torch.arange(N, dtype=torch.float32, device="cuda")
    x.mul_(2)
    host = x.to("cpu", non_blocking=True)  # pinned; the copy is still queued
    # BUG: read before the copy is known to be done
    assert host[-1].item() == 2 * (N - 1)


@requires_cuda
def test_fixed_pinned_read_before_sync():
    x = torch.arange(N, dtype=torch.float32, device="cuda")
    x.mul_(2)
    host = x.to("cpu", non_blocking=True)  # pinned; the copy is still queued
    copied = torch.cuda.Event()
    copied.record()
    copied.synchronize()
    assert host[-1].item() == 2 * (N - 1)


@requires_cuda
def test_race_pinned_staging_rewritten():
    staging = torch.empty(N, pin_memory=True)
    uploaded = []
    for step in range(3):
        staging.fill_(float(step))  # the host writes the next batch
        # BUG: the next fill_ may run before this copy read the staging buffer
        uploaded.append(staging.to("cuda", non_blocking=True))
    assert [t[0].item() for t in uploaded] == [0.0, 1.0, 2.0]


@requires_cuda
def test_fixed_pinned_staging_rewritten():
    staging = torch.empty(N, pin_memory=True)
    uploaded = []
    for step in range(3):
        staging.fill_(float(step))  # the host writes the next batch
        uploaded.append(staging.to("cuda", non_blocking=True))
        copied = torch.cuda.Event()
        copied.record()
        copied.synchronize()  # the copy has read the staging buffer
    assert [t[0].item() for t in uploaded] == [0.0, 1.0, 2.0]


@requires_cuda
@pytest.mark.parametrize("num_workers", [0, 1])
def test_dataloader_pinned_batches_reach_the_gpu(num_workers):
    samples = torch.arange(64 * 4, dtype=torch.float32).reshape(64, 4)
    loader = DataLoader(TensorDataset(samples), batch_size=16, pin_memory=True, num_workers=num_workers)
    total = torch.zeros(4, device="cuda")
    for (batch,) in loader:
        assert batch.is_pinned()
        total += batch.to("cuda", non_blocking=True).sum(dim=0)
    assert torch.allclose(total.cpu(), samples.sum(dim=0))
