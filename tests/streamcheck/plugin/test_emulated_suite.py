"""tests/emulated_suite, a GPU test suite written as a team writes it, run unchanged on this CPU
runner with `--streamcheck-emulate-cuda` (issue 36's acceptance test):

- no test is skipped for want of a GPU (its `skipif(not torch.cuda.is_available())` guards and
  module-level `TEST_CUDA` flags see the emulated device);
- each `test_race_<name>` fails with streamcheck's report: the race's kind (or the capture error
  CUDA gives) and a line of the test itself;
- each `test_fixed_<name>` twin passes, and so does every other test (training with backward and
  an optimizer, a custom autograd Function, threads with queues, a DataLoader with pinned memory,
  CUDA graphs, memory statistics);
- nothing aborts the process.
"""
from __future__ import annotations

import ast
import re
import shutil

import pytest

from tests.paths import ROOT

SUITE = ROOT / "tests" / "emulated_suite"

# What each racy test's report must name: the race's kind (or CUDA's capture error) and the text of
# a line of that test, the user's line the report points at.
RACY = {
    "test_streams.py::test_race_missing_wait_stream": ("RAW", "assert (y + 1).sum().item() == 7 * N"),
    "test_streams.py::test_race_record_stream_missing": ("FREE", "del x"),
    "test_pinned.py::test_race_pinned_read_before_sync": ("RAW", "assert host[-1].item() == 2 * (N - 1)"),
    "test_pinned.py::test_race_pinned_staging_rewritten": ("WAR", "staging.fill_(float(step))"),
    "test_threads.py::test_race_queue_handoff_without_event": ("RAW", "sums.append(t.sum().item())"),
    "test_graphs.py::test_race_graph_input_staged_unwaited": ("RAW", "static_in.fill_(value)"),
    "test_graphs.py::test_race_graph_fork_unjoined": ("cudaErrorStreamCaptureUnjoined", "y = x * 2"),
    "test_training.py::test_race_grads_bucketed_before_backward_is_done": (
        "RAW", "bucket = torch.cat([p.grad.flatten() for p in fresh_model.parameters()])"),
}
OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS) emulated_suite/(\S+?\.py::\S+)", re.M)
HEADER = re.compile(r"^_{3,} (?:ERROR at \w+ of )?(test_\w+(?:\[[^\]]*\])?) _{3,}$", re.M)


def suite_tests() -> dict:
    """file::name -> first line of each test function in the suite (parametrized ones by name)."""
    found = {}
    for path in sorted(SUITE.glob("test_*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                found[f"{path.name}::{node.name}"] = node.lineno
    return found


def line_in_test(test: str, text: str) -> int:
    """The line of `text` in the body of `test` (file::name)."""
    file, name = test.split("::")
    lines = (SUITE / file).read_text(encoding="utf-8").splitlines()
    start = suite_tests()[test]
    for number in range(start, len(lines) + 1):
        if number > start and lines[number - 1].startswith("def "):
            break
        if text in lines[number - 1]:
            return number
    raise AssertionError(f"{text!r} is not a line of {test}")


def failure_blocks(output: str) -> dict:
    """Test name -> its failure and error sections of the terminal report, whitespace flattened
    (reports wrap at the terminal's width)."""
    end = output.find("short test summary info")
    body = output[:end] if end >= 0 else output
    marks = list(HEADER.finditer(body))
    blocks = {}
    for mark, following in zip(marks, marks[1:] + [None]):
        text = body[mark.end():following.start() if following else len(body)]
        text = text.split("\n=", 1)[0]  # up to the next ==== section
        blocks[mark.group(1)] = blocks.get(mark.group(1), "") + " " + " ".join(text.split())
    return blocks


def test_the_suites_racy_tests_each_have_a_fixed_twin_and_a_report_to_expect():
    tests = suite_tests()
    racy = {t for t in tests if t.split("::")[1].startswith("test_race_")}
    assert racy == set(RACY)
    for test in racy:
        assert test.replace("::test_race_", "::test_fixed_") in tests, f"{test} has no fixed twin"
        line_in_test(test, RACY[test][1])


@pytest.mark.slow
def test_a_team_gpu_suite_runs_unchanged_on_the_emulation(pytester):
    shutil.copytree(SUITE, pytester.path / "emulated_suite", ignore=shutil.ignore_patterns("__pycache__"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-rA",
                                           "--streamcheck-emulate-cuda", "--streamcheck-seed=1", "emulated_suite",
                                           timeout=600)
    output = result.stdout.str()
    assert "Fatal Python error" not in result.stderr.str() + output and result.ret in (0, 1), result.stderr.str()
    outcomes = {}
    for outcome, test in OUTCOME.findall(output):
        test = re.sub(r"\[.*\]$", "", test)
        outcomes.setdefault(test, set()).add(outcome)
    blocks = failure_blocks(output)
    problems = []
    skipped = result.parseoutcomes().get("skipped", 0)
    if skipped:
        problems.append(f"{skipped} test(s) skipped: " + "; ".join(re.findall(r"^SKIPPED .*$", output, re.M)))
    for test in suite_tests():
        name = test.split("::")[1]
        seen = outcomes.get(test, set())
        if test in RACY:
            kind, text = RACY[test]
            where = f"{test.split('::')[0]}:{line_in_test(test, text)}"
            block = blocks.get(name, "")
            if "FAILED" not in seen and "ERROR" not in seen:
                problems.append(f"{test}: racy, but {sorted(seen) or 'not run'}")
            elif not (f"{kind} race on" in block or kind in block) or where not in block:
                problems.append(f"{test}: its failure does not name {kind} at {where}: {block[:300]}")
        elif seen != {"PASSED"}:
            problems.append(f"{test}: {sorted(seen) or 'not run'}: {blocks.get(name, '')[:300]}")
    assert not problems, "\n".join(problems)
