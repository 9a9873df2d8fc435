"""PNG timeline: draws the lanes, the racing pair in red and the missing wait."""
from __future__ import annotations

import struct

import numpy as np
import pytest

pytest.importorskip("matplotlib", reason="render_timeline needs matplotlib (the test extra)")

from streamcheck.device import Device  # noqa: E402
from streamcheck.pictures.timeline import render_timeline  # noqa: E402



from tests.streamcheck.pictures.test_export import implicit_join as _implicit_join, matmul, postscale, rms  # noqa: E402  (one home)


def implicit_join(post="C", steps=8, join=False):
    """The export tests' implicit-join program, with stream A held back longer for the picture."""
    return _implicit_join(post, steps, join)


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
RED = np.array([215, 25, 28]) / 255  # the race colour


def png_size(path) -> tuple:
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == PNG_SIGNATURE, "not a PNG"
    assert head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def red_pixels(path) -> int:
    from matplotlib.image import imread

    pixels = imread(str(path))[..., :3]
    return int((np.abs(pixels - RED).max(axis=-1) < 0.08).sum())


def test_implicit_join_timeline_shows_the_race_and_the_missing_wait(tmp_path):
    dev, value = implicit_join("C", steps=8)  # A runs late: post-scale reads the stale Y
    assert np.all(value == 0.0)
    path = tmp_path / "timeline.png"
    drawn = render_timeline(dev, path)

    width, height = png_size(path)
    assert (width, height) == drawn["size"]
    assert 800 <= width <= 3000 and 300 <= height <= 1500
    assert red_pixels(path) > 2000  # two red boxes, the dashed arrow and the marker

    assert drawn["lanes"] == ["host thread 0", "stream A (non_blocking)", "stream B (non_blocking)",
                              "stream C (non_blocking)"]
    roles = {(h["name"], h["lane"], h["role"]) for h in drawn["highlighted"]}
    assert roles == {("matmul", "stream A (non_blocking)", "first"), ("postscale", "stream C (non_blocking)", "second")}
    labels = {h["name"]: h["label"] for h in drawn["highlighted"]}
    assert labels == {"matmul": "matmul\nwrites Y", "postscale": "postscale\nreads Y"}
    assert {b["name"] for b in drawn["boxes"]} >= {"matmul", "rms", "postscale", "record rms_done", "wait rms_done"}

    # The dashed arrow runs from the matmul's end back to where the post-scale started.
    boxes = {b["name"]: b for b in drawn["boxes"]}
    (missing,) = drawn["missing"]
    assert missing["from"] == ("stream A (non_blocking)", boxes["matmul"]["end"])
    assert missing["to"] == ("stream C (non_blocking)", boxes["postscale"]["start"])
    assert boxes["postscale"]["start"] < boxes["matmul"]["end"]
    assert missing["label"].startswith("missing wait: stream C must wait for stream A")

    (arrow,) = [a for a in drawn["arrows"] if a["kind"] == "event"]
    assert arrow["from"] == ("stream B (non_blocking)", boxes["record rms_done"]["end"])
    assert arrow["to"] == ("stream C (non_blocking)", boxes["wait rms_done"]["start"])

    assert drawn["title"].startswith("RAW race on `Y`")
    assert "`postscale` (stream C) reads Y before `matmul` (stream A) finished" in drawn["title"]


def test_race_that_did_not_strike_says_so(tmp_path):
    dev = Device("sim")  # eager: the matmul happens to finish first
    x = dev.alloc((1, 8), name="x", fill=1.0)
    w = dev.alloc((8, 8), name="W", fill=0.5)
    y = dev.alloc((1, 8), name="Y", fill=0.0)
    r = dev.alloc((1, 1), name="r", fill=0.0)
    out = dev.alloc((1, 8), name="out", fill=0.0)
    a, b = dev.stream("A"), dev.stream("B")
    dev.launch(matmul, (x, w, y), stream=a, reads=[x, w], writes=[y])
    dev.launch(rms, (x, r), stream=b, reads=[x], writes=[r])
    dev.legacy.wait_event(b.record())
    dev.launch(postscale, (y, r, out), reads=[y, r], writes=[out])  # legacy stream
    drawn = render_timeline(dev, tmp_path / "t.png")
    assert "did not strike" in drawn["title"]
    (missing,) = drawn["missing"]
    assert missing["from"][0] == "stream A (non_blocking)" and missing["to"][0] == "legacy default stream"
    assert missing["from"][1] <= missing["to"][1]


def test_fixed_program_draws_no_race(tmp_path):
    dev, value = implicit_join("C", steps=8, join=True)
    assert np.allclose(value, 4.0)
    path = tmp_path / "fixed.png"
    drawn = render_timeline(dev, path, title="fixed: post-scale waits on both")
    assert drawn["title"] == "fixed: post-scale waits on both"
    assert drawn["highlighted"] == [] and drawn["missing"] == []
    assert {a["label"] for a in drawn["arrows"]} == {"event rms_done", "event mm_done"}
    assert red_pixels(path) == 0


