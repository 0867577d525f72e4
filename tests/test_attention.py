"""The LSG attention core against its specification (DESIGN.md §3), on random tensors.

The blocked path is compared with dense attention under the explicit (heads, N, N) mask that the
specification describes; such a mask is only affordable at these small sizes.
"""

import pytest
import torch
import torch.nn.functional as F

from helpers import lsg_config, lsg_self_attention, padding_mask
from lsg_converter.models.lsg_attention import lsg_attention
from lsg_converter.models.lsg_pattern import KeyPattern, additive_mask, few_query_attention
from lsg_converter.models.lsg_sparse import SPARSITY_TYPES

HEADS, HEAD_DIM = 4, 8


def random_qkv(batch, length, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, HEADS, length, HEAD_DIM, generator=generator, dtype=torch.float64) for _ in range(3)]


def sparse_position(config, head, token):
    """Compressed position of `token` in head `head`'s sparse sequence, or None if the head skips it."""
    factor, block = config.sparsity_factor, config.block_size
    if config.sparsity_type == "stride":
        return token // factor if token % factor == head % factor else None
    if config.sparsity_type == "block_stride":
        kept = block // factor
        offset = token % block
        for m in range(kept):
            if (head * kept + m) % block == offset:
                return token // block * kept + m
        return None
    return None


def explicit_key_counts(config, length, key_mask):
    """(B, H, N, N) int: how many times each query sees each key, straight from the specification.

    A key is seen once as a global, local or sparse key; with ``legacy_sparse_window`` and b == f
    (one compressed token per block) the right sparse window of block i starts at compressed
    position i instead of i + 2, as in the 2023 reference, so its first two keys are also local keys.
    """
    g, b, s = config.num_global_tokens, config.block_size, config.sparse_block_size
    use_sparse = config.sparsity_type != "none" and s > 0
    step = b // config.sparsity_factor if use_sparse else 0
    right_shift = 2 if config.legacy_sparse_window and b == config.sparsity_factor else 0
    counts = torch.zeros(HEADS, length, length, dtype=torch.long)
    counts[:, :g, :] = 1
    counts[:, :, :g] = 1
    for head in range(HEADS):
        for query in range(g, length):
            block = (query - g) // b
            for key in range(g, length):
                token = key - g
                p = sparse_position(config, head, token) if use_sparse else None
                p = -10**9 if p is None else p
                local = abs(token // b - block) <= 1
                left = not local and (block - 1) * step - s <= p < (block - 1) * step
                right_start = (block + 2) * step - right_shift
                right = right_start <= p < right_start + s
                counts[head, query, key] = local + left + right
    return counts[None] * key_mask[:, None, None, :]


def explicit_causal_mask(config, length, key_mask):
    """(B, H, N, N) bool for causal LSG: globals are a causal prefix; block k sees globals, the left
    sparse keys and tokens of blocks k - 1 and k up to the query itself."""
    g, b, s = config.num_global_tokens, config.block_size, config.sparse_block_size
    use_sparse = config.sparsity_type != "none" and s > 0
    step = b // config.sparsity_factor if use_sparse else 0
    allowed = torch.zeros(HEADS, length, length, dtype=torch.bool)
    for head in range(HEADS):
        for query in range(length):
            for key in range(query + 1):
                if query < g or key < g:
                    allowed[head, query, key] = True
                    continue
                block, token = (query - g) // b, key - g
                if token // b >= block - 1:
                    allowed[head, query, key] = True
                elif use_sparse:
                    p = sparse_position(config, head, token)
                    allowed[head, query, key] = p is not None and (block - 1) * step - s <= p < (block - 1) * step
    return allowed[None] & key_mask[:, None, None, :]


def dense_reference(query, key, value, counts):
    """Dense attention in which key k weighs counts[..., k] times (a bool mask: once or never)."""
    bias = counts.to(query.dtype).log().clamp(min=torch.finfo(query.dtype).min)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=bias)


