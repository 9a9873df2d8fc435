"""Every example and command in the docs runs, and says what the docs claim."""
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.paths import ROOT

FENCE = re.compile(r"```(\w*)\n(.*?)```", re.S)


def blocks(path, lang):
    return [textwrap.dedent(body) for tag, body in FENCE.findall(path.read_text()) if tag == lang]


RULES = ROOT / "docs" / "cuda-rules.md"
SETUP, *EXAMPLES = blocks(RULES, "python")


@pytest.fixture
def example_dir(tmp_path, monkeypatch):
    """Where a reader saves and runs an example: the working directory, which report paths are
    relative to (not this suite's rootdir, which the plugin sets for our own tests)."""
    from streamcheck.core.trace import set_site_settings, site_settings
    from dataclasses import replace

    monkeypatch.chdir(tmp_path)  # examples may write files (a Perfetto trace, a PNG)
    previous = set_site_settings(replace(site_settings(), root=None))
    yield tmp_path
    set_site_settings(previous)


def run_example(example) -> list:
    """The races of the setup and `example` run as one file, example.py, as a reader would save them."""
    namespace = {"__name__": "example"}
    exec(compile(SETUP + example, "example.py", "exec"), namespace)
    return namespace["dev"].races


# `#   missing edge: ...` under an example quotes its report; `...` marks what the quote leaves
# out, and a quoted line starting with a field's name starts that report line.
QUOTE = re.compile(r"^#   (.*)$", re.M)
FIELD = re.compile(r"^(first|second|missing edge|fix):")


def quoted_fragments(example) -> list:
    text = " ".join(("... " if FIELD.match(line) else "") + line for line in QUOTE.findall(example))
    return [" ".join(fragment.split()) for fragment in text.split("...") if fragment.strip()]


@pytest.mark.parametrize("example", EXAMPLES, ids=[f"example{i}" for i in range(len(EXAMPLES))])
def test_cuda_rules_examples_report_what_their_comments_say(example, example_dir):
    races = run_example(example)
    said = set(re.findall(r"#.*?\b(RAW|WAR|WAW|FREE) race", example))
    found = {race.kind for race in races}
    report = "\n\n".join(race.format() for race in races)
    if said or "no race" in example:
        assert found == said, report
    # What the comments quote is in the report, in that order, word for word.
    printed = " ".join(report.split())
    at = 0
    for fragment in quoted_fragments(example):
        found_at = printed.find(fragment, at)
        assert found_at >= 0, f"{fragment!r} is not in the report (after what came before):\n{report}"
        at = found_at + len(fragment)


def samples_after_examples(path):
    """(example, sample) for each unlabelled block right after a python block: what it prints."""
    example = None
    for tag, body in FENCE.findall(path.read_text()):
        if tag == "" and example is not None:
            yield example, body.rstrip("\n")
        example = textwrap.dedent(body) if tag == "python" else None


CUDA_RULES_SAMPLES = list(samples_after_examples(RULES))


@pytest.mark.parametrize("example, sample", CUDA_RULES_SAMPLES,
                         ids=[f"sample{i}" for i in range(len(CUDA_RULES_SAMPLES))])
def test_cuda_rules_sample_reports_are_what_the_examples_print(example, sample, example_dir):
    assert "\n\n".join(race.format() for race in run_example(example)) == sample