def test_long_run_zooms_to_the_first_race(tmp_path):
    dev = Device("sim", policy="delay", streams=["A"], steps=6)
    y = dev.alloc((1, 8), name="Y", fill=0.0)
    out = dev.alloc((25, 8), name="out", fill=0.0)
    a = dev.stream("A")
    for t in range(25):
        dev.launch(lambda v: v.fill(1.0), (y,), stream=a, writes=[y], name="produce")
        dev.launch(lambda v, o: o.__setitem__(..., v), (y, out[t:t + 1]), reads=[y], writes=[out[t:t + 1]],
                   name="consume")
        dev.legacy.synchronize()
    drawn = render_timeline(dev, tmp_path / "long.png")
    x0, x1 = drawn["window"]
    full = max(b for _, b in dev.backend.op_times.values())
    assert x1 - x0 < full / 2
    assert {h["name"] for h in drawn["highlighted"]} == {"produce", "consume"}
    for h in drawn["highlighted"]:
        box = next(b for b in drawn["boxes"] if b["index"] == h["index"])
        assert x0 <= box["start"] and box["end"] <= x1
    assert png_size(tmp_path / "long.png")[0] <= 22 * 120

    whole = render_timeline(dev, tmp_path / "whole.png", window=(0, full))
    assert whole["window"] == (0, full) and len(whole["boxes"]) > len(drawn["boxes"])
    with pytest.raises(ValueError, match="end > start"):
        render_timeline(dev, tmp_path / "bad.png", window=(5, 5))


def test_gpu_clock_draws_injected_delays_and_measured_times(tmp_path):
    from streamcheck.core import trace as T

    dev, _ = implicit_join("C", steps=8)
    launches = [i for i, op in enumerate(dev.trace.ops) if isinstance(op, T.Launch)]
    measured = {launches[0]: (2300.0, 2310.0), launches[1]: (100.0, 120.0), launches[2]: (140.0, 145.0)}
    drawn = render_timeline({"trace": dev.trace, "op_times": measured, "clock": "us", "backend": "cupy",
                             "delays": [(launches[0], "A", 2000.0)]}, tmp_path / "gpu.png")
    boxes = {b["name"]: b for b in drawn["boxes"]}
    assert (boxes["matmul"]["start"], boxes["matmul"]["end"]) == (2200.0, 2210.0)  # origin: first timed start
    (delay,) = drawn["delays"]
    assert delay["lane"] == "stream A (non_blocking)" and delay["end"] == boxes["matmul"]["start"]
    assert drawn["missing"][0]["to"] == ("stream C (non_blocking)", boxes["postscale"]["start"])
    assert "before `matmul` (stream A) finished" in drawn["title"]


def pipeline_decode(steps: int = 3):
    """FlashNorm's dual-stream pipeline with the talk's plan and a model's long group names, its
    matmul held back: the picture `repro --timeline` draws, with names that crowd it."""
    from flashnorm_kernels.pipeline import DeferredNormProjection
    from flashnorm_kernels.plan import SyncPlan

    dev = Device("sim", policy="delay", streams=["layers.0.input_layernorm.A"], kernels=["matmul"], steps=8)
    module = DeferredNormProjection(dev, [np.eye(16, dtype=np.float32)], plan=SyncPlan.implicit_join(),
                                    max_tokens=1, name="layers.0.input_layernorm")
    x = module.alloc_input(steps)
    for t in range(steps):
        rows = x[t:t + 1]
        dev.upload(rows, module.encode(np.full((1, 16), t + 1.0, np.float32)), stream=dev.legacy)
        module.read(module(rows, dev.legacy), dev.legacy)
    return dev


@pytest.mark.parametrize("dpi", [120, 60])
def test_labels_never_overlap_or_leave_the_canvas(tmp_path, dpi):
    drawn = render_timeline(pipeline_decode(), tmp_path / "t.png", dpi=dpi)
    width, height = drawn["size"]
    boxes = dict(enumerate(drawn["labels"]))
    for n, (text, (x0, y0, x1, y1)) in boxes.items():
        assert -0.5 <= x0 and x1 <= width + 0.5 and -0.5 <= y0 and y1 <= height + 0.5, f"{text!r} leaves the canvas"
        for m, (other, (a0, b0, a1, b1)) in boxes.items():
            if m > n:
                assert not (x0 < a1 and a0 < x1 and y0 < b1 and b0 < y1), f"{text!r} overlaps {other!r}"
    texts = [text for text, _ in drawn["labels"]]
    # What the race needs stays: both accesses' labels and the missing wait's.
    assert any("writes layers.0.input_layernorm.Y" in t for t in texts)
    assert any("reads layers.0.input_layernorm.Y" in t for t in texts)
    assert any(t.startswith("missing wait (layers.0.input_layernorm.Y") for t in texts)
    # Long event names under small boxes keep their last part.
    assert "record …fork_a" in texts or "record layers.0.input_layernorm.fork_a" in texts
