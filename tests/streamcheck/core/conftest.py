"""Fixtures of the core's call-site tests (test_trace_sites.py, test_native_walk.py)."""
from __future__ import annotations

import pytest

from streamcheck.core.trace import SiteSettings, set_site_settings


@pytest.fixture
def settings():
    """set(**fields): the process's SiteSettings for this test; the previous ones come back after."""
    previous = []

    def set_(**fields):
        previous.append(set_site_settings(SiteSettings(**fields)))

    yield set_
    if previous:
        set_site_settings(previous[0])
