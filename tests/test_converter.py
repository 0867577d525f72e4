"""LSGConverter and save_converted on a tiny local BERT: positions, global tokens, settings, errors, saving."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModel,
    AutoModelForMaskedLM,
    AutoTokenizer,
    BartForConditionalGeneration,
    BertForMaskedLM,
    BertForSequenceClassification,
    BertModel,
    GPT2Config,
    GPT2LMHeadModel,
    MBartForConditionalGeneration,
)
from transformers.utils import logging as transformers_logging

from helpers import FIXTURES, TINY_CONFIGS, TINY_LENGTH, padded_batch, remote_code_files, save_tiny_source

import lsg_converter
from lsg_converter import (
    CorruptCheckpointError,
    InvalidSettingsError,
    LSGBertConfig,
    LSGBertForMaskedLM,
    LSGBertForSequenceClassification,
    LSGConverter,
    OutputExistsError,
    SourceNotFoundError,
    UnknownSettingError,
    UnsafeCheckpointError,
    UnsupportedModelError,
    save_converted,
)

SOURCE_POSITIONS = 128  # rows of tiny_bert_dir's position table
NEW_LENGTH = 1000  # deliberately not a multiple of SOURCE_POSITIONS
MAX_GLOBAL_TOKENS = 512  # rows of the global token table


@pytest.fixture(scope="module")
def source(tiny_bert_dir: Path) -> BertForMaskedLM:
    return BertForMaskedLM.from_pretrained(tiny_bert_dir).eval()


@pytest.fixture(scope="module")
def converted(tiny_bert_dir: Path):
    """(model, tokenizer) of tiny_bert_dir converted to NEW_LENGTH with the default settings. Read only."""
    return LSGConverter(max_sequence_length=NEW_LENGTH).convert_from_pretrained(tiny_bert_dir)


def _global_table(model) -> torch.Tensor:
    return model.bert.embeddings.global_embeddings.weight.detach()


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------------------------- positions


def test_position_table_keeps_the_source_rows_then_repeats_the_body_rows(converted, source):
    model, _ = converted
    new_table = model.bert.embeddings.position_embeddings.weight.detach()
    old_table = source.bert.embeddings.position_embeddings.weight.detach()
    assert new_table.shape == (NEW_LENGTH, old_table.shape[1])
    torch.testing.assert_close(new_table[:SOURCE_POSITIONS], old_table, rtol=0, atol=0)
    body_period = SOURCE_POSITIONS - 2  # rows 1..126: between [CLS] (row 0) and the last [SEP] (row 127)
    # positions 128..253 continue the body period of the first window (127 was its row 1): rows 2..126, 1
    first_repeat = old_table[[*range(2, SOURCE_POSITIONS - 1), 1]]
    torch.testing.assert_close(new_table[SOURCE_POSITIONS : SOURCE_POSITIONS + body_period], first_repeat, rtol=0, atol=0)
    for position in range(SOURCE_POSITIONS + body_period, NEW_LENGTH):
        assert torch.equal(new_table[position], new_table[position - body_period]), position


def test_table_position_tiling_repeats_the_whole_source_table(tiny_bert_dir, source):
    model, _ = LSGConverter(max_sequence_length=NEW_LENGTH, position_tiling="table").convert_from_pretrained(
        tiny_bert_dir
    )
    new_table = model.bert.embeddings.position_embeddings.weight.detach()
    old_table = source.bert.embeddings.position_embeddings.weight.detach()
    expected = old_table[torch.arange(NEW_LENGTH) % SOURCE_POSITIONS]
    torch.testing.assert_close(new_table, expected, rtol=0, atol=0)


@pytest.mark.parametrize("arch, head", [("bert", "BertForMaskedLM"), ("roberta", "RobertaForMaskedLM"), ("bart", "BartModel")])
@pytest.mark.parametrize("tiling", ["body", "table"])
def test_converting_an_lsg_model_to_a_longer_length_gives_the_table_of_a_direct_conversion(arch, head, tiling, tmp_path):
    source = save_tiny_source(tmp_path / "source", arch, head)
    converter = LSGConverter(max_sequence_length=NEW_LENGTH, position_tiling=tiling)
    shorter, tokenizer = LSGConverter(max_sequence_length=2 * TINY_LENGTH, position_tiling=tiling).convert_from_pretrained(source)
    resized, _ = converter.convert_from_pretrained(save_converted(shorter, tokenizer, tmp_path / "shorter"))
    direct, _ = converter.convert_from_pretrained(source)

    tables = [
        {name: weight for name, weight in model.state_dict().items() if name.endswith("positions.weight")
         or name.endswith("position_embeddings.weight")}
        for model in (resized, direct)
    ]
    assert tables[0].keys() == tables[1].keys() and tables[0]
    for name in tables[0]:
        assert torch.equal(tables[0][name], tables[1][name]), name
    assert resized.config.pretrained_positions == direct.config.pretrained_positions == TINY_LENGTH


def test_a_reference_checkpoint_without_recorded_positions_continues_its_source_table(caplog):
    reference = LSGBertForMaskedLM.from_pretrained(FIXTURES / "bert-norm").bert.embeddings.position_embeddings.weight
    pretrained = 128  # the reference tiled its tiny source's 128-row table whole up to 1024 rows
    with caplog.at_level("INFO", logger="lsg_converter"):
        model, _ = LSGConverter(max_sequence_length=2048).convert_from_pretrained(FIXTURES / "bert-norm")
    table = model.bert.embeddings.position_embeddings.weight.detach()

    assert model.config.pretrained_positions == pretrained
    assert "repeats its first 128 rows" in caplog.text
    assert torch.equal(table[:1024], reference.detach())
    body_rows = 1 + (torch.arange(1024, 2048) - 1) % (pretrained - 2)
    assert torch.equal(table[1024:], reference.detach()[body_rows])


def test_unknown_position_tiling_raises_invalid_settings_error():
    with pytest.raises(InvalidSettingsError, match="body, table"):
        LSGConverter(position_tiling="mirror")


def test_config_max_position_embeddings_is_updated(converted):
    model, _ = converted
    assert model.config.max_position_embeddings == NEW_LENGTH


def test_position_ids_buffer_is_rebuilt_at_new_length(converted):
    model, _ = converted
    position_ids = model.bert.embeddings.position_ids
    assert position_ids.shape == (1, NEW_LENGTH)
    assert torch.equal(position_ids[0], torch.arange(NEW_LENGTH, dtype=position_ids.dtype))


def test_token_type_ids_buffer_is_rebuilt_at_new_length(converted):
    model, _ = converted
    token_type_ids = model.bert.embeddings.token_type_ids
    assert token_type_ids.shape == (1, NEW_LENGTH)
    assert not token_type_ids.any()


def test_source_weights_are_copied_unchanged(converted, source):
    model, _ = converted
    new_state = model.state_dict()
    for name, tensor in source.state_dict().items():
        if name in ("bert.embeddings.position_embeddings.weight",) or name.endswith(("position_ids", "token_type_ids")):
            continue
        assert name in new_state, f"{name} missing from the converted model"
        assert torch.equal(new_state[name], tensor), f"{name} changed during conversion"


# ---------------------------------------------------------------------------------------------- global tokens


def test_global_token_0_is_cls_plus_first_position_plus_type_0(converted, source):
    model, tokenizer = converted
    embeddings = source.bert.embeddings
    expected = (
        embeddings.word_embeddings.weight[tokenizer.cls_token_id]
        + embeddings.position_embeddings.weight[0]
        + embeddings.token_type_embeddings.weight[0]
    ).detach()
    torch.testing.assert_close(_global_table(model)[0], expected)


@pytest.mark.parametrize("stride", [64, 32])
def test_global_tokens_after_the_first_are_mask_plus_strided_position_plus_type_0(tiny_bert_dir, source, stride):
    model, tokenizer = LSGConverter(
        max_sequence_length=256, global_positional_stride=stride
    ).convert_from_pretrained(tiny_bert_dir)
    embeddings = source.bert.embeddings
    word = embeddings.word_embeddings.weight[tokenizer.mask_token_id].detach()
    type_0 = embeddings.token_type_embeddings.weight[0].detach()
    ks = [k for k in range(1, MAX_GLOBAL_TOKENS) if stride * k < SOURCE_POSITIONS]
    assert ks, "the source table must give at least one strided position"
    for k in ks:
        expected = word + embeddings.position_embeddings.weight[stride * k].detach() + type_0
        torch.testing.assert_close(_global_table(model)[k], expected, msg=f"global token {k}")


def test_random_global_init_is_reproducible_with_the_same_seed(tiny_bert_dir):
    first, _ = LSGConverter(max_sequence_length=256, random_global_init=True, seed=7).convert_from_pretrained(tiny_bert_dir)
    second, _ = LSGConverter(max_sequence_length=256, random_global_init=True, seed=7).convert_from_pretrained(tiny_bert_dir)
    assert torch.equal(_global_table(first), _global_table(second))


def test_random_global_init_differs_with_another_seed(tiny_bert_dir):
    first, _ = LSGConverter(max_sequence_length=256, random_global_init=True, seed=7).convert_from_pretrained(tiny_bert_dir)
    second, _ = LSGConverter(max_sequence_length=256, random_global_init=True, seed=8).convert_from_pretrained(tiny_bert_dir)
    assert not torch.allclose(_global_table(first), _global_table(second))


def test_conversion_leaves_the_global_rng_untouched(tiny_bert_dir):
    torch.manual_seed(2026)
    state = torch.random.get_rng_state()
    LSGConverter(max_sequence_length=256, random_global_init=True).convert_from_pretrained(tiny_bert_dir)
    assert torch.equal(torch.random.get_rng_state(), state)


# ---------------------------------------------------------------------------------------------- tokenizer


def test_tokenizer_model_max_length_is_set(converted):
    _, tokenizer = converted
    assert tokenizer.model_max_length == NEW_LENGTH


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
LONG_TOKENS = 3000


@pytest.fixture(scope="module")
def truncating_source(tiny_bert_dir, minilm_path, tmp_path_factory) -> Path:
    """tiny_bert_dir's weights beside all-MiniLM-L6-v2's own tokenizer files, whose tokenizer.json
    truncates and pads to 128 tokens."""
    folder = tmp_path_factory.mktemp("truncating") / "source"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        (folder / name).write_bytes((tiny_bert_dir / name).read_bytes())
    for name in TOKENIZER_FILES:
        (folder / name).write_bytes((minilm_path / name).read_bytes())
    assert json.loads((folder / "tokenizer.json").read_text())["truncation"]["max_length"] == 128
    return folder


@pytest.fixture(scope="module")
def untruncated(truncating_source):
    """(model, tokenizer) of truncating_source converted to 4096 tokens."""
    return LSGConverter(max_sequence_length=4096).convert_from_pretrained(truncating_source)


def _long_text() -> str:
    """A text of LONG_TOKENS ids with [CLS] and [SEP]."""
    return " ".join(["word"] * (LONG_TOKENS - 2))


def test_converted_tokenizer_has_no_truncation_or_padding_of_the_source(untruncated):
    _, tokenizer = untruncated
    assert tokenizer.backend_tokenizer.truncation is None and tokenizer.backend_tokenizer.padding is None
    assert len(tokenizer.backend_tokenizer.encode(_long_text()).ids) == LONG_TOKENS


def test_saved_tokenizer_json_has_no_truncation_or_padding(untruncated, tmp_path):
    model, tokenizer = untruncated
    folder = save_converted(model, tokenizer, tmp_path / "out")
    saved = json.loads((folder / "tokenizer.json").read_text())
    assert saved["truncation"] is None and saved["padding"] is None
    assert "max_length" not in json.loads((folder / "tokenizer_config.json").read_text())


def test_saved_tokenizer_encodes_a_long_text_whole_by_default(untruncated, tmp_path):
    model, tokenizer = untruncated
    reloaded = AutoTokenizer.from_pretrained(save_converted(model, tokenizer, tmp_path / "out"))
    assert reloaded.model_max_length == 4096
    assert len(reloaded(_long_text())["input_ids"]) == LONG_TOKENS


def test_converted_tokenizer_truncates_and_pads_to_the_new_length_when_asked(untruncated):
    _, tokenizer = untruncated
    assert len(tokenizer(_long_text() * 2, truncation=True)["input_ids"]) == 4096
    assert len(tokenizer("word", padding="max_length")["input_ids"]) == 4096


def _bart_globals(source_dir, word_ids, strided_rows):
    """Expected BART global tokens: word + position row (the table's 2 offset rows skipped)."""
    source = BartForConditionalGeneration.from_pretrained(source_dir)
    words, positions = source.model.shared.weight.detach(), source.model.encoder.embed_positions.weight.detach()[2:]
    return torch.stack([words[i] + positions[row] for i, row in zip(word_ids, strided_rows)])


def test_source_without_tokenizer_files_takes_global_tokens_from_the_config_ids(tmp_path, caplog):
    source_dir = save_tiny_source(tmp_path / "source", "bart", "BartForConditionalGeneration")
    assert not {"tokenizer.json", "tokenizer_config.json", "vocab.json"} & {p.name for p in source_dir.iterdir()}

    with caplog.at_level("WARNING", logger="lsg_converter"):
        model, tokenizer = LSGConverter(max_sequence_length=512).convert_from_pretrained(source_dir, num_global_tokens=2)

    assert tokenizer is None
    warning = " ".join(record.getMessage() for record in caplog.records)
    assert "no tokenizer" in warning and "bos_token_id 0" in warning and "no mask_token_id" in warning
    bos = model.config.bos_token_id
    expected = _bart_globals(source_dir, [bos, bos], [0, 64])  # no mask id: every global uses bos
    torch.testing.assert_close(model.model.encoder.global_embeddings.weight[:2].detach(), expected)


def test_barthez_style_mbart_source_uses_its_tokenizer_of_another_class_when_the_ids_agree(tmp_path, caplog):
    """BARThez checkpoints are model_type "mbart" with a BarthezTokenizer: a tokenizer class other than
    MBartTokenizer whose special ids are the model's is used as it is."""
    tokenizer = AutoTokenizer.from_pretrained(FIXTURES / "bart-norm")  # <s> 0 <pad> 1 </s> 2 <mask> 4
    config = TINY_CONFIGS["mbart"]()
    config.vocab_size = len(tokenizer)
    source_dir = tmp_path / "source"
    torch.manual_seed(0)
    MBartForConditionalGeneration(config).save_pretrained(source_dir)
    tokenizer.save_pretrained(source_dir)

    with caplog.at_level("WARNING", logger="lsg_converter"):
        model, tokenizer = LSGConverter(max_sequence_length=512).convert_from_pretrained(source_dir, num_global_tokens=2)

    assert type(model).__name__ == "LSGMBartForConditionalGeneration"
    assert type(tokenizer).__name__ != "MBartTokenizer" and tokenizer.mask_token_id == 4
    assert not [record for record in caplog.records if "Global tokens" in record.getMessage()]
    source = MBartForConditionalGeneration.from_pretrained(source_dir)
    words, positions = source.model.shared.weight.detach(), source.model.encoder.embed_positions.weight.detach()[2:]
    expected = torch.stack([words[0] + positions[0], words[4] + positions[64]])
    torch.testing.assert_close(model.model.encoder.global_embeddings.weight[:2].detach(), expected)


def test_tokenizer_of_another_vocabulary_is_not_returned_and_the_config_ids_give_the_global_tokens(
    tmp_path, minilm_path, caplog
):
    source_dir = save_tiny_source(tmp_path / "source", "bart", "BartForConditionalGeneration")
    bert_tokenizer = AutoTokenizer.from_pretrained(minilm_path)  # 30,522 tokens, [PAD] 0: not BART's ids
    bert_tokenizer.save_pretrained(source_dir)

    with caplog.at_level("WARNING", logger="lsg_converter"):
        model, tokenizer = LSGConverter(max_sequence_length=512).convert_from_pretrained(source_dir, num_global_tokens=2)

    assert tokenizer is None
    warnings = [record.getMessage() for record in caplog.records]
    assert f"{type(bert_tokenizer).__name__} has 30522 tokens, the model 99 ids" in warnings[0]
    assert "no tokenizer is returned or saved" in warnings[0]
    assert "config's ids" in " ".join(warnings)
    bos = model.config.bos_token_id
    expected = _bart_globals(source_dir, [bos, bos], [0, 64])
    torch.testing.assert_close(model.model.encoder.global_embeddings.weight[:2].detach(), expected)


def test_a_tokenizer_whose_special_ids_differ_from_the_configs_is_not_returned(tmp_path, caplog):
    tokenizer = AutoTokenizer.from_pretrained(FIXTURES / "bart-norm")  # <pad> 1
    config = TINY_CONFIGS["bart"]()
    config.update(dict(vocab_size=len(tokenizer), pad_token_id=0))
    source_dir = tmp_path / "source"
    BartForConditionalGeneration(config).save_pretrained(source_dir)
    tokenizer.save_pretrained(source_dir)

    with caplog.at_level("WARNING", logger="lsg_converter"):
        _, returned = LSGConverter(max_sequence_length=512).convert_from_pretrained(source_dir)

    assert returned is None
    assert "has pad_token_id 1, the model 0" in caplog.text


# ---------------------------------------------------------------------------------------------- settings


def test_lsg_kwargs_land_in_the_config(tiny_bert_dir):
    settings = dict(
        block_size=32,
        sparse_block_size=16,
        sparsity_factor=4,
        sparsity_type="pooling",
        num_global_tokens=3,
        pool_with_global=False,
        mask_first_token=True,
    )
    model, _ = LSGConverter(max_sequence_length=256).convert_from_pretrained(tiny_bert_dir, **settings)
    for key, value in settings.items():
        assert getattr(model.config, key) == value, key


def test_documented_lsg_defaults_apply_without_kwargs(converted):
    model, _ = converted
    body_third = (SOURCE_POSITIONS - 2) // 3  # 42 here, 170 for a 512-position source
    documented = dict(block_size=body_third, sparsity_type="none", num_global_tokens=1)
    for key, value in documented.items():
        assert getattr(model.config, key) == value, key
    assert model.config.model_type == "lsg-bert"


def test_fresh_conversion_with_one_compressed_token_per_block_keeps_the_aligned_sparse_window(tiny_bert_dir, tmp_path):
    model, tokenizer = LSGConverter(max_sequence_length=256).convert_from_pretrained(
        tiny_bert_dir, block_size=8, sparsity_factor=8, sparse_block_size=8, sparsity_type="pooling"
    )
    folder = save_converted(model, tokenizer, tmp_path / "converted")

    assert model.config.legacy_sparse_window is False
    assert LSGBertForMaskedLM.from_pretrained(folder).config.legacy_sparse_window is False


@pytest.mark.parametrize(
    "values,legacy",
    [
        (dict(model_type="bert", block_size=8, num_global_tokens=1), True),  # a 2023 reference config.json
        (dict(model_type="lsg-bert", block_size=8, num_global_tokens=1), False),  # ours, from before the key
        (dict(model_type="bert"), False),  # a plain BERT config
        (dict(block_size=8, num_global_tokens=1), False),  # built by hand
    ],
    ids=["reference", "ours", "plain", "by-hand"],
)
def test_only_configs_written_by_the_2023_reference_default_to_the_legacy_sparse_window(values, legacy):
    assert LSGBertConfig(**values).legacy_sparse_window is legacy


def test_upgraded_reference_checkpoint_keeps_the_legacy_sparse_window_through_save_and_reconversion(tmp_path):
    model, tokenizer = LSGConverter(max_sequence_length=1024).convert_from_pretrained(FIXTURES / "bert-pooling")
    upgraded = save_converted(model, tokenizer, tmp_path / "upgraded")
    again, _ = LSGConverter(max_sequence_length=2048).convert_from_pretrained(upgraded)

    assert model.config.legacy_sparse_window is True
    assert json.loads((upgraded / "config.json").read_text())["model_type"] == "lsg-bert"
    assert LSGBertForMaskedLM.from_pretrained(upgraded).config.legacy_sparse_window is True
    assert again.config.legacy_sparse_window is True


def test_default_block_size_is_a_multiple_of_the_sparsity_factor_when_sparse_keys_are_used(tiny_bert_dir):
    model, _ = LSGConverter(max_sequence_length=256).convert_from_pretrained(
        tiny_bert_dir, sparsity_type="pooling", sparsity_factor=4
    )
    assert model.config.block_size == 40  # a third of the 126 body positions is 42, rounded down to 4 x 10


def test_explicit_block_size_replaces_the_derived_default(tiny_bert_dir):
    model, _ = LSGConverter(max_sequence_length=256).convert_from_pretrained(tiny_bert_dir, block_size=64)
    assert model.config.block_size == 64


BAD_SETTINGS = {  # setting -> what the one-line message must say (max_sequence_length=256 below)
    "unknown-sparsity-type": ({"sparsity_type": "bogus"}, "sparsity_type='bogus' is unknown: use one of none, norm"),
    "block-0": ({"block_size": 0}, "block_size=0 is not positive: use block_size= of at least 1"),
    "block-negative": ({"block_size": -3}, "block_size=-3 is not positive"),
    "block-over-max-length": ({"block_size": 300}, "block_size=300 is larger than max_sequence_length=256"),
    "sparse-block-0": (
        {"sparsity_type": "norm", "sparse_block_size": 0},
        "sparse_block_size=0 gives sparsity_type='norm' no sparse keys: use sparse_block_size= of at least 1",
    ),
    "sparse-block-over-max-length": (
        {"sparsity_type": "norm", "sparse_block_size": 512, "block_size": 32},
        "sparse_block_size=512 is larger than max_sequence_length=256",
    ),
    "factor-0": ({"sparsity_type": "pooling", "sparsity_factor": 0}, "sparsity_factor=0 gives sparsity_type='pooling'"),
    "factor-negative": ({"sparsity_factor": -2}, "sparsity_factor=-2 is negative"),
    "global-negative": ({"num_global_tokens": -1}, "num_global_tokens=-1 is outside the 512-row global token table"),
    "global-over-table": ({"num_global_tokens": 513}, "use num_global_tokens= between 0 and 512"),
}


@pytest.mark.parametrize("settings,message", BAD_SETTINGS.values(), ids=BAD_SETTINGS)
def test_a_setting_that_cannot_work_is_refused_in_one_line_naming_it(tiny_bert_dir, settings, message):
    with pytest.raises(InvalidSettingsError) as refused:
        LSGConverter(max_sequence_length=256).convert_from_pretrained(tiny_bert_dir, **settings)
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


def test_settings_are_refused_before_the_weights_are_read(tiny_bert_dir, tmp_path):
    source = tmp_path / "source"
    shutil.copytree(tiny_bert_dir, source)
    (source / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(InvalidSettingsError, match="block_size=0"):
        LSGConverter(max_sequence_length=256).convert_from_pretrained(source, block_size=0)


def test_a_max_length_below_the_source_positions_is_refused(tiny_bert_dir):
    with pytest.raises(InvalidSettingsError) as refused:
        LSGConverter(max_sequence_length=100).convert_from_pretrained(tiny_bert_dir)
    assert str(refused.value) == (
        "max_sequence_length=100 is below the 128 positions the source already reads: "
        "use max_sequence_length= of at least 128."
    )


def test_a_sparsity_factor_of_1_makes_every_token_a_sparse_key_and_is_accepted(tiny_bert_dir):
    model, _ = LSGConverter(max_sequence_length=256).convert_from_pretrained(
        tiny_bert_dir, sparsity_type="norm", sparsity_factor=1, sparse_block_size=8, block_size=16
    )
    assert model.config.sparsity_factor == 1


def test_a_misspelt_keyword_raises_a_type_error_naming_the_closest_setting(tiny_bert_dir):
    with pytest.raises(TypeError) as refused:
        LSGConverter(max_sequence_length=256).convert_from_pretrained(tiny_bert_dir, block_sise=64)
    assert isinstance(refused.value, UnknownSettingError)
    assert str(refused.value) == "convert_from_pretrained() got an unknown setting block_sise=64: did you mean block_size=?"


def test_a_keyword_close_to_nothing_says_what_is_accepted(tiny_bert_dir):
    with pytest.raises(UnknownSettingError, match="zzz=1: no LSG setting or key of the source's BertConfig is called that"):
        LSGConverter(max_sequence_length=256).convert_from_pretrained(tiny_bert_dir, zzz=1)


def test_keys_of_the_source_config_are_accepted_as_overrides(tiny_bert_dir):
    model, _ = LSGConverter(max_sequence_length=256).convert_from_pretrained(
        tiny_bert_dir, hidden_dropout_prob=0.2, architecture="BertForSequenceClassification", num_labels=5
    )
    assert model.config.hidden_dropout_prob == 0.2
    assert model.classifier.out_features == 5


def test_num_labels_of_a_new_head_sets_its_label_maps_without_transformers_warning(tiny_bert_dir, tmp_path, caplog):
    """The source's config has 2 labels (transformers' default): asking for 3 gives LABEL_0..2, and
    transformers does not warn that num_labels=3 is incompatible with an id2label map of length 2."""
    transformers_logging.enable_propagation()
    try:
        with caplog.at_level("WARNING"):
            model, tokenizer = LSGConverter(max_sequence_length=256).convert_from_pretrained(
                tiny_bert_dir, architecture="BertForSequenceClassification", num_labels=3
            )
    finally:
        transformers_logging.disable_propagation()

    assert not [record for record in caplog.records if "id2label" in record.getMessage()]
    saved = json.loads((save_converted(model, tokenizer, tmp_path / "out") / "config.json").read_text())
    assert saved["id2label"] == {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"}
    assert saved["label2id"] == {"LABEL_0": 0, "LABEL_1": 1, "LABEL_2": 2}
    assert model.classifier.out_features == 3


def test_num_labels_keeps_the_source_label_names_when_it_has_as_many(tiny_bert_dir, tmp_path):
    source = shutil.copytree(tiny_bert_dir, tmp_path / "source")
    config = json.loads((source / "config.json").read_text())
    labels = {"0": "negative", "1": "neutral", "2": "positive"}
    config.update(id2label=labels, label2id={name: int(index) for index, name in labels.items()})
    (source / "config.json").write_text(json.dumps(config))

    model, _ = LSGConverter(max_sequence_length=256).convert_from_pretrained(
        source, architecture="BertForSequenceClassification", num_labels=3
    )

    assert model.config.id2label == {0: "negative", 1: "neutral", 2: "positive"}


@pytest.fixture(scope="module")
def classifier_of_3_labels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BertForSequenceClassification with 3 labels and 512 positions (the global tokens then take
    source positions, none drawn at random), saved with save_pretrained. Read only."""
    config = TINY_CONFIGS["bert"]()
    config.update({"max_position_embeddings": 512, "num_labels": 3})
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("classifier") / "source"
    BertForSequenceClassification(config).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("source_kind", ["plain", "lsg"])
def test_num_labels_replaces_a_source_classifier_of_another_size_with_a_new_one(
    classifier_of_3_labels, tmp_path, caplog, source_kind
):
    source = classifier_of_3_labels
    if source_kind == "lsg":  # an LSG classifier converted again
        source = save_converted(*LSGConverter(max_sequence_length=768).convert_from_pretrained(source), tmp_path / "lsg")
    unchanged, _ = LSGConverter(max_sequence_length=1024).convert_from_pretrained(source)

    with caplog.at_level("WARNING", logger="lsg_converter"):
        model, _ = LSGConverter(max_sequence_length=1024).convert_from_pretrained(source, num_labels=5)

    assert type(model) is LSGBertForSequenceClassification
    assert model.classifier.out_features == 5 and len(model.config.id2label) == 5
    assert model.lsg_new_weights == ["classifier.bias", "classifier.weight"]  # the card says they are random
    warning = " ".join(record.getMessage() for record in caplog.records if "newly initialised" in record.getMessage())
    assert "classifier.weight [3, 32] -> [5, 32]" in warning and "classifier.bias [3] -> [5]" in warning
    expected = {name: tensor for name, tensor in unchanged.state_dict().items() if not name.startswith("classifier.")}
    converted = {name: tensor for name, tensor in model.state_dict().items() if not name.startswith("classifier.")}
    assert expected.keys() == converted.keys()
    assert all(torch.equal(converted[name], tensor) for name, tensor in expected.items())


def test_num_labels_still_refuses_a_classifier_that_does_not_match_its_own_config(classifier_of_3_labels, tmp_path):
    source = shutil.copytree(classifier_of_3_labels, tmp_path / "source")
    weights = load_file(source / "model.safetensors")
    weights["classifier.weight"] = torch.zeros(4, weights["classifier.weight"].shape[1])  # the config says 3 labels
    save_file(weights, source / "model.safetensors", metadata={"format": "pt"})

    with pytest.raises(CorruptCheckpointError, match=r"classifier.weight \[4, 32\]"):
        LSGConverter(max_sequence_length=1024).convert_from_pretrained(source, num_labels=5)


@pytest.mark.parametrize("architecture", [None, "BertForMaskedLM"])
def test_num_labels_for_a_head_without_labels_is_refused_naming_the_heads_with_labels(tmp_path, architecture):
    source = save_tiny_source(tmp_path / "source", "bert", "BertModel")

    with pytest.raises(InvalidSettingsError) as refused:
        LSGConverter(max_sequence_length=256).convert_from_pretrained(source, architecture=architecture, num_labels=3)

    message = str(refused.value)
    assert "num_labels=3" in message and "pass architecture= with one of BertForSequenceClassification" in message


@pytest.mark.parametrize("labels", [0, -1])
def test_num_labels_below_1_is_refused_as_a_value_error(tiny_bert_dir, labels):
    with pytest.raises(InvalidSettingsError, match=f"num_labels={labels} is no number of labels") as refused:
        LSGConverter(max_sequence_length=256).convert_from_pretrained(
            tiny_bert_dir, architecture="BertForSequenceClassification", num_labels=labels
        )
    assert isinstance(refused.value, ValueError)


def test_a_misspelt_converter_argument_raises_a_type_error_naming_the_closest():
    with pytest.raises(UnknownSettingError) as refused:
        LSGConverter(max_sequence_lenght=4096)
    assert str(refused.value) == (
        "LSGConverter() got an unknown setting max_sequence_lenght=4096: did you mean max_sequence_length=?"
    )


def test_an_lsg_setting_given_to_the_converter_says_where_it_belongs():
    with pytest.raises(UnknownSettingError, match="block_size=64, an LSG setting: pass it to convert_from_pretrained"):
        LSGConverter(max_sequence_length=4096, block_size=64)


@pytest.mark.parametrize("length", [0, -5])
def test_non_positive_max_sequence_length_raises_invalid_settings_error(length):
    with pytest.raises(InvalidSettingsError):
        LSGConverter(max_sequence_length=length)


def test_lsg_errors_share_the_lsg_error_base_class():
    for error in (InvalidSettingsError, OutputExistsError, SourceNotFoundError, UnsupportedModelError):
        assert issubclass(error, lsg_converter.LSGError)


# ---------------------------------------------------------------------------------------------- sources and heads


def test_unsupported_model_type_raises_naming_the_supported_ones(tmp_path):
    config = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=32)
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(UnsupportedModelError, match="bert"):
        LSGConverter(max_sequence_length=256).convert_from_pretrained(tmp_path / "gpt2")


def test_a_config_without_model_type_is_refused_naming_the_type_its_architectures_suggest(tmp_path):
    source = save_tiny_source(tmp_path / "source", "bert", "BertModel")
    config = json.loads((source / "config.json").read_text())
    del config["model_type"]
    (source / "config.json").write_text(json.dumps(config))

    with pytest.raises(CorruptCheckpointError) as refused:
        LSGConverter(max_sequence_length=256).convert_from_pretrained(source)

    assert str(refused.value) == (
        f'{source}/config.json has no "model_type"; its architectures ["BertModel"] suggest "bert": '
        'add "model_type": "bert".'
    )


def test_missing_folder_raises_source_not_found(tmp_path):
    with pytest.raises(SourceNotFoundError):
        LSGConverter(max_sequence_length=256).convert_from_pretrained(tmp_path / "no-such-model")


def test_source_head_is_kept_by_default(converted):
    model, _ = converted
    assert type(model) is LSGBertForMaskedLM
    assert model.config.architectures == ["LSGBertForMaskedLM"]


def test_architecture_argument_builds_the_requested_head(tiny_bert_dir):
    model, _ = LSGConverter(max_sequence_length=256).convert_from_pretrained(
        tiny_bert_dir, architecture="BertForSequenceClassification"
    )
    assert isinstance(model, LSGBertForSequenceClassification)


def test_unknown_head_raises_unsupported_model_error(tiny_bert_dir):
    with pytest.raises(UnsupportedModelError, match="architecture=.*BertForMaskedLM"):
        LSGConverter(max_sequence_length=256).convert_from_pretrained(tiny_bert_dir, architecture="BertForSomethingElse")


@pytest.fixture
def colbert_dir(tmp_path) -> Path:
    """A ColBERT-style checkpoint: a BertModel under "bert." plus a projection, architectures ["HF_ColBERT"]."""
    torch.manual_seed(0)
    bert = BertModel(TINY_CONFIGS["bert"]()).eval()
    folder = tmp_path / "colbert"
    bert.save_pretrained(folder)
    weights = {f"bert.{name}": tensor.contiguous() for name, tensor in bert.state_dict().items()}
    save_file({**weights, "linear.weight": torch.randn(8, bert.config.hidden_size)}, folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["HF_ColBERT"]}))
    return folder


def test_source_of_an_unknown_head_converts_its_base_model_with_a_warning(colbert_dir, caplog):
    with caplog.at_level("WARNING", logger="lsg_converter"):
        model, _ = LSGConverter(max_sequence_length=512).convert_from_pretrained(
            colbert_dir, num_global_tokens=0, sparsity_type="none", block_size=TINY_LENGTH
        )

    assert type(model).__name__ == "LSGBertModel"
    warning = " ".join(record.getMessage() for record in caplog.records)
    assert "HF_ColBERT" in warning and "architecture=" in warning and "BertForMaskedLM" in warning
    bert = BertModel.from_pretrained(colbert_dir).eval()
    input_ids, attention_mask = padded_batch([TINY_LENGTH, 90], TINY_LENGTH)
    with torch.no_grad():
        expected = bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        output = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    torch.testing.assert_close(output, expected, atol=1e-5, rtol=0)


def test_a_source_tensor_the_lsg_class_does_not_use_is_saved_under_its_own_name(colbert_dir, tmp_path, caplog):
    with caplog.at_level("WARNING", logger="lsg_converter"):
        model, tokenizer = LSGConverter(max_sequence_length=512).convert_from_pretrained(colbert_dir)
    saved = save_converted(model, tokenizer, tmp_path / "out")

    assert torch.equal(load_file(saved / "model.safetensors")["linear.weight"], load_file(colbert_dir / "model.safetensors")["linear.weight"])
    kept_lines = [r.getMessage() for r in caplog.records if "linear.weight" in r.getMessage()]
    assert len(kept_lines) == 1 and "kept" in kept_lines[0]


def test_a_kept_source_tensor_survives_reloading_and_saving_again(colbert_dir, tmp_path):
    model, tokenizer = LSGConverter(max_sequence_length=512).convert_from_pretrained(colbert_dir)
    reloaded = AutoModel.from_pretrained(save_converted(model, tokenizer, tmp_path / "first"))
    again = save_converted(reloaded, None, tmp_path / "second")

    projection = load_file(colbert_dir / "model.safetensors")["linear.weight"]
    assert torch.equal(reloaded.linear.weight, projection)
    assert torch.equal(load_file(again / "model.safetensors")["linear.weight"], projection)


def test_a_source_without_architectures_becomes_the_head_its_weights_hold(tmp_path, caplog):
    source = save_tiny_source(tmp_path / "source", "bert", "BertForMaskedLM")
    config = json.loads((source / "config.json").read_text())
    del config["architectures"]
    (source / "config.json").write_text(json.dumps(config))

    with caplog.at_level("WARNING", logger="lsg_converter"):
        model, _ = LSGConverter(max_sequence_length=256).convert_from_pretrained(source)

    assert type(model).__name__ == "LSGBertForMaskedLM"
    assert not [r for r in caplog.records if "newly initialised" in r.getMessage()]
    mlm = BertForMaskedLM.from_pretrained(source)
    assert torch.equal(model.cls.predictions.transform.dense.weight, mlm.cls.predictions.transform.dense.weight)


def test_a_source_without_architectures_or_head_weights_becomes_the_bare_model(tmp_path):
    source = save_tiny_source(tmp_path / "source", "bert", "BertModel")
    config = json.loads((source / "config.json").read_text())
    del config["architectures"]
    (source / "config.json").write_text(json.dumps(config))

    model, _ = LSGConverter(max_sequence_length=256).convert_from_pretrained(source)

    assert type(model).__name__ == "LSGBertModel"


def test_a_source_whose_weights_lack_its_named_head_becomes_the_head_they_hold(tmp_path, caplog):
    source = save_tiny_source(tmp_path / "source", "bert", "BertModel")
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "architectures": ["BertForSequenceClassification"]}))

    with caplog.at_level("WARNING", logger="lsg_converter"):
        model, _ = LSGConverter(max_sequence_length=256).convert_from_pretrained(source)

    assert type(model).__name__ == "LSGBertModel"
    warning = " ".join(record.getMessage() for record in caplog.records)
    assert "classifier.weight" in warning and "architecture='BertForSequenceClassification'" in warning


def test_a_new_head_asked_for_names_its_newly_initialised_weights_in_one_line(tiny_bert_dir, caplog):
    with caplog.at_level("WARNING", logger="lsg_converter"):
        LSGConverter(max_sequence_length=256).convert_from_pretrained(
            tiny_bert_dir, architecture="BertForSequenceClassification"
        )
    lines = [record.getMessage() for record in caplog.records if "newly initialised" in record.getMessage()]
    assert len(lines) == 1
    assert all(name in lines[0] for name in ("classifier.weight", "classifier.bias", "bert.pooler.dense.weight"))


def test_a_source_without_a_pooler_gets_none(tmp_path):
    torch.manual_seed(0)
    BertModel(TINY_CONFIGS["bert"](), add_pooling_layer=False).save_pretrained(tmp_path / "source")

    model, tokenizer = LSGConverter(max_sequence_length=256).convert_from_pretrained(tmp_path / "source")
    saved = save_converted(model, tokenizer, tmp_path / "out")

    assert model.pooler is None
    assert not [name for name in load_file(saved / "model.safetensors") if "pooler" in name]
    assert AutoModel.from_pretrained(saved).pooler is None


def test_a_masked_lm_of_a_pretraining_checkpoint_keeps_its_pooler_and_next_sentence_head(tmp_path):
    """bert-base-uncased's shape: BertForPreTraining weights, config.json naming BertForMaskedLM."""
    source = save_tiny_source(tmp_path / "source", "bert", "BertForPreTraining")
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "architectures": ["BertForMaskedLM"]}))

    model, tokenizer = LSGConverter(max_sequence_length=256).convert_from_pretrained(source)
    saved = load_file(save_converted(model, tokenizer, tmp_path / "out") / "model.safetensors")

    assert type(model).__name__ == "LSGBertForMaskedLM"
    original = load_file(source / "model.safetensors")
    for name in ("bert.pooler.dense.weight", "cls.seq_relationship.weight", "cls.seq_relationship.bias"):
        assert torch.equal(saved[name], original[name]), name


