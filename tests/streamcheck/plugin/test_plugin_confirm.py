"""--streamcheck-confirm (and its ini twin): a failing run_schedules test's report says, per race,
whether it was confirmed on the sim, with the stale value, so a CI log shows the read itself."""
from __future__ import annotations

import pytest

from streamcheck.core.schedule import seed_delays
from streamcheck.plugin import per_test_seed, schedule_specs
from tests.streamcheck.plugin.test_plugin import PROGRAMS, _failure_block, _notes_dir, _run  # noqa: F401

RACY = PROGRAMS + '''
def test_racy(run_schedules):
    run_schedules(lambda dev: program(dev, join=False), policies=["eager"], schedules=1)
'''

STRIKES = PROGRAMS + '''
def test_strikes(run_schedules):
    run_schedules(lambda dev: program(dev, join=False), policies=["delay"], schedules=1)
'''

FIXED = PROGRAMS + '''
def test_fixed(run_schedules):
    run = run_schedules(lambda dev: program(dev, join=True))
    assert run.reference.tolist() == [2.0, 4.0, 6.0, 8.0]
'''

DEVICE = PROGRAMS + '''
def test_device(streamcheck_device):
    program(streamcheck_device, join=False)
'''


def _text(result) -> str:
    return "\n".join(line[2:].strip() for line in _failure_block(result))


def test_a_race_that_did_not_strike_is_confirmed_with_the_stale_read(pytester, tmp_path):
    pytester.makepyfile(test_racy=RACY)
    result = _run(pytester, tmp_path, "--streamcheck-confirm")
    result.assert_outcomes(failed=1)
    text = _text(result)
    assert "confirmation (--streamcheck-confirm):" in text
    assert ("RAW on `x` (test_racy.py:15 -> test_racy.py:18): confirmed on the sim: `consume` on stream B at "
            "test_racy.py:18 read x[0] = 0.0, the sequential run read 1.0 (held `produce` on stream A at "
            "test_racy.py:15 until `consume` on stream B at test_racy.py:18 ran; replay: Device(\"sim\", "
            "policy='replay:") in text


def _striking_base_seed() -> int:
    """A base seed whose first delay schedule of test_strikes holds stream A and not B (the seed
    picks the streams), so the race strikes in the run itself."""
    for base in range(1000):
        spec = schedule_specs(per_test_seed(base, "test_strikes.py::test_strikes"), ("delay",), 1, None)[0]
        if seed_delays(spec.seed, "A") and not seed_delays(spec.seed, "B"):
            return base
    raise AssertionError("no base seed holds A alone")


def test_a_race_that_struck_is_confirmed_too(pytester, tmp_path):
    pytester.makepyfile(test_strikes=STRIKES)
    result = _run(pytester, tmp_path, "-o", "streamcheck_confirm=yes", f"--streamcheck-seed={_striking_base_seed()}")
    result.assert_outcomes(failed=1)
    text = _text(result)
    assert "gave values that differ from the sequential reference" in text
    assert "confirmed on the sim: `consume` on stream B at test_strikes.py:18 read x[0] = 0.0" in text


def test_without_the_option_the_hint_names_the_race_directed_delay(pytester, tmp_path):
    pytester.makepyfile(test_racy=RACY)
    result = _run(pytester, tmp_path)
    result.assert_outcomes(failed=1)
    text = _text(result)
    assert "confirmation (--streamcheck-confirm)" not in text
    assert ("to make them strike: --streamcheck-confirm holds stream A: `produce` writes at test_racy.py:15 until "
            "`consume` ran; by hand: Device(\"sim\", policy=\"delay\", streams=['A'], kernels=['produce'], "
            "steps=8)") in text


def test_the_command_line_turns_off_what_the_ini_file_turns_on(pytester):
    pytester.makeini("[pytest]\nstreamcheck_confirm = true\n")
    pytester.makepyfile(test_racy=RACY)
    texts = {}
    for args in ([], ["--no-streamcheck-confirm"]):
        result = pytester.runpytest_inprocess("--streamcheck-backend=sim", "-p", "no:hypothesispytest", *args)
        result.assert_outcomes(failed=1)
        texts[bool(args)] = _text(result)
    assert "confirmation (--streamcheck-confirm):" in texts[False] and "to make them strike" not in texts[False]
    assert "confirmation (--streamcheck-confirm)" not in texts[True] and "to make them strike" in texts[True]


def test_confirmation_never_changes_the_outcome_of_a_correct_program(pytester, tmp_path):
    pytester.makepyfile(test_fixed=FIXED)
    for args in ([], ["--streamcheck-confirm"]):
        result = _run(pytester, tmp_path, "--streamcheck-seed=7", *args)
        result.assert_outcomes(passed=1)
        assert result.ret == pytest.ExitCode.OK
        out = result.stdout.str()
        assert "on the sim" not in out and "to make them strike" not in out and "FAILED" not in out


def test_a_streamcheck_device_test_says_why_it_is_not_confirmed(pytester, tmp_path):
    pytester.makepyfile(test_device=DEVICE)
    result = _run(pytester, tmp_path, "--streamcheck-confirm")
    result.assert_outcomes(failed=1)
    assert ("confirmation (--streamcheck-confirm): not attempted: a streamcheck_device test's body cannot be "
            "rerun from the start") in result.stdout.str()


@pytest.mark.parametrize("args, message", [
    (["-o", "streamcheck_confirm=maybe"], "ini option streamcheck_confirm='maybe' is not valid; accepted values: "
                                          "true, false (also yes/no, on/off, 1/0)"),
])
def test_bad_confirm_values_are_usage_errors(pytester, args, message):
    pytester.makepyfile(test_nothing="def test_nothing(): pass")
    result = pytester.runpytest_inprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()
