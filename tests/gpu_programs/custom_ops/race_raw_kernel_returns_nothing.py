"""A custom operator that writes through a raw pointer and declares nothing (RAW).

`fill_raw(Tensor x, float value) -> ()` is defined with `torch.library.Library.define`; its
CUDA implementation is a Triton kernel that stores into `x` through its pointer, so no version
counter moves. An operator that declares no written argument and returns no tensor can only
have had an effect by writing: streamcheck assumes it writes every tensor argument (and says
so in a note). It runs on a side stream; the default stream then reads `x` with no wait.
The fix (fixed_raw_kernel_returns_nothing.py): declare the write (`Tensor(a!) x`) and make the
default stream wait for the side stream.
"""
import torch
import triton
import triton.language as tl

N = 1 << 20
STEPS = 4


@triton.jit
def _fill(x_ptr, value, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offsets, value, mask=offsets < n)


def _fill_raw(x, value):
    _fill[(triton.cdiv(x.numel(), 1024),)](x, value, x.numel(), BLOCK=1024)


lib = torch.library.Library("sc_programs", "FRAGMENT")
lib.define("fill_raw(Tensor x, float value) -> ()")  # BUG: the schema does not say x is written
lib.impl("fill_raw", _fill_raw, "CUDA")

side = torch.cuda.Stream()
x = torch.zeros(N, device="cuda")
torch.cuda.synchronize()
for step in range(STEPS):
    side.wait_stream(torch.cuda.current_stream())  # the side stream's write comes after the last read
    with torch.cuda.stream(side):
        torch.ops.sc_programs.fill_raw(x, float(step))  # RACE: the write, on the side stream
    doubled = x * 2.0  # RACE: the read, on the default stream, with no wait for the side stream
    torch.cuda.current_stream().wait_stream(side)
torch.cuda.synchronize()
print("RESULT", float(doubled[0]))
