"""LSGConverter and save_converted on a tiny local BERT: positions, global tokens, settings, errors, saving."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForMaskedLM,
    AutoTokenizer,
    BartForConditionalGeneration,
    BertForMaskedLM,
    BertModel,
    GPT2Config,
    GPT2LMHeadModel,
    MBartForConditionalGeneration,
)

from helpers import FIXTURES, TINY_CONFIGS, TINY_LENGTH, padded_batch, save_tiny_source

import lsg_converter
from lsg_converter import (
    InvalidSettingsError,
    LSGBertForMaskedLM,
    LSGBertForSequenceClassification,
    LSGConverter,
    OutputExistsError,
    SourceNotFoundError,
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
    source_dir = save_tiny_source(tmp_path / "source", "mbart", "MBartForConditionalGeneration")
    AutoTokenizer.from_pretrained(FIXTURES / "bart-norm").save_pretrained(source_dir)  # <s> 0 <pad> 1 </s> 2 <mask> 4

    with caplog.at_level("WARNING", logger="lsg_converter"):
        model, tokenizer = LSGConverter(max_sequence_length=512).convert_from_pretrained(source_dir, num_global_tokens=2)

    assert type(model).__name__ == "LSGMBartForConditionalGeneration"
    assert type(tokenizer).__name__ != "MBartTokenizer" and tokenizer.mask_token_id == 4
    assert not [record for record in caplog.records if "Global tokens" in record.getMessage()]
    source = MBartForConditionalGeneration.from_pretrained(source_dir)
    words, positions = source.model.shared.weight.detach(), source.model.encoder.embed_positions.weight.detach()[2:]
    expected = torch.stack([words[0] + positions[0], words[4] + positions[64]])
    torch.testing.assert_close(model.model.encoder.global_embeddings.weight[:2].detach(), expected)


def test_tokenizer_of_another_vocabulary_gives_way_to_the_config_ids(tmp_path, minilm_path, caplog):
    source_dir = save_tiny_source(tmp_path / "source", "bart", "BartForConditionalGeneration")
    bert_tokenizer = AutoTokenizer.from_pretrained(minilm_path)  # [CLS] 101, [MASK] 103, [PAD] 0: not BART's ids
    bert_tokenizer.save_pretrained(source_dir)

    with caplog.at_level("WARNING", logger="lsg_converter"):
        model, tokenizer = LSGConverter(max_sequence_length=512).convert_from_pretrained(source_dir, num_global_tokens=2)

    assert type(tokenizer) is type(bert_tokenizer)  # still returned: it is the source's, only its ids are not used
    warning = " ".join(record.getMessage() for record in caplog.records)
    assert type(bert_tokenizer).__name__ in warning and "config's ids" in warning
    bos = model.config.bos_token_id
    expected = _bart_globals(source_dir, [bos, bos], [0, 64])
    torch.testing.assert_close(model.model.encoder.global_embeddings.weight[:2].detach(), expected)


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


def test_default_block_size_is_a_multiple_of_the_sparsity_factor_when_sparse_keys_are_used(tiny_bert_dir):
    model, _ = LSGConverter(max_sequence_length=256).convert_from_pretrained(
        tiny_bert_dir, sparsity_type="pooling", sparsity_factor=4
    )
    assert model.config.block_size == 40  # a third of the 126 body positions is 42, rounded down to 4 x 10


def test_explicit_block_size_replaces_the_derived_default(tiny_bert_dir):
    model, _ = LSGConverter(max_sequence_length=256).convert_from_pretrained(tiny_bert_dir, block_size=64)
    assert model.config.block_size == 64


@pytest.mark.parametrize(
    "bad_setting", [{"sparsity_type": "bogus"}, {"block_size": 0}, {"num_global_tokens": 600}], ids=lambda s: next(iter(s))
)
def test_invalid_lsg_setting_raises_invalid_settings_error(tiny_bert_dir, bad_setting):
    with pytest.raises(InvalidSettingsError):
        LSGConverter(max_sequence_length=256).convert_from_pretrained(tiny_bert_dir, **bad_setting)


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
    with pytest.raises(UnsupportedModelError, match="--architecture.*BertForMaskedLM"):
        LSGConverter(max_sequence_length=256).convert_from_pretrained(tiny_bert_dir, architecture="BertForSomethingElse")


def test_source_of_an_unknown_head_converts_its_base_model_with_a_warning(tmp_path, caplog):
    """A ColBERT-style checkpoint: a BertModel under "bert." plus a projection, architectures ["HF_ColBERT"]."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    bert = BertModel(TINY_CONFIGS["bert"]()).eval()
    folder = tmp_path / "colbert"
    bert.save_pretrained(folder)
    weights = {f"bert.{name}": tensor.contiguous() for name, tensor in bert.state_dict().items()}
    save_file({**weights, "linear.weight": torch.randn(8, bert.config.hidden_size)}, folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["HF_ColBERT"]}))

    with caplog.at_level("WARNING", logger="lsg_converter"):
        model, _ = LSGConverter(max_sequence_length=512).convert_from_pretrained(
            folder, num_global_tokens=0, sparsity_type="none", block_size=TINY_LENGTH
        )

    assert type(model).__name__ == "LSGBertModel"
    warning = " ".join(record.getMessage() for record in caplog.records)
    assert "HF_ColBERT" in warning and "--architecture" in warning and "BertForMaskedLM" in warning
    input_ids, attention_mask = padded_batch([TINY_LENGTH, 90], TINY_LENGTH)
    with torch.no_grad():
        expected = bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        output = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    torch.testing.assert_close(output, expected, atol=1e-5, rtol=0)


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
    expected = {
        "config.json",
        "modeling_lsg_bert.py",
        "configuration_lsg_bert.py",
        "lsg_attention.py",
        "lsg_flex.py",
        "lsg_model.py",
        "model.safetensors",
        "tokenizer_config.json",
    }
    assert expected <= names
    assert {"tokenizer.json", "vocab.txt"} & names, "no tokenizer vocabulary saved"


def test_saved_remote_code_imports_nothing_from_lsg_converter(saved_folder):
    remote_code = ("modeling_lsg_bert.py", "configuration_lsg_bert.py", "lsg_attention.py", "lsg_flex.py", "lsg_model.py")
    for name in remote_code:
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
    (target / "config.json").write_text('{"mine": true}\n')
    (target / "notes.txt").write_text("old file")
    save_converted(model, tokenizer, target, overwrite=True)
    assert not (target / "notes.txt").exists()
    assert json.loads((target / "config.json").read_text())["model_type"] == "lsg-bert"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
