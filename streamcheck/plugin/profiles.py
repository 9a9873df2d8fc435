"""Our hypothesis profiles (streamcheck-dev/-ci/-fuzz, streamcheck/strategies.py), selected by
STREAMCHECK_HYPOTHESIS_PROFILE or --hypothesis-profile. Hypothesis is imported only then:
HYPOTHESIS_PROFILE and the loaded profile otherwise stay the user's.

--streamcheck-example-db DIR (ini streamcheck_example_db) puts a DirectoryBasedExampleDatabase at
DIR on our profiles and on the loaded one. Every xdist worker (and every later run) opens the same
directory, so a failing example one worker saved is replayed first by any other that runs the test.
A derandomized profile (streamcheck-ci) implies no database in hypothesis; it keeps none, with a
warning when it is the loaded one.
"""
from __future__ import annotations

import os
import warnings

import pytest

from .options import path_option

SHARED_DB_SUFFIX = "-with-streamcheck-example-db"


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


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """The shared example database, after hypothesis's plugin loaded the profile it was asked for."""
    path = path_option(config, "streamcheck_example_db")
    if path is None:
        return
    if os.path.exists(path) and not os.path.isdir(path):
        raise pytest.UsageError(f"streamcheck: --streamcheck-example-db={path!r} is a file; name a directory "
                                "(it is created if missing)")
    from hypothesis import settings
    from hypothesis.database import DirectoryBasedExampleDatabase

    from .. import strategies

    database = DirectoryBasedExampleDatabase(path)
    for name in strategies.PROFILES:  # so code that asks for our profile by name gets it too (fuzz)
        profile = settings.get_profile(name)
        if not profile.derandomize:
            settings.register_profile(name, parent=profile, database=database)
    current = settings.get_current_profile_name()
    if settings.default.derandomize:
        warnings.warn(pytest.PytestConfigWarning(
            f"streamcheck: --streamcheck-example-db: the loaded hypothesis profile {current!r} is derandomized, "
            "which in hypothesis implies no example database; it keeps none (use streamcheck-dev, or a profile "
            "of your own with derandomize=False)"))
        return
    name = current if current.endswith(SHARED_DB_SUFFIX) else current + SHARED_DB_SUFFIX
    settings.register_profile(name, parent=settings.default, database=database)
    settings.load_profile(name)
