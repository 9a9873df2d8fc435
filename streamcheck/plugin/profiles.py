"""Our hypothesis profiles (streamcheck-dev/-ci/-fuzz, streamcheck/strategies.py), selected by
STREAMCHECK_HYPOTHESIS_PROFILE or --hypothesis-profile. Hypothesis is imported only then:
HYPOTHESIS_PROFILE and the loaded profile otherwise stay the user's.
"""
from __future__ import annotations

import os

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Select the profile asked for."""
    # Runs before any pytest_configure (xdist workers call it too): our hypothesis
    # profiles must exist before hypothesis's plugin loads the one named by
    # --hypothesis-profile in its pytest_configure.
    _select_hypothesis_profile(config)


def _select_hypothesis_profile(config) -> None:
    """Register our profiles if the command line names one, and load the one
    STREAMCHECK_HYPOTHESIS_PROFILE names (the command line wins: hypothesis's plugin loads
    it later). Nothing else: HYPOTHESIS_PROFILE and the loaded profile are the user's."""
    from_cli = config.getoption("hypothesis_profile", None)  # None also when hypothesis's plugin is off
    env = os.environ.get("STREAMCHECK_HYPOTHESIS_PROFILE", "").strip()
    if not from_cli and not env:
        return  # nothing asked for: do not import hypothesis
    from .. import strategies

    if not from_cli:
        try:
            strategies.load_profile()
        except ValueError as exc:
            raise pytest.UsageError(f"streamcheck: {exc}") from None
