"""The flex_attention backend against the SDPA one, how a model chooses between them, and LSH on any device.

Here flex_attention runs uncompiled (conftest's `flex_kernel`): the same mask_mod, fast to test, but it
materialises the scores and ignores the block structure, so the structure is checked apart, tile by
tile, against the mask it must cover. The compiled kernel on the CPU: test_flex_compiled.py; on CUDA
(gradients, bf16, generation): test_gpu.py.
"""

import itertools
import re

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters
from torch.nn.attention.flex_attention import create_mask, flex_attention

from helpers import host_syncs, lsg_config, lsg_self_attention, padding_mask
from lsg_converter import LSGBartConfig, LSGBartForConditionalGeneration, LSGBertConfig, LSGBertForMaskedLM
from lsg_converter.models import lsg_flex
from lsg_converter.models.lsg_attention import DEFAULT_BACKEND, lsg_backend, prefers_flex_attention
from lsg_converter.models.lsg_pattern import KeyPattern
from lsg_converter.models.lsg_sparse import SPARSITY_TYPES, lsh_hyperplanes
from lsg_converter.models.lsg_flex import (
    FLEX_ATTENTION_AVAILABLE,
    KeyLayout,
    RowBounds,
    block_structure,
    lsg_mask_mod,
    tile_structure,
)

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

HEADS, HEAD_DIM = 4, 8
TOKENS = 75  # 10 blocks of 8, the last one padded


def random_qkv(batch, length, seed=0, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, HEADS, length, HEAD_DIM, generator=generator).to(dtype) for _ in range(3)]


def both_backends(query, key, value, mask, config, seed=0, **options):
    """(sdpa output, flex output) of the same call, each from the same random state."""
    outputs = []
    for backend in ("sdpa", "flex_attention"):
        torch.manual_seed(seed)
        with torch.no_grad():
            outputs.append(lsg_self_attention(query, key, value, mask, config, backend=backend, **options))
    return outputs


