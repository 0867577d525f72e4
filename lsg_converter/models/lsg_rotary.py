"""The global tokens' distances kept within the trained length, in the encoders with rotary positions.

The global tokens sit at position 0 of the rotary module, so a token at position p reads them, and they
read it, at distance p: beyond the source's trained length, a rotation the source never saw. Where a
block ends past the trained length T, the distance is clamped per block: the block's queries read the
global keys rotated on to position s = end - T (so every query of the block reads them at a distance
within [T - b, T)), and the global queries read the block's keys rotated back by s. A rotation of the
already-rotated keys by s is the rotation of the raw keys to the shifted position (rotations compose;
the source's attention scaling, if any, is already in the keys). transformers' rotary encoders
(ModernBERT, GTE, NomicBERT, jina-embeddings-v3, EuroBERT) rotate the whole head dimension in halves
(``rotate_half``), as this file does.

This file travels with saved models as remote code: it imports torch and, of this folder, lsg_pattern only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .lsg_pattern import is_exporting


@dataclass(frozen=True, eq=False)
class GlobalDistanceClamp:
    """The clamp of a model's global token distances (see the module docstring).

    owner: the module that holds the rotary position module, under the name `rotary`; frequencies: the name
    of that module's buffer of inverse frequencies (D / 2,) that the layer rotates with (both looked up at
    each call: the module is adopted into a step class after the clamp is made, and its buffers follow it to
    its device); trained_positions: T, the positions the source was trained on.
    """

    owner: nn.Module
    rotary: str
    frequencies: str
    trained_positions: int

    def block_shifts(self, num_blocks: int, block: int, device: torch.device) -> torch.Tensor | None:
        """(nb,) int64: how far each block's global keys move on (0 for a block that ends within the trained
        length); None where no block ends beyond it, except while exporting (one program serves every length,
        so it moves them, by 0 where no block ends beyond it)."""
        if not is_exporting() and num_blocks * block <= self.trained_positions:
            return None
        ends = torch.arange(1, num_blocks + 1, device=device) * block
        return (ends - self.trained_positions).clamp(min=0)

    def rotated(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """`x` (..., D), rotary-rotated on by `positions` (int64, broadcasting to x's dimensions but the last):
        the rotation the source's module gives `positions`, applied to the already rotated `x`."""
        inverse_frequencies = getattr(self.owner.get_submodule(self.rotary), self.frequencies)
        if 2 * inverse_frequencies.shape[0] != x.shape[-1]:
            raise ValueError(
                f"The rotary module rotates {2 * inverse_frequencies.shape[0]} of the {x.shape[-1]} dimensions of a "
                "head: the global distances cannot be clamped. Set clamp_global_distances=False in the config."
            )
        angles = positions[..., None].float() * inverse_frequencies.to(x.device, torch.float)  # (..., D / 2)
        angles = torch.cat([angles, angles], dim=-1)  # (..., D): each frequency rotates a dimension of each half
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        first_half, second_half = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-second_half, first_half], dim=-1) * sin

    def block_global_keys(self, global_keys: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
        """Each block's global keys: (B, g, H, D) -> (B, nb, g, H, D), rotated on by the block's shift."""
        return self.rotated(global_keys[:, None], shifts.view(1, -1, 1, 1))

    def keys_for_global_queries(self, token_keys: torch.Tensor, shifts: torch.Tensor, block: int) -> torch.Tensor:
        """The token keys (B, T, H, D), T = nb b, each block's rotated back by its shift: (B, T, H, D)."""
        blocks = token_keys.unflatten(1, (-1, block))  # (B, nb, b, H, D)
        return self.rotated(blocks, -shifts.view(1, -1, 1, 1)).flatten(1, 2)
