"""A thread started before `streamcheck.instrument()` issues a torch operator on a side stream
that the main thread's read is not ordered after: on Python >= 3.12 the thread gets the
dispatch mode and the race is reported; where it cannot (older Pythons, forced here too) the
recording names the thread and its unseen work instead of missing it silently.

    pytest -m gpu tests/streamcheck/record/adapters/test_threads_before_gpu.py
"""
from __future__ import annotations

import importlib.util
import threading

import pytest

from streamcheck.record.adapters import threads


def _missing() -> str:
    if importlib.util.find_spec("torch") is None:
        return "needs torch with CUDA"
    import torch

    if not torch.cuda.is_available():
        return "needs an NVIDIA GPU and a CUDA build of torch (torch.cuda.is_available() is False)"
    return ""


_WHY = _missing()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(bool(_WHY), reason=_WHY)]


def _program():
    """(session, poller thread): the poller, started before the recording, adds one to `x` on a
    side stream; the main thread, told by a threading.Event (not an edge), reads `x` on the
    default stream with no wait for the side stream."""
    import torch

    import streamcheck

    x = torch.zeros(1 << 20, device="cuda")
    torch.cuda.synchronize()
    go, done = threading.Event(), threading.Event()

    def poll():
        go.wait()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            x.add_(torch.ones_like(x))  # ones_like allocates: torch's allocator sees this thread
        done.set()
    poller = threading.Thread(target=poll, name="poller", daemon=True)
    poller.start()
    with streamcheck.instrument() as session:
        go.set()
        assert done.wait(30)
        (x * 2).sum()
        torch.cuda.synchronize()
    poller.join(30)
    return session, poller


@pytest.mark.skipif(not threads.REACHES_RUNNING_THREADS,
                    reason="reaching running threads needs Python >= 3.12 (threading.setprofile_all_threads)")
def test_the_pre_existing_threads_side_stream_write_races_with_the_main_threads_read():
    session, poller = _program()
    writes = [r for r in session.races if r.first.name == "aten.add_.Tensor" and r.second.name == "aten.mul.Tensor"]
    assert writes and writes[0].kind == "RAW", session.report()
    assert not any(f"(ident {poller.ident})" in n for n in session.notices), session.notices
    assert session.errors == []


def test_where_it_cannot_be_reached_the_thread_and_its_unseen_work_are_named(monkeypatch):
    monkeypatch.setattr(threads, "REACHES_RUNNING_THREADS", False)  # as on Python < 3.12
    session, poller = _program()
    named = [n for n in session.notices if f"'poller' (ident {poller.ident})" in n]
    assert any("its torch operators are not recorded" in n for n in named), session.notices
    assert any("allocated CUDA memory through torch at" in n and "test_threads_before_gpu.py" in n for n in named)
    assert not any(r.first.name == "aten.add_.Tensor" for r in session.races)  # unseen, and said so
