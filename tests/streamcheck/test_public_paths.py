"""Every `streamcheck.…` name the README and docs/ show can be imported and looked up: a module that
moves keeps its documented path (streamcheck/__init__.py's aliases of old paths), or the docs change
with it (docs/architecture.md)."""
from __future__ import annotations

import importlib
import re

import pytest

from tests.paths import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DOTTED = re.compile(r"(?<![\w/.-])streamcheck(?:\.[A-Za-z_]\w*)+")
FROM_IMPORT = re.compile(r"\bfrom (streamcheck[\w.]*) import \(?([\w, ]+)")
# Named in the docs, but not Python paths: entry-point groups (pyproject.toml).
ENTRY_POINT_GROUPS = {"streamcheck.backends", "streamcheck.commands"}


def _documented() -> list:
    names = set()
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        names.update(name for name in DOTTED.findall(text) if name not in ENTRY_POINT_GROUPS)
        for module, imported in FROM_IMPORT.findall(text):
            names.update(f"{module}.{name.strip()}" for name in imported.split(",") if name.strip())
    return sorted(names)


DOCUMENTED = _documented()


def resolve(name: str):
    """The object a dotted name names: its longest importable module, then attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            found = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise  # the module exists but one of its own imports is missing
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(name)


def test_the_docs_name_the_public_paths_the_layout_keeps():
    assert {"streamcheck.device.Device", "streamcheck.instrument", "streamcheck.sync_proof.prove",
            "streamcheck.timeline.render_timeline", "streamcheck.export.write_chrome_trace",
            "streamcheck.analyses.sync_audit.audit", "streamcheck.declare_access"} <= set(DOCUMENTED)


@pytest.mark.parametrize("name", DOCUMENTED)
def test_a_documented_name_imports(name):
    assert resolve(name) is not None


def test_an_old_path_is_the_moved_module_itself_not_a_copy():
    # Monkeypatching either name must reach the code that runs.
    from streamcheck.pictures import export
    from streamcheck.proofs import sync_proof
    from streamcheck.record import instrument

    assert resolve("streamcheck.instrument") is instrument and callable(instrument)
    assert resolve("streamcheck.sync_proof") is sync_proof and resolve("streamcheck.export") is export
    assert instrument.__spec__.name == "streamcheck.record.instrument"


def test_a_name_that_is_not_there_fails():
    with pytest.raises(ModuleNotFoundError):
        resolve("streamcheck.recorder.Recorder")  # moved to streamcheck.record.recorder, no alias
    with pytest.raises(AttributeError):
        resolve("streamcheck.device.NoSuchThing")
