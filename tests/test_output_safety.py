"""Nothing of the user's is ever destroyed: an output that is, holds or lies inside the source is refused,
overwrite or not; an output that cannot be written is refused before the conversion, in one line, and
a write that fails leaves nothing behind."""

from __future__ import annotations

import errno
import shutil
import sys
from pathlib import Path
from typing import Callable

import pytest

from helpers import cli_command, run_process
from lsg_converter import LSGConverter, save_converted
from lsg_converter import saving
from lsg_converter.errors import (
    OutputExistsError,
    OutputNotReplaceableError,
    OutputNotWritableError,
    OutputOverlapsSourceError,
)
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

    assert result.returncode != 0 and "holds notes.txt and no model's config.json" in result.stderr
    assert files_of(users_folder) == {"notes.txt": b"the user's notes\n"}



# --overwrite replaces only what a conversion wrote: a folder holding a model's config.json, or an empty one.


@pytest.fixture
def users_home(tmp_path: Path) -> Path:
    """A folder of the user's own files, as a home folder holds them."""
    home = tmp_path / "home"
    (home / "Documents").mkdir(parents=True)
    (home / "Documents" / "thesis.txt").write_text("chapter 1\n")
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_rsa").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    return home


@pytest.fixture
def earlier_output(converted_tiny, tmp_path: Path) -> Path:
    """The folder an earlier conversion saved."""
    model, tokenizer = converted_tiny
    return save_converted(model, tokenizer, tmp_path / "out")


@pytest.mark.parametrize("overwrite", [["--overwrite"], []], ids=["with --overwrite", "without"])
def test_the_cli_never_replaces_a_file(tiny_bert_dir, tmp_path, capsys, overwrite):
    notes = tmp_path / "notes.txt"
    notes.write_text("draft\n")

    code = main([str(tiny_bert_dir), "--max-len", "256", "--save-path", str(notes), *overwrite])

    line = one_error_line(capsys, code, 5)
    assert f"{notes} is a file" in line and "pass --overwrite" not in line
    assert notes.read_text() == "draft\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("overwrite", [["--overwrite"], []], ids=["with --overwrite", "without"])
def test_the_cli_never_replaces_a_folder_of_the_users_files(tiny_bert_dir, users_home, capsys, overwrite):
    before = files_of(users_home)

    code = main([str(tiny_bert_dir), "--max-len", "256", "--save-path", str(users_home), *overwrite])

    line = one_error_line(capsys, code, 5)
    assert ".ssh, Documents" in line and "no model's config.json" in line and "pass --overwrite" not in line
    assert files_of(users_home) == before
    assert sorted(path.name for path in users_home.parent.iterdir()) == ["home"]


def test_save_converted_never_replaces_a_folder_of_the_users_files(converted_tiny, users_home):
    model, tokenizer = converted_tiny
    before = files_of(users_home)

    with pytest.raises(OutputNotReplaceableError, match="holds .ssh, Documents.*save_path="):
        save_converted(model, tokenizer, users_home, overwrite=True)

    assert files_of(users_home) == before


def test_a_folder_whose_config_json_is_no_models_is_the_users(converted_tiny, tmp_path):
    model, tokenizer = converted_tiny
    project = tmp_path / "project"
    project.mkdir()
    (project / "config.json").write_text('{"theme": "dark"}\n')

    with pytest.raises(OutputNotReplaceableError, match="no model's config.json"):
        save_converted(model, tokenizer, project, overwrite=True)

    assert files_of(project) == {"config.json": b'{"theme": "dark"}\n'}


def test_overwrite_replaces_an_earlier_conversions_output(converted_tiny, earlier_output):
    model, tokenizer = converted_tiny
    (earlier_output / "stale.bin").write_bytes(b"\x00")

    save_converted(model, tokenizer, earlier_output, overwrite=True)

    assert not (earlier_output / "stale.bin").exists() and (earlier_output / "model.safetensors").is_file()
    assert sorted(path.name for path in earlier_output.parent.iterdir()) == ["out"]


def test_an_earlier_output_is_kept_without_overwrite_and_the_refusal_names_the_flag(converted_tiny, earlier_output):
    model, tokenizer = converted_tiny
    before = files_of(earlier_output)

    with pytest.raises(OutputExistsError, match="already holds a model.*pass overwrite=True"):
        save_converted(model, tokenizer, earlier_output)

    assert files_of(earlier_output) == before


def test_an_empty_folder_is_written_into_without_overwrite(converted_tiny, tmp_path):
    model, tokenizer = converted_tiny
    (tmp_path / "out").mkdir()

    save_converted(model, tokenizer, tmp_path / "out")

    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"]


def failing_rename(monkeypatch, fails: Callable[[Path, Path], bool], error: BaseException) -> None:
    """The saving module's renames raise `error` where `fails(path, destination)`; the others happen."""
    rename = saving.Path.rename

    def rename_unless_it_fails(path, destination):
        if fails(Path(path), Path(destination)):
            raise error
        return rename(path, destination)

    monkeypatch.setattr(saving.Path, "rename", rename_unless_it_fails)


@pytest.mark.parametrize(
    "error", [OSError(errno.EXDEV, "Invalid cross-device link"), KeyboardInterrupt()], ids=["OSError", "Ctrl-C"]
)
def test_a_failure_moving_the_new_output_in_puts_the_earlier_one_back(converted_tiny, earlier_output, monkeypatch, error):
    model, tokenizer = converted_tiny
    before = files_of(earlier_output)
    failing_rename(monkeypatch, lambda path, destination: path.suffix == ".partial" and destination == earlier_output, error)

    with pytest.raises(OutputNotWritableError if isinstance(error, OSError) else KeyboardInterrupt) as failed:
        save_converted(model, tokenizer, earlier_output, overwrite=True)

    if isinstance(error, OSError):
        assert "Invalid cross-device link" in str(failed.value) and "is back in place" in str(failed.value)
    assert files_of(earlier_output) == before
    assert sorted(path.name for path in earlier_output.parent.iterdir()) == ["out"]


def test_an_output_that_cannot_be_moved_aside_like_a_mount_point_is_kept_as_it_was(converted_tiny, earlier_output, monkeypatch):
    model, tokenizer = converted_tiny
    before = files_of(earlier_output)
    busy = OSError(errno.EBUSY, "Device or resource busy")
    failing_rename(monkeypatch, lambda path, destination: path == earlier_output, busy)

    with pytest.raises(OutputNotWritableError, match="cannot be moved aside.*left as it was") as failed:
        save_converted(model, tokenizer, earlier_output, overwrite=True)

    assert "Nothing was written there" not in str(failed.value) and "free space" not in str(failed.value)
    assert files_of(earlier_output) == before
    assert sorted(path.name for path in earlier_output.parent.iterdir()) == ["out"]


def test_a_save_path_starting_with_a_tilde_is_in_the_home_folder(tiny_bert_dir, tmp_path, monkeypatch, capsys):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)

    code = main([str(tiny_bert_dir), "--max-len", "256", "--save-path", "~/x"])

    assert code == 0, capsys.readouterr().err
    assert (home / "x" / "config.json").is_file()
    assert list(work.iterdir()) == []
