"""The example database of --streamcheck-example-db (streamcheck/plugin/profiles.py): an entry that
was damaged on disk is named, kept, and not replayed as some other example."""
from __future__ import annotations

import os
import unittest
import warnings

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from streamcheck.plugin.profiles import KEYS_ENTRY, UNREADABLE_ENTRY, checked_database, entry_name

KEYS_FOLDER = entry_name(KEYS_ENTRY)  # the database's list of its keys, not examples


def failing_property(database, phases):
    @settings(database=database, phases=phases, max_examples=200, derandomize=False, deadline=None)
    @given(st.integers(0, 10**6))
    def prop(x):
        assert x < 1000

    return prop


def saved_failure(tmp_path):
    """A database where hypothesis saved the shrunk failure x = 1000; that entry's file."""
    database = checked_database(str(tmp_path / "examples"))
    with pytest.raises(AssertionError):
        failing_property(database, list(Phase))()
    files = [p for p in (tmp_path / "examples").rglob("*") if p.is_file() and p.read_bytes() == b"\x42\x03\xe8"]
    assert len(files) == 1, "x = 1000 is saved as one file (int tag, 2 bytes, 0x03e8)"
    return database, files[0]


def test_a_saved_failure_replays_from_the_checked_database(tmp_path):
    database, _ = saved_failure(tmp_path)
    with pytest.raises(AssertionError, match="1000 < 1000"):
        failing_property(database, [Phase.reuse])()


@pytest.mark.parametrize("damage", [b"\x42\x03", b"\x9c\xff\x17\x00\x81", b""], ids=["truncated", "random", "empty"])
def test_a_damaged_entry_is_named_kept_and_not_replayed(tmp_path, damage):
    database, entry = saved_failure(tmp_path)
    entry.write_bytes(damage)
    # Only the primary entry counts here: what shrinking left elsewhere goes too.
    for other in entry.parent.parent.iterdir():
        if other != entry.parent and other.name != KEYS_FOLDER:
            for p in other.iterdir():
                p.unlink()
    # Hypothesis runs nothing: the damaged bytes are not replayed as some other example (b"\x42\x03" as x = 3).
    with pytest.warns(pytest.PytestWarning) as warned, pytest.raises(unittest.SkipTest, match="no test cases"):
        failing_property(database, [Phase.reuse])()
    (message,) = [str(w.message) for w in warned if UNREADABLE_ENTRY in str(w.message)]
    assert message.startswith(f"{UNREADABLE_ENTRY} {entry} could not be read: it holds {len(damage)} bytes that are "
                              "not what hypothesis saved there")
    assert "It is kept there and not replayed" in message
    assert entry.read_bytes() == damage  # still there, as it was
    # Once per run (per database), however often hypothesis asks.
    with warnings.catch_warnings(record=True) as again, pytest.raises(unittest.SkipTest):
        warnings.simplefilter("always")  # so that a second warning would be seen
        failing_property(database, [Phase.reuse])()
    assert not [w for w in again if UNREADABLE_ENTRY in str(w.message)]


def test_entries_are_found_where_hypothesis_puts_them(tmp_path):
    from hypothesis.database import DirectoryBasedExampleDatabase

    DirectoryBasedExampleDatabase(str(tmp_path)).save(b"key", b"\x42\x03\xe8")
    assert list(checked_database(str(tmp_path)).fetch(b"key")) == [b"\x42\x03\xe8"]
    assert os.listdir(tmp_path)  # and fetching deleted nothing
