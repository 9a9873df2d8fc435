"""torch.cuda.get_device_properties on the sim."""
from __future__ import annotations

import uuid

# The namespace of the emulated devices' UUIDs: each device index gets the same UUID in every run,
# as a GPU keeps its own.
_UUID_NAMESPACE = uuid.UUID("5c0ff1ce-5eed-4c0d-a5e1-5712ea3c8ec0")


class DeviceProperties:
    """torch.cuda.get_device_properties on the sim: an H100-like device that says it is emulated,
    with the emulation's memory capacity as its total memory. One object per device and run (as
    torch hands out its cached properties): two calls compare equal."""

    def __init__(self, index: int, total_memory: int):
        self.name = "streamcheck sim (emulated CUDA device)"
        self.major, self.minor = 9, 0
        self.total_memory = total_memory
        self.multi_processor_count = 132
        self.is_integrated = 0
        self.is_multi_gpu_board = 0
        self.L2_cache_size = 50 * (1 << 20)
        self.warp_size = 32
        self.max_threads_per_multi_processor = 2048
        self.regs_per_multiprocessor = 65536
        # A real device's UUID prints as 8-4-4-4-12 hex digits and has 16 bytes, as uuid.UUID does.
        self.uuid = uuid.uuid5(_UUID_NAMESPACE, f"streamcheck sim device {index}")
        self.index = index

    def _identity(self) -> tuple:
        return self.name, self.index, self.uuid, self.total_memory

    def __eq__(self, other) -> bool:
        return isinstance(other, DeviceProperties) and other._identity() == self._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def __repr__(self) -> str:
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // (1 << 20)}MB, multi_processor_count="
                f"{self.multi_processor_count}, uuid={self.uuid})")
