"""Every architecture of the table end to end: heads equal their source, reference checkpoints, remote code."""

import ast
import inspect
import json
import re

import pytest
import torch

from helpers import (
    FIXTURES,
    TINY_CONFIGS,
    TINY_LENGTH,
    VOCAB,
    assert_reproduces_reference,
    reference_cases,
    is_causal_head,
    padded_batch,
    remote_code_files,
    run_without_lsg_converter,
    save_tiny_source,
)
from lsg_converter import ARCHITECTURES, LSGConverter, save_converted
from lsg_converter.models.lsg_model import lsg_auto_classes
from lsg_converter.positions import SINUSOID_LAYOUTS, sinusoidal_positions, tiled_position_rows

import transformers
from transformers.models.distilbert.modeling_distilbert import create_sinusoidal_embeddings
from transformers.models.pegasus.modeling_pegasus import PegasusSinusoidalPositionalEmbedding

ARCH_HEADS = [(arch, head) for arch in ARCHITECTURES for head in ARCHITECTURES[arch].heads]
OUTPUT_FIELDS = [
    "last_hidden_state",
    "pooler_output",
    "encoder_last_hidden_state",
    "logits",
    "prediction_logits",
    "seq_relationship_logits",
    "sop_logits",
    "start_logits",
    "end_logits",
]


# Each family of the table as the documentation names it.
FAMILY_NAMES = {
    "bert": "BERT", "roberta": "RoBERTa", "distilbert": "DistilBERT", "albert": "ALBERT", "electra": "ELECTRA",
    "camembert": "CamemBERT", "xlm-roberta": "XLM-RoBERTa", "bart": "BART", "mbart": "mBART", "pegasus": "Pegasus",
    "mpnet": "MPNet", "deberta-v2": "DeBERTa-v2", "t5": "T5", "mt5": "mT5", "umt5": "UMT5", "nomic_bert": "NomicBERT",
    "gte": "GTE", "eurobert": "EuroBERT", "modernbert": "ModernBERT",
    "jina_embeddings_v3": "jina-embeddings-v3",
}  # fmt: skip


# Sources whose padded query rows LSG does not compute as they do; the tokens' rows are compared. DeBERTa's
# padded queries see no key at all (its mask is the product of the query and key masks): they average every
# value, LSG's attend to the tokens. ModernBERT's sliding layers run as blocks of half their window, where a
# block of padded queries alone is left out.
MASKS_PADDED_QUERIES = ("deberta-v2", "modernbert")


def head_inputs(arch, head, lengths=(TINY_LENGTH, 90)):
    """A padded batch (BART builds its decoder inputs from input_ids, as its classification head expects)."""
    input_ids, attention_mask = padded_batch(list(lengths), TINY_LENGTH, arch)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask)
    if ARCHITECTURES[arch].layout.token_type_table is not None:
        inputs["token_type_ids"] = (torch.arange(TINY_LENGTH) >= 64).long().expand(len(lengths), -1)
    if head.endswith("ForMultipleChoice"):
        inputs = {name: tensor[:, None].repeat(1, 3, 1) for name, tensor in inputs.items()}
    if head.endswith(("Model", "ForConditionalGeneration")) and TINY_CONFIGS[arch]().is_encoder_decoder:
        inputs["decoder_input_ids"] = input_ids[:, :16]  # Pegasus does not derive them from input_ids
    return inputs


