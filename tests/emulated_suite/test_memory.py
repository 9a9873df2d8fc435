"""The caching allocator's statistics, as a memory regression test reads them."""
import pytest
import torch

TEST_CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.skipif(not TEST_CUDA, reason="CUDA not available"), pytest.mark.usefixtures("clean_memory")]

MiB = 1 << 20


def test_allocated_grows_by_the_tensor_and_returns_after_del():
    before = torch.cuda.memory_allocated()
    x = torch.empty(MiB, dtype=torch.float32, device="cuda")  # 4 MiB: a multiple of the allocator's rounding
    assert torch.cuda.memory_allocated() - before == 4 * MiB
    assert torch.cuda.memory_reserved() >= torch.cuda.memory_allocated()
    del x
    assert torch.cuda.memory_allocated() == before


def test_peak_is_kept_until_reset():
    before = torch.cuda.memory_allocated()
    x = torch.empty(2 * MiB, dtype=torch.uint8, device="cuda")
    del x
    assert torch.cuda.max_memory_allocated() >= before + 2 * MiB
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()


def test_memory_stats_agree_with_the_shortcuts():
    x = torch.ones(MiB, device="cuda")
    stats = torch.cuda.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.cuda.memory_allocated()
    assert stats["reserved_bytes.all.current"] == torch.cuda.memory_reserved()
    assert stats["allocated_bytes.all.peak"] >= 4 * MiB
    assert stats["num_alloc_retries"] == 0 and stats["num_ooms"] == 0
    assert "Allocated memory" in torch.cuda.memory_summary()
    del x


def test_freed_block_is_reused_by_the_next_allocation_of_its_size():
    x = torch.empty(MiB, device="cuda")
    address = x.data_ptr()
    del x
    y = torch.empty(MiB, device="cuda")
    assert y.data_ptr() == address  # the caching allocator hands the cached block back


def test_empty_cache_gives_unused_memory_back():
    # 64 MiB: a segment of its own (torch rounds requests over 10 MiB to 2 MiB and never shares them), so
    # no other test's tensor keeps it reserved
    x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    reserved = torch.cuda.memory_reserved()
    del x
    assert torch.cuda.memory_reserved() == reserved  # cached, not given back yet
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() < reserved


def test_mem_get_info_reports_free_and_total():
    free, total = torch.cuda.mem_get_info()
    assert 0 < free <= total


def test_allocating_more_than_the_device_holds_raises_out_of_memory():
    total = torch.cuda.get_device_properties(0).total_memory
    with pytest.raises(torch.cuda.OutOfMemoryError):
        torch.empty(2 * total, dtype=torch.uint8, device="cuda")
    assert torch.cuda.memory_stats()["num_ooms"] == 1
