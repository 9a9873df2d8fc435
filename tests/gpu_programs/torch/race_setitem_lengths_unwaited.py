"""A batch's lengths written on an input-preparation stream and read on the compute stream without
an edge (RAW).

Rebuilds a bug of serving engines that prepare each step's inputs on a side stream so the
preparation overlaps the previous step's compute: the number of valid tokens of each request is
counted and written into a persistent buffer, `self.seq_lens[:n] = (ids != -1).sum(dim=1)` (a
setitem whose value is a CUDA tensor). The compute stream then reads the buffer; nothing orders it
after the preparation stream, so it reads the previous step's lengths.
The fix the projects shipped: `torch.cuda.current_stream().wait_stream(prep)` before the compute
stream reads the prepared inputs (fixed_setitem_lengths_unwaited.py).
"""
# expect: RAW
# delay: --delay-stream s1
# strikes: yes
import torch

from _torch_common import N, STEPS, report

WIDTH = 4  # token slots per request
ROWS = N // WIDTH  # requests the batch can hold


class InputBatch:
    def __init__(self):
        self.ids = torch.full((ROWS, WIDTH), -1, dtype=torch.int32, device="cuda")
        self.seq_lens = torch.zeros(ROWS, dtype=torch.int64, device="cuda")

    def prepare(self, n: int, length: int, token: int) -> None:
        self.ids.fill_(-1)
        self.ids[:n, :length] = token
        self.seq_lens[:n] = (self.ids[:n] != -1).sum(dim=1)  # the lengths, written on s1


prep = torch.cuda.Stream()  # s1: the input-preparation stream
batch = InputBatch()
torch.cuda.synchronize()
observed, expected = [], []
for step in range(1, STEPS + 1):
    n, length = ROWS - step, step % WIDTH + 1
    with torch.cuda.stream(prep):
        batch.prepare(n, length, token=step)
    # BUG: no torch.cuda.current_stream().wait_stream(prep) here
    total = batch.seq_lens[:n].sum()  # the lengths, read on the legacy stream
    observed.append(float(total.item()))
    expected.append(float(n * length))
report(observed, expected)
