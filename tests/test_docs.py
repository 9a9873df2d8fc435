"""Every example and command in the docs runs, and says what the docs claim."""
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"```(\w*)\n(.*?)```", re.S)


def blocks(path, lang):
    return [textwrap.dedent(body) for tag, body in FENCE.findall(path.read_text()) if tag == lang]


RULES = ROOT / "docs" / "cuda-rules.md"
SETUP, *EXAMPLES = blocks(RULES, "python")


@pytest.mark.parametrize("example", EXAMPLES, ids=[f"example{i}" for i in range(len(EXAMPLES))])
def test_cuda_rules_examples_report_what_their_comments_say(example, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples may write files (a Perfetto trace, a PNG)
    namespace = {"__name__": "example"}
    exec(compile(SETUP + example, str(RULES), "exec"), namespace)
    said = set(re.findall(r"#.*?\b(RAW|WAR|WAW|FREE) race", example))
    found = {race.kind for race in namespace["dev"].races}
    if said or "no race" in example:
        assert found == said, namespace["dev"].report()


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
