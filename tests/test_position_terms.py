"""Relative position terms in LSG attention (lsg_pattern.PositionTerms): a shared bucketed table (as
MPNet's bias) and query-side / key-side rows per bucket (as DeBERTa's c2p / p2c), evaluated for the
(query, key) pairs the core evaluates, on every backend, and exact against dense attention with the
same terms restricted to the block-local pattern."""

import math

import pytest
import torch

from helpers import OpRecorder, lsg_config, lsg_self_attention, padding_mask
from lsg_converter.models.lsg_attention import lsg_attention
from lsg_converter.models.lsg_pattern import PositionTerms
from lsg_converter.models.lsg_settings import LSGSettings
from lsg_converter.models.lsg_sparse import SPARSITY_TYPES, sparse_context

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

BATCH, HEADS, HEAD_DIM = 2, 4, 8
BLOCK = 8
TOKENS = 75  # 10 blocks of 8, the last one padded
BUCKETS = 17


def clamped_bucket(relative):
    """One bucket per distance in [-8, 8], the rest in the two outer ones."""
    return relative.clamp(-8, 8) + 8


def log_bucket(relative, num_buckets=BUCKETS - 1, max_distance=40):
    """T5 / MPNet's relative_position_bucket (bidirectional): exact near, logarithmic far."""
    half = num_buckets // 2
    bucket = (relative > 0).long() * half
    distance = relative.abs()
    exact = half // 2
    far = exact + (torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact) * (half - exact)).long()
    far = far.clamp(max=half - 1)
    return bucket + torch.where(distance < exact, distance, far)


BUCKET_FUNCTIONS = {"clamped": clamped_bucket, "log": log_bucket}


def random_inputs(length, seed=0, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(BATCH, HEADS, length, HEAD_DIM, generator=generator, dtype=dtype) for _ in range(3)]


def random_terms(length, bucket=clamped_bucket, global_position=0, seed=1, dtype=torch.float64, parts=("table", "query", "key")):
    generator = torch.Generator().manual_seed(seed)

    def draw(*shape):
        return torch.randn(*shape, generator=generator, dtype=dtype)

    return PositionTerms(
        bucket=bucket,
        table=draw(HEADS, BUCKETS) if "table" in parts else None,
        query_rows=draw(BATCH, HEADS, length, BUCKETS) if "query" in parts else None,
        key_rows=draw(BATCH, HEADS, length, BUCKETS) if "key" in parts else None,
        global_position=global_position,
    )


def run(backend, inputs, mask, config, terms, causal=False):
    with torch.no_grad():
        return lsg_self_attention(*inputs, mask, config, causal=causal, backend=backend, position_terms=terms)


ZERO_TERM_CASES = [(backend, sparsity) for backend in ("sdpa", "eager", "flex_attention") for sparsity in ("none", "norm", "pooling")]


def zero_term_outputs(backend, sparsity_type):
    config = lsg_config(block_size=BLOCK, sparse_block_size=BLOCK, sparsity_type=sparsity_type, num_global_tokens=2)
    length = 2 + TOKENS
    inputs = random_inputs(length, dtype=torch.float32)
    mask = padding_mask([length, 50], length)
    zero = PositionTerms(bucket=clamped_bucket, table=torch.zeros(HEADS, BUCKETS))
    return run(backend, inputs, mask, config, zero), run(backend, inputs, mask, config, None)


@pytest.mark.parametrize(("backend", "sparsity_type"), [case for case in ZERO_TERM_CASES if case != ("sdpa", "none")])
def test_a_zero_term_is_bit_identical_to_no_term(backend, sparsity_type):
    with_zero_term, without_term = zero_term_outputs(backend, sparsity_type)

    assert torch.equal(with_zero_term, without_term)


