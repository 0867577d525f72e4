"""`lsg-convert` refuses what the conversion cannot carry: one line, its exit code, nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import BertModel

from helpers import TINY_CONFIGS, save_tiny_sentence_transformer, save_tiny_source
from lsg_converter import LSGConverter
from lsg_converter_cli import main

ERROR_PREFIX = "lsg-convert: error:"


def refusal(capsys: pytest.CaptureFixture[str], argv: list[str], folder: Path, expected_code: int) -> str:
    """Run the CLI with --save-path folder/out; the one error line, after checking the code and that nothing was written."""
    before = sorted(p.name for p in folder.iterdir())
    capsys.readouterr()  # what building the source printed
    code = main([*argv, "--save-path", str(folder / "out")])
    err = capsys.readouterr().err
    assert code == expected_code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(ERROR_PREFIX), err
    assert sorted(p.name for p in folder.iterdir()) == before
    return lines[0]


def test_a_max_length_below_the_source_positions_exits_2(tiny_bert_dir, tmp_path, capsys):
    line = refusal(capsys, [str(tiny_bert_dir), "--max-len", "100"], tmp_path, 2)
    assert "100" in line and "128 positions" in line


@pytest.mark.parametrize(
    "flags,named",
    [
        (["--block-size", "600"], "600 is larger than"),
        (["--sparsity-type", "pooling", "--sparsity-factor", "0"], "no sparse keys"),
        (["--sparsity-type", "norm", "--sparse-block-size", "0"], "no sparse keys"),
    ],
    ids=["block-over-max-len", "factor-0", "sparse-block-0"],
)
def test_a_setting_that_cannot_work_exits_2(tiny_bert_dir, tmp_path, capsys, flags, named):
    line = refusal(capsys, [str(tiny_bert_dir), "--max-len", "512", *flags], tmp_path, 2)
    assert named in line


def test_relative_position_embeddings_exit_2_naming_the_setting(tmp_path, capsys):
    config = TINY_CONFIGS["bert"]()
    config.position_embedding_type = "relative_key_query"
    BertModel(config).save_pretrained(tmp_path / "source")

    line = refusal(capsys, [str(tmp_path / "source"), "--max-len", "512"], tmp_path, 2)
    assert "position_embedding_type" in line and "relative_key_query" in line


def test_a_folder_without_weights_exits_4_saying_they_are_missing(tiny_bert_dir, tmp_path, capsys):
    shutil.copytree(tiny_bert_dir, tmp_path / "source")
    (tmp_path / "source" / "model.safetensors").unlink()

    line = refusal(capsys, [str(tmp_path / "source"), "--max-len", "512"], tmp_path, 4)
    assert "weights are missing" in line and "corrupt" not in line


class Blocked:
    """Any class of the test module: torch's weights_only loader allows none."""


def test_an_unsafe_pickle_exits_6_refused_for_safety(tiny_bert_dir, tmp_path, capsys):
    source = tmp_path / "source"
    shutil.copytree(tiny_bert_dir, source)
    state = load_file(source / "model.safetensors")
    (source / "model.safetensors").unlink()
    torch.save({**state, "extra": Blocked()}, source / "pytorch_model.bin")

    line = refusal(capsys, [str(source), "--max-len", "512"], tmp_path, 6)
    assert "for safety" in line and f"{__name__}.Blocked" in line and "safetensors" in line


def test_a_source_whose_weights_miss_every_head_exits_6(tiny_bert_dir, tmp_path, capsys):
    source = tmp_path / "source"
    shutil.copytree(tiny_bert_dir, source)
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))  # the weights have 2

    line = refusal(capsys, [str(source), "--max-len", "512"], tmp_path, 6)
    assert "bert.encoder.layer.2" in line or "encoder.layer.2" in line


@pytest.fixture
def texts(tmp_path) -> Path:
    """A text to adapt on, outside the folder `refusal` watches."""
    path = tmp_path.parent / f"{tmp_path.name}-texts.txt"
    path.write_text("The king and queen spoke to their people about war and peace. " * 200)
    return path


@pytest.fixture
def no_conversion(monkeypatch):
    """The conversion is never reached: these refusals must come before it."""

    def converted(*args, **kwargs):
        raise AssertionError("the source was converted before the refusal")

    monkeypatch.setattr(LSGConverter, "convert_from_pretrained", converted)


def test_adapt_on_a_source_without_sentence_transformers_pipeline_exits_3_before_converting(
    tmp_path, capsys, texts, no_conversion
):
    source = save_tiny_source(tmp_path / "t5", "t5", "T5ForConditionalGeneration")

    line = refusal(capsys, [str(source), "--max-len", "512", "--adapt-on", str(texts)], tmp_path, 3)
    assert "no sentence-transformers model (no modules.json)" in line and "without --adapt-on" in line


def test_adapt_on_a_head_exits_3_before_converting(tiny_bert_dir, tmp_path, capsys, texts, no_conversion):
    source = save_tiny_sentence_transformer(tmp_path / "st", tiny_bert_dir)
    argv = [str(source), "--max-len", "512", "--adapt-on", str(texts), "--architecture", "BertForSequenceClassification"]

    line = refusal(capsys, argv, tmp_path, 3)
    assert "--architecture BertForSequenceClassification is a head" in line and "(BertModel)" in line
