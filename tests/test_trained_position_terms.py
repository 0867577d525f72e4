"""A training step through position terms being trained (T5's bias table) on the CPU: SDPA runs its math
kernel there, which keeps each block's gathered keys and values for the backward pass (every key three
times and more); the sdpa backend reads each segment of a block's keys as a view of its sequence, forward
and backward, and keeps the layer's own keys and each query's log-sum-exp, not the softmax's weights
(lsg_sdpa.TrainedTermsAttention).
Outputs and gradients, the bias table's included, are the eager backend's."""

import pytest
import torch
import transformers
from transformers.models.t5.modeling_t5 import T5Attention

from helpers import T5_SHAPE, OpRecorder, lsg_config, lsg_self_attention, padding_mask
from lsg_converter.models import lsg_t5_bias

HEADS, HEAD_DIM = T5_SHAPE["num_heads"], T5_SHAPE["d_kv"]
LENGTH = 2 + 75  # 2 global tokens, then 10 blocks of 8, the last one padded
CONFIGS = {
    "local": dict(sparsity_type="none", sparse_block_size=0),
    "norm": dict(sparsity_type="norm", sparse_block_size=8, sparsity_factor=2),
}


def t5_attention() -> torch.nn.Module:
    """A T5 encoder attention of T5_SHAPE in float64 with a random bias table (16 buckets up to 20 tokens)."""
    config = transformers.T5Config(**{**T5_SHAPE, "relative_attention_num_buckets": 16, "relative_attention_max_distance": 20})
    torch.manual_seed(0)
    attention = T5Attention(config, has_relative_attention_bias=True).double()
    with torch.no_grad():
        attention.relative_attention_bias.weight.normal_(std=2)
    return attention


def projections(batch: int) -> list[torch.Tensor]:
    """Queries, keys and values laid out as a model's projections, (B, L, H, D) seen as (B, H, L, D)."""
    generator = torch.Generator().manual_seed(1)
    return [
        torch.randn(batch, LENGTH, HEADS, HEAD_DIM, generator=generator, dtype=torch.float64).transpose(1, 2).requires_grad_()
        for _ in range(3)
    ]


def attend(backend: str, qkv, mask, sparsity: str, attention: torch.nn.Module) -> torch.Tensor:
    config = lsg_config(block_size=8, num_global_tokens=2, **CONFIGS[sparsity])
    terms = lsg_t5_bias.t5_position_terms(attention, global_position=0)
    return lsg_self_attention(*qkv, mask, config, backend=backend, scaling=1.0, position_terms=terms)


@pytest.mark.parametrize("sparsity", list(CONFIGS))
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_trained_position_terms_give_the_eager_outputs_and_gradients(sparsity, padded):
    mask = padding_mask([LENGTH, 50], LENGTH) if padded else None
    results = []
    for backend in ("sdpa", "eager"):
        attention, qkv = t5_attention(), projections(2)
        output = attend(backend, qkv, mask, sparsity, attention)
        weights = torch.linspace(-1, 1, output.numel(), dtype=output.dtype).reshape(output.shape)
        if mask is not None:  # the padding rows' outputs are not used
            weights = weights * mask[:, None, :, None]
        table = attention.relative_attention_bias.weight
        results.append([output * (weights != 0), *torch.autograd.grad((output * weights).sum(), [*qkv, table])])

    assert results[1][-1].abs().max() > 0
    for name, got, expected in zip(["output", "queries", "keys", "values", "bias table"], *results):
        torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-10, msg=lambda message: f"{name}: {message}")


@pytest.mark.parametrize("sparsity", list(CONFIGS))
def test_trained_position_terms_keep_no_gathered_keys(sparsity):
    """Every tensor kept for the backward pass that holds rows of keys (its last size the head size) holds
    at most twice the layer's keys (the layer's keys, then the compressed ones: 1.5 times with a sparsity
    factor of 2): a gathered copy holds each key three times and more."""
    qkv = projections(2)
    kept_rows = []

    def pack(tensor):
        if tensor.dim() >= 3 and tensor.shape[-1] == HEAD_DIM:
            kept_rows.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        attend("sdpa", qkv, padding_mask([LENGTH, 50], LENGTH), sparsity, t5_attention())

    assert kept_rows
    assert max(kept_rows) <= 2 * qkv[1].numel(), f"{max(kept_rows) / qkv[1].numel():.2f} times the layer's keys"


