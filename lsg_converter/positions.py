"""Positions at the new length: the default block size, and the position tables tiled (learned) or
regenerated (sinusoidal) up to the length the converted model reads."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from transformers.utils import logging

from .architectures import Architecture, max_length_of
from .models.lsg_defaults import PRETRAINED_POSITIONS_KEY, conversion_block_size
from .models.lsg_pattern import uses_sparse_keys

logger = logging.get_logger(__name__)

# How the learned positions reach the new length (see LSGConverter).
POSITION_TILINGS = ("body", "table")
# How fixed sinusoidal tables lay out their sines and cosines (see `sinusoidal_positions`).
SINUSOID_LAYOUTS = ("halves", "interleaved")


def window_block_size(source_positions: int, config: Any) -> int:
    """The block size of a conversion that asks for none: `lsg_defaults.conversion_block_size` (a third
    of the source's body positions), rounded down to a multiple of ``sparsity_factor`` when the setting
    uses sparse keys."""
    block_size = conversion_block_size(source_positions)
    if uses_sparse_keys(config) and block_size > config.sparsity_factor:
        block_size -= block_size % config.sparsity_factor
    return block_size


def tiled_position_rows(source_positions: int, max_length: int, tiling: str) -> torch.Tensor:
    """Source row of each new position (max_length,): see LSGConverter's `position_tiling`.

    "body": position i < P keeps row i, later ones take 1 + (i - 1) mod (P - 2), so the body rows
    1..P-2 keep their period (P = 512: positions 511, 512, ... take rows 511, 2, 3, ..., 510, 1, 2, ...).
    "table": i mod P.
    """
    positions = torch.arange(max_length)
    body_rows = source_positions - 2
    if tiling == "table" or body_rows < 1:
        return positions % source_positions
    return torch.where(positions < source_positions, positions, 1 + (positions - 1) % body_rows)


def continued_position_rows(pretrained_positions: int, rows: int, max_length: int, tiling: str) -> torch.Tensor:
    """Row of a `rows`-row table that each new position (max_length,) takes: the table's own rows
    stay, later positions continue the tiling of its first `pretrained_positions` rows (the source's
    table before any LSG conversion), so that converting 512 -> 1024 -> 4096 gives the table that
    512 -> 4096 gives."""
    continued = tiled_position_rows(pretrained_positions, max_length, tiling)
    kept = min(rows, max_length)
    continued[:kept] = torch.arange(kept)
    return continued


def inferred_pretrained_positions(table: torch.Tensor) -> int:
    """The pretrained positions of an LSG model's learned table (rows, E) whose config does not
    record them (`PRETRAINED_POSITIONS_KEY`): the shortest head of the table that the rest repeats,
    by either tiling (logged); the whole table when none does (a table trained at its length; a
    warning says so)."""
    rows = table.shape[0]
    repeats_row = (table[3:] == table[0]).all(dim=1) | (table[3:] == table[2]).all(dim=1)
    for candidate in (3 + repeats_row.nonzero().flatten()).tolist():
        for tiling in POSITION_TILINGS:
            if torch.equal(table, table[tiled_position_rows(candidate, rows, tiling)]):
                logger.info(
                    f"The LSG source's config does not record {PRETRAINED_POSITIONS_KEY}: its {rows}-row position "
                    f"table repeats its first {candidate} rows ({tiling} tiling), taken as the pretrained positions."
                )
                return candidate
    logger.warning(
        f"The LSG source's config does not record {PRETRAINED_POSITIONS_KEY} and its {rows}-row position table "
        f"repeats no shorter head: the whole table is taken as the pretrained positions."
    )
    return rows


def pretrained_positions(model: nn.Module, arch: Architecture, positions: int, is_lsg: bool) -> int:
    """The positions `model` read before its first LSG conversion: `positions` (those it reads now)
    for a plain source; for an LSG source, what its config records, else what its table shows
    (`inferred_pretrained_positions`)."""
    if not is_lsg or arch.sinusoid_layout(model.config):
        return positions
    recorded = getattr(model.config, PRETRAINED_POSITIONS_KEY, None)
    rows = arch.position_rows(model)
    if recorded is not None or rows is None:
        return positions if recorded is None else recorded
    return inferred_pretrained_positions(rows)


def extend_positions(
    model: nn.Module, arch: Architecture, max_length: int, tiling: str, pretrained_positions: int
) -> int:
    """Bring every position table of an LSG model to `max_length` rows after its offset rows, in
    place, and rebuild the position/token-type buffers beside it. Learned tables keep their rows and
    continue the tiling of their first `pretrained_positions` rows (`continued_position_rows`; the
    offset rows kept once in front), sinusoidal ones are regenerated. Returns the positions added (also
    for a model without a position table, which reads them through its relative positions)."""
    base = model.base_model
    offset = arch.position_offset_of(model)
    added = max_length - max_length_of(model)
    layout = arch.sinusoid_layout(model.config)
    for table_name, table in arch.position_tables_in(base).items():
        old = table.weight.detach()
        weight = old.new_empty(offset + max_length, old.shape[1])  # the one table of that size built (no copy)
        weight[:offset] = old[:offset]
        if layout:
            weight[offset:] = sinusoidal_positions(max_length, old.shape[1], layout)
        else:
            learned = old[offset:]
            rows = continued_position_rows(pretrained_positions, learned.shape[0], max_length, tiling)
            torch.index_select(learned, 0, rows, out=weight[offset:])
        table.weight = nn.Parameter(weight, requires_grad=table.weight.requires_grad)
        table.num_embeddings = weight.shape[0]
        parent_name = table_name.rpartition(".")[0]
        rebuild_position_buffers(base.get_submodule(parent_name) if parent_name else base, weight.shape[0])
    if not arch.layout.position_tables:  # rotary encoders: NomicBERT's embeddings hold the buffers (transformers 5.13)
        rebuild_position_buffers(base.get_submodule(arch.layout.embeddings), max_length)
    return added


def move_longrope_threshold(config: Any, source_length: int, added_rows: int) -> None:
    """Keep a LongRoPE rotary module on the factors its source rotates with at its own length, in place.

    LongRoPE (``rope_type`` "longrope", per layer type too) rotates with its long factors once a call's positions
    pass ``original_max_position_embeddings`` O. Where the source's length L stays within O (the source never
    rotates with them), O moves on by the `added_rows`, as ``max_position_embeddings`` does (which keeps a
    dynamic rope from rescaling within the new length): the converted model rotates with the short factors up
    to its new length. A source whose length reaches past O (Phi-3's way) keeps O, and the attention ``factor``
    LongRoPE reads, where the config names none, as max_position_embeddings / O: L / O, written in."""
    parameters = getattr(config, "rope_parameters", None) or {}
    per_layer_type = [rope for rope in parameters.values() if isinstance(rope, dict)]
    for rope in per_layer_type or [parameters]:
        if rope.get("rope_type") != "longrope":
            continue
        original = rope["original_max_position_embeddings"]
        if original >= source_length:
            rope["original_max_position_embeddings"] = original + added_rows
        elif rope.get("factor") is None:
            rope["factor"] = source_length / original


def rebuild_position_buffers(module: nn.Module, rows: int) -> None:
    """The (1, rows) ``position_ids`` (0, 1, ...) and ``token_type_ids`` (zeros) buffers of `module`, where
    it has them: transformers sizes them by the length its config names when the model is built."""
    for buffer_name in ("position_ids", "token_type_ids"):
        buffer = getattr(module, buffer_name, None)
        if isinstance(buffer, torch.Tensor):
            values = torch.arange(rows) if buffer_name == "position_ids" else torch.zeros(rows)
            module.register_buffer(buffer_name, values.to(buffer).expand(1, -1), persistent=False)


def sinusoidal_positions(rows: int, width: int, layout: str) -> torch.Tensor:
    """(rows, width) fixed sinusoidal positions in `layout` (one of `SINUSOID_LAYOUTS`).

    Position p has the angles p / 10000^(2i/width), i < ceil(width/2): their sines and the cosines of
    the first floor(width/2), either sines then cosines ("halves": Pegasus, Marian) or alternating,
    sines in the even columns ("interleaved": DistilBERT). Computed the way transformers builds both
    (`PegasusSinusoidalPositionalEmbedding.create_weight`, DistilBERT's `create_sinusoidal_embeddings`):
    numpy in float64, one scalar power per column, then float32, so a source's rows come out bit for
    bit (torch's float64 sin and pow differ from numpy's in the last bit, which float32 keeps now and then).
    """
    divisors = np.array([np.power(10000, 2 * (column // 2) / width) for column in range(width)])
    angles = np.arange(rows, dtype=np.float64)[:, None] / divisors
    sines = torch.from_numpy(np.sin(angles[:, 0::2])).float()
    cosines = torch.from_numpy(np.cos(angles[:, 1::2])).float()
    if layout == "halves":
        return torch.cat([sines, cosines], dim=1)
    if layout == "interleaved":
        table = torch.empty(rows, width)
        table[:, 0::2], table[:, 1::2] = sines, cosines
        return table
    raise ValueError(f"Unknown sinusoid layout {layout!r}: use one of {', '.join(SINUSOID_LAYOUTS)}.")