@pytest.mark.compat
@pytest.mark.parametrize("arch,head", ARCH_HEADS, ids=[head for _, head in ARCH_HEADS])
def test_converted_head_equals_source_without_global_tokens_or_sparsity(arch, head, tmp_path):
    source_dir = save_tiny_source(tmp_path / "source", arch, head)
    source = getattr(transformers, head).from_pretrained(source_dir).eval()
    model, _ = LSGConverter(max_sequence_length=1024).convert_from_pretrained(
        source_dir, num_global_tokens=0, sparsity_type="none", block_size=64
    )
    inputs = head_inputs(arch, head)

    with torch.no_grad():
        try:
            expected = source(**inputs)
        except IndexError as error:  # transformers 5.11's CamembertForMultipleChoice and XLMRoberta's: no pooler
            pytest.skip(f"the source {head} itself fails on transformers {transformers.__version__}: {error!r}")
        output = model(**inputs)

    assert type(model).__name__ == f"LSG{head}"
    compared = [field for field in OUTPUT_FIELDS if getattr(expected, field, None) is not None]
    assert compared
    for field in compared:
        lsg, dense = getattr(output, field), getattr(expected, field)
        if arch in MASKS_PADDED_QUERIES and lsg.shape[:2] == inputs["attention_mask"].shape:
            real = inputs["attention_mask"].bool()
            lsg, dense = lsg[real], dense[real]
        torch.testing.assert_close(lsg, dense, atol=1e-5, rtol=0)


@pytest.mark.compat
@pytest.mark.parametrize("case", reference_cases())
def test_reference_checkpoint_reproduces_reference_outputs(case):
    settings = json.loads((FIXTURES / case / "case.json").read_text())
    head = json.loads((FIXTURES / case / "config.json").read_text())["architectures"][0]
    model = ARCHITECTURES[settings["arch"]].lsg_class(head).from_pretrained(FIXTURES / case).eval()

    assert model.config.sparsity_type == settings["sparsity_type"]
    assert model.config.num_global_tokens == settings["num_global_tokens"]
    assert_reproduces_reference(model, case)


def test_reference_checkpoint_loaded_directly_is_marked_as_legacy():
    model = ARCHITECTURES["bert"].lsg_class("BertForMaskedLM").from_pretrained(FIXTURES / "bert-pooling")

    assert model.config.legacy_sparse_window is True


def test_aligned_sparse_window_misses_the_reference_outputs_when_block_size_equals_sparsity_factor():
    """bert-pooling (b == f == 8): the reference's right sparse window started two compressed tokens early."""
    settings = json.loads((FIXTURES / "bert-pooling" / "case.json").read_text())
    assert settings["block_size"] == settings["sparsity_factor"]
    model = ARCHITECTURES["bert"].lsg_class("BertForMaskedLM").from_pretrained(
        FIXTURES / "bert-pooling", legacy_sparse_window=False
    ).eval()

    with pytest.raises(AssertionError):
        assert_reproduces_reference(model, "bert-pooling")


def test_every_fixture_architecture_is_covered():
    archs = {json.loads((FIXTURES / case / "case.json").read_text())["arch"] for case in reference_cases()}
    assert {"bert", "roberta", "distilbert", "bart"} <= archs


DEFAULT_HEAD_AUTO_CLASS = {
    "bert": "AutoModelForPreTraining",
    "roberta": "AutoModelForMaskedLM",
    "distilbert": "AutoModelForMaskedLM",
    "albert": "AutoModelForPreTraining",
    "electra": "AutoModelForPreTraining",
    "camembert": "AutoModelForMaskedLM",
    "xlm-roberta": "AutoModelForMaskedLM",
    "bart": "AutoModelForSeq2SeqLM",
    "mbart": "AutoModelForSeq2SeqLM",
    "pegasus": "AutoModelForSeq2SeqLM",
    "mpnet": "AutoModelForMaskedLM",
    "deberta-v2": "AutoModelForMaskedLM",
    "t5": "AutoModelForSeq2SeqLM",
    "mt5": "AutoModelForSeq2SeqLM",
    "umt5": "AutoModelForSeq2SeqLM",
    "nomic_bert": "AutoModelForMaskedLM",
    "gte": "AutoModelForMaskedLM",
    "eurobert": "AutoModelForMaskedLM",
    "modernbert": "AutoModelForMaskedLM",
    "jina_embeddings_v3": "AutoModelForMaskedLM",
}