@pytest.mark.parametrize(
    "settings",
    [
        dict(sparsity_type="none", num_global_tokens=2),
        dict(sparsity_type="none", num_global_tokens=0),
        dict(sparsity_type="stride", num_global_tokens=1, sparsity_factor=2, sparse_block_size=4),
        dict(sparsity_type="stride", num_global_tokens=3, sparsity_factor=4, sparse_block_size=6),
        dict(sparsity_type="block_stride", num_global_tokens=1, sparsity_factor=2, sparse_block_size=8),
        dict(sparsity_type="block_stride", num_global_tokens=2, sparsity_factor=4, sparse_block_size=3),
        # geometries the 2023 reference got wrong: s < 0.75 b / f (it dropped the sparse context) ...
        dict(sparsity_type="stride", num_global_tokens=1, sparsity_factor=2, sparse_block_size=2),
        # ... and an odd b / f (it crashed)
        dict(sparsity_type="block_stride", num_global_tokens=1, sparsity_factor=4, sparse_block_size=5, block_size=12),
        # one compressed token per block (b == f): the right sparse window stays aligned after the local one ...
        dict(sparsity_type="stride", num_global_tokens=1, sparsity_factor=8, sparse_block_size=4),
        # ... except for checkpoints of the 2023 reference, whose right window starts two compressed tokens early
        dict(sparsity_type="stride", num_global_tokens=1, sparsity_factor=8, sparse_block_size=4, legacy_sparse_window=True),
    ],
    ids=lambda s: f"{s['sparsity_type']}-g{s['num_global_tokens']}-f{s.get('sparsity_factor', 2)}-s{s.get('sparse_block_size', 0)}"
    + ("-legacy" if s.get("legacy_sparse_window") else ""),
)
@pytest.mark.parametrize("lengths", [(101, 101), (101, 77)], ids=["full", "padded"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_blocked_path_equals_dense_attention_with_explicit_mask(settings, lengths, causal):
    config = lsg_config(**{"block_size": 8, **settings})
    g = config.num_global_tokens
    length = g + max(lengths)  # 101 tokens: not a multiple of the block size
    query, key, value = random_qkv(len(lengths), length)
    key_mask = padding_mask([g + n for n in lengths], length)

    output = lsg_self_attention(query, key, value, key_mask, config, causal=causal)
    allowed = (explicit_causal_mask if causal else explicit_key_counts)(config, length, key_mask)
    expected = dense_reference(query, key, value, allowed)

    real = key_mask[:, None, :, None].expand_as(output)
    torch.testing.assert_close(output[real], expected[real], atol=1e-10, rtol=0)


def causal_settings():
    for sparsity_type in SPARSITY_TYPES:
        if sparsity_type == "bos_pooling":  # refused for decoders: needs the first token's query
            continue
        for factor in (1, 2, 4):
            yield dict(sparsity_type=sparsity_type, sparsity_factor=factor)


@pytest.mark.parametrize("settings", list(causal_settings()), ids=lambda s: f"{s['sparsity_type']}-f{s['sparsity_factor']}")
@pytest.mark.parametrize("step_queries", [1, 5])
def test_cached_causal_step_equals_the_full_causal_pass(settings, step_queries):
    config = lsg_config(block_size=8, sparse_block_size=8, num_global_tokens=2, **settings)
    length = 2 + 90
    query, key, value = random_qkv(2, length, seed=3)
    key_mask = padding_mask([length, 2 + 70], length)
    full = lsg_self_attention(query, key, value, key_mask, config, causal=True)

    for end in (2 + 10, 2 + 33, 2 + 64, length):  # inside block 1, block 3, at a block start, at the end
        step = lsg_self_attention(
            query[:, :, end - step_queries : end], key[:, :, :end], value[:, :, :end], key_mask[:, :end], config,
            causal=True,
        )
        torch.testing.assert_close(step, full[:, :, end - step_queries : end], atol=1e-10, rtol=0)


def test_mask_first_token_hides_the_first_real_token_as_a_key():
    config = lsg_config(block_size=8, sparsity_type="none", num_global_tokens=1, mask_first_token=True)
    length = 1 + 60
    query, key, value = random_qkv(1, length)
    key_mask = torch.ones(1, length, dtype=torch.bool)
    hidden_first = key_mask.clone()
    hidden_first[:, 1] = False

    output = lsg_self_attention(query, key, value, key_mask, config)

    expected = dense_reference(query, key, value, explicit_key_counts(config, length, hidden_first))
    torch.testing.assert_close(output, expected, atol=1e-10, rtol=0)


def test_short_input_runs_plain_attention():
    config = lsg_config(block_size=16, num_global_tokens=2)
    length = 2 + 32  # t <= 2b
    query, key, value = random_qkv(2, length)
    key_mask = padding_mask([34, 20], length)

    output = lsg_self_attention(query, key, value, key_mask, config)

    expected = dense_reference(query, key, value, key_mask[:, None, None, :].expand(-1, HEADS, length, -1))
    real = key_mask[:, None, :, None].expand_as(output)
    torch.testing.assert_close(output[real], expected[real], atol=1e-10, rtol=0)


def all_sparsity_settings():
    for sparsity_type in SPARSITY_TYPES:
        for factor in (1, 2, 4):
            yield dict(sparsity_type=sparsity_type, sparsity_factor=factor)


@pytest.mark.parametrize(
    "settings", list(all_sparsity_settings()), ids=lambda s: f"{s['sparsity_type']}-f{s['sparsity_factor']}"
)
def test_real_token_outputs_ignore_padding_and_batch_neighbours(settings):
    config = lsg_config(block_size=8, sparse_block_size=8, num_global_tokens=1, **settings)
    g, tokens = 1, 75  # not a multiple of the block size
    query, key, value = random_qkv(1, g + tokens, seed=1)
    alone = lsg_self_attention(query, key, value, None, config)

    # the same sequence padded to 123 tokens, batched with a different, longer sequence
    other = random_qkv(1, g + 123, seed=2)
    batch = [torch.cat([F.pad(x, (0, 0, 0, 123 - tokens)), y]) for x, y in zip((query, key, value), other)]
    key_mask = padding_mask([g + tokens, g + 123], g + 123)
    batched = lsg_self_attention(*batch, key_mask, config)

    torch.testing.assert_close(batched[:1, :, : g + tokens], alone, atol=1e-10, rtol=0)


@pytest.mark.parametrize("sparsity_type", SPARSITY_TYPES)
def test_every_sparsity_type_gives_finite_outputs_and_gradients(sparsity_type):
    config = lsg_config(block_size=16, sparse_block_size=16, sparsity_type=sparsity_type, num_global_tokens=2)
    query, key, value = (x.float().requires_grad_() for x in random_qkv(2, 2 + 150))
    key_mask = padding_mask([152, 90], 152)

    output = lsg_self_attention(query, key, value, key_mask, config)
    output[key_mask[:, None, :, None].expand_as(output)].sum().backward()

    assert torch.isfinite(output).all()
    for tensor in (query, key, value):
        assert torch.isfinite(tensor.grad).all() and tensor.grad.abs().sum() > 0


def test_lsh_is_deterministic_for_a_seed_and_changes_with_it():
    query, key, value = random_qkv(1, 1 + 128)
    first = lsg_self_attention(query, key, value, None, lsg_config(block_size=16, sparsity_type="lsh", lsh_seed=3))
    again = lsg_self_attention(query, key, value, None, lsg_config(block_size=16, sparsity_type="lsh", lsh_seed=3))
    other = lsg_self_attention(query, key, value, None, lsg_config(block_size=16, sparsity_type="lsh", lsh_seed=4))

    torch.testing.assert_close(first, again, atol=0, rtol=0)
    assert not torch.allclose(first, other)


def test_sparse_context_reaches_beyond_the_local_window():
    """Changing a token outside block 0's local window changes block 0 only through sparse keys."""
    length = 1 + 128
    query, key, value = random_qkv(1, length)
    # b = 16: block 0 sees tokens [0, 32) locally; with f = 2, s = 16 its right sparse keys are the
    # compressed positions [16, 32), i.e. tokens [32, 64)
    far_token = 1 + 40
    changed_value = value.clone()
    changed_value[:, :, far_token] += 1.0

    def first_block_output(config, values):
        return lsg_self_attention(query, key, values, None, config)[:, :, 1:17]

    local_only = lsg_config(block_size=16, sparsity_type="none", num_global_tokens=1)
    with_sparse = lsg_config(block_size=16, sparse_block_size=16, sparsity_type="pooling", num_global_tokens=1)
    torch.testing.assert_close(first_block_output(local_only, value), first_block_output(local_only, changed_value))
    assert not torch.allclose(first_block_output(with_sparse, value), first_block_output(with_sparse, changed_value))


def test_input_not_a_multiple_of_block_size_is_refused_without_adaptive():
    query, key, value = random_qkv(1, 1 + 100)
    with pytest.raises(ValueError, match="adaptive"):
        lsg_self_attention(query, key, value, None, lsg_config(block_size=16, adaptive=False))


# --------------------------------------------------------------------------------------------------
# Attention weights: the eager backend (output_attentions=True)
# --------------------------------------------------------------------------------------------------

SELECTION_SETTINGS = [  # sparse keys that are tokens: the specification's dense mask gives every weight
    dict(sparsity_type="none", num_global_tokens=2),
    dict(sparsity_type="stride", num_global_tokens=1, sparsity_factor=2, sparse_block_size=4),
    dict(sparsity_type="block_stride", num_global_tokens=2, sparsity_factor=4, sparse_block_size=3),
    dict(sparsity_type="stride", num_global_tokens=1, sparsity_factor=8, sparse_block_size=4, legacy_sparse_window=True),
]


def eager_attention(*args, **kwargs):
    """The output and the token weights of the eager backend."""
    return lsg_attention(*args, backend="eager", **kwargs)


def dense_probabilities(query, key, counts):
    """softmax(q k^T / sqrt(D)) in which key k weighs counts[..., k] times: (B, H, N, N)."""
    scores = query @ key.transpose(-1, -2) * HEAD_DIM**-0.5
    return (scores + counts.to(query.dtype).log()).softmax(dim=-1)


@pytest.mark.parametrize("settings", SELECTION_SETTINGS, ids=lambda s: f"{s['sparsity_type']}-g{s['num_global_tokens']}")
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_eager_weights_are_the_specified_attention_probabilities_of_the_tokens(settings, causal):
    config = lsg_config(**{"block_size": 8, **settings})
    g = config.num_global_tokens
    length = g + 101
    query, key, value = random_qkv(2, length)
    key_mask = padding_mask([length, g + 77], length)

    _, weights = eager_attention(query, key, value, key_mask, config, causal=causal)

    allowed = (explicit_causal_mask if causal else explicit_key_counts)(config, length, key_mask)
    expected = dense_probabilities(query, key, allowed)[:, :, g:, g:]
    assert weights.shape == (2, HEADS, 101, 101)
    real = key_mask[:, None, g:, None].expand_as(weights)
    torch.testing.assert_close(weights[real], expected[real], atol=1e-12, rtol=0)


def eager_settings():
    for sparsity_type in SPARSITY_TYPES:
        for factor in (1, 4):
            yield dict(sparsity_type=sparsity_type, sparsity_factor=factor)


@pytest.mark.parametrize("settings", list(eager_settings()), ids=lambda s: f"{s['sparsity_type']}-f{s['sparsity_factor']}")
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_eager_output_equals_the_sdpa_output(settings, causal):
    if causal and settings["sparsity_type"] == "bos_pooling":
        pytest.skip("bos_pooling is refused for decoders")
    config = lsg_config(block_size=8, sparse_block_size=8, num_global_tokens=2, **settings)
    query, key, value = random_qkv(2, 2 + 101, seed=4)
    key_mask = padding_mask([2 + 101, 2 + 60], 2 + 101)

    eager = lsg_self_attention(query, key, value, key_mask, config, causal=causal, backend="eager")
    sdpa = lsg_self_attention(query, key, value, key_mask, config, causal=causal, backend="sdpa")

    real = key_mask[:, None, :, None].expand_as(sdpa)
    torch.testing.assert_close(eager[real], sdpa[real], atol=1e-12, rtol=0)


@pytest.mark.parametrize("sparsity_type", SPARSITY_TYPES)
def test_eager_output_is_its_weights_times_the_token_values(sparsity_type):
    config = lsg_config(block_size=8, sparse_block_size=8, sparsity_factor=4, sparsity_type=sparsity_type, num_global_tokens=0)
    query, key, value = random_qkv(2, 90, seed=5)
    key_mask = padding_mask([90, 61], 90)

    output, weights = eager_attention(query, key, value, key_mask, config)

    torch.testing.assert_close(output, weights @ value, atol=1e-12, rtol=0)
    real_rows = weights.sum(dim=-1)[key_mask[:, None, :].expand(-1, HEADS, -1)]
    torch.testing.assert_close(real_rows, torch.ones_like(real_rows), atol=1e-12, rtol=0)
    assert (weights[1, :, :61, 61:] == 0).all()  # no real token's weight on padding


def test_a_pooling_key_spreads_its_weight_evenly_over_its_window():
    """With local keys only on both sides of one block, block 0's right sparse keys are the only way
    to tokens [2b, ...): each window of f tokens gets equal weights."""
    config = lsg_config(block_size=8, sparse_block_size=8, sparsity_factor=4, sparsity_type="pooling", num_global_tokens=0)
    query, key, value = random_qkv(1, 64, seed=6)

    _, weights = eager_attention(query, key, value, None, config)

    sparse_part = weights[0, :, :8, 24:40].unflatten(-1, (4, 4))  # block 0's 8 queries, 4 windows of f = 4 tokens
    torch.testing.assert_close(sparse_part, sparse_part[..., :1].expand_as(sparse_part), atol=1e-12, rtol=0)
    assert (sparse_part > 0).all()


def test_eager_weights_are_zero_outside_the_pattern():
    config = lsg_config(block_size=8, sparsity_type="none", num_global_tokens=1)
    query, key, value = random_qkv(1, 1 + 64)

    _, weights = eager_attention(query, key, value, None, config)

    block = torch.arange(64) // 8
    outside = (block[:, None] - block[None, :]).abs() > 1
    assert (weights[:, :, outside] == 0).all() and (weights[:, :, ~outside] > 0).all()


def test_eager_weights_of_a_cached_step_are_the_last_rows_of_the_full_pass():
    config = lsg_config(block_size=8, sparse_block_size=8, sparsity_type="pooling", num_global_tokens=2)
    length = 2 + 90
    query, key, value = random_qkv(2, length, seed=3)
    key_mask = padding_mask([length, 2 + 70], length)
    full_output, full_weights = eager_attention(query, key, value, key_mask, config, causal=True)

    end = 2 + 33
    output, weights = eager_attention(
        query[:, :, end - 3 : end], key[:, :, :end], value[:, :, :end], key_mask[:, :end], config, causal=True
    )

    torch.testing.assert_close(output, full_output[:, :, end - 3 : end], atol=1e-12, rtol=0)
    torch.testing.assert_close(weights, full_weights[:, :, end - 2 - 3 : end - 2, : end - 2], atol=1e-12, rtol=0)


@pytest.mark.parametrize("sparsity_type", ["norm", "pooling", "lsh"])
def test_eager_training_hides_the_keys_the_sdpa_backend_hides(sparsity_type):
    config = lsg_config(block_size=8, sparse_block_size=8, sparsity_type=sparsity_type, num_global_tokens=2)
    query, key, value = random_qkv(2, 2 + 70, seed=7)

    torch.manual_seed(11)
    eager = lsg_self_attention(query, key, value, None, config, dropout=0.3, backend="eager")
    torch.manual_seed(11)
    sdpa = lsg_self_attention(query, key, value, None, config, dropout=0.3, backend="sdpa")

    torch.testing.assert_close(eager, sdpa, atol=1e-12, rtol=0)


def test_eager_weights_are_on_the_autograd_path_of_the_output():
    config = lsg_config(block_size=8, sparse_block_size=8, num_global_tokens=2)
    query, key, value = random_qkv(1, 2 + 50)

    output, weights = eager_attention(query.requires_grad_(), key, value, None, config)
    weights.retain_grad()
    output.sum().backward()

    assert weights.grad is not None and weights.grad.abs().sum() > 0


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_key_columns_are_inverted_by_the_slots(causal):
    config = lsg_config(block_size=8, sparse_block_size=6, sparsity_factor=2, num_global_tokens=2)
    pattern = KeyPattern.of(config, causal)
    num_tokens, num_blocks = 64, 8
    num_compressed = num_tokens // 2
    columns = pattern.key_columns(torch.arange(num_blocks), num_tokens, num_compressed)

    for block in range(num_blocks):
        query = torch.tensor(block * 8)
        for slot, column in enumerate(columns[block].tolist()):
            if column < 2:
                assert slot == column
            elif column < 2 + num_tokens:
                assert pattern.local_slot(query, torch.tensor(column - 2)) == slot
            elif column < 2 + num_tokens + num_compressed:
                assert pattern.sparse_slot(query, torch.tensor(column - 2 - num_tokens)) == slot


def test_few_query_attention_equals_sdpa_in_outputs_and_gradients():
    """The global queries' path on CUDA, checked on the CPU in float64 (a fully masked query included)."""
    generator = torch.Generator().manual_seed(0)
    query, key, value = (
        torch.randn(2, 3, n, 16, generator=generator, dtype=torch.float64).requires_grad_() for n in (2, 40, 40)
    )
    allowed = torch.rand(2, 1, 2, 40, generator=generator) > 0.3
    allowed[1, :, 0] = False
    mask = additive_mask(allowed, torch.float64)

    def output_and_gradients(attention):  # the gradients of the queries that see keys
        output = attention(query, key, value, mask, 0.25)
        seeing = allowed.any(dim=-1, keepdim=True).expand_as(output)
        gradients = torch.autograd.grad(output[seeing].square().sum(), (query, key, value))
        return output, gradients

    few, few_gradients = output_and_gradients(few_query_attention)
    sdpa, sdpa_gradients = output_and_gradients(
        lambda q, k, v, m, scale: F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=scale)
    )

    torch.testing.assert_close(few, sdpa, atol=1e-12, rtol=1e-12)
    for few_gradient, sdpa_gradient in zip(few_gradients, sdpa_gradients):
        torch.testing.assert_close(few_gradient, sdpa_gradient, atol=1e-12, rtol=1e-12)


def test_few_query_attention_in_bfloat16_stays_within_its_rounding_of_float64():
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(2, 3, n, 64, generator=generator, dtype=torch.float64) for n in (1, 4000, 4000))
    allowed = torch.rand(2, 1, 1, 4000, generator=generator) > 0.2

    exact = F.scaled_dot_product_attention(query, key, value, attn_mask=additive_mask(allowed, torch.float64))
    half = few_query_attention(*(x.bfloat16() for x in (query, key, value)), additive_mask(allowed, torch.bfloat16), 0.125)

    torch.testing.assert_close(half.double(), exact, atol=1e-2, rtol=1e-2)
