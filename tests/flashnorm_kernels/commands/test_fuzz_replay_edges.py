"""`streamcheck fuzz --replay` with nothing to replay (issue 31 §4.2, §4.12): an empty token is a usage
error, not a whole 60 s fuzz run, and a field with no value names itself. (The other refused tokens:
test_fuzz_cli.py.)"""
from __future__ import annotations

import pytest

from streamcheck import cli
from tests.flashnorm_kernels.commands.test_fuzz_cli import TOKEN, _with


@pytest.mark.parametrize("token, message", [
    ("", "--replay: the token is empty; paste the whole token printed in the summary table"),
    ("  ", "--replay: the token is empty; paste the whole token printed in the summary table"),
    (_with(TOKEN, "missing", ""), "--replay: missing= has no value; paste the token exactly as printed"),
    ("missing=,", "--replay: missing= has no value; paste the token exactly as printed"),
    (_with(TOKEN, "seed", ""), "--replay: seed= has no value; paste the token exactly as printed"),
])
def test_an_empty_replay_or_field_is_one_line_and_exit_2(capsys, token, message):
    status = cli.main(["fuzz", "--replay", token])
    captured = capsys.readouterr()
    assert status == 2 and captured.out == ""
    assert captured.err == f"streamcheck fuzz: error: {message}\n"