def test_the_package_docstring_names_every_family():
    import lsg_converter

    assert set(ARCHITECTURES) <= set(FAMILY_NAMES)
    named = set(re.findall(r"[\w-]+", lsg_converter.__doc__))
    assert [name for name in FAMILY_NAMES.values() if name not in named] == []

@pytest.mark.compat
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_saved_folder_loads_as_remote_code_without_lsg_converter(arch, tmp_path):
    head = ARCHITECTURES[arch].default_head
    model, _ = LSGConverter(max_sequence_length=1024).convert_from_pretrained(
        save_tiny_source(tmp_path / "source", arch, head), block_size=16, sparse_block_size=16, num_global_tokens=2
    )
    inputs = dict(zip(("input_ids", "attention_mask"), padded_batch([300, 260], 300, arch)))
    if model.config.is_encoder_decoder:
        inputs["decoder_input_ids"] = inputs["input_ids"][:, :16]
    with torch.no_grad():
        logits = model(**inputs)[0]
    torch.save({"inputs": inputs, "logits": logits}, tmp_path / "io.pt")
    folder = save_converted(model, None, tmp_path / "converted")

    result = run_without_lsg_converter(
        f"""
        import torch, transformers
        auto_class = getattr(transformers, {DEFAULT_HEAD_AUTO_CLASS[arch]!r})
        model = auto_class.from_pretrained({str(folder)!r}, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        assert type(model).__name__ == {type(model).__name__!r}, type(model).__name__
        io = torch.load({str(tmp_path / "io.pt")!r})
        with torch.no_grad():
            logits = model(**io["inputs"])[0]
        print("MAX_DIFF", (logits - io["logits"]).abs().max().item())
        """,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert float(result.stdout.split("MAX_DIFF")[1]) <= 1e-5
    assert {path.name for path in folder.glob("*.py")} == set(remote_code_files(model.config))


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_each_head_the_config_lists_is_a_class_statement_of_the_architecture_file_and_none_else(arch):
    """grep and editors find ``class LSGBertForMaskedLM(LSGBertMixin, BertForMaskedLM)``; each is saved as remote code."""
    module = ARCHITECTURES[arch].modeling_module()
    config_class = ARCHITECTURES[arch].config_class()
    mixin = f"LSG{config_class.lsg_base_name()}Mixin"
    statements = [node for node in ast.parse(inspect.getsource(module)).body if isinstance(node, ast.ClassDef)]
    heads = {  # the classes that join the mixin to a Hugging Face class (the file may hold swapped modules too)
        node.name: [base.id for base in node.bases]
        for node in statements
        if any(getattr(base, "id", None) == mixin for base in node.bases)
    }
    auto_classes = lsg_auto_classes(config_class)

    assert sorted(heads) == sorted(auto_classes.values())
    assert all(bases == [mixin, name.removeprefix("LSG")] for name, bases in heads.items())
    assert {getattr(module, name)._auto_class: name for name in heads} == auto_classes


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_default_settings_read_4000_tokens_with_finite_outputs(arch, tmp_path):
    head = ARCHITECTURES[arch].default_head
    model, _ = LSGConverter(max_sequence_length=4096).convert_from_pretrained(
        save_tiny_source(tmp_path / "source", arch, head)
    )
    input_ids, attention_mask = padded_batch([4000, 3100], 4000, arch)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask)
    if model.config.is_encoder_decoder:
        inputs["decoder_input_ids"] = input_ids[:, :8]

    with torch.no_grad():
        output = model(**inputs)

    assert model.config.sparsity_type == "none" and model.config.num_global_tokens == 1
    outputs = [getattr(output, field) for field in OUTPUT_FIELDS if getattr(output, field, None) is not None]
    assert outputs
    for tensor in outputs:
        assert torch.isfinite(tensor).all()
    if not model.config.is_encoder_decoder:
        assert outputs[0].shape[:2] == (2, 4000)