@pytest.mark.parametrize("sparsity", list(CONFIGS))
def test_trained_position_terms_keep_no_weights(sparsity):
    """Nothing kept for the backward pass is as large as the softmax's weights, (blocks, H, b, K): the
    backward makes them again from the scores and each query's log-sum-exp."""
    qkv = projections(2)
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda tensor: kept.append(tensor.numel()) or tensor, lambda tensor: tensor):
        attend("sdpa", qkv, None, sparsity, t5_attention())

    keys_per_block = 2 + 3 * 8 + (2 * 8 if sparsity == "norm" else 0)  # global, local and sparse keys
    weights = 2 * 10 * HEADS * 8 * keys_per_block  # 2 rows of 10 blocks of 8 queries
    assert kept and max(kept) < weights, f"{max(kept) / weights:.2f} times the weights"


@pytest.mark.parametrize("sparsity", list(CONFIGS))
def test_trained_position_terms_gather_no_keys(sparsity):
    """Forward and backward, no tensor indexing makes rows of keys (or of their gradients) as many as the
    layer's keys: the blocks read their global, sparse and local keys as views, and their gradients add
    back to the rows they were read from (a gathered copy holds each key three times and more)."""
    qkv = projections(2)
    with OpRecorder() as recorder:
        output = attend("sdpa", qkv, padding_mask([LENGTH, 50], LENGTH), sparsity, t5_attention())
        output.sum().backward()

    gathered = recorder.largest_rows_made_by("index", HEAD_DIM)
    assert gathered < qkv[1].numel(), f"{gathered / qkv[1].numel():.2f} times the layer's keys"


@pytest.mark.parametrize("sparsity", list(CONFIGS))
def test_trained_position_terms_in_bfloat16_give_the_eager_outputs_and_gradients(sparsity):
    """Half precision on the CPU: the blocks are computed in float32 (as SDPA's math kernel) and the
    outputs and gradients come back in bfloat16, the eager backend's to bfloat16's precision (each
    tensor within 2% of it, relative to its norm)."""
    mask = padding_mask([LENGTH, 50], LENGTH)
    results = []
    for backend in ("sdpa", "eager"):
        attention = t5_attention().to(torch.bfloat16)
        qkv = [x.detach().to(torch.bfloat16).requires_grad_() for x in projections(2)]
        output = attend(backend, qkv, mask, sparsity, attention) * mask[:, None, :, None]
        grads = torch.autograd.grad(output.float().square().sum(), [*qkv, attention.relative_attention_bias.weight])
        assert output.dtype == torch.bfloat16 and all(grad.dtype == torch.bfloat16 for grad in grads)
        results.append([x.float() for x in (output, *grads)])

    for name, got, expected in zip(["output", "queries", "keys", "values", "bias table"], *results):
        error = ((got - expected).norm() / expected.norm()).item()
        assert error < 0.02, f"{name}: relative error {error:.4f}"


def test_a_query_whose_every_key_is_masked_gives_the_table_no_gradient():
    """A causal call without global tokens, padded on the left: the first padding query of a block that
    starts with padding sees no key. The bias table's gradient takes nothing from it, as the eager
    backend's (a masked key's position term is masked, whatever the row's other keys)."""
    length = 40  # 5 blocks of 8
    config = lsg_config(block_size=8, num_global_tokens=0, sparsity_type="none", sparse_block_size=0)
    mask = torch.arange(length)[None, :] >= torch.tensor([[0], [13]])  # row 1: 13 padding tokens first
    gradients = []
    for backend in ("sdpa", "eager"):
        attention, qkv = t5_attention(), [x[:, :, :length] for x in projections(2)]
        terms = lsg_t5_bias.t5_position_terms(attention, global_position=0)
        output = lsg_self_attention(*qkv, mask, config, backend=backend, scaling=1.0, causal=True, position_terms=terms)
        weights = torch.linspace(-1, 1, output.numel(), dtype=output.dtype).reshape(output.shape)
        gradients.append(torch.autograd.grad((output * weights).sum(), attention.relative_attention_bias.weight)[0])

    torch.testing.assert_close(gradients[0], gradients[1], atol=1e-10, rtol=1e-10)
