"""What the emulation tests share: a program run on a fresh sim device under the emulation, and the
lines of a test file found by their `# <tag>` comments (a race is asserted at the test's own lines)."""
from __future__ import annotations

from pathlib import Path

from streamcheck.device import Device
from streamcheck.emulation.torch_cuda import Emulation


def emulate(program, *, devices: int = 1, policy: str = "sequential", **params):
    """Run `program()` on a fresh sim device under the emulation: (device, what it returned, emulation)."""
    dev = Device("sim", policy=policy, devices=devices, **params)
    with Emulation(dev) as emulation:
        value = program()
    return dev, value, emulation


def tagged_lines(test_file: str):
    """`line(tag)`: the line of `test_file` that ends with the comment `# <tag>` (exactly one)."""
    lines = Path(test_file).read_text(encoding="utf-8").splitlines()

    def line(tag: str) -> int:
        hits = [n for n, text in enumerate(lines, 1) if text.rstrip().endswith(f"# {tag}")]
        assert len(hits) == 1, f"tag {tag!r} marks {len(hits)} lines"
        return hits[0]
    return line


def races_at(test_file: str):
    """`races(dev)`: (kind, first line, second line) of each race of `dev`; every access must be at a line
    of `test_file` (the test's own)."""
    name = Path(test_file).name

    def races(dev) -> set:
        found = set()
        for r in dev.races:
            for access in (r.first, r.second):
                assert Path(access.site.file).name == name, f"a race at a line not the test's own:\n{r.format()}"
            found.add((r.kind, r.first.site.line, r.second.site.line))
        return found
    return races
