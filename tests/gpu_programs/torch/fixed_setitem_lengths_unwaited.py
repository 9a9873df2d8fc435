"""Fixed twin of race_setitem_lengths_unwaited.py: the compute stream waits for the preparation
stream (`wait_stream`) before it reads the lengths the preparation wrote."""
# expect: clean
# delay: --delay-stream s1
# strikes: no
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
    torch.cuda.current_stream().wait_stream(prep)  # THE FIX: the lengths are written before they are read
    total = batch.seq_lens[:n].sum()  # the lengths, read on the legacy stream
    observed.append(float(total.item()))
    expected.append(float(n * length))
report(observed, expected)
