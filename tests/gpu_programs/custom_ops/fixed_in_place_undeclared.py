"""The fixed twin of race_in_place_undeclared.py: `shift` declares its write
(`mutates_args=("x",)`) and the default stream waits for the side stream before it reads `x`.
"""
import torch

N = 1 << 20
STEPS = 4


@torch.library.custom_op("sc_programs::shift", mutates_args=("x",))
def shift(x: torch.Tensor) -> torch.Tensor:
    x.add_(1.0)
    return x.sum(0, keepdim=True)


side = torch.cuda.Stream()
x = torch.zeros(N, device="cuda")
torch.cuda.synchronize()
totals = []
for step in range(STEPS):
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        totals.append(shift(x))
    torch.cuda.current_stream().wait_stream(side)  # the fix: the read waits for the write
    doubled = x * 2.0
torch.cuda.synchronize()
print("RESULT", float(doubled[0]))
