"""torch.export: one exported program serves every input length the model reads (from 2 tokens, torch's
own limit for a dynamic dimension, to the position table's), with the outputs of the model itself, for
each family of the table: absolute positions with sparse keys (BERT, DistilBERT), a relative bias (MPNet),
disentangled attention (DeBERTa) and an encoder-decoder (BART). The README's export recipe, run."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim, export

from helpers import TINY_CONFIGS
from lsg_converter import ARCHITECTURES

CASES = {
    "bert": ("BertModel", dict(sparsity_type="norm", block_size=32, sparse_block_size=32)),
    "distilbert": ("DistilBertModel", dict(sparsity_type="stride", block_size=32, sparse_block_size=16)),
    "mpnet": ("MPNetModel", dict(sparsity_type="none", block_size=32)),
    "deberta-v2": ("DebertaV2Model", dict(sparsity_type="pooling", block_size=32, sparse_block_size=32, sparsity_factor=4)),
    "bart": ("BartModel", dict(sparsity_type="none", block_size=32)),
}


def inputs(arch: str, length: int) -> dict[str, torch.Tensor]:
    input_ids = torch.randint(5, 90, (1, length))
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    if arch == "bart":  # the decoder reads a fixed 8-token prefix; no cache in an exported program
        batch.update(decoder_input_ids=torch.randint(5, 90, (1, 8)), use_cache=False)
    return batch


@pytest.mark.parametrize("arch", CASES)
def test_one_exported_program_serves_every_length_with_the_models_outputs(arch):
    head, settings = CASES[arch]
    values = {**TINY_CONFIGS[arch]().to_dict(), "num_global_tokens": 2, **settings}
    model = ARCHITECTURES[arch].lsg_class(head)(ARCHITECTURES[arch].config_class()(**values)).eval()
    max_length = ARCHITECTURES[arch].layout.max_input_length(model.config)
    length = Dim.AUTO
    dynamic = {"input_ids": {1: length}, "attention_mask": {1: length}}
    if arch == "bart":
        dynamic.update(decoder_input_ids=None, use_cache=None)

    program = export(model, (), inputs(arch, 100), dynamic_shapes=dynamic)

    assert [(bounds.lower, bounds.upper) for bounds in program.range_constraints.values()] == [(2, max_length)]
    for size in (2, 7, 32, 33, 65, max_length):  # one block, the edge of two, several, the whole table
        batch = inputs(arch, size)
        with torch.no_grad():
            torch.testing.assert_close(program.module()(**batch)[0], model(**batch)[0], atol=1e-5, rtol=0)
