"""A download's host bytes (issue 31 §4.4): `Device.download` copies into pinned host memory that the
copy writes; the host reading the array before it synchronized with the copy's stream is a RAW race
(`Device.host_uses`, which run_schedules applies to the program's result)."""
from __future__ import annotations

import numpy as np

from streamcheck.device import Device


def _downloaded(synchronize: bool):
    dev = Device("sim")
    a = dev.stream("A")
    x = dev.alloc(4, "float32", name="x", fill=0.0)
    dev.launch(lambda x: x.__setitem__(Ellipsis, 5.0), (x,), stream=a, writes=[x], name="fill")
    out = dev.download(x, stream=a)
    if synchronize:
        a.synchronize()
    dev.host_uses({"result": [out]})  # the host reads it now: a program returning it does
    return dev, out


def test_a_download_the_host_uses_before_any_synchronize_is_a_raw_race():
    dev, _ = _downloaded(synchronize=False)
    [race] = dev.races
    assert (race.kind, race.buffer) == ("RAW", "download of x")
    assert race.first.name == "copy D2H" and race.first.actor == "stream A"
    assert race.second.actor == "host thread 0" and race.second.name == "host use"
    assert "without synchronizing with stream A" in race.missing_edge


def test_a_download_the_host_uses_after_synchronizing_its_stream_is_no_race():
    dev, out = _downloaded(synchronize=True)
    assert dev.races == [] and out.tolist() == [5.0] * 4


def test_host_uses_ignores_what_no_download_returned():
    dev = Device("sim")
    dev.host_uses([np.zeros(3), "text", 4])
    assert dev.races == []