# T5 builds its encoder and decoder with copies of the config: the source reads no output_hidden_states
# set on the model's config afterwards either
@pytest.mark.parametrize("arch", [arch for arch in ARCHITECTURES if "t5" not in arch])
def test_hidden_states_asked_for_in_the_config_leave_the_global_tokens_out(arch, tmp_path):
    """A head that passes output_hidden_states=None on to its base model (DeBERTa's, MPNet's) reads it
    from the config, as the base model does."""
    head = ARCHITECTURES[arch].default_head
    model, _ = LSGConverter(max_sequence_length=1024).convert_from_pretrained(
        save_tiny_source(tmp_path / "source", arch, head), block_size=16, sparse_block_size=16, num_global_tokens=2
    )
    model.config.output_hidden_states = True
    inputs = dict(zip(("input_ids", "attention_mask"), padded_batch([100, 70], 100, arch)))
    if model.config.is_encoder_decoder:
        inputs["decoder_input_ids"] = inputs["input_ids"][:, :8]

    with torch.no_grad():
        output = model(**inputs)

    hidden_states = output.encoder_hidden_states if model.config.is_encoder_decoder else output.hidden_states
    assert {tuple(state.shape) for state in hidden_states} == {(2, 100, model.config.hidden_size)}


ENCODER_ARCHS = [arch for arch in ARCHITECTURES if not TINY_CONFIGS[arch]().is_encoder_decoder]


@pytest.mark.parametrize("arch", ENCODER_ARCHS)  # transformers' encoder-decoders fail with return_dict=False in the config
def test_a_tuple_asked_for_in_the_config_is_the_source_s_tuple(arch, tmp_path):
    if arch in ("eurobert", "modernbert"):
        pytest.skip(f"transformers' own {arch} heads (5.24) read the fields of the tuple their model returns")
    head = ARCHITECTURES[arch].default_head
    source = getattr(transformers, head).from_pretrained(save_tiny_source(tmp_path / "source", arch, head)).eval()
    model, _ = LSGConverter(max_sequence_length=1024).convert_from_pretrained(
        str(tmp_path / "source"), num_global_tokens=0, sparsity_type="none", block_size=64
    )
    inputs = dict(zip(("input_ids", "attention_mask"), padded_batch([100, 70], 100, arch)))
    for config in (source.config, model.config):
        config.output_hidden_states, config.return_dict = True, False

    with torch.no_grad():
        expected, output = source(**inputs), model(**inputs)

    assert isinstance(output, tuple)
    assert [type(item).__name__ for item in output] == [type(item).__name__ for item in expected]
    real = inputs["attention_mask"].bool()
    torch.testing.assert_close(output[-1][-1][real], expected[-1][-1][real], atol=1e-5, rtol=0)  # last hidden state


@pytest.mark.parametrize("arch", ["albert", "electra"])
def test_factorised_embeddings_carry_the_global_tokens_in_the_embedding_space(arch, tmp_path):
    source_dir = save_tiny_source(tmp_path / "source", arch, ARCHITECTURES[arch].default_head)
    special_tokens = ["[PAD]", "[UNK]", "[SEP]", "[CLS]", "[MASK]"]
    vocab = {token: index for index, token in enumerate(special_tokens + [f"t{i}" for i in range(VOCAB - 5)])}
    transformers.BertTokenizer(vocab=vocab).save_pretrained(source_dir)
    model, _ = LSGConverter(max_sequence_length=1024).convert_from_pretrained(source_dir, num_global_tokens=2)
    config, embeddings = model.config, model.base_model.embeddings
    words, positions = embeddings.word_embeddings.weight, embeddings.position_embeddings.weight
    token_type_0 = embeddings.token_type_embeddings.weight[0]
    input_ids, attention_mask = padded_batch([300, 200], 300, arch)

    with torch.no_grad():
        hidden_states = model.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    assert config.embedding_size < config.hidden_size
    assert embeddings.global_embeddings.embedding_dim == config.embedding_size
    global_tokens = embeddings.global_embeddings.weight
    torch.testing.assert_close(global_tokens[0], words[vocab["[CLS]"]] + positions[0] + token_type_0)
    torch.testing.assert_close(global_tokens[1], words[vocab["[MASK]"]] + positions[64] + token_type_0)
    assert hidden_states.shape == (2, 300, config.hidden_size)