def test_relative_position_embeddings_are_refused_naming_the_setting_and_which_models_convert(tmp_path):
    config = TINY_CONFIGS["bert"]()
    config.position_embedding_type = "relative_key"
    BertModel(config).save_pretrained(tmp_path / "source")

    with pytest.raises(InvalidSettingsError) as refused:
        LSGConverter(max_sequence_length=256).convert_from_pretrained(tmp_path / "source")
    assert str(refused.value).startswith("position_embedding_type='relative_key' changes attention")
    assert "(only 'absolute' converts): convert a checkpoint with absolute positions" in str(refused.value)
    assert "relative positions LSG carries (MPNet, DeBERTa-v2/v3, T5, mT5, UMT5)" in str(refused.value)
    assert "rotary positions (ModernBERT, NomicBERT, GTE, jina-embeddings-v3, EuroBERT)." in str(refused.value)


def test_a_folder_with_a_config_but_no_weights_says_the_weights_are_missing(tiny_bert_dir, tmp_path):
    shutil.copytree(tiny_bert_dir, tmp_path / "source")
    (tmp_path / "source" / "model.safetensors").unlink()

    with pytest.raises(SourceNotFoundError, match="weights are missing"):
        LSGConverter(max_sequence_length=256).convert_from_pretrained(tmp_path / "source")


