"""What LSG attention leaves out of an inference pass without changing a real token's output: the blocks
of a padded batch that hold padding only, and a bias table's block mask made again at every layer.

Two calls given the same `padding_plans` are two layers of one forward pass (the model's recorder gives its
layers the plans it made with the padding mask)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import OpRecorder, lsg_config, lsg_self_attention, padding_mask
from lsg_converter.models.lsg_pattern import PositionTerms
from lsg_converter.models.lsg_sdpa import mask_runs

HEADS, HEAD_DIM, BLOCK, BUCKETS = 4, 8, 8, 9
BACKENDS = ["sdpa", "eager", "flex_attention"]


def random_qkv(lengths, seed=0, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(len(lengths), HEADS, max(lengths), HEAD_DIM, generator=generator, dtype=dtype) for _ in range(3)]


def bias_table_terms(seed=1):
    """A table of one score per head and bucket (as MPNet's and T5's bias), its buckets clamped distances."""
    table = torch.randn(HEADS, BUCKETS, generator=torch.Generator().manual_seed(seed))
    return PositionTerms(bucket=lambda relative: relative.clamp(-4, 4) + 4, table=table)


def attention(qkv, lengths, config, backend="sdpa", terms=None, plans=None):
    with torch.no_grad():
        return lsg_self_attention(
            *qkv, padding_mask(lengths, max(lengths)), config, backend=backend, position_terms=terms, padding_plans=plans
        )


class SdpaCalls(TorchDispatchMode):
    """The SDPA kernel calls under it: the query rows they were given in all, apart by whether they had a
    mask (`rows`), each call's query rows per batch entry (`call_rows`, dim 2 of its queries), and each
    call's query rows in all and keys per query (`calls`)."""

    def __init__(self):
        super().__init__()
        self.rows = {True: 0, False: 0}
        self.call_rows: list[int] = []
        self.calls: list[tuple[int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket.__name__.startswith("_scaled_dot_product"):
            self.rows[kwargs.get("attn_mask") is not None] += args[0].shape[0] * args[0].shape[2]
            self.call_rows.append(args[0].shape[2])
            self.calls.append((args[0].shape[0] * args[0].shape[2], args[1].shape[2]))
        return func(*args, **kwargs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_block_of_padding_only_gets_zero_output(backend):
    config = lsg_config(block_size=BLOCK, sparse_block_size=BLOCK, sparsity_type="norm", num_global_tokens=1)
    lengths = [1 + 80, 1 + 20]  # the second row: blocks 0-2 hold tokens, blocks 3-9 padding only
    output = attention(random_qkv(lengths), lengths, config, backend)  # (B, H, g + t, D)

    assert output[1, :, 1 + 3 * BLOCK :].abs().max() == 0
    assert output[1, :, 1 + 20 : 1 + 3 * BLOCK].abs().min() > 0  # padding in a block with tokens: computed


@pytest.mark.parametrize("backend", ["eager", "flex_attention"])
def test_every_backend_gives_the_sdpa_rows_of_a_padded_batch(backend):
    config = lsg_config(block_size=BLOCK, sparse_block_size=BLOCK, sparsity_type="pooling", num_global_tokens=2)
    lengths = [2 + 75, 2 + 30]
    qkv = random_qkv(lengths, dtype=torch.float64)

    torch.testing.assert_close(attention(qkv, lengths, config, backend), attention(qkv, lengths, config), atol=1e-10, rtol=0)


def test_the_sdpa_backend_attends_only_the_blocks_that_hold_a_real_token():
    config = lsg_config(block_size=BLOCK, sparsity_type="none", num_global_tokens=1)
    lengths = [1 + 80, 1 + 20]  # 10 blocks, then 3
    qkv = random_qkv(lengths)
    with SdpaCalls() as calls:
        attention(qkv, lengths, config)

    # the blocks' rows (over their local keys; over the global key apart, on the CPU), then the 2 rows' global query
    assert sum(rows for rows, keys in calls.calls if keys > 1) == (10 + 3) * BLOCK + 2


def test_a_real_token_output_is_the_same_alone_and_beside_a_longer_row():
    config = lsg_config(block_size=BLOCK, sparse_block_size=BLOCK, sparsity_type="norm", num_global_tokens=1)
    lengths = [1 + 90, 1 + 21]
    qkv = random_qkv(lengths, dtype=torch.float64)
    batched = attention(qkv, lengths, config)
    alone = attention([x[1:, :, : lengths[1]] for x in qkv], lengths[1:], config)

    torch.testing.assert_close(batched[1:, :, : lengths[1]], alone, atol=1e-10, rtol=0)


def test_a_bias_table_block_mask_is_made_once_for_the_layers_of_a_forward_pass():
    config = lsg_config(block_size=BLOCK, sparsity_type="none", num_global_tokens=1)
    lengths = [1 + 80, 1 + 64]
    terms, plans = bias_table_terms(), {}
    first_layer = attention(random_qkv(lengths, seed=0), lengths, config, terms=terms, plans=plans)
    with OpRecorder() as recorder:
        second_layer = attention(random_qkv(lengths, seed=1), lengths, config, terms=terms, plans=plans)

    mask_elements = 2 * 10 * HEADS * BLOCK * (1 + 3 * BLOCK)  # (B, nb, H, b, K), more than the keys gathered
    assert recorder.outputs_of_at_least(mask_elements) == []
    fresh = attention(random_qkv(lengths, seed=1), lengths, config, terms=bias_table_terms())
    torch.testing.assert_close(second_layer, fresh, atol=0, rtol=0)
    assert not torch.equal(first_layer, second_layer)


@pytest.mark.parametrize("sparsity, padded", [("pooling", True), ("norm", False)])
def test_a_block_mask_is_made_once_for_layers_whose_sparse_keys_lie_beyond_the_max_distance(sparsity, padded):
    # clamped at 4 and blocks of 8: every sparse key lies 9 or more tokens from its queries, so its term is
    # its side's, whichever keys each layer selects; the sparse keys' mask is the padding's (pooling), or
    # every key where nothing is masked (norm, whose mask on a padded batch depends on the keys it selects)
    config = lsg_config(block_size=BLOCK, sparse_block_size=BLOCK, sparsity_type=sparsity, num_global_tokens=1)
    lengths = [1 + 80, 1 + 64] if padded else [1 + 80, 1 + 80]
    mask = padding_mask(lengths, max(lengths)) if padded else None
    terms, plans = bias_table_terms(), {}
    terms.max_distance = 4

    def layer(seed, terms, plans=None):
        with torch.no_grad():
            return lsg_self_attention(*random_qkv(lengths, seed), mask, config, position_terms=terms, padding_plans=plans)

    layer(0, terms, plans)
    with OpRecorder() as recorder:
        second_layer = layer(1, terms, plans)

    mask_elements = 2 * 10 * HEADS * BLOCK * (1 + 2 * BLOCK + 3 * BLOCK)  # (B, nb, H, b, K)
    # the keys and values each block gathers ("index", (B nb, H, K, D)) are as large where b = D
    assert [name for name in recorder.outputs_of_at_least(mask_elements) if name != "index"] == []
    fresh = layer(1, bias_table_terms())  # pair by pair
    torch.testing.assert_close(second_layer, fresh, atol=0, rtol=0)


def test_a_block_mask_is_made_again_by_layers_with_other_terms():
    config = lsg_config(block_size=BLOCK, sparsity_type="none", num_global_tokens=1)
    lengths, plans = [1 + 80, 1 + 64], {}
    attention(random_qkv(lengths), lengths, config, terms=bias_table_terms(seed=1), plans=plans)
    other_terms = attention(random_qkv(lengths), lengths, config, terms=bias_table_terms(seed=2), plans=plans)

    fresh = attention(random_qkv(lengths), lengths, config, terms=bias_table_terms(seed=2))
    torch.testing.assert_close(other_terms, fresh, atol=0, rtol=0)


def test_a_block_mask_with_gradients_is_made_at_every_layer():
    config = lsg_config(block_size=BLOCK, sparsity_type="none", num_global_tokens=1)
    lengths, plans = [1 + 80, 1 + 64], {}
    terms = bias_table_terms()
    terms.table.requires_grad_(True)
    for seed in (0, 1):
        lsg_self_attention(
            *random_qkv(lengths, seed), padding_mask(lengths, max(lengths)), config, position_terms=terms, padding_plans=plans
        ).sum().backward()

    memo = next(iter(plans.values())).memo
    assert not any(isinstance(key, tuple) and key[0] == "block mask" for key in memo)
    assert terms.table.grad.abs().sum() > 0


def test_mask_runs_part_the_blocks_into_runs_that_need_their_mask_or_not():
    lowest = torch.finfo(torch.float32).min
    mask = torch.zeros(6, 1, 1, 5)
    mask[0, ..., :2] = lowest  # no left neighbour
    mask[4:, ..., 3:] = lowest  # padding

    assert mask_runs(mask) == [(0, 1, True), (1, 4, False), (4, 6, True)]
    assert mask_runs(torch.zeros(6, 2, 1, 5)) == [(0, 6, True)]  # position terms per head: not scanned


def test_mask_runs_scan_a_bool_mask_with_rows_per_head():
    hidden = torch.zeros(6, 2, 1, 5, dtype=torch.bool)
    hidden[0, 1, :, :2] = True  # one head's sparse keys before the start

    assert mask_runs(hidden) == [(0, 1, True), (1, 6, False)]
    assert mask_runs(torch.zeros(6, 2, 3, 5, dtype=torch.bool)) == [(0, 6, True)]  # rows per query: not scanned


def test_the_gathered_blocks_away_from_the_edges_run_without_a_mask():
    # sparse keys: no window views, every block's keys gathered (on CUDA, with or without sparse keys)
    config = lsg_config(block_size=BLOCK, sparsity_type="pooling", sparsity_factor=2, sparse_block_size=BLOCK, num_global_tokens=1)
    lengths = [1 + 80]  # 10 blocks, 40 pooled keys (4 a block)
    queries, keys, values = random_qkv(lengths)
    with SdpaCalls() as calls:
        lsg_self_attention(queries.requires_grad_(), keys, values, padding_mask(lengths, max(lengths)), config)

    # block i's sparse windows, pooled keys [4(i - 1) - 8, 4(i - 1)) and [4(i + 2), 4(i + 2) + 8), lie inside for 3 <= i <= 6
    assert calls.rows[False] == 4 * BLOCK
    assert calls.rows[True] == 6 * BLOCK + 1  # and the global query


@pytest.mark.parametrize("num_global", [0, 1, 3])
def test_blocks_read_as_window_views_give_the_eager_output_of_a_padded_batch(num_global):
    config = lsg_config(block_size=BLOCK, sparsity_type="none", num_global_tokens=num_global)
    lengths = [num_global + 203, num_global + 61]  # 26 blocks, the last one padded; then 8
    qkv = random_qkv(lengths, dtype=torch.float64)

    torch.testing.assert_close(attention(qkv, lengths, config), attention(qkv, lengths, config, "eager"), atol=1e-12, rtol=0)


def test_blocks_read_as_window_views_copy_no_keys():
    config = lsg_config(block_size=BLOCK, sparsity_type="none", num_global_tokens=1)
    lengths = [1 + 203]  # 26 blocks: gathered, their windows would hold 26 x (1 + 3 x 8) keys
    with OpRecorder() as recorder:
        attention(random_qkv(lengths), lengths, config)

    assert recorder.largest <= HEADS * 26 * BLOCK * HEAD_DIM  # the blocks' output: no copy of the windows


def test_blocks_read_as_window_views_give_the_same_output_with_gradients():
    config = lsg_config(block_size=BLOCK, sparsity_type="none", num_global_tokens=2)
    lengths = [2 + 120, 2 + 77]
    qkv = random_qkv(lengths)
    gathered = lsg_self_attention(*(x.clone().requires_grad_() for x in qkv), padding_mask(lengths, max(lengths)), config)

    torch.testing.assert_close(attention(qkv, lengths, config), gathered.detach(), atol=1e-6, rtol=1e-5)


def test_blocks_run_without_a_mask_give_the_eager_output_of_a_padded_batch():
    config = lsg_config(block_size=BLOCK, sparsity_type="none", num_global_tokens=1)
    lengths = [1 + 80, 1 + 45]
    qkv = random_qkv(lengths, dtype=torch.float64)

    torch.testing.assert_close(attention(qkv, lengths, config), attention(qkv, lengths, config, "eager"), atol=1e-12, rtol=0)


@pytest.mark.parametrize("block, kernel_rows", [(170, 192), (161, 192), (160, 160), (128, 128), (192, 192)])
def test_window_view_blocks_of_a_little_under_192_queries_reach_the_kernel_as_192_rows(block, kernel_rows):
    config = lsg_config(block_size=block, sparsity_type="none", num_global_tokens=1)
    lengths = [1 + 5 * block]
    with SdpaCalls() as calls:
        attention(random_qkv(lengths), lengths, config)

    block_calls = [rows for rows in calls.call_rows if rows > 1]  # not the global query's call (one row)
    assert block_calls[0] == kernel_rows  # the window views' call: blocks 1-3 (0 and 4 lack a neighbour)


@pytest.mark.parametrize("num_global", [0, 2])
def test_blocks_run_as_192_query_rows_give_the_eager_output_of_a_padded_batch(num_global):
    config = lsg_config(block_size=170, sparsity_type="none", num_global_tokens=num_global)
    lengths = [num_global + 6 * 170 + 30, num_global + 4 * 170 - 9]  # 7 blocks, the last one padded; then 4
    qkv = random_qkv(lengths, dtype=torch.float64)

    torch.testing.assert_close(attention(qkv, lengths, config), attention(qkv, lengths, config, "eager"), atol=1e-12, rtol=0)
