"""A custom operator that writes its input in place without declaring it (RAW).

`shift` is registered with `torch.library.custom_op(..., mutates_args=())`, yet its
implementation adds to `x` in place. It runs on a side stream; the default stream then reads
`x` with no wait for the side stream. streamcheck finds the write by `x`'s version counter
(the schema does not declare it) and reports the race between the two lines marked below.
The fix (fixed_in_place_undeclared.py): declare the write (`mutates_args=("x",)`) and make
the default stream wait for the side stream before the read.
"""
import torch

N = 1 << 20
STEPS = 4


@torch.library.custom_op("sc_programs::shift", mutates_args=())
def shift(x: torch.Tensor) -> torch.Tensor:
    x.add_(1.0)  # BUG: writes x, though mutates_args says it writes nothing
    return x.sum(0, keepdim=True)


side = torch.cuda.Stream()
x = torch.zeros(N, device="cuda")
torch.cuda.synchronize()
totals = []
for step in range(STEPS):
    side.wait_stream(torch.cuda.current_stream())  # the side stream's write comes after the last read
    with torch.cuda.stream(side):
        totals.append(shift(x))  # RACE: the write, on the side stream
    doubled = x * 2.0  # RACE: the read, on the default stream, with no wait for the side stream
    torch.cuda.current_stream().wait_stream(side)
torch.cuda.synchronize()
print("RESULT", float(doubled[0]))