def test_pegasus_positions_are_regenerated_sinusoids_and_give_the_global_tokens_theirs(tmp_path):
    config = TINY_CONFIGS["pegasus"]()
    config.max_position_embeddings = 1024  # as google/pegasus-large
    torch.manual_seed(0)
    transformers.PegasusForConditionalGeneration(config).save_pretrained(tmp_path / "source")

    model, _ = LSGConverter(max_sequence_length=4096).convert_from_pretrained(tmp_path / "source", num_global_tokens=4)

    sinusoids = PegasusSinusoidalPositionalEmbedding(4096, config.d_model).create_weight()
    for table_name in ARCHITECTURES["pegasus"].layout.position_tables:
        torch.testing.assert_close(model.model.get_submodule(table_name).weight.detach(), sinusoids, atol=0, rtol=0)
    assert model.config.max_position_embeddings == 4096
    # no tokenizer and no bos/mask id in a Pegasus config: token 0; global k sits at source position 64 k
    word = model.model.shared.weight[0].detach()
    expected = torch.stack([word + sinusoids[64 * k] for k in range(4)])
    torch.testing.assert_close(model.model.encoder.global_embeddings.weight[:4].detach(), expected)


# transformers' own builders of the sinusoid tables, by layout
TRANSFORMERS_SINUSOIDS = {
    "halves": lambda rows, width: PegasusSinusoidalPositionalEmbedding(rows, width).create_weight(),
    "interleaved": lambda rows, width: create_sinusoidal_embeddings(rows, width, torch.empty(rows, width)),
}


@pytest.mark.parametrize("layout", SINUSOID_LAYOUTS)
def test_sinusoid_tables_are_transformers_own_bit_for_bit_at_a_real_width(layout):
    """2,048 x 768: computed with torch in float64, 3 entries came out one float32 bit off numpy's."""
    expected = TRANSFORMERS_SINUSOIDS[layout](2048, 768)
    torch.testing.assert_close(sinusoidal_positions(2048, 768, layout), expected, atol=0, rtol=0)


def save_sinusoidal_distilbert(folder, head="DistilBertForMaskedLM"):
    config = TINY_CONFIGS["distilbert"]()
    config.sinusoidal_pos_embds = True
    torch.manual_seed(0)
    getattr(transformers, head)(config).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("head", ["DistilBertModel", "DistilBertForMaskedLM", "DistilBertForSequenceClassification"])
def test_sinusoidal_distilbert_equals_the_source_without_global_tokens_or_sparsity(head, tmp_path):
    source_dir = save_sinusoidal_distilbert(tmp_path / "source", head)
    source = getattr(transformers, head).from_pretrained(source_dir).eval()
    model, _ = LSGConverter(max_sequence_length=1024).convert_from_pretrained(
        source_dir, num_global_tokens=0, sparsity_type="none", block_size=TINY_LENGTH
    )
    inputs = head_inputs("distilbert", head)

    with torch.no_grad():
        expected, output = source(**inputs)[0], model(**inputs)[0]

    assert model.config.sinusoidal_pos_embds
    torch.testing.assert_close(output, expected, atol=1e-5, rtol=0)