@pytest.mark.parametrize("sparsity_type", SPARSITY_TYPES)
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("lengths", [(TOKENS, TOKENS), (TOKENS, 50)], ids=["full", "padded"])
@pytest.mark.parametrize("num_global", [0, 2])
def test_flex_forward_equals_sdpa_forward(sparsity_type, causal, lengths, num_global):
    config = lsg_config(block_size=8, sparse_block_size=8, sparsity_type=sparsity_type, num_global_tokens=num_global)
    length = num_global + TOKENS
    query, key, value = random_qkv(2, length)
    mask = padding_mask([num_global + n for n in lengths], length)

    sdpa, flex = both_backends(query, key, value, mask, config, causal=causal)

    real = mask[:, None, :, None].expand_as(sdpa)
    torch.testing.assert_close(flex[real], sdpa[real], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "settings",
    [
        dict(sparsity_factor=1),
        dict(sparsity_factor=4, sparse_block_size=3),
        dict(block_size=12),
        dict(sparsity_factor=8, legacy_sparse_window=True),  # the 2023 reference's right window, 2 positions early
    ],
)
def test_flex_forward_equals_sdpa_forward_in_other_geometries(settings):
    config = lsg_config(**{"block_size": 8, "sparse_block_size": 8, "num_global_tokens": 1, **settings})
    query, key, value = random_qkv(2, 1 + 100, seed=4)
    mask = padding_mask([101, 64], 101)

    sdpa, flex = both_backends(query, key, value, mask, config)

    real = mask[:, None, :, None].expand_as(sdpa)
    torch.testing.assert_close(flex[real], sdpa[real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["right", "hole"], ids=["padded", "hole"])
@pytest.mark.parametrize("sparsity_type", ["none", "norm"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_flex_dropout_hides_the_same_keys_as_sdpa(causal, sparsity_type, kind):
    config = lsg_config(block_size=8, sparse_block_size=8, num_global_tokens=2, sparsity_type=sparsity_type)
    query, key, value = random_qkv(2, 2 + TOKENS, seed=1)
    mask = token_mask(kind, 2)

    sdpa, flex = both_backends(query, key, value, mask, config, seed=3, dropout=0.3, causal=causal)
    _, undropped = both_backends(query, key, value, mask, config, causal=causal)

    real = mask[:, None, :, None].expand_as(sdpa)
    torch.testing.assert_close(flex[real], sdpa[real], atol=1e-5, rtol=0)
    assert not torch.allclose(flex[real], undropped[real])


def test_flex_backend_runs_sdpa_on_cpu_while_gradients_are_needed():
    config = lsg_config(block_size=8, sparse_block_size=8, num_global_tokens=1)
    query, key, value = (x.requires_grad_() for x in random_qkv(1, 1 + TOKENS))

    flex = lsg_self_attention(query, key, value, None, config, backend="flex_attention")
    flex.square().sum().backward()

    sdpa = lsg_self_attention(query, key, value, None, config, backend="sdpa")
    torch.testing.assert_close(flex, sdpa, atol=0, rtol=0)
    assert query.grad is not None and torch.isfinite(query.grad).all()


# --------------------------------------------------------------------------------------------------
# The block structure: which key tiles each query tile reads
# --------------------------------------------------------------------------------------------------


def tile_geometries():
    for sparsity_type, factor, span, block, num_global, causal in itertools.product(
        ["none", "norm"], [1, 2, 4, 8], [3, 8], [8, 12], [0, 3], [False, True]
    ):
        if block % factor:
            continue
        yield dict(sparsity_type=sparsity_type, sparsity_factor=factor, sparse_block_size=span, block_size=block,
                   num_global_tokens=num_global, legacy_sparse_window=block == factor), causal


SPARSE_TILE_GEOMETRIES = [geometry for geometry in tile_geometries() if geometry[0]["sparsity_type"] != "none"]


def geometry_id(value):
    return ("causal" if value else "bidirectional") if isinstance(value, bool) else "-".join(map(str, value.values()))


@pytest.mark.parametrize("settings, causal", list(tile_geometries()), ids=geometry_id)
@pytest.mark.parametrize("num_tokens, tile", [(50, 8), (97, 16)])
def test_block_structure_reads_every_tile_holding_a_visible_key(settings, causal, num_tokens, tile):
    pattern = KeyPattern.of(lsg_config(**settings), causal)
    padded_tokens = -(-num_tokens // pattern.block_size) * pattern.block_size
    layout = KeyLayout.of(pattern, num_tokens, tile)
    compressed = padded_tokens // pattern.block_size * pattern.compressed_per_block
    real_keys = torch.zeros(1, 1, layout.length, dtype=torch.bool)  # globals and tokens, compressed positions
    real_keys[..., : layout.token_end] = True
    real_keys[..., layout.sparse_offset : layout.sparse_offset + compressed] = True
    rows = pattern.num_global + num_tokens

    mask_mod = lsg_mask_mod(pattern, layout, real_keys)
    visible = create_mask(mask_mod, 1, 1, rows, layout.length, device="cpu")[0, 0]  # (queries, keys)
    tiles_needed = tiled(visible, tile).any(dim=(1, 3))
    tiles_read = block_structure(pattern, num_tokens, tile, torch.device("cpu")).to_dense()[0, 0].bool()

    assert not (tiles_needed & ~tiles_read).any()  # nothing visible is skipped
    if pattern.sparse_size >= pattern.compressed_per_block:  # contiguous windows: nothing more is read
        assert torch.equal(tiles_read, tiles_needed)


def layer_geometries(test):
    """Parametrizes `test` with geometries without sparse keys: block and global tokens, causal or not, tokens and tile."""
    for decorator in (
        pytest.mark.parametrize("num_tokens, tile", [(50, 8), (97, 16)]),
        pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"]),
        pytest.mark.parametrize("block, num_global", [(8, 0), (8, 3), (12, 3), (8, 20)]),
    ):
        test = decorator(test)
    return test


@layer_geometries
def test_block_structure_without_sparse_keys_reads_exactly_the_tiles_of_visible_keys(block, num_global, causal, num_tokens, tile):
    settings = dict(sparsity_type="none", block_size=block, num_global_tokens=num_global)
    pattern = KeyPattern.of(lsg_config(**settings), causal)
    layout = KeyLayout.of(pattern, num_tokens, tile)
    rows = num_global + num_tokens

    mask_mod = lsg_mask_mod(pattern, layout)
    visible = create_mask(mask_mod, 1, 1, rows, rows, device="cpu")[0, 0]  # (queries, keys)
    tiles = -(-rows // tile)
    visible = F.pad(visible, (0, tiles * tile - rows, 0, tiles * tile - rows))
    tiles_needed = visible.unflatten(0, (tiles, tile)).unflatten(2, (-1, tile)).any(dim=(1, 3))
    tiles_read = block_structure(pattern, num_tokens, tile, torch.device("cpu")).to_dense()[0, 0].bool()

    assert (layout.token_offset, layout.length) == (num_global, rows)
    assert torch.equal(tiles_read, tiles_needed)


def tiled(mask: torch.Tensor, tile: int, outside: bool = False) -> torch.Tensor:
    """(..., q, k) -> (..., q tiles, tile, k tiles, tile), the rows and columns past the end `outside`."""
    rows, keys = mask.shape[-2:]
    padded = F.pad(mask, (0, -keys % tile, 0, -rows % tile), value=outside)
    return padded.unflatten(-1, (-1, tile)).unflatten(-3, (-1, tile))


def tile_lists_as_dense(counts: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """A BlockMask's (1, 1, nq) counts and (1, 1, nq, nk) indices -> (nq, nk) bool, the tiles listed."""
    listed = torch.arange(indices.shape[-1]) < counts[0, 0, :, None]
    return torch.zeros(indices.shape[2:], dtype=torch.bool).scatter_(1, indices[0, 0].long(), listed)


@layer_geometries
def test_full_tiles_are_tiles_whose_every_query_sees_every_key(block, num_global, causal, num_tokens, tile):
    settings = dict(sparsity_type="none", block_size=block, num_global_tokens=num_global)
    pattern = KeyPattern.of(lsg_config(**settings), causal)
    rows = num_global + num_tokens
    mask_mod = lsg_mask_mod(pattern, KeyLayout.of(pattern, num_tokens, tile))
    visible = create_mask(mask_mod, 1, 1, rows, rows, device="cpu")[0, 0]  # (queries, keys)
    every_key_seen = (tiled(visible, tile) | tiled(torch.zeros_like(visible), tile, True)).all(dim=(1, 3))  # rows past the end aside

    structure = block_structure(pattern, num_tokens, tile, torch.device("cpu"), rule_only=True)
    full = tile_lists_as_dense(structure.full_kv_num_blocks, structure.full_kv_indices)
    partial = tile_lists_as_dense(structure.kv_num_blocks, structure.kv_indices)
    read = block_structure(pattern, num_tokens, tile, torch.device("cpu")).to_dense()[0, 0].bool()

    assert not (full & ~every_key_seen).any()  # the kernel skips the mask_mod only where it holds everywhere
    assert not (full & partial).any() and torch.equal(full | partial, read)  # the same tiles read


@pytest.mark.parametrize("settings, causal", SPARSE_TILE_GEOMETRIES, ids=geometry_id)
@pytest.mark.parametrize("blocks, tile", [(6, 8), (9, 16)])
def test_full_tiles_with_every_sparse_key_valid_are_tiles_whose_every_query_sees_every_key(
    settings, causal, blocks, tile
):
    pattern = KeyPattern.of(lsg_config(**settings), causal)
    num_tokens = blocks * pattern.block_size  # whole blocks: every compressed key is valid
    layout = KeyLayout.of(pattern, num_tokens, tile)
    rows = pattern.num_global + num_tokens
    visible = create_mask(lsg_mask_mod(pattern, layout), 1, 1, rows, layout.length, device="cpu")[0, 0]
    some_key_seen = tiled(visible, tile).any(dim=(1, 3))
    every_key_seen = (tiled(visible, tile) | tiled(torch.zeros_like(visible), tile, True)).all(dim=(1, 3))

    structure = block_structure(pattern, num_tokens, tile, torch.device("cpu"), rule_only=True)
    full = tile_lists_as_dense(structure.full_kv_num_blocks, structure.full_kv_indices)
    partial = tile_lists_as_dense(structure.kv_num_blocks, structure.kv_indices)

    assert not (full & ~every_key_seen).any()  # the kernel skips the mask_mod only where it holds everywhere
    assert not (full & partial).any() and not (some_key_seen & ~(full | partial)).any()  # every visible key read


def test_sparse_windows_aligned_with_the_tiles_are_read_as_full_tiles():
    config = lsg_config(sparsity_type="norm", block_size=16, sparsity_factor=2, sparse_block_size=16, num_global_tokens=0)
    pattern = KeyPattern.of(config)  # each block: 2 windows of 16 compressed keys, 8 blocks apart, starting on a tile
    layout = KeyLayout.of(pattern, 256, 8)

    structure = block_structure(pattern, 256, 8, torch.device("cpu"), rule_only=True)

    full = tile_lists_as_dense(structure.full_kv_num_blocks, structure.full_kv_indices)
    sparse_tiles = full[:, layout.sparse_offset // 8 :].sum(dim=1)  # per query tile
    assert sparse_tiles[8:-8].tolist() == [4] * 16  # the blocks whose two windows lie inside the sequence


def test_the_mask_mod_without_validity_masks_the_zero_padding_of_each_segment():
    pattern = KeyPattern.of(lsg_config(sparsity_type="pooling", sparsity_factor=2, sparse_block_size=8, block_size=8,
                                       num_global_tokens=2))
    layout = KeyLayout.of(pattern, 40, 16)  # tokens end at row 42, sparse keys at 48 + 20
    visible = create_mask(lsg_mask_mod(pattern, layout), 1, 1, 42, layout.length, device="cpu")[0, 0]

    assert (layout.token_end, layout.sparse_offset, layout.sparse_end, layout.length) == (42, 48, 68, 80)
    assert not visible[:, 42:48].any() and not visible[:, 68:].any()
    assert visible[2:, 48:68].any(dim=0).all()  # every compressed key is some query's


@pytest.mark.parametrize("sparsity_type", [kind for kind in SPARSITY_TYPES if kind != "none"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("num_global", [0, 2])
def test_unpadded_tokens_of_whole_blocks_with_sparse_keys_read_no_keys_validity(
    sparsity_type, causal, num_global, monkeypatch
):
    config = lsg_config(block_size=8, sparse_block_size=8, sparsity_type=sparsity_type, num_global_tokens=num_global)
    query, key, value = random_qkv(2, num_global + 80, seed=7)  # 10 whole blocks, no padding mask
    calls = recorded_flex_calls(monkeypatch)

    sdpa, flex = both_backends(query, key, value, None, config, causal=causal)

    (taken, block_mask), = calls
    if sparsity_type == "lsh":  # an empty bucket is a masked key: read through the rows' bounds
        assert taken in ("row bounds", "per key")
    else:
        assert taken == "none" and captured_tensors(block_mask.mask_mod) == []
    torch.testing.assert_close(flex, sdpa, atol=1e-5, rtol=0)


def test_unpadded_tokens_of_whole_blocks_with_sparse_keys_make_no_host_sync():
    config = lsg_config(block_size=8, sparse_block_size=8, sparsity_type="norm", num_global_tokens=1)
    query, key, value = random_qkv(2, 1 + 80)
    attend = lambda: lsg_self_attention(query, key, value, None, config, backend="flex_attention")  # noqa: E731
    torch.compiler.reset()  # uncompiled flex_attention runs through torch.compile: no recompiles piled up by other tests
    with torch.no_grad():
        attend()  # the tile structure, made once per shape

        assert host_syncs(attend) == []


@pytest.mark.parametrize("block, num_global, tile", [(8, 2, 8), (8, 2, 16), (12, 3, 16), (8, 0, 8)])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_a_padded_batch_reads_no_tile_of_its_padding_and_full_tiles_where_every_key_is_seen(block, num_global, tile, causal):
    pattern = KeyPattern.of(lsg_config(sparsity_type="none", block_size=block, num_global_tokens=num_global), causal)
    num_tokens, rows = 97, num_global + 97
    token_bounds = torch.tensor([[0, 97], [0, 41], [30, 97]])  # every token; right padding; left padding
    layout = KeyLayout.of(pattern, num_tokens, tile)
    mask_mod = lsg_mask_mod(pattern, layout, RowBounds(token_bounds, None))
    visible = create_mask(mask_mod, 3, 1, rows, rows, device="cpu")[:, 0]  # (B, queries, keys)
    some_key_seen = tiled(visible, tile).any(dim=(2, 4))  # (B, query tiles, key tiles)
    every_key_seen = (tiled(visible, tile) | tiled(torch.zeros_like(visible), tile, True)).all(dim=(2, 4))
    tiles = -(-rows // tile)
    query_rows = torch.arange(tiles * tile) - num_global  # the token each query row is, per tile
    block_of = torch.div(query_rows.clamp(min=0), block, rounding_mode="floor")
    real_block = (query_rows >= 0) & (query_rows < num_tokens)
    real_block = real_block & (block_of[None] >= token_bounds[:, :1] // block) & (block_of[None] * block < token_bounds[:, 1:])
    holds_real_block = real_block.unflatten(1, (tiles, tile)).any(dim=2)  # (B, query tiles)

    structure = tile_structure(pattern, num_tokens, tile, torch.device("cpu"), True, token_bounds)
    def per_row(counts, indices):  # (B, 1, nq), (B, 1, nq, nk) -> (B, nq, nk) bool
        return torch.stack([tile_lists_as_dense(counts[row : row + 1], indices[row : row + 1]) for row in range(len(counts))])

    full = per_row(structure.full_kv_num_blocks, structure.full_kv_indices)
    read = full | per_row(structure.kv_num_blocks, structure.kv_indices)

    assert not (full & ~every_key_seen).any()  # the mask_mod is skipped only where it holds everywhere
    assert not (read & ~some_key_seen).any()  # no tile of padding keys alone
    assert not (some_key_seen & holds_real_block[..., None] & ~read).any()  # every key a real block's query sees
    assert not read[~holds_real_block].any()  # nothing for the queries of blocks of padding only (their rows get zeros)


def test_blocks_aligned_with_the_tiles_read_full_tiles_only():
    pattern = KeyPattern.of(lsg_config(sparsity_type="none", block_size=16, num_global_tokens=0), False)

    structure = block_structure(pattern, 256, 16, torch.device("cpu"), rule_only=True)

    assert int(structure.kv_num_blocks.sum()) == 0  # no tile evaluates the mask_mod
    assert structure.full_kv_num_blocks[0, 0].tolist() == [2] + [3] * 14 + [2]  # each block's window: 3 tiles


def test_a_row_padded_at_a_block_edge_reads_full_tiles_of_its_tokens_only():
    pattern = KeyPattern.of(lsg_config(sparsity_type="none", block_size=16, num_global_tokens=0), False)
    bounds = torch.tensor([[0, 256], [0, 128]])  # row 1: 8 blocks of padding

    structure = tile_structure(pattern, 256, 16, torch.device("cpu"), True, bounds)

    assert int(structure.kv_num_blocks.sum()) == 0  # no tile evaluates the mask_mod
    assert structure.full_kv_num_blocks[1, 0].tolist() == [2] + [3] * 6 + [2] + [0] * 8


def test_the_mask_mod_gives_token_queries_the_keys_of_the_pattern():
    pattern = KeyPattern.of(lsg_config(sparsity_type="none", block_size=8, num_global_tokens=2))
    visible = create_mask(lsg_mask_mod(pattern, KeyLayout.of(pattern, 40, 8)), 1, 1, 2 + 40, 2 + 40, device="cpu")[0, 0]

    query_token, key_token = torch.arange(40)[:, None], torch.arange(40)[None, :]
    assert torch.equal(visible[2:, 2:], (key_token // 8 - query_token // 8).abs() <= 1)
    assert visible[2:, :2].all()  # every token query sees the global keys
    assert not visible[:2].any()  # global query rows see no key: the global queries' output is written into them


def recorded_flex_calls(monkeypatch) -> list:
    """(validity read, block_mask) of each flex_attention call the backend makes (then run uncompiled)."""
    calls = []

    def recording_kernel(signature):
        def kernel(*args, block_mask, **kwargs):
            calls.append((signature.validity, block_mask))
            return flex_attention(*args, block_mask=block_mask, **kwargs)
        return kernel

    monkeypatch.setattr(lsg_flex, "_flex_kernel", recording_kernel)
    return calls


def captured_tensors(function) -> list[torch.Tensor]:
    """The tensors a function reads from its closure, or from the closures of the functions it holds."""
    tensors = []
    for cell in function.__closure__ or ():
        value = cell.cell_contents
        if isinstance(value, torch.Tensor):
            tensors.append(value)
        elif callable(value) and getattr(value, "__closure__", None):
            tensors += captured_tensors(value)
    return tensors


def token_mask(kind: str, num_global: int) -> torch.Tensor:
    """(2, g + TOKENS) bool: row 0 every token, row 1 padded as `kind` says."""
    length = num_global + TOKENS
    mask = padding_mask([length, num_global + 50], length)
    if kind == "full":
        mask[1] = True
    elif kind == "left":  # row 1's first 25 tokens are padding, its globals are not
        mask[1] = torch.arange(length) >= num_global + 25
        mask[1, :num_global] = True
    elif kind == "hole":  # row 1 masks tokens 20-29 only
        mask[1] = True
        mask[1, num_global + 20 : num_global + 30] = False
    return mask


@pytest.mark.parametrize("sparsity_type", ["none", "pooling", "stride"])
@pytest.mark.parametrize(
    "kind, mask_first_token, validity",
    [
        ("full", False, None),
        ("right", False, "row bounds"),
        ("left", False, "row bounds"),
        ("right", True, "row bounds"),
        ("hole", False, "per key"),
    ],
    ids=["full", "right", "left", "right-first-token-masked", "hole"],
)
def test_rows_padded_by_one_run_read_a_few_numbers_per_row(
    sparsity_type, kind, mask_first_token, validity, monkeypatch
):
    config = lsg_config(block_size=8, sparse_block_size=8, sparsity_type=sparsity_type, num_global_tokens=2,
                        mask_first_token=mask_first_token)
    query, key, value = random_qkv(2, 2 + TOKENS, seed=5)
    mask = token_mask(kind, 2)
    calls = recorded_flex_calls(monkeypatch)

    sdpa, flex = both_backends(query, key, value, mask, config)

    (taken, block_mask), = calls
    expected = validity or ("none" if sparsity_type == "none" else "row bounds")
    assert taken == expected
    if taken != "per key":  # no tensor per key: at most a few numbers per row and head
        assert all(max(x.shape) < TOKENS for x in captured_tensors(block_mask.mask_mod))
    if taken == "none":
        assert captured_tensors(block_mask.mask_mod) == []
    real = mask[:, None, :, None].expand_as(sdpa)
    torch.testing.assert_close(flex[real], sdpa[real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("sparsity_type", ["none", "pooling"])
def test_the_layers_output_is_the_flex_kernels_own_with_the_global_rows_written_in(sparsity_type, monkeypatch):
    config = lsg_config(block_size=8, sparse_block_size=8, sparsity_type=sparsity_type, num_global_tokens=2)
    query, key, value = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in random_qkv(2, 2 + TOKENS, seed=3))
    kernel_outputs = []

    def recording_kernel(signature):
        def kernel(*args, **kwargs):
            kernel_outputs.append(flex_attention(*args, **kwargs))
            return kernel_outputs[-1]
        return kernel

    monkeypatch.setattr(lsg_flex, "_flex_kernel", recording_kernel)
    output = lsg_self_attention(query, key, value, None, config, backend="flex_attention")

    (kernel_output,) = kernel_outputs
    assert output.untyped_storage().data_ptr() == kernel_output.untyped_storage().data_ptr()  # no joined copy
    torch.testing.assert_close(output, lsg_self_attention(query, key, value, None, config, backend="sdpa"), atol=1e-5, rtol=0)


def test_global_rows_written_into_a_kernels_saved_output_give_their_gradient_to_the_global_output():
    kernel_input = torch.randn(2, 6, 3, 4, requires_grad=True)
    kernel_output = kernel_input.exp()  # exp keeps its output for its backward
    global_output = torch.randn(2, 2, 3, 4, requires_grad=True)
    weights = torch.randn(2, 6, 3, 4)

    layer_output = lsg_flex.GlobalRowsWritten.apply(kernel_output, global_output)
    (layer_output * weights).sum().backward()  # autograd does not see the write as a change of exp's output

    assert layer_output.untyped_storage().data_ptr() == kernel_output.untyped_storage().data_ptr()
    assert torch.equal(layer_output[:, :2], global_output)
    assert torch.equal(global_output.grad, weights[:, :2])
    # (the kernel's own rows 0-1 must carry no gradient in its backward, as flex_attention's fully masked rows)
    torch.testing.assert_close(kernel_input.grad[:, 2:], (weights * kernel_input.exp())[:, 2:])


def test_block_structure_is_built_once_per_shape_whatever_the_padding():
    config = lsg_config(block_size=8, sparse_block_size=8, num_global_tokens=2, sparsity_type="pooling")
    length = 2 + TOKENS
    query, key, value = random_qkv(2, length)
    block_structure.cache_clear()

    for lengths in [(length, length), (length, 30), (20, length)]:
        both_backends(query, key, value, padding_mask(lengths, length), config)

    assert block_structure.cache_info().misses == 1
    pattern = KeyPattern.of(config)
    cpu = torch.device("cpu")
    assert block_structure(pattern, TOKENS, lsg_flex.TILE, cpu) is block_structure(pattern, TOKENS, lsg_flex.TILE, cpu)


@pytest.mark.parametrize(
    "sparsity_type, paddings",
    [("norm", [(0, 0), (0, 35), (45, 15)]), ("none", [(0, 35), (45, 15), (0, 60)])],  # tokens of padding per row
    ids=["sparse-keys", "each-row-its-tiles"],
)
def test_compiled_flex_attention_does_not_recompile_when_only_the_padding_changes(sparsity_type, paddings, monkeypatch):
    # the kernel compiled as on CUDA (here with a backend that needs no C++ compiler), called with
    # the BlockMask and mask_mod each call builds (without sparse keys, a padded batch's tiles per row)
    compiled = torch.compile(flex_attention, backend="aot_eager")
    monkeypatch.setattr(lsg_flex, "_flex_kernel", lambda device: compiled)
    config = lsg_config(block_size=8, sparse_block_size=8, num_global_tokens=2, sparsity_type=sparsity_type)
    length = 2 + TOKENS
    query, key, value = random_qkv(2, length)
    torch.compiler.reset()
    counters.clear()

    for lengths in [(length - first, length - second) for first, second in paddings]:
        mask = padding_mask(lengths, length)
        sdpa, flex = both_backends(query, key, value, mask, config)
        real = mask[:, None, :, None].expand_as(sdpa)
        torch.testing.assert_close(flex[real], sdpa[real], atol=1e-5, rtol=0)

    assert counters["stats"]["unique_graphs"] == 1


# --------------------------------------------------------------------------------------------------
# Choosing the backend
# --------------------------------------------------------------------------------------------------

TINY_BERT = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, vocab_size=99,
    max_position_embeddings=256, block_size=8, sparse_block_size=8, num_global_tokens=2,
)
INVALID_IMPLEMENTATIONS = ["flash_attention_2", "lsg_eager", "paged|eager"]


def tiny_inputs():
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, 99, (2, 100), generator=generator)
    attention_mask = padding_mask([100, 70], 100).long()
    return dict(input_ids=input_ids, attention_mask=attention_mask)


def logits(model, inputs):
    with torch.no_grad():
        return model(**inputs).logits


@pytest.fixture(scope="module")
def tiny_lsg_bert(tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("lsg-bert")
    LSGBertForMaskedLM(LSGBertConfig(**TINY_BERT)).save_pretrained(folder)
    return folder


def test_the_default_backend_runs_sdpa_on_the_cpu(tiny_lsg_bert):
    model = LSGBertForMaskedLM.from_pretrained(tiny_lsg_bert).eval()
    inputs = tiny_inputs()

    default = logits(model, inputs)
    assert lsg_backend(model.bert.encoder.layer[0].attention.self.config._attn_implementation) == DEFAULT_BACKEND
    model.set_attn_implementation("sdpa")

    torch.testing.assert_close(default, logits(model, inputs), atol=0, rtol=0)


@pytest.mark.parametrize(
    "device_type, dtype, num_tokens, unmasked, flex",
    [
        ("cuda", torch.bfloat16, 4096, True, True),
        ("cuda", torch.bfloat16, 32768, True, True),
        ("cuda", torch.bfloat16, 4095, True, False),  # shorter than measured
        ("cuda", torch.bfloat16, 16384, False, False),  # padding, sparse keys, DropKey or position terms
        ("cuda", torch.float16, 16384, True, False),
        ("cuda", torch.float32, 16384, True, False),
        ("cpu", torch.bfloat16, 16384, True, False),
    ],
)
def test_the_default_backend_runs_flex_attention_only_where_it_was_measured_faster(device_type, dtype, num_tokens, unmasked, flex):
    assert prefers_flex_attention(device_type, dtype, num_tokens, unmasked) == (flex and FLEX_ATTENTION_AVAILABLE)


def test_the_default_is_no_value_a_user_gives():
    with pytest.raises(ValueError, match="leave it unset"):
        lsg_backend(DEFAULT_BACKEND)


def test_another_copys_registered_default_reads_back_as_the_default():
    assert lsg_backend("lsg_0123456789ab_default") == DEFAULT_BACKEND


def test_from_pretrained_chooses_flex_attention(tiny_lsg_bert):
    sdpa = LSGBertForMaskedLM.from_pretrained(tiny_lsg_bert, attn_implementation="sdpa").eval()
    flex = LSGBertForMaskedLM.from_pretrained(tiny_lsg_bert, attn_implementation="flex_attention").eval()
    inputs = tiny_inputs()

    assert lsg_backend(flex.config._attn_implementation) == "flex_attention"
    real = inputs["attention_mask"].bool()
    torch.testing.assert_close(logits(flex, inputs)[real], logits(sdpa, inputs)[real], atol=1e-5, rtol=0)
    assert not torch.equal(logits(flex, inputs), logits(sdpa, inputs))  # another kernel really ran


def test_config_chooses_flex_attention():
    model = LSGBertForMaskedLM(LSGBertConfig(**TINY_BERT, attn_implementation="flex_attention"))

    assert lsg_backend(model.config._attn_implementation) == "flex_attention"


def test_set_attn_implementation_switches_backend_both_ways(tiny_lsg_bert):
    model = LSGBertForMaskedLM.from_pretrained(tiny_lsg_bert, attn_implementation="sdpa").eval()
    inputs = tiny_inputs()
    sdpa = logits(model, inputs)

    model.set_attn_implementation("flex_attention")
    flex = logits(model, inputs)
    model.set_attn_implementation("sdpa")

    assert not torch.equal(flex, sdpa)
    torch.testing.assert_close(logits(model, inputs), sdpa, atol=0, rtol=0)


@pytest.mark.parametrize("implementation", INVALID_IMPLEMENTATIONS)
def test_from_pretrained_refuses_other_implementations_naming_the_valid_ones(tiny_lsg_bert, implementation):
    expected = re.escape(f'`attn_implementation="{implementation}"` is not supported by LSG models: use one of "eager", "sdpa", "flex_attention"')
    with pytest.raises(ValueError, match=expected):
        LSGBertForMaskedLM.from_pretrained(tiny_lsg_bert, attn_implementation=implementation)


@pytest.mark.parametrize("implementation", INVALID_IMPLEMENTATIONS)
def test_config_refuses_other_implementations(implementation):
    with pytest.raises(ValueError, match='"eager", "sdpa", "flex_attention"'):
        LSGBertConfig(**TINY_BERT, attn_implementation=implementation)


@pytest.mark.parametrize("implementation", INVALID_IMPLEMENTATIONS)
def test_set_attn_implementation_refuses_other_implementations_and_keeps_the_backend(tiny_lsg_bert, implementation):
    model = LSGBertForMaskedLM.from_pretrained(tiny_lsg_bert, attn_implementation="flex_attention")

    with pytest.raises(ValueError, match='"eager", "sdpa", "flex_attention"'):
        model.set_attn_implementation(implementation)
    assert lsg_backend(model.config._attn_implementation) == "flex_attention"


def test_dense_decoder_keeps_the_implementations_of_transformers():
    config = LSGBartConfig(d_model=32, is_decoder=True, attn_implementation="eager")

    assert config.lsg_dense_decoder and config._attn_implementation == "eager"


def test_encoder_decoder_flex_encoder_equals_sdpa_encoder():
    torch.manual_seed(0)
    config = LSGBartConfig(
        d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=37, decoder_ffn_dim=37, vocab_size=99, max_position_embeddings=256,
        block_size=8, sparse_block_size=8, num_global_tokens=2,
    )
    model = LSGBartForConditionalGeneration(config).eval()
    inputs = {**tiny_inputs(), "decoder_input_ids": torch.tensor([[2, 5, 7], [2, 9, 4]])}

    model.set_attn_implementation("sdpa")
    sdpa = logits(model, inputs)
    model.set_attn_implementation("flex_attention")

    torch.testing.assert_close(logits(model, inputs), sdpa, atol=1e-5, rtol=0)


def test_the_layers_of_one_forward_share_one_block_structure(monkeypatch):
    model = LSGBertForMaskedLM(LSGBertConfig(**TINY_BERT, sparsity_type="pooling", attn_implementation="flex_attention"))
    calls = recorded_flex_calls(monkeypatch)

    logits(model.eval(), tiny_inputs())

    assert [validity for validity, _ in calls] == ["row bounds"] * TINY_BERT["num_hidden_layers"]
    indices = {block_mask.kv_indices.data_ptr() for _, block_mask in calls}
    assert len(indices) == 1


# --------------------------------------------------------------------------------------------------
# LSH on any device and in half precision
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu"), "meta"])
def test_lsh_hyperplanes_are_drawn_on_the_cpu_from_the_seed_then_moved(device):
    shape = (1, HEADS, 1, HEAD_DIM, 4)

    planes = lsh_hyperplanes(shape, torch.Generator().manual_seed(7), torch.float32, device)

    assert planes.device == torch.device(device)
    if planes.device.type == "cpu":
        expected = torch.randn(shape, generator=torch.Generator().manual_seed(7))
        torch.testing.assert_close(planes, expected, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_lsh_gives_finite_outputs_in_half_precision_with_empty_buckets(dtype):
    config = lsg_config(block_size=16, sparse_block_size=16, sparsity_type="lsh", num_global_tokens=1)
    length = 1 + 150
    query, key, value = random_qkv(2, length, dtype=dtype)
    mask = padding_mask([length, 60], length)  # the padded chunks hash into empty buckets

    output = lsg_self_attention(query, key, value, mask, config)

    assert torch.isfinite(output).all()
