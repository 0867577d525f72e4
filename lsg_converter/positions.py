"""Positions at the new length: the default block size, and the position tables tiled (learned) or
regenerated (sinusoidal) up to the length the converted model reads."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .architectures import Architecture
from .models.lsg_pattern import uses_sparse_keys

# How the learned positions reach the new length (see LSGConverter).
POSITION_TILINGS = ("body", "table")


def window_block_size(source_positions: int, config: Any) -> int:
    """Default block size: a third of the source's body positions, so that a block's local window
    (previous, own and next block) spans one training window's body (170 for 512 positions).

    Rounded down to a multiple of ``sparsity_factor`` when the setting uses sparse keys."""
    block_size = max((source_positions - 2) // 3, 1)
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


def extend_positions(model: nn.Module, arch: Architecture, max_length: int, tiling: str) -> int:
    """Bring every position table of an LSG model to `max_length` rows after its offset rows, in
    place, and rebuild the position/token-type buffers beside it. Learned tables are extended with
    `tiled_position_rows` (the offset rows kept once in front), sinusoidal ones regenerated.
    Returns the rows added."""
    base = model.base_model
    offset = arch.position_offset_of(model)
    added = 0
    for table_name, table in arch.position_tables_in(base).items():
        old = table.weight.detach()
        if arch.sinusoidal_positions:
            extended = _sinusoidal_positions(max_length, old.shape[1]).to(old)
        else:
            learned = old[offset:]
            extended = learned[tiled_position_rows(learned.shape[0], max_length, tiling)]
        weight = torch.cat([old[:offset], extended])
        table.weight = nn.Parameter(weight, requires_grad=table.weight.requires_grad)
        table.num_embeddings = weight.shape[0]
        added = weight.shape[0] - old.shape[0]
        parent_name = table_name.rpartition(".")[0]
        parent = base.get_submodule(parent_name) if parent_name else base
        for buffer_name in ("position_ids", "token_type_ids"):
            buffer = getattr(parent, buffer_name, None)
            if isinstance(buffer, torch.Tensor):
                values = torch.arange(weight.shape[0]) if buffer_name == "position_ids" else torch.zeros(weight.shape[0])
                parent.register_buffer(buffer_name, values.to(buffer).expand(1, -1), persistent=False)
    return added


def _sinusoidal_positions(rows: int, width: int) -> torch.Tensor:
    """(rows, width) fixed sinusoidal positions, sines in the first half and cosines in the second
    (the non-interleaved layout of Pegasus and Marian): row p, column j < width/2 holds
    sin(p / 10000^(2j/width)), column width/2 + j holds cos of the same angle."""
    sines = (width + 1) // 2
    positions = torch.arange(rows, dtype=torch.float64)[:, None]
    frequencies = 10000 ** (-2 * torch.arange(sines, dtype=torch.float64) / width)
    angles = positions * frequencies
    return torch.cat([angles.sin(), angles[:, : width // 2].cos()], dim=1).float()