def test_a_zero_term_equals_no_term_where_sdpa_reads_window_views():
    # without terms or sparse keys, the sdpa backend on the CPU reads the blocks as window views and
    # joins the global keys through their log-sum-exp: the same softmax, summed in another order
    with_zero_term, without_term = zero_term_outputs("sdpa", "none")

    torch.testing.assert_close(with_zero_term, without_term, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(
    "block", [BLOCK, 170], ids=["local keys rounded up to 16", "blocks of 170 run as 192 kernel rows"]
)
def test_a_table_of_terms_without_gradients_gives_the_eager_output_where_sdpa_reads_window_views(block):
    # a table's terms (T5's, MPNet's bias) are the same over every block's local keys: the sdpa backend
    # reads the blocks' keys as views with one mask shared by every block, the edge blocks' added to theirs
    config = lsg_config(block_size=block, sparsity_type="none", num_global_tokens=2)
    length = 2 + 7 * block + 3
    inputs = random_inputs(length)
    mask = padding_mask([length, 2 + 4 * block + 1], length)
    terms = random_terms(length, log_bucket, global_position=3, parts=("table",))

    sdpa = run("sdpa", inputs, mask, config, terms)

    torch.testing.assert_close(sdpa, run("eager", inputs, mask, config, terms), atol=1e-10, rtol=0)
    assert not torch.allclose(sdpa, run("sdpa", inputs, mask, config, None), atol=1e-3)


def test_a_table_of_terms_without_gradients_gathers_no_copy_of_the_keys():
    # only the edge blocks (the first, the last, those beside padding) gather their own windows
    config = lsg_config(block_size=BLOCK, sparsity_type="none", num_global_tokens=2)
    length = 2 + 40 * BLOCK
    inputs = random_inputs(length, dtype=torch.float32)
    terms = random_terms(length, log_bucket, dtype=torch.float32, parts=("table",))

    with OpRecorder() as recorder:
        run("sdpa", inputs, padding_mask([length, length - 5 * BLOCK], length), config, terms)

    gathered, keys = recorder.largest_rows_made_by("index", HEAD_DIM), inputs[1].numel()
    assert gathered < keys / 2, f"{gathered / keys:.2f} times the layer's keys"


@pytest.mark.parametrize("sparsity_type", SPARSITY_TYPES)
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("bucket", sorted(BUCKET_FUNCTIONS))
def test_a_random_term_gives_the_same_output_on_every_backend(sparsity_type, causal, bucket):
    if causal and sparsity_type == "bos_pooling":
        pytest.skip("bos_pooling is refused for decoders")
    config = lsg_config(block_size=BLOCK, sparse_block_size=BLOCK, sparsity_type=sparsity_type, num_global_tokens=2)
    length = 2 + TOKENS
    inputs = random_inputs(length)
    mask = padding_mask([length, 50], length)
    terms = random_terms(length, BUCKET_FUNCTIONS[bucket], global_position=3)

    sdpa = run("sdpa", inputs, mask, config, terms, causal)
    eager = run("eager", inputs, mask, config, terms, causal)
    flex = run("flex_attention", inputs, mask.clone(), config, terms, causal)

    torch.testing.assert_close(eager, sdpa, atol=1e-10, rtol=0)
    torch.testing.assert_close(flex, sdpa, atol=1e-10, rtol=0)
    assert not torch.allclose(sdpa, run("sdpa", inputs, mask, config, None, causal), atol=1e-3)


def dense_reference(inputs, lengths, terms, num_global, causal):
    """Dense attention over [g global tokens | t tokens] with the terms restricted to the block-local
    pattern: a token query sees the global keys and the tokens of its own and neighbouring blocks
    (causal: up to itself), a global query every key (causal: the global keys before it)."""
    query, key, value = inputs
    length = key.shape[2]
    num_tokens = length - num_global
    positions = torch.cat([torch.full((num_global,), terms.global_position), torch.arange(num_tokens)])
    relative = positions[None, :] - positions[:, None]  # (L, L): key position - query position
    heads = torch.arange(HEADS)[:, None, None]
    scores = (query @ key.transpose(-1, -2)) * HEAD_DIM**-0.5
    scores = scores + terms.table[heads, terms.bucket(relative)]
    rows = torch.arange(length)
    scores = scores + terms.query_rows[:, heads, rows[:, None], terms.bucket(relative)]
    scores = scores + terms.key_rows[:, heads, rows[None, :], terms.bucket(relative)]

    token = torch.arange(num_tokens)
    local = (token[:, None] // BLOCK - token[None, :] // BLOCK).abs() <= 1
    allowed = torch.ones(length, length, dtype=torch.bool)
    allowed[num_global:, num_global:] = local
    if causal:
        allowed &= rows[None, :] <= rows[:, None]
    key_mask = padding_mask(lengths, length)
    allowed = allowed[None, None] & key_mask[:, None, None, :]
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    return scores.softmax(dim=-1) @ value


@pytest.mark.parametrize("backend", ["sdpa", "eager", "flex_attention"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("num_global", [0, 2])
def test_without_sparse_keys_it_is_dense_attention_with_the_terms_restricted_to_the_block_local_pattern(
    backend, causal, num_global
):
    config = lsg_config(block_size=BLOCK, sparsity_type="none", num_global_tokens=num_global)
    length = num_global + TOKENS
    lengths = [length, num_global + 50]
    inputs = random_inputs(length)
    terms = random_terms(length, global_position=5)

    output = run(backend, inputs, padding_mask(lengths, length), config, terms, causal)

    expected = dense_reference(inputs, lengths, terms, num_global, causal)
    real = padding_mask(lengths, length)[:, None, :, None]
    torch.testing.assert_close(output * real, expected * real, atol=1e-10, rtol=0)


def test_each_part_of_the_term_changes_the_output():
    config = lsg_config(block_size=BLOCK, sparse_block_size=BLOCK, sparsity_type="norm", num_global_tokens=1)
    length = 1 + TOKENS
    inputs = random_inputs(length)
    outputs = [run("sdpa", inputs, None, config, random_terms(length, parts=(part,))) for part in ("table", "query", "key")]
    plain = run("sdpa", inputs, None, config, None)

    for output in outputs:
        assert not torch.allclose(output, plain, atol=1e-3)


def test_the_eager_weights_with_position_terms_give_its_output():
    config = lsg_config(block_size=BLOCK, sparse_block_size=BLOCK, sparsity_type="pooling", num_global_tokens=0)
    inputs = random_inputs(TOKENS)
    terms = random_terms(TOKENS)

    output, weights = lsg_attention(*inputs, None, config, backend="eager", position_terms=terms)

    torch.testing.assert_close(output, weights @ inputs[2], atol=1e-12, rtol=0)
    torch.testing.assert_close(weights.sum(dim=-1), torch.ones(BATCH, HEADS, TOKENS, dtype=torch.float64))


@pytest.mark.parametrize("sparsity_type", ["none", "norm", "pooling", "stride"])
def test_a_cached_step_with_position_terms_equals_the_last_rows_of_the_full_causal_pass(sparsity_type):
    config = lsg_config(block_size=BLOCK, sparse_block_size=BLOCK, sparsity_type=sparsity_type, num_global_tokens=1)
    length = 1 + TOKENS
    inputs = random_inputs(length)
    terms = random_terms(length)
    full = lsg_self_attention(*inputs, None, config, causal=True, position_terms=terms)

    step_terms = random_terms(length)
    step_terms.query_rows = terms.query_rows[:, :, -3:]  # one row per query given
    step_terms.table, step_terms.key_rows = terms.table, terms.key_rows
    query, key, value = inputs
    step = lsg_self_attention(query[:, :, -3:], key, value, None, config, causal=True, position_terms=step_terms)

    torch.testing.assert_close(step, full[:, :, -3:], atol=1e-10, rtol=0)


def compressed_positions(sparsity_type, lengths, factor=2):
    config = lsg_config(block_size=BLOCK, sparse_block_size=BLOCK, sparsity_type=sparsity_type, sparsity_factor=factor)
    keys, values, queries = random_inputs(80)
    mask = padding_mask(lengths, 80)
    return sparse_context(queries, keys, values, mask, LSGSettings.of(config), HEAD_DIM**-0.5, with_positions=True)


def test_a_selected_sparse_key_is_at_the_position_of_the_token_it_selected():
    sparse = compressed_positions("stride", [80, 80], factor=4)

    head = torch.arange(HEADS)[:, None]
    expected = torch.arange(0, 80, 4)[None, :] + head % 4  # head j keeps tokens 4 k + (j mod 4)
    assert torch.equal(sparse.positions, expected.expand(BATCH, -1, -1))


def test_a_pooled_sparse_key_is_at_the_centre_of_the_real_tokens_of_its_window():
    sparse = compressed_positions("pooling", [80, 75], factor=4)

    centres = torch.arange(0, 80, 4) + 2  # 1.5 rounded half up
    assert torch.equal(sparse.positions[0, 0], centres)
    assert sparse.positions[1, 0, -2].item() == round((72 + 73 + 74) / 3)  # the window [72, 76) holds 3 real tokens


@pytest.mark.parametrize("sparsity_type", [kind for kind in SPARSITY_TYPES if kind != "none"])
@pytest.mark.parametrize(("factor", "sparse_size"), [(1, BLOCK), (2, BLOCK), (2, BLOCK // 2), (4, BLOCK)])
def test_every_sparse_key_comes_from_the_block_its_compressed_position_belongs_to(sparsity_type, factor, sparse_size):
    config = lsg_config(block_size=BLOCK, sparse_block_size=sparse_size, sparsity_type=sparsity_type, sparsity_factor=factor)
    keys, values, queries = random_inputs(80)
    sparse = sparse_context(queries, keys, values, padding_mask([80, 75], 80), LSGSettings.of(config), HEAD_DIM**-0.5, with_positions=True)

    compressed_blocks = (torch.arange(sparse.positions.shape[-1]) // (BLOCK // factor)).expand_as(sparse.positions)
    seen = sparse.mask.expand_as(sparse.positions)  # padding's keys are masked: their positions are never read
    assert torch.equal(sparse.positions[seen] // BLOCK, compressed_blocks[seen])


def test_position_terms_build_no_tensor_that_grows_faster_than_the_length():
    config = lsg_config(block_size=BLOCK, sparse_block_size=BLOCK, sparsity_type="norm", num_global_tokens=1)

    def largest_tensor(length):
        inputs = random_inputs(length, dtype=torch.float32)
        terms = random_terms(length, log_bucket, dtype=torch.float32)
        with OpRecorder() as ops:
            run("sdpa", inputs, None, config, terms)
        return ops.largest

    assert largest_tensor(1 + 1024) <= 2.1 * largest_tensor(1 + 512)