def test_sinusoidal_distilbert_positions_are_distilbert_s_own_sinusoids_at_the_new_length(tmp_path):
    source_dir = save_sinusoidal_distilbert(tmp_path / "source")
    model, _ = LSGConverter(max_sequence_length=4096).convert_from_pretrained(source_dir, num_global_tokens=2)

    dim = model.config.dim
    sinusoids = create_sinusoidal_embeddings(4096, dim, torch.empty(4096, dim))
    table = model.distilbert.embeddings.position_embeddings.weight.detach()
    torch.testing.assert_close(table, sinusoids, atol=0, rtol=0)
    assert model.config.max_position_embeddings == 4096
    word = model.distilbert.embeddings.word_embeddings.weight[0].detach()  # no tokenizer: token 0
    torch.testing.assert_close(model.distilbert.embeddings.global_embeddings.weight[1].detach(), word + sinusoids[64])


def test_learned_distilbert_positions_are_still_tiled(tmp_path):
    source_dir = save_tiny_source(tmp_path / "source", "distilbert", "DistilBertForMaskedLM")
    learned = transformers.DistilBertForMaskedLM.from_pretrained(source_dir).distilbert.embeddings.position_embeddings.weight

    model, _ = LSGConverter(max_sequence_length=4 * TINY_LENGTH).convert_from_pretrained(source_dir)

    table = model.distilbert.embeddings.position_embeddings.weight.detach()
    assert not model.config.sinusoidal_pos_embds
    assert table.shape[0] == 4 * TINY_LENGTH
    torch.testing.assert_close(table[:TINY_LENGTH], learned.detach(), atol=0, rtol=0)
    assert (table[:, None] == learned.detach()[None]).all(-1).any(1).all()  # every new row is a learned row


def test_sinusoidal_distilbert_saved_and_reloaded_gives_the_same_outputs(tmp_path):
    model, _ = LSGConverter(max_sequence_length=1024).convert_from_pretrained(
        save_sinusoidal_distilbert(tmp_path / "source"), block_size=16, sparse_block_size=16, sparsity_type="norm"
    )
    folder = save_converted(model, None, tmp_path / "converted")
    reloaded = transformers.AutoModelForMaskedLM.from_pretrained(folder).eval()
    inputs = dict(zip(("input_ids", "attention_mask"), padded_batch([300, 260], 300, "distilbert")))

    with torch.no_grad():
        torch.testing.assert_close(reloaded(**inputs).logits, model(**inputs).logits, atol=1e-6, rtol=0)
    torch.testing.assert_close(
        reloaded.distilbert.embeddings.position_embeddings.weight, model.distilbert.embeddings.position_embeddings.weight
    )


def test_pegasus_encoder_layerdrop_is_refused_as_it_could_skip_the_layer_the_global_tokens_join(tmp_path):
    from lsg_converter import InvalidSettingsError

    source_dir = save_tiny_source(tmp_path / "source", "pegasus", "PegasusForConditionalGeneration")
    with pytest.raises(InvalidSettingsError, match="encoder_layerdrop=0"):
        LSGConverter(max_sequence_length=512).convert_from_pretrained(source_dir, encoder_layerdrop=0.1)


SEQ2SEQ_DECODER_HEADS = [(a, h) for a, h in ARCH_HEADS if h.endswith("ForCausalLM") and TINY_CONFIGS[a]().is_encoder_decoder]


@pytest.mark.parametrize("arch,head", SEQ2SEQ_DECODER_HEADS)
def test_decoder_only_head_of_an_encoder_decoder_model_is_its_dense_decoder_with_longer_positions(arch, head, tmp_path):
    source_dir = save_tiny_source(tmp_path / "source", arch, head)
    source = getattr(transformers, head).from_pretrained(source_dir).eval()
    model, _ = LSGConverter(max_sequence_length=1024).convert_from_pretrained(source_dir)
    prompt, _ = padded_batch([40], 40, arch)

    assert model.config.is_decoder and model.config._attn_implementation == "sdpa"
    assert model.lsg_global_embeddings is None
    assert model.model.decoder.embed_positions.weight.shape[0] == 1024 + ARCHITECTURES[arch].position_offset
    settings = dict(max_new_tokens=40, min_new_tokens=40, do_sample=False)
    assert torch.equal(model.generate(prompt, **settings), source.generate(prompt, **settings))
    long_input, _ = padded_batch([1000], 1000, arch)
    with torch.no_grad():
        assert model(input_ids=long_input).logits.isfinite().all()


