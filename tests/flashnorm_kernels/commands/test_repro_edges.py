"""`streamcheck repro` edges a new user hit (issue 31 §4): outputs that would overwrite one another, a
fixtures path that is a file, and the side-by-side text that cut lines without saying so."""
from __future__ import annotations

import subprocess
import sys

import pytest

from flashnorm_kernels.commands.repro import side_by_side_text
from streamcheck.cli import main


@pytest.mark.parametrize("first, second", [("--json", "--trace"), ("--trace", "--timeline")])
def test_two_outputs_to_one_file_exit_2_before_the_run(capsys, tmp_path, first, second):
    if "--timeline" in (first, second):
        pytest.importorskip("matplotlib")
    target = str(tmp_path / "out.png" if second == "--timeline" else tmp_path / "out.json")
    status = main(["repro", "implicit-join", "--backend", "sim", "--tokens", "8", first, target, second, target])
    captured = capsys.readouterr()
    assert status == 2 and captured.out == ""  # nothing ran
    (line,) = captured.err.splitlines()
    assert line == (f"streamcheck repro: {first} and {second} both name {target}; one would overwrite the other: "
                    "give each its own file")
    assert list(tmp_path.iterdir()) == []


def test_a_fixtures_path_that_is_a_file_says_so_and_suggests_no_out(capsys, tmp_path):
    not_a_folder = tmp_path / "models.txt"
    not_a_folder.write_text("")
    assert main(["repro", "implicit-join", "--fixtures", str(not_a_folder), "--tokens", "4"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (f"streamcheck repro: fixtures root {not_a_folder} is a file, not a directory; give the directory "
                    "that holds the fixture models (tiny_llama_zen/)")
    assert "--out" not in line


def test_side_by_side_marks_the_lines_it_cuts():
    long = "Special cases aren't special enough to break the rules."
    text = side_by_side_text(f"short\n{long}", f"short\n{long}", width=20)
    rows = text.splitlines()[2:]
    assert rows[0] == "  short                | short"
    assert rows[1] == "  Special cases aren'… | Special cases aren'…"
    assert all(len(row.split(" | ")[0]) == 2 + 20 for row in rows)


def test_without_transformers_the_repro_says_what_to_install_in_one_line():
    # As in an environment where transformers is missing: importing it fails.
    program = ("import sys; sys.modules['transformers'] = None; from streamcheck.cli import main; "
               "sys.exit(main(['repro', 'implicit-join', '--backend', 'sim', '--tokens', '4']))")
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == ("streamcheck repro: the fixture model is a transformers Llama, and transformers is not "
                             "installed here: pip install 'transformers>=5.0,<6' (streamcheck's `hf` extra: "
                             "pip install 'streamcheck[hf]', or pip install -e '.[hf]' in a checkout)\n")


def test_without_transformers_flashify_says_what_to_install_in_one_line(tmp_path):
    program = ("import sys; sys.modules['transformers'] = None; from flashnorm_kernels.cli import main; "
               f"sys.exit(main(['flashify', {str(tmp_path / 'src')!r}, {str(tmp_path / 'dst')!r}]))")
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == ("flashnorm flashify: error: transformers is not installed here: pip install "
                             "'transformers>=5.0,<6' (streamcheck's `hf` extra: pip install 'streamcheck[hf]', or pip install -e "
                             "'.[hf]' in a checkout)\n")