class RunsACommand:
    """Unpickling it would run a shell command: torch's weights_only loader must refuse it first."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_an_unsafe_pickle_is_refused_for_safety_naming_what_it_calls(tiny_bert_dir, tmp_path):
    source = tmp_path / "source"
    shutil.copytree(tiny_bert_dir, source)
    state = load_file(source / "model.safetensors")
    (source / "model.safetensors").unlink()
    marker = tmp_path / "command-ran"
    torch.save({**state, "extra": RunsACommand(marker)}, source / "pytorch_model.bin")

    with pytest.raises(UnsafeCheckpointError) as refused:
        LSGConverter(max_sequence_length=256).convert_from_pretrained(source)

    message = str(refused.value)
    assert f"its pickle calls {os.system.__module__}.system" in message and "safetensors" in message
    assert "corrupt" not in message
    assert not marker.exists()


@pytest.mark.parametrize("arch,head", [(arch, row.default_head) for arch, row in lsg_converter.ARCHITECTURES.items()])
def test_an_input_longer_than_the_converted_length_is_refused_naming_both_lengths(arch, head, tmp_path):
    model, _ = LSGConverter(max_sequence_length=256).convert_from_pretrained(save_tiny_source(tmp_path, arch, head))
    inputs = {"input_ids": torch.randint(3, 90, (1, 257))}
    if model.config.is_encoder_decoder:
        inputs["decoder_input_ids"] = inputs["input_ids"][:, :4]

    with pytest.raises(ValueError, match="The input has 257 tokens, more than the 256 this model reads"):
        model(**inputs)


@pytest.mark.parametrize("arch", [a for a, row in lsg_converter.ARCHITECTURES.items() if TINY_CONFIGS[a]().is_encoder_decoder])
def test_a_decoder_input_longer_than_the_converted_length_is_refused(arch, tmp_path):
    head = lsg_converter.ARCHITECTURES[arch].default_head
    model, _ = LSGConverter(max_sequence_length=256).convert_from_pretrained(save_tiny_source(tmp_path, arch, head))

    with pytest.raises(ValueError, match="The decoder input has 257 tokens, more than the 256"):
        model(input_ids=torch.randint(3, 90, (1, 8)), decoder_input_ids=torch.randint(3, 90, (1, 257)))


def test_the_config_ids_warning_only_appears_when_there_are_global_tokens(tmp_path, caplog):
    source = save_tiny_source(tmp_path / "source", "bert", "BertForMaskedLM")  # no tokenizer: config ids
    with caplog.at_level("WARNING", logger="lsg_converter"):
        LSGConverter(max_sequence_length=256).convert_from_pretrained(source, num_global_tokens=0)
        assert not [record for record in caplog.records if "Global tokens" in record.getMessage()]
        LSGConverter(max_sequence_length=256).convert_from_pretrained(source, num_global_tokens=1)
        assert [record for record in caplog.records if "Global tokens" in record.getMessage()]


# ---------------------------------------------------------------------------------------------- saving


@pytest.fixture(scope="module")
def saved_folder(converted, tmp_path_factory) -> Path:
    model, tokenizer = converted
    return save_converted(model, tokenizer, tmp_path_factory.mktemp("saved") / "tiny-lsg")


EXPECTED_AUTO_CLASSES = {
    "AutoConfig",
    "AutoModel",
    "AutoModelForMaskedLM",
    "AutoModelForSequenceClassification",
    "AutoModelForTokenClassification",
    "AutoModelForQuestionAnswering",
    "AutoModelForMultipleChoice",
    "AutoModelForPreTraining",
}


def test_save_converted_writes_lsg_model_type_and_auto_map(saved_folder):
    config = json.loads((saved_folder / "config.json").read_text())
    assert config["model_type"] == "lsg-bert"
    assert EXPECTED_AUTO_CLASSES <= set(config["auto_map"])
    for auto_class, class_path in config["auto_map"].items():
        module, _, _ = class_path.partition(".")
        assert (saved_folder / f"{module}.py").is_file(), f"{auto_class} points to a missing file {module}.py"


def test_save_converted_writes_remote_code_weights_and_tokenizer(saved_folder):
    names = {p.name for p in saved_folder.iterdir()}
    expected = {"config.json", *remote_code_files(LSGBertConfig), "model.safetensors", "tokenizer_config.json"}
    assert expected <= names
    assert {"tokenizer.json", "vocab.txt"} & names, "no tokenizer vocabulary saved"


def test_saved_remote_code_imports_nothing_from_lsg_converter(saved_folder):
    for name in remote_code_files(LSGBertConfig):
        assert "lsg_converter" not in (saved_folder / name).read_text().replace('"lsg_converter', ""), name


RELOAD_WITHOUT_PACKAGE = """
import sys
from safetensors.torch import save_file
from transformers import AutoModelForMaskedLM
model = AutoModelForMaskedLM.from_pretrained(sys.argv[1], trust_remote_code=True)
assert "lsg_converter" not in sys.modules, "the saved model imported lsg_converter"
print(type(model).__module__, type(model).__name__)
save_file({k: v.clone() for k, v in model.state_dict().items()}, sys.argv[2])
"""


def test_saved_model_reloads_with_plain_transformers_and_remote_code(saved_folder, converted, tmp_path):
    """In a fresh interpreter that never imports lsg_converter, the folder's own code rebuilds the model."""
    from safetensors.torch import load_file

    model, _ = converted
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    result = subprocess.run(
        [sys.executable, "-c", RELOAD_WITHOUT_PACKAGE, str(saved_folder), str(tmp_path / "state.safetensors")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    module, name = result.stdout.split()[-2:]
    assert name == "LSGBertForMaskedLM"
    assert not module.startswith("lsg_converter"), module
    reloaded = load_file(tmp_path / "state.safetensors")
    original = model.state_dict()
    assert set(reloaded) == set(original)
    for key, tensor in reloaded.items():
        assert torch.equal(tensor, original[key]), key


def test_import_lsg_converter_registers_auto_classes(saved_folder):
    reloaded = AutoModelForMaskedLM.from_pretrained(saved_folder)
    assert isinstance(reloaded, LSGBertForMaskedLM)
    assert reloaded.config.max_position_embeddings == NEW_LENGTH


def test_saved_tokenizer_keeps_model_max_length(saved_folder):
    assert AutoTokenizer.from_pretrained(saved_folder).model_max_length == NEW_LENGTH


def test_save_converted_into_existing_empty_folder_works(converted, tmp_path):
    model, tokenizer = converted
    (tmp_path / "out").mkdir()
    save_converted(model, tokenizer, tmp_path / "out")
    assert (tmp_path / "out" / "config.json").is_file()


def test_save_converted_refuses_non_empty_folder_and_leaves_it_untouched(converted, tmp_path):
    model, tokenizer = converted
    target = tmp_path / "out"
    target.mkdir()
    (target / "config.json").write_text('{"mine": true}\n')
    (target / "notes.txt").write_bytes(b"do not touch\x00\xff")
    before = _files(target)
    with pytest.raises(OutputExistsError):
        save_converted(model, tokenizer, target)
    assert _files(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_save_converted_with_overwrite_replaces_folder_and_leaves_no_temporary(converted, tmp_path):
    model, tokenizer = converted
    target = tmp_path / "out"
    target.mkdir()
    (target / "config.json").write_text('{"model_type": "lsg-bert"}\n')
    (target / "notes.txt").write_text("old file")
    save_converted(model, tokenizer, target, overwrite=True)
    assert not (target / "notes.txt").exists()
    assert json.loads((target / "config.json").read_text())["model_type"] == "lsg-bert"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_the_saved_tokenizer_loads_by_its_own_class_without_remote_code(converted, tmp_path):
    from transformers import BertTokenizer, PreTrainedTokenizerFast

    model, tokenizer = converted
    folder = save_converted(model, tokenizer, tmp_path / "saved")

    for tokenizer_class in (BertTokenizer, PreTrainedTokenizerFast):
        loaded = tokenizer_class.from_pretrained(folder)
        assert loaded("hello world")["input_ids"] == tokenizer("hello world")["input_ids"]
        assert loaded.model_max_length == NEW_LENGTH
