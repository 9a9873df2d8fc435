"""Subcommands that installed packages plug into `streamcheck` (streamcheck/cli.py): FlashNorm's
`repro` and `fuzz` come through the `streamcheck.commands` entry point group, and a plugin
that is broken or missing costs a clear message, never a traceback or the other commands.

The plugin packages here are real distributions on PYTHONPATH (a dist-info directory with
entry_points.txt), found the way pip-installed ones are."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

from streamcheck import cli

MAIN = "import sys; from streamcheck.cli import main; sys.exit(main(sys.argv[1:]))"

HELLO = textwrap.dedent('''
    def register(subparsers):
        parser = subparsers.add_parser("hello", help="say hello", description="Say hello.")
        parser.add_argument("--name", default="world", help="whom to greet")
        parser.set_defaults(func=lambda args: print(f"hello {args.name}"))


    def register_run(subparsers):
        subparsers.add_parser("run", help="a second `run`")


    def register_raises(subparsers):
        raise RuntimeError("register() is broken")
''')


def test_flashnorm_commands_come_through_entry_points():
    plugins = {ep.name: ep.value for ep in metadata.entry_points(group=cli.PLUGIN_GROUP)}
    assert plugins["repro"] == "flashnorm_kernels.commands.repro:register"
    assert plugins["fuzz"] == "flashnorm_kernels.commands.fuzz:register"
    (sub,) = [a for a in cli.build_parser()._actions if a.dest == "command"]
    assert set(sub.choices) == {"run", "demo", "repro", "fuzz"}


def _plugin_site(tmp_path: Path, entry_points: str) -> Path:
    """A directory holding the distribution `plugin-demo` and its module `hello_plugin`."""
    site = tmp_path / "site"
    info = site / "plugin_demo-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plugin-demo\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{cli.PLUGIN_GROUP}]\n{entry_points}")
    (site / "hello_plugin.py").write_text(HELLO)
    return site


def _streamcheck(site: Path, *argv, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-c", MAIN, *argv], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=120)


@pytest.fixture
def plugins(tmp_path):
    return _plugin_site(tmp_path, "hello = hello_plugin:register\n"
                                  "missing = no_such_module:register\n"
                                  "raises = hello_plugin:register_raises\n")


def test_a_packages_command_plugs_in(plugins, tmp_path):
    result = _streamcheck(plugins, "hello", "--name", "CUDA", cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (0, "hello CUDA\n", "")


def test_broken_plugins_are_listed_and_leave_the_other_commands_working(plugins, tmp_path):
    help_text = _streamcheck(plugins, "--help", cwd=tmp_path)
    assert help_text.returncode == 0 and help_text.stderr == ""
    listed = {line.split()[0]: line for line in help_text.stdout.splitlines() if line.startswith("    ")}
    assert {"run", "demo", "repro", "fuzz", "hello", "missing", "raises"} <= set(listed)
    assert "unavailable: its plugin failed to load" in listed["missing"]
    assert "unavailable: its plugin failed to load" in listed["raises"]
    demo = _streamcheck(plugins, "demo", "--help", cwd=tmp_path)
    assert demo.returncode == 0 and demo.stderr == ""


@pytest.mark.parametrize("command, value, error", [
    ("missing", "no_such_module:register", "ModuleNotFoundError: No module named 'no_such_module'"),
    ("raises", "hello_plugin:register_raises", "RuntimeError: register() is broken"),
])
def test_running_a_broken_plugins_command_says_why_in_one_line(plugins, tmp_path, command, value, error):
    # Arguments meant for the real command are taken, not refused: the message is about the plugin.
    result = _streamcheck(plugins, command, "--budget", "10s", "file.json", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"streamcheck {command}: cannot run: its plugin failed to load (entry point "
                           f"{command} = {value} (from plugin-demo 1.0) in group streamcheck.commands): ")
    assert error in line and "reinstall the package that provides it" in line


def test_other_commands_still_refuse_unknown_arguments(plugins, tmp_path):
    result = _streamcheck(plugins, "demo", "--no-such-option", cwd=tmp_path)
    assert result.returncode == 2
    assert "error: unrecognized arguments: --no-such-option" in result.stderr


def test_a_plugin_cannot_replace_a_built_in_command(tmp_path):
    site = _plugin_site(tmp_path, "run = hello_plugin:register_run\n")
    result = _streamcheck(site, "run", "--help", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout.startswith("usage: streamcheck run [options] script.py")  # the built-in `run`
    assert result.stderr == ("streamcheck: ignoring the plugin command run = hello_plugin:register_run "
                             "(from plugin-demo 1.0): `streamcheck run` is already defined\n")


def test_without_the_plugin_the_command_is_an_unknown_choice(capsys, monkeypatch):
    # As when the package that provides `repro` is not installed: argparse's usage error.
    monkeypatch.setattr(metadata, "entry_points", lambda group: [])
    with pytest.raises(SystemExit) as exc:
        cli.main(["repro", "implicit-join"])
    assert exc.value.code == 2
    assert "invalid choice: 'repro' (choose from 'run', 'demo')" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "Installed packages may add commands (entry point group streamcheck.commands)" in capsys.readouterr().out
