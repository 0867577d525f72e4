"""Every default of the LSG settings, in one place: what a config takes for a key it is not given, the
keys some families add, and what a conversion takes instead. Docstrings, --help texts and the docs name
these tables rather than restate their values (tests check the ones that must be written out).

This file travels with saved models as remote code, and `lsg-convert`'s front end reads it by its path
before torch is imported: it imports nothing.
"""

# The LSG keys of every LSG config (`lsg_settings.LSGSettings`' fields, in this order) and their defaults:
# the 2023 reference's, so that a configuration built by hand, or a reference checkpoint's config that
# lacks a key, reads as the reference read it. A conversion starts from these, then `CONVERSION_DEFAULTS`.
LSG_DEFAULTS: dict[str, object] = {
    "block_size": 128,
    "sparse_block_size": 128,
    "sparsity_factor": 2,
    "sparsity_type": "norm",
    "num_global_tokens": 1,
    "pool_with_global": True,
    "mask_first_token": False,
    "adaptive": True,
    "lsh_num_pre_rounds": 1,
    "lsh_seed": 0,
    "legacy_sparse_window": False,  # True for a config the 2023 reference wrote (lsg_model.is_reference_config)
}
# Rows of the global token table, as in the reference checkpoints: num_global_tokens goes from 0 to this.
MAX_GLOBAL_TOKENS = 512

# The keys of the families that have them, with the LSG keys (a family's config's ``lsg_defaults``; a
# family with facts of its own states them in its configuration file, as T5's configuration_lsg_t5.py).
# Models with relative position terms (MPNet, DeBERTa): the position of the global tokens in those terms.
# 0, the first token's: global 0 is made from the [CLS] / <s> embedding at position 0, so every query sees
# it with the term it gave that token, and the global queries see the text as that token did.
RELATIVE_POSITION_DEFAULTS: dict[str, object] = {**LSG_DEFAULTS, "global_token_position": 0}
# Encoder-decoder models: the decoder also attends to the encoder's global tokens.
SEQ2SEQ_DEFAULTS: dict[str, object] = {**LSG_DEFAULTS, "pass_global_tokens_to_decoder": True}
# Encoders with rotary positions (ModernBERT, GTE, NomicBERT, jina-embeddings-v3, EuroBERT): a block that ends
# past the trained length reads the global tokens, and they read it, at a distance within it
# (lsg_rotary.GlobalDistanceClamp); False: at the distance from position 0, however far.
ROTARY_DEFAULTS: dict[str, object] = {**LSG_DEFAULTS, "clamp_global_distances": True}

# LSG config key: the positions the model read before its first LSG conversion (512 for BERT and
# RoBERTa), the length of the table that a longer conversion continues to tile, and the trained length of
# a rotary encoder.
PRETRAINED_POSITIONS_KEY = "pretrained_positions"

# What a conversion of a plain (not yet LSG) source takes instead of the reference's values, unless told
# otherwise: local attention only, one global token ([CLS] at position 0), and a block size derived from
# the source (`conversion_block_size`). Chosen on all-MiniLM-L6-v2 and Shakespeare (docs/benchmarks.md,
# "Extrapolation quality"): a long document then reads as faithfully as independent chunks, in one pass.
# The config defaults stay the reference's, which its checkpoints were trained with; num_global_tokens
# equals the reference's, stated here because the conversion's choice was measured, not inherited.
CONVERSION_DEFAULTS: dict[str, object] = {"sparsity_type": "none", "num_global_tokens": 1}
# The positions around a training window's body (its first and last token, [CLS] and [SEP]).
WINDOW_EDGE_POSITIONS = 2


def conversion_block_size(source_positions: int) -> int:
    """The block size a conversion takes where none is asked for: a third of the source's body positions
    (those between a training window's first and last token), so that a block's local window (previous,
    own and next block) spans one training window's body; at least 1. With sparse keys the converter
    rounds it down to a multiple of ``sparsity_factor`` (the converter's `positions.window_block_size`)."""
    return max((source_positions - WINDOW_EDGE_POSITIONS) // 3, 1)
