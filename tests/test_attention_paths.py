"""One place chooses how the token queries of an LSG call run (`lsg_attention.choose_path`, issue 67): the
path table of docs/attention.md, on the CPU, read off real forwards of tiny LSG models."""

import pytest
import torch

from helpers import padding_mask
from lsg_converter import LSGBertConfig, LSGBertForMaskedLM, LSGBertLMHeadModel
from lsg_converter.models import lsg_attention
from lsg_converter.models.lsg_attention import AttentionPath
from lsg_converter.models.lsg_transformers import CPU_FLASH_ATTENTION_BACKWARD
from test_conventions import batch, tiny_lsg

TOKENS = 256  # 8 blocks of 32


def lsg_bert(backend: str | None, head=LSGBertForMaskedLM, **settings) -> torch.nn.Module:
    """A 1-layer tiny LSG-BERT with local and global keys (or `settings`), in eval mode."""
    values = dict(vocab_size=100, hidden_size=32, num_attention_heads=4, intermediate_size=37, num_hidden_layers=1,
                  max_position_embeddings=TOKENS + 64, block_size=32, sparse_block_size=0, sparsity_type="none",
                  num_global_tokens=1, attention_probs_dropout_prob=0.0)  # fmt: skip
    config = LSGBertConfig(**{**values, **settings}, attn_implementation=backend)
    torch.manual_seed(0)
    return head(config).eval()


def inputs(padded: bool = False) -> dict:
    input_ids = torch.randint(5, 100, (2, TOKENS), generator=torch.Generator().manual_seed(0))
    mask = padding_mask([TOKENS, TOKENS - 40], TOKENS).long() if padded else torch.ones_like(input_ids)
    return {"input_ids": input_ids, "attention_mask": mask}


def chosen_paths(model: torch.nn.Module, monkeypatch, training: bool = False, **model_inputs) -> list[AttentionPath]:
    """The path `choose_path` chose at each LSG call of one forward (with gradients where `training`)."""
    chosen = []
    choose = lsg_attention.choose_path

    def recorded(backend, job):
        chosen.append(choose(backend, job))
        return chosen[-1]

    monkeypatch.setattr(lsg_attention, "choose_path", recorded)
    model.train(training)
    with torch.set_grad_enabled(training):
        model(**model_inputs)
    return [path for path, _ in chosen]


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("backend", ["sdpa", None], ids=["sdpa", "unset"])
def test_cpu_inference_reads_the_local_keys_as_views(backend, padded, monkeypatch):
    assert chosen_paths(lsg_bert(backend), monkeypatch, **inputs(padded)) == [AttentionPath.WINDOW_VIEWS]


@pytest.mark.skipif(CPU_FLASH_ATTENTION_BACKWARD is None, reason="this torch has no CPU flash kernel backward")
def test_cpu_training_reads_the_local_keys_as_views(monkeypatch):
    assert chosen_paths(lsg_bert("sdpa"), monkeypatch, training=True, **inputs()) == [AttentionPath.WINDOW_VIEWS]


def test_sparse_keys_gather_each_blocks_keys(monkeypatch):
    model = lsg_bert("sdpa", sparsity_type="norm", sparse_block_size=16)

    assert chosen_paths(model, monkeypatch, **inputs()) == [AttentionPath.GATHERED]


def test_dropkey_in_training_gathers_each_blocks_keys(monkeypatch):
    model = lsg_bert("sdpa", attention_probs_dropout_prob=0.1)

    assert chosen_paths(model, monkeypatch, training=True, **inputs()) == [AttentionPath.GATHERED]


def test_a_causal_decoder_without_padding_runs_the_masks_of_its_shape(monkeypatch):
    model = lsg_bert("sdpa", head=LSGBertLMHeadModel, is_decoder=True)

    assert chosen_paths(model, monkeypatch, input_ids=inputs()["input_ids"]) == [AttentionPath.UNMASKED]


def test_position_terms_being_trained_on_the_cpu_run_the_trained_terms_path(monkeypatch):
    model = tiny_lsg("mpnet", sparsity_type="none", sparse_block_size=0, attention_probs_dropout_prob=0.0)

    paths = chosen_paths(model, monkeypatch, training=True, **batch("mpnet"))

    assert paths == [AttentionPath.TRAINED_TERMS] * model.config.num_hidden_layers


def test_eager_runs_the_eager_path(monkeypatch):
    assert chosen_paths(lsg_bert("eager"), monkeypatch, **inputs(padded=True)) == [AttentionPath.EAGER]


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_flex_inference_runs_the_flex_path(padded, monkeypatch):
    torch.compiler.reset()
    paths = chosen_paths(lsg_bert("flex_attention"), monkeypatch, **inputs(padded))

    assert paths == [AttentionPath.FLEX]


def test_flex_inference_with_a_hole_in_the_mask_runs_the_same_flex_path(monkeypatch):
    torch.compiler.reset()
    batch_inputs = inputs()
    batch_inputs["attention_mask"][1, 100:110] = 0

    assert chosen_paths(lsg_bert("flex_attention"), monkeypatch, **batch_inputs) == [AttentionPath.FLEX]


def test_flex_in_training_on_the_cpu_runs_an_sdpa_path(monkeypatch):
    paths = chosen_paths(lsg_bert("flex_attention"), monkeypatch, training=True, **inputs())

    assert paths and all(not path.name.startswith("FLEX") for path in paths)