def readme_commands():
    return [line.strip() for body in blocks(ROOT / "README.md", "bash") for line in body.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_readme_quickstart_is_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    quickstart = readme_commands()[:2]
    assert len(quickstart) == 2
    for command in quickstart:
        assert command in ci, f"{command!r} is in the README quickstart but not run by .ci/run"


# The README's other commands, each run here (quickstart and GPU-only ones excepted).
CPU_COMMANDS = [c for c in readme_commands()[2:] if "cupy" not in c and "-m gpu" not in c and "pip install" not in c]


@pytest.mark.parametrize("command", CPU_COMMANDS)
def test_readme_commands_run(command, tmp_path):
    argv = command.split()
    exe = Path(sys.executable).parent / argv[0]
    result = subprocess.run([str(exe) if exe.exists() else argv[0], *argv[1:]], cwd=ROOT, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr


def test_readme_example_test_passes_and_its_buggy_twin_fails(pytester):
    (example,) = blocks(ROOT / "README.md", "python")
    pytester.makepyfile(test_readme=example)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--streamcheck-backend=sim", "-q")
    result.assert_outcomes(passed=1)
    pytester.makepyfile(test_readme=example.replace("SyncPlan.correct()", "SyncPlan.implicit_join()"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--streamcheck-backend=sim", "-q")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*RAW race on `norm_proj.Y`*", "*replay: pytest*"])


PLUGIN_DOC = ROOT / "docs" / "plugin.md"


def test_plugin_doc_failure_and_header_are_what_pytest_prints(pytester, monkeypatch):
    example = blocks(PLUGIN_DOC, "python")[0]
    [failure] = [body for body in blocks(PLUGIN_DOC, "") if body.startswith("E ")]
    [header] = [body.strip() for body in blocks(PLUGIN_DOC, "") if body.startswith("streamcheck: backend=")]
    pytester.makepyfile(test_doc=example)
    monkeypatch.setenv("COLUMNS", "100")  # the terminal width the doc says
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                                           "--streamcheck-seed=1", "--streamcheck-backend=sim")
    result.assert_outcomes(failed=1)
    # pytest ends the empty `E` line with spaces; the doc cannot show them.
    printed = [line.rstrip() for line in result.stdout.lines if line.startswith("E ") or line.rstrip() == "E"]
    assert "\n".join(printed) == failure.rstrip("\n")
    # The header's seed is random in the doc's run; the rest is fixed.
    seedless = re.compile(r"--streamcheck-seed=\d+")
    printed_header = next(line for line in result.stdout.lines if line.startswith("streamcheck: backend="))
    assert seedless.sub("", printed_header) == seedless.sub("", header)


def test_readme_race_report_is_what_the_quickstart_repro_prints():
    [sample] = [body.rstrip("\n") for body in blocks(ROOT / "README.md", "") if " race on `" in body]
    # As the quickstart runs it on a machine without a GPU; a wide terminal, so nothing wraps.
    result = subprocess.run([str(Path(sys.executable).parent / "streamcheck"), "repro", "implicit-join",
                             "--backend", "sim"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "COLUMNS": "400"})
    assert result.returncode == 0, result.stdout + result.stderr
    report = result.stdout.split("race report (the missing wait):\n", 1)[1]
    # The whole section, up to the fixed run's line: a line the README leaves out is a difference too.
    assert report.split("\n\n2. ", 1)[0] == sample, report


DEVICE_API = ROOT / "docs" / "device-api.md"


@pytest.mark.parametrize("example", blocks(DEVICE_API, "python"))
def test_device_api_guide_examples_run_and_check_what_they_say(example, example_dir):
    # Each block is a program of its own, saved as example.py; its asserts are what the guide says.
    exec(compile(example, "example.py", "exec"), {"__name__": "example"})


def test_device_api_guide_race_without_the_wait_is_what_its_comment_says(example_dir):
    first = blocks(DEVICE_API, "python")[0]
    wait = "b.wait_event(a.record())                        # without this line: a RAW race on `x`\n"
    assert wait in first
    namespace = {"__name__": "example"}
    with pytest.raises(AssertionError):  # the guide's `assert dev.races == []` no longer holds
        exec(compile(first.replace(wait, ""), "example.py", "exec"), namespace)
    assert [(race.kind, race.buffer) for race in namespace["dev"].races] == [("RAW", "x")]


def test_readme_leads_to_the_device_api_guide():
    assert "(docs/device-api.md)" in (ROOT / "README.md").read_text()


def test_plugin_doc_options_table_has_every_option(pytester):
    # What `pytest --help` lists is what the table must explain (the --no- switches share their option's row).
    shown = pytester.runpytest_inprocess("--help", "-p", "no:hypothesispytest").stdout.str()
    options = set(re.findall(r"^\s+(--streamcheck-[a-z-]+)", shown, re.M))
    assert "--streamcheck-seed" in options and "--streamcheck-library" in options
    rows = [line for line in PLUGIN_DOC.read_text().splitlines() if line.startswith("| `--streamcheck-")]
    documented = {option for row in rows for option in re.findall(r"`(--streamcheck-[a-z-]+)", row.split(" | ")[0])}
    assert options == documented