@pytest.mark.parametrize("arch,head", [(a, h) for a, h in ARCH_HEADS if is_causal_head(h)])
def test_converting_to_a_causal_head_makes_a_decoder(arch, head, tmp_path):
    source_dir = save_tiny_source(tmp_path / "source", arch, ARCHITECTURES[arch].default_head)

    model, _ = LSGConverter(max_sequence_length=512).convert_from_pretrained(source_dir, architecture=head)

    assert type(model).__name__ == f"LSG{head}" and model.config.is_decoder


def test_distilbert_inputs_embeds_equal_input_ids(tmp_path):
    model, _ = LSGConverter(max_sequence_length=1024).convert_from_pretrained(
        save_tiny_source(tmp_path / "source", "distilbert", "DistilBertForMaskedLM"), block_size=16, sparse_block_size=16
    )
    input_ids, attention_mask = padded_batch([200, 150], 200, "distilbert")

    with torch.no_grad():
        from_ids = model(input_ids=input_ids, attention_mask=attention_mask).logits
        embeddings = model.get_input_embeddings()(input_ids)
        from_embeddings = model(inputs_embeds=embeddings, attention_mask=attention_mask).logits

    torch.testing.assert_close(from_embeddings, from_ids, atol=1e-6, rtol=0)


@pytest.mark.parametrize("arch", ["roberta", "bart"])
def test_both_offset_rows_are_kept_once_in_front_of_the_tiled_positions(arch, tmp_path):
    source_dir = save_tiny_source(tmp_path / "source", arch, ARCHITECTURES[arch].default_head)
    source = getattr(transformers, ARCHITECTURES[arch].default_head).from_pretrained(source_dir)
    model, _ = LSGConverter(max_sequence_length=1000).convert_from_pretrained(source_dir)

    for table_name in ARCHITECTURES[arch].layout.position_tables:
        old = source.base_model.get_submodule(table_name).weight
        new = model.base_model.get_submodule(table_name).weight
        assert new.shape[0] == 1000 + 2
        torch.testing.assert_close(new[:2], old[:2])
        torch.testing.assert_close(new[2 : 2 + TINY_LENGTH], old[2:])
        torch.testing.assert_close(new[2:], old[2:][tiled_position_rows(TINY_LENGTH, 1000, "body")])
    assert model.config.max_position_embeddings == source.config.max_position_embeddings + 1000 - TINY_LENGTH


def test_deep_copies_and_pickles_use_their_own_global_tokens(tmp_path):
    import copy
    import pickle

    model, _ = LSGConverter(max_sequence_length=1024).convert_from_pretrained(
        save_tiny_source(tmp_path / "source", "bert", "BertForMaskedLM"), block_size=16, sparse_block_size=16
    )
    input_ids, attention_mask = padded_batch([300], 300)
    with torch.no_grad():
        original = model(input_ids=input_ids, attention_mask=attention_mask).logits
        copies = [copy.deepcopy(model), pickle.loads(pickle.dumps(model))]
        for duplicate in copies:
            torch.testing.assert_close(duplicate(input_ids=input_ids, attention_mask=attention_mask).logits, original)
            duplicate.bert.embeddings.global_embeddings.weight.zero_()
            assert not torch.allclose(duplicate(input_ids=input_ids, attention_mask=attention_mask).logits, original)
        unchanged = model(input_ids=input_ids, attention_mask=attention_mask).logits

    torch.testing.assert_close(unchanged, original, atol=0, rtol=0)
