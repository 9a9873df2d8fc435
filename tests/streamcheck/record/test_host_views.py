"""record/host_views.py: each access through a host view reports the bytes it touched (offsets
from the array's start here), reads and writes apart; results numpy makes afresh are plain arrays."""
from __future__ import annotations

import numpy as np
import pytest

from streamcheck.record.host_views import HostView


@pytest.fixture
def view():
    base = np.arange(8, dtype=np.float32)
    start = base.ctypes.data
    log = []
    v = HostView.of(base, lambda lo, hi, write, name: log.append((lo - start, hi - start, write)))
    v.log = log
    return v


def test_an_element_read_reads_its_bytes_only(view):
    assert view[3] == 3.0 and type(view[3]) is not HostView
    assert view.log == [(12, 16, False)] * 2


def test_a_slice_is_a_view_that_records_its_own_accesses_later(view):
    part = view[2:4]
    assert isinstance(part, HostView) and view.log == []
    assert part.tolist() == [2.0, 3.0]
    assert view.log == [(8, 16, False)]


def test_an_assignment_writes_the_bytes_it_selects(view):
    view[1:3] = 0.0
    view[5] = 9.0
    assert view.log == [(4, 12, True), (20, 24, True)] and view[5] == 9.0


def test_ufuncs_read_their_inputs_and_write_out(view):
    total = view.sum()
    assert total == 28.0 and view.log == [(0, 32, False)]
    view.log.clear()
    view += 1
    assert view.log == [(0, 32, False), (0, 32, True)] and isinstance(view, HostView)
    doubled = view * 2
    assert type(doubled) is np.ndarray  # a fresh array: not pinned memory


def test_an_index_array_takes_the_whole_view_as_read(view):
    picked = view[np.array([0, 7])]
    assert picked.tolist() == [0.0, 7.0] and view.log == [(0, 32, False)]


def test_numpy_functions_conversions_and_printing_read(view):
    np.concatenate([view[:2], view[6:]])
    float(view[0, ...])  # a 0-d view converted
    str(view)
    np.copyto(view[:2], 5.0)
    assert view.log == [(0, 8, False), (24, 32, False), (0, 4, False), (0, 32, False), (0, 8, True)]


def test_an_empty_selection_touches_nothing(view):
    assert view[4:4].tolist() == [] and view.log == []
