"""What a plain `pip install` of the built wheel gets: the fixture models as package data of
flashnorm_kernels, and `streamcheck repro implicit-join` running from the installed wheel,
outside the repository."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from flashnorm_kernels.testing.fixtures import FIXTURE_NAMES
from tests.paths import ROOT

BUILT_FROM = ("pyproject.toml", "README.md", "streamcheck", "flashnorm_kernels")
MODEL_FILES = ("config.json", "generation_config.json", "metadata.json", "model.safetensors")


def _pip(*args, cwd=None) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, cwd=cwd,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def _isolation() -> list:
    # Offline and fast with this environment's setuptools; an environment without one (a
    # Python 3.12 venv has none) lets pip fetch the backend pyproject.toml names.
    spec = importlib.util.find_spec("setuptools")
    if spec is None:
        return []
    import setuptools

    return ["--no-build-isolation"] if int(setuptools.__version__.split(".")[0]) >= 64 else []


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # Built from a copy of the sources: setuptools reuses a build/ directory in the source
    # tree, and files left there by an older layout would go into the wheel.
    src = tmp_path_factory.mktemp("src")
    for name in BUILT_FROM:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("wheel")
    _pip("wheel", "--no-deps", *_isolation(), "-q", "-w", str(out), str(src))
    (built,) = out.glob("streamcheck-*.whl")
    return built


def test_the_wheel_holds_the_fixture_models(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for model in FIXTURE_NAMES:
            for file in MODEL_FILES:
                name = f"flashnorm_kernels/models/{model}/{file}"
                assert name in names, f"{name} is not in {wheel.name}"
                assert archive.read(name) == (ROOT / name).read_bytes(), f"{name} differs from the repository's"


def test_the_wheel_declares_the_commands_flashnorm_plugs_in(wheel):
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
        declared = archive.read(name).decode()
    assert ("[streamcheck.commands]\nfuzz = flashnorm_kernels.commands.fuzz:register\n"
            "repro = flashnorm_kernels.commands.repro:register\n") in declared


@pytest.mark.slow
def test_repro_runs_from_the_installed_wheel_outside_the_repository(wheel, tmp_path):
    site = tmp_path / "site"
    _pip("install", "--no-deps", "-q", "--target", str(site), str(wheel))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # First on sys.path: ahead of this environment's editable install of the repository.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    where = subprocess.run(
        [sys.executable, "-c", "import streamcheck, flashnorm_kernels.testing.fixtures as f; "
                               "print(streamcheck.__file__); print(f.fixture_dir('tiny_llama_zen'))"],
        capture_output=True, text=True, cwd=elsewhere, env=env, timeout=120)
    assert where.returncode == 0, where.stderr
    for path in where.stdout.split():
        assert Path(path).is_relative_to(site), f"{path} is not from the installed wheel"

    result = subprocess.run([str(site / "bin" / "streamcheck"), "repro", "implicit-join", "--backend", "sim",
                             "--tokens", "8"], capture_output=True, text=True, cwd=elsewhere, env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "RAW race on `layers.0.input_layernorm.Y`" in result.stdout
    assert "result: reproduced (stale reads, race reported) and fixed" in result.stdout


def test_transformers_is_the_hf_extra_that_the_quickstart_and_the_tests_install():
    # streamcheck never imports transformers, so a plain install leaves it (and anyio's pytest plugin) out; the
    # quickstart's repro runs a transformers Llama, so its command installs the `hf` extra, and the line printed
    # where transformers is missing names the same requirement.
    from flashnorm_kernels import TRANSFORMERS, transformers_missing
    from tests.test_docs import readme_commands

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("transformers") for d in project["dependencies"]), project["dependencies"]
    extras = project["optional-dependencies"]
    assert TRANSFORMERS in extras["hf"] and "streamcheck[hf]" in extras["test"]
    main_job, tests = readme_commands()[:2]
    assert "-e '.[hf]'" in main_job and "streamcheck repro implicit-join" in main_job
    assert "-e '.[test]'" in tests
    assert transformers_missing() == ""  # the test extra brought it here
