"""The `lsg-convert` command line: success, --help, and one clear exit code per bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import save_tiny_source
from lsg_converter import ARCHITECTURES
from lsg_converter.cli import main

ERROR_PREFIX = "lsg-convert: error:"


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _assert_clean_error(capsys: pytest.CaptureFixture[str], code: int, expected_code: int) -> str:
    """The exit code is `expected_code` and stderr holds exactly one line starting with the error prefix."""
    err = capsys.readouterr().err
    assert code == expected_code, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected a one-line error, got:\n{err}"
    assert lines[0].startswith(ERROR_PREFIX)
    return lines[0]


def _console_script() -> str:
    beside_python = Path(sys.executable).with_name("lsg-convert")
    script = str(beside_python) if beside_python.exists() else shutil.which("lsg-convert")
    assert script, "the lsg-convert console script is not installed (pip install -e .)"
    return script


# ---------------------------------------------------------------------------------------------- success


def test_success_writes_the_folder_and_returns_0(tiny_bert_dir, tmp_path, capsys):
    out = tmp_path / "out"
    code = main([str(tiny_bert_dir), "--max-len", "512", "--save-path", str(out), "--block-size", "32"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "lsg-bert"
    assert config["max_position_embeddings"] == 512
    assert config["block_size"] == 32
    assert (out / "model.safetensors").is_file()
    assert str(out) in captured.out


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_every_architecture_converts_from_the_command_line(arch, tmp_path, capsys):
    source = save_tiny_source(tmp_path / "source", arch, ARCHITECTURES[arch].default_head)

    code = main([str(source), "--max-len", "2048", "--save-path", str(tmp_path / "out"), "--num-global-tokens", "2"])

    assert code == 0, capsys.readouterr().err
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == f"lsg-{arch}" and config["num_global_tokens"] == 2
    assert (tmp_path / "out" / f"modeling_lsg_{arch}.py").is_file()


def test_bart_decoder_can_be_kept_from_the_global_tokens(tmp_path, capsys):
    source = save_tiny_source(tmp_path / "source", "bart", "BartForConditionalGeneration")

    code = main([str(source), "--max-len", "1024", "--save-path", str(tmp_path / "out"), "--no-pass-global-tokens-to-decoder"])

    assert code == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "out" / "config.json").read_text())["pass_global_tokens_to_decoder"] is False


def test_quiet_success_prints_nothing(tiny_bert_dir, tmp_path, capsys):
    code = main([str(tiny_bert_dir), "--max-len", "256", "--save-path", str(tmp_path / "out"), "--quiet"])
    assert code == 0
    assert capsys.readouterr().out == ""


def test_default_save_path_is_source_name_lsg_max_len(tiny_bert_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([str(tiny_bert_dir), "--max-len", "256"]) == 0
    assert (tmp_path / f"{tiny_bert_dir.name}-lsg-256" / "config.json").is_file()


def test_help_shows_examples_and_exit_codes(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "examples:" in out
    assert "lsg-convert bert-base-uncased --max-len 4096" in out
    assert "exit codes" in out
    assert "--overwrite" in out and "--push-to-hub" in out
    assert "6 corrupt" in out and "7 Hub" in out


def test_console_script_converts_and_exits_0(tiny_bert_dir, tmp_path):
    out = tmp_path / "out"
    result = subprocess.run(
        [_console_script(), str(tiny_bert_dir), "--max-len", "256", "--save-path", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert (out / "config.json").is_file()
    assert (out / "modeling_lsg_bert.py").is_file()


def test_console_script_error_exits_with_its_code_and_no_traceback(tmp_path):
    result = subprocess.run(
        [_console_script(), str(tmp_path / "missing"), "--max-len", "256", "--save-path", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().startswith(ERROR_PREFIX)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------- bad inputs


def test_missing_source_exits_2_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    code = main([str(tmp_path / "no-such-model"), "--max-len", "256", "--save-path", str(out)])
    _assert_clean_error(capsys, code, 2)
    assert not out.exists()


def test_missing_relative_source_error_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = main(["no-such-model", "--max-len", "256", "--save-path", "out"])
    _assert_clean_error(capsys, code, 2)


def test_unsupported_model_type_exits_3_and_writes_nothing(tmp_path, capsys):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=32)).save_pretrained(
        tmp_path / "gpt2"
    )
    out = tmp_path / "out"
    code = main([str(tmp_path / "gpt2"), "--max-len", "256", "--save-path", str(out)])
    line = _assert_clean_error(capsys, code, 3)
    assert "bert" in line
    assert not out.exists()


@pytest.mark.parametrize("max_len", ["0", "-5"])
def test_non_positive_max_len_exits_4_and_writes_nothing(tiny_bert_dir, tmp_path, capsys, max_len):
    out = tmp_path / "out"
    code = main([str(tiny_bert_dir), "--max-len", max_len, "--save-path", str(out)])
    _assert_clean_error(capsys, code, 4)
    assert not out.exists()


def test_block_size_0_exits_4_and_writes_nothing(tiny_bert_dir, tmp_path, capsys):
    out = tmp_path / "out"
    code = main([str(tiny_bert_dir), "--max-len", "256", "--block-size", "0", "--save-path", str(out)])
    _assert_clean_error(capsys, code, 4)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_existing_output_without_overwrite_exits_5_and_leaves_files_untouched(tiny_bert_dir, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text('{"mine": true}\n')
    (out / "weights.bin").write_bytes(b"\x00\x01\x02")
    before = _files(out)
    code = main([str(tiny_bert_dir), "--max-len", "256", "--save-path", str(out)])
    line = _assert_clean_error(capsys, code, 5)
    assert "--overwrite" in line
    assert _files(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_overwrite_replaces_the_existing_output(tiny_bert_dir, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text('{"mine": true}\n')
    (out / "weights.bin").write_bytes(b"\x00\x01\x02")
    code = main([str(tiny_bert_dir), "--max-len", "256", "--save-path", str(out), "--overwrite"])
    assert code == 0, capsys.readouterr().err
    assert not (out / "weights.bin").exists()
    assert json.loads((out / "config.json").read_text())["model_type"] == "lsg-bert"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
