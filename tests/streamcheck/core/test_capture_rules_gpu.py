"""The capture rules of streamcheck/capture.py against CUDA itself (needs a GPU).

Each scenario is a short sequence of stream-capture steps. It runs twice: on raw CuPy with no
streamcheck anywhere, where CUDA's own error names are read from the CUDARuntimeError each
step raises, and on Device("sim"), where streamcheck's CaptureTracker decides. The error
code of every step must agree. A disagreement means the model is wrong about CUDA.

    pytest -m gpu tests/streamcheck/core/test_capture_rules_gpu.py
"""
from __future__ import annotations

import threading

import pytest

from streamcheck.device.backends import gpu_available
from streamcheck.core.capture import CaptureError
from streamcheck.device import Device

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not gpu_available(), reason="needs an NVIDIA GPU and CuPy (CuPy missing or no CUDA device)"),
]

# (step, stream or event, argument). Streams: o (origin), a, b; events are made by "record".
SCENARIOS = {
    "fork_join": [("begin", "o", "global"), ("record", "o", "e1"), ("wait", "a", "e1"), ("work", "a", None),
                  ("record", "a", "e2"), ("wait", "o", "e2"), ("end", "o", None)],
    "fork_with_work_unjoined": [("begin", "o", "global"), ("record", "o", "e1"), ("wait", "a", "e1"),
                                ("work", "a", None), ("end", "o", None)],
    "fork_without_work": [("begin", "o", "global"), ("record", "o", "e1"), ("wait", "a", "e1"),
                          ("end", "o", None)],
    "wait_on_event_recorded_outside": [("record", "a", "e1"), ("begin", "o", "global"), ("wait", "o", "e1"),
                                       ("end", "o", None)],
    "sync_capturing_stream": [("begin", "o", "global"), ("work", "o", None), ("sync_stream", "o", None),
                              ("end", "o", None)],
    "sync_event_recorded_in_capture": [("begin", "o", "global"), ("record", "o", "e1"), ("sync_event", "e1", None),
                                       ("end", "o", None)],
    "wait_after_capture_on_event_recorded_inside": [("begin", "o", "global"), ("record", "o", "e1"),
                                                    ("end", "o", None), ("wait", "a", "e1"), ("work", "a", None)],
    "sync_after_capture_on_event_recorded_inside": [("begin", "o", "global"), ("record", "o", "e1"),
                                                    ("end", "o", None), ("sync_event", "e1", None)],
    "merge_two_captures": [("begin", "o", "global"), ("begin", "b", "global"), ("record", "o", "e1"),
                           ("wait", "b", "e1"), ("end", "b", None), ("end", "o", None)],
    "end_on_other_thread_global": [("begin", "o", "global"), ("work", "o", None), ("end_other_thread", "o", None)],
    "end_on_other_thread_relaxed": [("begin", "o", "relaxed"), ("work", "o", None), ("end_other_thread", "o", None)],
    "end_on_forked_stream": [("begin", "o", "global"), ("record", "o", "e1"), ("wait", "a", "e1"),
                             ("end", "a", None), ("end", "o", None)],
}


class RawCupy:
    """The steps on CuPy alone: CUDA decides."""

    def __init__(self):
        import cupy

        self.cupy = cupy
        rt = cupy.cuda.runtime
        self.modes = {"global": rt.streamCaptureModeGlobal, "relaxed": rt.streamCaptureModeRelaxed}
        self.streams = {name: cupy.cuda.Stream(non_blocking=True) for name in ("o", "a", "b")}
        self.events = {}
        self.x = cupy.zeros(16, dtype=cupy.float32)
        cupy.cuda.Device().synchronize()

    def step(self, what, who, arg):
        s = self.streams.get(who)
        if what == "begin":
            s.begin_capture(mode=self.modes[arg])
        elif what == "end":
            s.end_capture()
        elif what == "end_other_thread":
            self._on_thread(s.end_capture)
        elif what == "record":
            self.events[arg] = s.record()
        elif what == "wait":
            s.wait_event(self.events[arg])
        elif what == "work":
            with s:
                self.x += 1  # in place: no allocation inside the capture
        elif what == "sync_stream":
            s.synchronize()
        elif what == "sync_event":
            self.events[who].synchronize()

    @staticmethod
    def _on_thread(call):
        failure = []

        def run():
            try:
                call()
            except BaseException as exc:  # handed to the main thread
                failure.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
        if failure:
            raise failure[0]

    def code(self, exc) -> str:
        text = str(exc)
        return text.split(":", 1)[0].strip() if text.startswith("cuda") else f"other: {type(exc).__name__}: {text}"

    def cleanup(self):
        for s in self.streams.values():
            for _ in range(2):
                try:
                    if not s.is_capturing():
                        break
                except Exception:
                    pass  # invalidated: still capturing as far as CUDA is concerned
                try:
                    s.end_capture()
                except Exception:
                    pass
        self.cupy.cuda.Device().synchronize()


class Sim:
    """The same steps through streamcheck's device API: the CaptureTracker decides."""

    def __init__(self):
        self.dev = Device("sim")
        self.streams = {name: self.dev.stream(name) for name in ("o", "a", "b")}
        self.events = {}
        self.x = self.dev.alloc((16,), name="x", fill=0.0)

    def step(self, what, who, arg):
        s = self.streams.get(who)
        if what == "begin":
            s.begin_capture(mode=arg)
        elif what == "end":
            s.end_capture()
        elif what == "end_other_thread":
            RawCupy._on_thread(s.end_capture)
        elif what == "record":
            self.events[arg] = s.record()
        elif what == "wait":
            s.wait_event(self.events[arg])
        elif what == "work":
            self.dev.launch(lambda v: v.__iadd__(1), (self.x,), stream=s, writes=[self.x], name="add_one")
        elif what == "sync_stream":
            s.synchronize()
        elif what == "sync_event":
            self.events[who].synchronize()

    def code(self, exc) -> str:
        return exc.code if isinstance(exc, CaptureError) else f"other: {type(exc).__name__}: {exc}"

    def cleanup(self):
        pass


def outcomes(api, steps) -> list:
    codes = []
    try:
        for what, who, arg in steps:
            try:
                api.step(what, who, arg)
                codes.append(None)
            except Exception as exc:
                codes.append(api.code(exc))
    finally:
        api.cleanup()
    return codes


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_capture_rules_agree_with_cuda(name):
    steps = SCENARIOS[name]
    cuda = outcomes(RawCupy(), steps)
    ours = outcomes(Sim(), steps)
    table = "\n".join(f"  {step!s:55} CUDA: {c!s:42} streamcheck: {o}" for step, c, o in zip(steps, cuda, ours))
    print(f"{name}\n{table}")
    assert ours == cuda, f"{name}: streamcheck's capture model disagrees with CUDA\n{table}"
