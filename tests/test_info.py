"""`lsg-convert PATH --info` says what a model is without converting it: a plain model (not LSG yet), an
LSG model of this library, or a checkpoint of the 2023 reference, with the tokens it reads and its settings."""

from __future__ import annotations

from helpers import FIXTURES
from lsg_converter import LSGConverter, save_converted
from lsg_converter_cli import main


def test_info_on_a_converted_model_gives_its_head_length_and_settings(tiny_bert_dir, tmp_path, capsys):
    model, tokenizer = LSGConverter(max_sequence_length=1024).convert_from_pretrained(tiny_bert_dir, num_global_tokens=3)
    save_converted(model, tokenizer, tmp_path / "lsg")

    assert main([str(tmp_path / "lsg"), "--info"]) == 0

    out = capsys.readouterr().out
    assert "an LSG bert model (LSGBertForMaskedLM) written by lsg_converter" in out
    assert "reads up to 1,024 tokens" in out and "num_global_tokens=3" in out
    assert not (tmp_path / "lsg-lsg-1024").exists()


def test_info_on_a_2023_checkpoint_names_its_format_and_legacy_window(capsys):
    assert main([str(FIXTURES / "bart-norm"), "--info"]) == 0

    out = capsys.readouterr().out
    assert "written by the 2023 reference" in out and "legacy_sparse_window=True" in out


def test_info_on_a_plain_model_says_it_is_not_lsg_and_how_to_convert_it(tiny_bert_dir, capsys):
    assert main([str(tiny_bert_dir), "--info"]) == 0
    assert "not LSG yet: lsg-convert" in capsys.readouterr().out


def test_info_on_a_folder_without_a_model_is_one_line_exit_4(tmp_path, capsys):
    assert main([str(tmp_path), "--info"]) == 4
    assert capsys.readouterr().err.startswith("lsg-convert: error: ")


def test_max_len_is_still_required_to_convert(tiny_bert_dir, capsys):
    assert main([str(tiny_bert_dir)]) == 2
    assert "--max-len" in capsys.readouterr().err


def test_info_as_a_command_word_is_info_as_a_flag(tiny_bert_dir, capsys):
    assert main([str(tiny_bert_dir), "--info"]) == 0
    as_flag = capsys.readouterr().out

    assert main(["info", str(tiny_bert_dir)]) == 0
    assert capsys.readouterr().out == as_flag


def test_info_after_the_model_is_refused_with_the_flag_named(tiny_bert_dir, capsys):
    assert main([str(tiny_bert_dir), "info"]) == 2
    assert "unrecognized arguments: info: did you mean --info?" in capsys.readouterr().err


def test_info_without_a_model_asks_for_one(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["info"]) == 2
    assert capsys.readouterr().err == "lsg-convert: error: info needs the model to describe: lsg-convert info MODEL (see lsg-convert --help)\n"
