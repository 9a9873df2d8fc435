"""The fixed twin of race_raw_kernel_returns_nothing.py: the schema declares the write
(`Tensor(a!) x`) and the default stream waits for the side stream before it reads `x`.
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
lib.define("fill_raw(Tensor(a!) x, float value) -> ()")
lib.impl("fill_raw", _fill_raw, "CUDA")

side = torch.cuda.Stream()
x = torch.zeros(N, device="cuda")
torch.cuda.synchronize()
for step in range(STEPS):
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.ops.sc_programs.fill_raw(x, float(step))
    torch.cuda.current_stream().wait_stream(side)  # the fix: the read waits for the write
    doubled = x * 2.0
torch.cuda.synchronize()
print("RESULT", float(doubled[0]))
