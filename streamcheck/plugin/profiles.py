"""Our hypothesis profiles (streamcheck-dev/-ci/-fuzz, streamcheck/strategies.py), selected by
STREAMCHECK_HYPOTHESIS_PROFILE or --hypothesis-profile. Hypothesis is imported only then:
HYPOTHESIS_PROFILE and the loaded profile otherwise stay the user's.

--streamcheck-example-db DIR (ini streamcheck_example_db) puts a DirectoryBasedExampleDatabase at
DIR on our profiles and on the loaded one. Every xdist worker (and every later run) opens the same
directory, so a failing example one worker saved is replayed first by any other that runs the test.
A derandomized profile (streamcheck-ci) implies no database in hypothesis; it keeps none, with a
warning when it is the loaded one. An entry damaged on disk is not replayed, stays where it is, and
gets a warning naming its file (checked_database).
"""
from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

import pytest

from .options import option_value, path_option

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


# The start of the warning an unreadable entry gets (`streamcheck fuzz --workers` passes it on).
UNREADABLE_ENTRY = "streamcheck: example database entry"
# DirectoryBasedExampleDatabase's own list of its keys: its entries are keys, not examples.
KEYS_ENTRY = b".hypothesis-keys"


def entry_name(data: bytes) -> str:
    """The name DirectoryBasedExampleDatabase gives the folder of a key and the file of a value."""
    return hashlib.sha384(data).hexdigest()[:16]


def checked_database(path: str):
    """A DirectoryBasedExampleDatabase at `path` that replays only the entries hypothesis wrote.
    Hypothesis skips an entry it cannot decode and deletes it, and replays a truncated one as some
    other example: either way the failure saved there is lost without a word. Here such an entry
    (its bytes no longer hash to its file's name, or they do not decode) is not replayed, stays
    where it is, and gets a warning naming its file, once per run."""
    from hypothesis.database import DirectoryBasedExampleDatabase, choices_from_bytes

    class CheckedExampleDatabase(DirectoryBasedExampleDatabase):
        def __init__(self) -> None:
            super().__init__(path)
            self.reported: set = set()  # the files already warned about

        def fetch(self, key: bytes):
            folder = Path(self.path, entry_name(key))
            try:
                names = sorted(os.listdir(folder))
            except OSError:
                return  # nothing saved for this key
            for name in names:
                file = folder / name
                try:
                    value = file.read_bytes()
                except OSError as exc:
                    self._unreadable(file, f"cannot be read ({exc.strerror or exc})")
                    continue
                if name != entry_name(value):
                    self._unreadable(file, f"holds {len(value)} bytes that are not what hypothesis saved there "
                                     "(their hash is not the file's name: truncated, emptied or overwritten)")
                elif key != KEYS_ENTRY and choices_from_bytes(value) is None:
                    self._unreadable(file, "is not in the format of this hypothesis version")
                else:
                    yield value

        def _unreadable(self, file: Path, problem: str) -> None:
            if file in self.reported:
                return
            self.reported.add(file)
            warnings.warn(pytest.PytestWarning(
                f"{UNREADABLE_ENTRY} {file} could not be read: it {problem}. It is kept there and not replayed: "
                "restore it, or delete it to drop that example"), stacklevel=2)

    return CheckedExampleDatabase()


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """The shared example database, after hypothesis's plugin loaded the profile it was asked for."""
    path = path_option(config, "streamcheck_example_db")
    if path is None:
        return
    if os.path.exists(path) and not os.path.isdir(path):
        raise pytest.UsageError(f"streamcheck: --streamcheck-example-db={path!r} is a file; name a directory "
                                "(it is created if missing)")
    if not os.path.isdir(os.path.dirname(path)):  # as --streamcheck-trace-dir: a typo must not create a tree
        value, source = option_value(config, "streamcheck_example_db")
        raise pytest.UsageError(f"streamcheck: {source}={value!r}: the directory {os.path.dirname(path)} does not "
                                "exist; create it or choose another place")
    from hypothesis import settings

    from .. import strategies

    database = checked_database(path)
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
