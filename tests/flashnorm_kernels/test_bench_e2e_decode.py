"""benchmarks/bench_e2e_decode.py on the CPU: the script's logic, not its numbers.

The GPU run (bf16, a 7B-shaped model) is the lead's; here the tiny model in fp32 checks that
the table has a row per (variant, batch) with numbers, that folding (Prop 1) generates the same
tokens as the plain model, and that the profiler's CUDA accounting counts kernels, not ranges.
"""
import importlib.util
import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests.paths import ROOT

SCRIPT = ROOT / "benchmarks" / "bench_e2e_decode.py"
# | (a) HF eager | batch | µs | tokens/s | vs (a) | leading equal/of | method | repeats |
ROW = re.compile(r"^\| \((a|b)\) [^|]+\| (\d+) \| ([0-9.]+) \| ([0-9.]+) \| [^|]+\| (\d+)/(\d+) \| steps \| 1 \|$",
                 re.M)


def load_script():
    spec = importlib.util.spec_from_file_location("bench_e2e_decode", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(out, *options):
    env = dict(os.environ, OUT=str(out), OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--device", "cpu", *options],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, json.loads((out / "bench_e2e_decode.json").read_text())


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    return run_script(tmp_path_factory.mktemp("out"), "--variants", "a,b", "--new-tokens", "4", "--repeats", "1")


def test_table_has_a_row_with_numbers_per_variant_and_batch(tiny_run):
    stdout, _ = tiny_run
    rows = {(m[0], int(m[1])): m for m in ROW.findall(stdout)}
    assert set(rows) == {("a", 1), ("a", 16), ("b", 1), ("b", 16)}, stdout
    for variant, batch in rows:
        us, tokens_per_s = float(rows[variant, batch][2]), float(rows[variant, batch][3])
        assert us > 0
        # tokens/s is batch / step time: the two columns are one measurement.
        assert tokens_per_s == pytest.approx(batch * 1e6 / us, rel=2e-3)


def test_folded_model_generates_the_plain_models_tokens_in_fp32(tiny_run):
    stdout, result = tiny_run
    for batch in (1, 16):
        row = result["rows"]["b"][str(batch)]
        assert row["agree"] == [4] * batch, stdout  # every sequence, every token
    assert {m[4:] for m in ROW.findall(stdout) if m[0] == "b"} == {("4", "4")}


def test_share_is_a_fraction_and_the_amdahl_line_says_what_is_missing(tiny_run):
    stdout, result = tiny_run
    for batch in ("1", "16"):
        share = result["share"][batch]
        assert 0 < share["share"] < 1
        assert share["share"] == pytest.approx(share["norm_share"] + share["proj_share"])
        assert result["isolated"][batch]["error"].startswith("not measured: needs CUDA")
    assert "Amdahl comparison not made: missing isolated speedup" in stdout


def test_one_call_variant_is_timed_by_difference_and_makes_the_same_tokens(tmp_path):
    # `as` (hf_cuda.greedy_decode with a StaticCache) is timed as (T(N) - T(N/4)) / (3N/4), the way
    # the CUDA-graph variants are; on the CPU it is the one variant that exercises that path.
    stdout, result = run_script(tmp_path, "--variants", "a,as", "--batches", "2", "--new-tokens", "8",
                                "--repeats", "1", "--profile-steps", "0")
    row = result["rows"]["as"]["2"]
    assert row["method"] == "diff" and row["repeats"] == 1
    assert row["agree"] == [8, 8], stdout  # fp32: the static cache changes no greedy token
    line = next(line for line in stdout.splitlines() if line.startswith("| (as)"))
    assert f"| {row['us_per_step']:.1f} |" in line and "| 8/8 | diff | 1 |" in line
    assert "batch 2: share of decode in norm + projection: not measured: --profile-steps 0" in stdout


def _event(name, device_type, kernels=(), children=(), us=0.0, annotation=False):
    return SimpleNamespace(name=name, device_type=device_type, is_user_annotation=annotation,
                           kernels=[SimpleNamespace(name=k, duration=d) for k, d in kernels],
                           cpu_children=list(children), time_range=SimpleNamespace(elapsed_us=lambda: us),
                           cpu_time_total=0.0)


def test_cuda_share_counts_kernels_inside_the_ranges_not_their_gpu_annotations():
    torch = pytest.importorskip("torch")
    from torch.autograd import DeviceType

    bench = load_script()
    cpu, cuda = DeviceType.CPU, DeviceType.CUDA
    # A norm range whose op launched 2 µs of kernels (and whose GPU annotation spans 9 µs), a
    # projection range with a nested op (5 µs GEMV), and 13 µs of attention kernels outside.
    norm_op = _event("aten::mul", cpu, kernels=[("mul_kernel", 2.0)])
    norm = _event(bench.NORM_LABEL, cpu, kernels=[(bench.NORM_LABEL, 9.0)], children=[norm_op])
    mm = _event("aten::mm", cpu, kernels=[("gemv", 5.0)])
    proj = _event(bench.PROJ_LABEL, cpu, children=[_event("aten::linear", cpu, children=[mm])])
    device = [_event("mul_kernel", cuda, us=2.0), _event("gemv", cuda, us=5.0), _event("attn", cuda, us=13.0),
              _event(bench.NORM_LABEL, cuda, us=9.0, annotation=True)]
    share = bench.share_from_events(torch, [norm, norm_op, proj, mm, *device], cuda=True, wall_us=1e9)
    assert share["total_us"] == 20.0
    assert share["norm_share"] == pytest.approx(2 / 20)
    assert share["proj_share"] == pytest.approx(5 / 20)


def test_amdahl_fraction_of_the_expected_gain():
    bench = load_script()
    # s = 0.5 of the time sped up 2x: expected 1/(0.5 + 0.25) = 1.333x, 25 % less time.
    # Measured 100 -> 87.5 µs: 12.5 % less time, half of the expected saving.
    result = bench.amdahl(0.5, 2.0, 100.0, 87.5)
    assert result["expected_speedup"] == pytest.approx(4 / 3)
    assert result["measured_speedup"] == pytest.approx(100 / 87.5)
    assert result["fraction_reaching_model"] == pytest.approx(0.5)


def test_leading_equal_stops_at_the_first_difference():
    torch = pytest.importorskip("torch")
    bench = load_script()
    ref = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    got = torch.tensor([[1, 2, 9, 4], [5, 6, 7, 8]])  # the 4 after the 9 does not count
    assert bench.leading_equal(ref, got) == [2, 4]
