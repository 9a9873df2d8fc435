"""torch.cuda.get_device_properties on the sim."""
from __future__ import annotations

TOTAL_MEMORY = 80 * (1 << 30)  # the emulated device's memory (reported; never enforced)


class DeviceProperties:
    """torch.cuda.get_device_properties on the sim: an H100-like device that says it is emulated."""

    def __init__(self, index: int):
        self.name = "streamcheck sim (emulated CUDA device)"
        self.major, self.minor = 9, 0
        self.total_memory = TOTAL_MEMORY
        self.multi_processor_count = 132
        self.is_integrated = 0
        self.is_multi_gpu_board = 0
        self.L2_cache_size = 50 * (1 << 20)
        self.warp_size = 32
        self.max_threads_per_multi_processor = 2048
        self.regs_per_multiprocessor = 65536
        self.uuid = f"sim-{index}"
        self.index = index

    def __repr__(self) -> str:
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // (1 << 20)}MB, multi_processor_count="
                f"{self.multi_processor_count})")


