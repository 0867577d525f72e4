"""Nothing of the user's is ever destroyed: an output that is, holds or lies inside the source is refused,
overwrite or not; an output that cannot be written is refused before the conversion, in one line, and
a write that fails leaves nothing behind."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from helpers import cli_command, run_process
from lsg_converter import LSGConverter, save_converted
from lsg_converter.errors import OutputNotWritableError, OutputOverlapsSourceError
from lsg_converter_cli import main

ERROR_PREFIX = "lsg-convert: error: "


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def one_error_line(capsys: pytest.CaptureFixture[str], code: int, expected_code: int) -> str:
    err = capsys.readouterr().err
    assert code == expected_code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(ERROR_PREFIX), err
    return lines[0]


@pytest.fixture
def source_copy(tiny_bert_dir: Path, tmp_path: Path) -> Path:
    """A copy of the tiny BERT inside `parent/`, beside a file of the user's (`parent/notes.txt`)."""
    parent = tmp_path / "parent"
    source = shutil.copytree(tiny_bert_dir, parent / "mini")
    (parent / "notes.txt").write_text("the user's notes\n")
    return source


@pytest.mark.parametrize("where", ["the source", "its parent", "inside it"])
def test_the_cli_refuses_an_output_overlapping_the_source_even_with_overwrite(source_copy, capsys, where):
    save_path = {"the source": source_copy, "its parent": source_copy.parent, "inside it": source_copy / "out"}[where]
    before = files_of(source_copy.parent)

    code = main([str(source_copy), "--max-len", "256", "--save-path", str(save_path), "--overwrite"])

    line = one_error_line(capsys, code, 5)
    assert "source" in line and "--save-path" in line
    assert files_of(source_copy.parent) == before


def test_the_cli_refuses_the_source_folder_as_output_without_overwrite_too(source_copy, capsys):
    before = files_of(source_copy)
    code = main([str(source_copy), "--max-len", "256", "--save-path", str(source_copy)])
    line = one_error_line(capsys, code, 5)
    assert "is the source folder" in line and "--overwrite" not in line.split("source folder")[1]
    assert files_of(source_copy) == before


def test_save_converted_refuses_the_source_folder_with_overwrite(source_copy):
    model, tokenizer = LSGConverter(max_sequence_length=256).convert_from_pretrained(source_copy)
    before = files_of(source_copy.parent)

    for save_path in (source_copy, source_copy.parent):
        with pytest.raises(OutputOverlapsSourceError, match="save_path="):
            save_converted(model, tokenizer, save_path, overwrite=True)

    assert files_of(source_copy.parent) == before


def test_an_output_under_a_file_is_refused_before_the_conversion_in_one_line(tiny_bert_dir, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")

    result = run_process(cli_command(tiny_bert_dir, "--max-len", "256", "--save-path", blocker / "out"), tmp_path, None)

    assert result.returncode == OutputNotWritableError.exit_code, result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "is a file, not a folder" in result.stderr and "Traceback" not in result.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a-file"]


def test_a_write_the_file_system_refuses_raises_one_error_and_leaves_nothing(converted_tiny, tmp_path):
    model, tokenizer = converted_tiny
    out = tmp_path / ("x" * 250)  # a valid name, but the save's staging folder beside it is over the 255-byte limit

    with pytest.raises(OutputNotWritableError, match="File name too long.*Nothing was written there"):
        save_converted(model, tokenizer, out)

    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def converted_tiny(tiny_bert_dir):
    return LSGConverter(max_sequence_length=256).convert_from_pretrained(tiny_bert_dir)


def test_the_quickstart_never_replaces_a_folder_it_did_not_write(tmp_path):
    users_folder = tmp_path / "mine"
    users_folder.mkdir()
    (users_folder / "notes.txt").write_text("the user's notes\n")
    quickstart = Path(__file__).resolve().parents[1] / "examples" / "quickstart.py"

    result = run_process([sys.executable, str(quickstart), "--save-path", str(users_folder), "--max-len", "1024"], tmp_path, None)

    assert result.returncode != 0 and "already exists and is not empty" in result.stderr
    assert files_of(users_folder) == {"notes.txt": b"the user's notes\n"}

