"""torch.cuda's legacy tensor types on the sim: `torch.cuda.FloatTensor(3)`, `torch.cuda.LongTensor([1, 2])`
make emulated tensors as a GPU build makes CUDA ones, and `isinstance(t, torch.cuda.FloatTensor)` holds for
an emulated float32 tensor. Typed CUDA storages (`torch.cuda.FloatStorage`) and the legacy sparse types
(`torch.cuda.sparse.FloatTensor`) are refused in one line.
"""
from __future__ import annotations

import torch

from ..device.objects import caller_site
from .running import EmulationError, active
from .tensors import CudaTensor

# torch.cuda's dense legacy types and their dtypes (torch/csrc/tensor/python_tensor.cpp's list).
TENSOR_TYPES = {
    "BFloat16Tensor": torch.bfloat16, "BoolTensor": torch.bool, "ByteTensor": torch.uint8, "CharTensor": torch.int8,
    "DoubleTensor": torch.float64, "FloatTensor": torch.float32, "HalfTensor": torch.float16,
    "IntTensor": torch.int32, "LongTensor": torch.int64, "ShortTensor": torch.int16,
}
STORAGE_TYPES = ("BFloat16Storage", "BoolStorage", "ByteStorage", "CharStorage", "ComplexDoubleStorage",
                 "ComplexFloatStorage", "DoubleStorage", "FloatStorage", "HalfStorage", "IntStorage", "LongStorage",
                 "ShortStorage")


class _LegacyTensorType(type):
    """A legacy constructor: called, an emulated tensor of its dtype; `isinstance` true of those."""

    def __call__(cls, *args, device=None):
        emulation = active()
        index = emulation.current_device() if device is None else emulation.device_index(device)
        where = torch.device("cuda", index)
        if len(args) == 1 and isinstance(args[0], torch.Tensor):  # an alias of a tensor of this very type
            other = args[0]
            if not isinstance(other, cls):
                raise TypeError(f"expected {cls.__module__}.{cls.__name__} (got {other.type()})")
            return other.view_as(other)
        if len(args) == 1 and isinstance(args[0], (list, tuple)) and not isinstance(args[0], torch.Size):
            return torch.tensor(args[0], dtype=cls.dtype, device=where)  # data
        sizes = args[0] if len(args) == 1 and isinstance(args[0], torch.Size) else args or (0,)  # (): empty
        if not all(isinstance(n, int) for n in sizes):
            raise TypeError(f"{cls.__module__}.{cls.__name__}() takes sizes (ints), a sequence of values or a "
                            f"{cls.__name__}, got {tuple(type(a).__name__ for a in args)}")
        return torch.empty(tuple(sizes), dtype=cls.dtype, device=where)  # uninitialized, as torch makes it

    def __instancecheck__(cls, obj):
        return type(obj) is CudaTensor and obj.dtype == cls.dtype

    def __subclasscheck__(cls, sub):
        return False


def legacy_tensor_type(name: str):
    """The emulated stand-in for torch.cuda.<name> (e.g. FloatTensor)."""
    return _LegacyTensorType(name, (), {"__module__": "torch.cuda", "dtype": TENSOR_TYPES[name], "is_cuda": True,
                                        "is_sparse": False, "layout": torch.strided})


class _RefusedType(type):
    """A type whose construction is refused in one line; no emulated object is an instance of it."""

    def __call__(cls, *args, **kwargs):
        raise EmulationError(f"{cls.__module__}.{cls.__name__} at {caller_site()}: {cls.why}")

    def __instancecheck__(cls, obj):
        return False

    def __subclasscheck__(cls, sub):
        return False


def refused_type(module: str, name: str, why: str):
    return _RefusedType(name, (), {"__module__": module, "why": why})


STORAGE_REFUSAL = ("typed CUDA storages (deprecated in torch) are not emulated; make a tensor "
                   "(torch.empty(n, dtype=..., device='cuda')) and use its untyped_storage()")
SPARSE_REFUSAL = ("sparse CUDA tensors are not emulated (the sim's tensors are strided); use a dense tensor, or "
                  "check this program on a GPU (streamcheck run --backend gpu)")
