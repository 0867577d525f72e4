"""T5's relative bias as LSG position terms (lsg_t5_bias): transformers' bucket function runs once per
forward, on the distances up to the maximal distance only, and the bias looked up by clamped distance
(and, for a block's sparse keys, by their offset from the block's start) gives the outputs and the bias
gradient of the terms that evaluate the bucket function for every pair."""

import pytest
import torch
import transformers
from transformers.models.t5.modeling_t5 import T5Attention
from transformers.models.umt5.modeling_umt5 import UMT5Attention

from helpers import T5_SHAPE, TINY_CONFIGS, lsg_config, lsg_self_attention, padded_batch, padding_mask, save_tiny_source
from lsg_converter import LSGConverter
from lsg_converter.models import lsg_t5_bias
from lsg_converter.models.lsg_pattern import KeyPattern, PositionTerms, far_sparse_scores
from lsg_converter.models.lsg_transformers import relative_position_buckets

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

MAX_DISTANCE = 20  # the sparse keys lie 9 to 31 tokens from their queries: within it and beyond
ATTENTIONS = {"t5": (T5Attention, transformers.T5Config), "umt5": (UMT5Attention, transformers.UMT5Config)}


def encoder_attention(arch: str) -> torch.nn.Module:
    """A T5-style encoder attention module of T5_SHAPE with a random bias table, 32 buckets up to MAX_DISTANCE."""
    attention_class, config_class = ATTENTIONS[arch]
    config = config_class(**{**T5_SHAPE, "relative_attention_num_buckets": 32, "relative_attention_max_distance": MAX_DISTANCE})
    torch.manual_seed(0)
    attention = attention_class(config, has_relative_attention_bias=True)
    with torch.no_grad():
        attention.relative_attention_bias.weight.normal_(std=2)
    return attention


def per_pair_terms(attention: torch.nn.Module) -> PositionTerms:
    """The terms before lsg_t5_bias: transformers' bucket function evaluated for every pair."""
    return PositionTerms(
        bucket=lambda relative: relative_position_buckets(attention, relative),
        table=attention.relative_attention_bias.weight.T,
    )


@pytest.mark.parametrize("arch", list(ATTENTIONS))
def test_the_bias_by_clamped_distance_is_transformers_bias_at_every_distance(arch):
    attention = encoder_attention(arch)
    terms = lsg_t5_bias.t5_position_terms(attention, global_position=0)
    distances = torch.arange(-5 * MAX_DISTANCE, 5 * MAX_DISTANCE + 1)

    expected = attention.relative_attention_bias.weight[relative_position_buckets(attention, distances)].T
    torch.testing.assert_close(terms.table[:, terms.bucket(distances)], expected, atol=0, rtol=0)


@pytest.mark.parametrize("arch", list(ATTENTIONS))
@pytest.mark.parametrize("sparsity_type", ["norm", "pooling", "stride"])
@pytest.mark.parametrize(
    ("block", "length"),
    [(8, 2 + 75), (24, 2 + 150)],  # sparse keys within and beyond MAX_DISTANCE; beyond it (25 tokens and more) only
    ids=["sparse keys within reach", "sparse keys beyond reach"],
)
def test_the_output_and_the_bias_gradient_equal_those_of_the_bucket_function_for_every_pair(arch, sparsity_type, block, length):
    config = lsg_config(block_size=block, sparse_block_size=block, sparsity_factor=2, sparsity_type=sparsity_type, num_global_tokens=2)
    generator = torch.Generator().manual_seed(1)
    inputs = [torch.randn(2, 4, length, 8, generator=generator, requires_grad=True) for _ in range(3)]
    mask = padding_mask([length, 50], length)
    results = []
    for make_terms in (per_pair_terms, lambda attention: lsg_t5_bias.t5_position_terms(attention, 0)):
        attention = encoder_attention(arch)
        output = lsg_self_attention(*inputs, mask, config, scaling=1.0, position_terms=make_terms(attention))
        (output * mask[:, None, :, None]).pow(2).sum().backward()
        results.append((output, attention.relative_attention_bias.weight.grad, [x.grad.clone() for x in inputs]))
        for x in inputs:
            x.grad = None

    (output, bias_gradient, input_gradients), (expected, expected_bias_gradient, expected_input_gradients) = results[1], results[0]
    torch.testing.assert_close(output, expected, atol=1e-5, rtol=0)
    assert expected_bias_gradient.abs().max() > 0
    torch.testing.assert_close(bias_gradient, expected_bias_gradient, atol=1e-4, rtol=1e-5)
    for gradient, expected_gradient in zip(input_gradients, expected_input_gradients):
        torch.testing.assert_close(gradient, expected_gradient, atol=1e-4, rtol=1e-5)


def test_sparse_keys_beyond_the_max_distance_get_the_bias_of_their_side_whatever_their_position():
    attention = encoder_attention("t5")
    terms = lsg_t5_bias.t5_position_terms(attention, global_position=0)
    pattern = KeyPattern.of(lsg_config(block_size=24, sparse_block_size=24, sparsity_factor=2, sparsity_type="norm"))
    scores = far_sparse_scores(terms, pattern, torch.device("cpu"))

    bias = attention.relative_attention_bias.weight  # (buckets, H)
    left, right = relative_position_buckets(attention, torch.tensor([-MAX_DISTANCE, MAX_DISTANCE]))
    expected = torch.cat([bias[left][:, None].expand(-1, 24), bias[right][:, None].expand(-1, 24)], dim=1)
    assert scores.shape == (1, 1, T5_SHAPE["num_heads"], 1, 48)
    torch.testing.assert_close(scores[0, 0, :, 0], expected, atol=0, rtol=0)


@pytest.mark.parametrize(
    "settings",
    [dict(block_size=8, sparse_block_size=8), dict(block_size=24, sparse_block_size=24, legacy_sparse_window=True, sparsity_factor=24)],
    ids=["blocks shorter than the max distance", "the 2023 reference's right window over the next block"],
)
def test_sparse_keys_within_the_max_distance_are_looked_up_key_by_key(settings):
    terms = lsg_t5_bias.t5_position_terms(encoder_attention("t5"), global_position=0)
    pattern = KeyPattern.of(lsg_config(**{"sparsity_factor": 2, "sparsity_type": "norm", **settings}))

    assert far_sparse_scores(terms, pattern, torch.device("cpu")) is None


@pytest.mark.parametrize(("arch", "calls_per_forward"), [("t5", 1), ("mt5", 1), ("umt5", T5_SHAPE["num_layers"])])
def test_the_bucket_function_runs_once_per_forward_on_the_distances_up_to_the_max_distance(
    arch, calls_per_forward, tmp_path, monkeypatch
):
    source = save_tiny_source(tmp_path / "source", arch, f"{arch.upper()}EncoderModel")
    model, _ = LSGConverter(max_sequence_length=1024).convert_from_pretrained(
        str(source), block_size=16, sparse_block_size=16, sparsity_type="norm", num_global_tokens=2
    )
    max_distance = TINY_CONFIGS[arch]().relative_attention_max_distance
    bucketed = []

    def counted(attention, relative_position):
        bucketed.append(relative_position.numel())
        return relative_position_buckets(attention, relative_position)

    monkeypatch.setattr(lsg_t5_bias, "relative_position_buckets", counted)
    input_ids, attention_mask = padded_batch([400, 300], 400, arch)
    with torch.no_grad():
        model.eval()(input_ids=input_ids, attention_mask=attention_mask)

    assert bucketed == [2 * max_distance + 1] * calls_per_forward
