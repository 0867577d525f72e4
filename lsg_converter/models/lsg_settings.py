"""The LSG settings of a model: one frozen value, read from its config once and validated in one place.

The attention core, the sparse compressors and the key pattern read an `LSGSettings`, never the
Hugging Face config: `LSGSettings.of` reads a config's LSG keys (the defaults of `lsg_defaults.LSG_DEFAULTS`
for the missing ones) and gives the same settings object for the same values, which builds its two key
patterns once.

This file travels with saved models as remote code: it imports, of this folder, lsg_defaults, lsg_pattern and
lsg_sparse only (not torch).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from .lsg_defaults import LSG_DEFAULTS, MAX_GLOBAL_TOKENS
from .lsg_pattern import KeyPattern, uses_sparse_keys
from .lsg_sparse import SPARSITY_TYPES

LSG_KEYS = tuple(LSG_DEFAULTS)  # the LSG keys of a config, `LSGSettings`' fields
INTEGER_KEYS = ("block_size", "sparse_block_size", "sparsity_factor", "num_global_tokens", "lsh_num_pre_rounds")


@dataclass(frozen=True)
class LSGSettings:
    """The LSG keys of a model (`LSG_KEYS`; see `LSGConfigMixin` for each key's meaning), every one given:
    `of` takes a config's values as they are and the defaults (`lsg_defaults.LSG_DEFAULTS`) for the keys
    it lacks; `validate` says, in one line naming the key, what cannot work.
    """

    block_size: int
    sparse_block_size: int
    sparsity_factor: int
    sparsity_type: str
    num_global_tokens: int
    pool_with_global: bool
    mask_first_token: bool
    adaptive: bool
    lsh_num_pre_rounds: int
    lsh_seed: int
    legacy_sparse_window: bool
    _patterns: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    # the chunk of tokens in which norm and lsh select or hash keys (lsg_sparse): min(b, s), or b where that
    # would not tile the blocks (`__post_init__`)
    selection_chunk: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        chunk, sizes = self.block_size, (self.block_size, self.sparse_block_size, self.sparsity_factor)
        if all(type(size) is int and size > 0 for size in sizes):  # else `validate` refuses them
            smaller = min(self.block_size, self.sparse_block_size)
            if not self.block_size % smaller and not smaller % self.sparsity_factor:
                chunk = smaller
        object.__setattr__(self, "selection_chunk", chunk)

    @classmethod
    def of(cls, config: Any) -> LSGSettings:
        """The settings held by the attributes of `config` (an LSG config, or anything carrying the keys;
        `LSG_DEFAULTS` for the missing ones); `config` itself if it is settings already. Equal values give
        the same settings object, whose key patterns are then built once."""
        if isinstance(config, LSGSettings):
            return config
        values = tuple((name, getattr(config, name, default)) for name, default in LSG_DEFAULTS.items())
        try:
            return _settings(values)
        except TypeError:  # a value that cannot be hashed (a list): settings of their own, for `validate` to refuse
            return cls(**dict(values))

    @property
    def uses_sparse_keys(self) -> bool:
        """Whether the blocks get sparse keys at all (otherwise: local + global only)."""
        return uses_sparse_keys(self)

    def pattern(self, causal: bool = False) -> KeyPattern:
        """The key pattern of these settings (`KeyPattern.of`), built once per direction."""
        pattern = self._patterns.get(causal)
        if pattern is None:
            pattern = self._patterns[causal] = KeyPattern.of(self, causal)
        return pattern

    def validate(self, max_length: int | None = None, causal: bool = False) -> None:
        """Raise ValueError, saying what to change, if these settings cannot work: with `max_length` (the
        length the model reads) blocks longer than that are refused too; `causal` for an LSG decoder.
        Messages name the keys as ``key=value``, the way they are passed in Python."""
        for key in INTEGER_KEYS:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{key}={value!r} is not an integer: use a whole number.")
        if self.sparsity_type not in SPARSITY_TYPES:
            raise ValueError(f"sparsity_type={self.sparsity_type!r} is unknown: use one of {', '.join(SPARSITY_TYPES)}.")
        if self.block_size < 1:
            raise ValueError(f"block_size={self.block_size} is not positive: use block_size= of at least 1.")
        for key in ("sparse_block_size", "sparsity_factor", "lsh_num_pre_rounds"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key}={getattr(self, key)} is negative: use {key}= of at least 0.")
        if self.sparsity_type != "none":
            for key in ("sparse_block_size", "sparsity_factor"):
                if getattr(self, key) < 1:
                    raise ValueError(
                        f"{key}={getattr(self, key)} gives sparsity_type={self.sparsity_type!r} no sparse keys: "
                        f"use {key}= of at least 1, or sparsity_type='none' for local and global attention only."
                    )
        if not 0 <= self.num_global_tokens <= MAX_GLOBAL_TOKENS:
            raise ValueError(
                f"num_global_tokens={self.num_global_tokens} is outside the {MAX_GLOBAL_TOKENS}-row global token table: "
                f"use num_global_tokens= between 0 and {MAX_GLOBAL_TOKENS}."
            )
        if not isinstance(self.legacy_sparse_window, bool):
            raise ValueError(f"legacy_sparse_window={self.legacy_sparse_window!r} is not a boolean: use True or False.")
        if self.uses_sparse_keys and self.block_size % self.sparsity_factor:
            raise ValueError(
                f"block_size={self.block_size} is not a multiple of sparsity_factor={self.sparsity_factor}: "
                "use a block_size= that sparsity_factor= divides."
            )
        if max_length is not None:
            for key in ("block_size", "sparse_block_size") if self.uses_sparse_keys else ("block_size",):
                if getattr(self, key) > max_length:
                    raise ValueError(
                        f"{key}={getattr(self, key)} is larger than max_sequence_length={max_length}: "
                        f"use {key}= of at most {max_length}."
                    )
        if causal and self.sparsity_type == "bos_pooling" and self.uses_sparse_keys:
            raise ValueError(
                "sparsity_type='bos_pooling' needs the first token's query, which a cached causal decoder no longer "
                "has: use sparsity_type='pooling' for decoder (causal LM) models."
            )


@functools.lru_cache(maxsize=64)
def _settings(values: tuple[tuple[str, Any], ...]) -> LSGSettings:
    """One settings object per distinct set of values (see `LSGSettings.of`)."""
    return LSGSettings(**dict(values))
