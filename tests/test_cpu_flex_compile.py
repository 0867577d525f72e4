"""A whole LSG model with the flex_attention backend compiled by inductor on the CPU (fullgraph): it
compiles and gives the uncompiled model's outputs, its mask_mod reading no key's validity (no key masked)
and each key's (a padded batch: a compiled graph checks no run on the host). Each compile costs about 20 s
here."""

import pytest
import torch

from helpers import padding_mask
from lsg_converter import LSGBertConfig, LSGBertModel
from lsg_converter.models import lsg_flex

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not lsg_flex.FLEX_ATTENTION_AVAILABLE, reason="needs torch's flex_attention"),
]

TOKENS = 300  # not a multiple of the block size nor of a flex tile


def tiny_flex_bert() -> LSGBertModel:
    config = LSGBertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=512, block_size=16, sparse_block_size=16,
                           sparsity_type="none", num_global_tokens=1, attn_implementation="flex_attention")
    torch.manual_seed(0)
    return LSGBertModel(config).eval()


@pytest.mark.parametrize("lengths", [None, [TOKENS, 250]], ids=["unpadded", "padded"])
def test_a_model_compiled_fullgraph_with_flex_on_the_cpu_equals_the_uncompiled_model(monkeypatch, lengths):
    model = tiny_flex_bert()
    inputs = {"input_ids": torch.randint(5, 90, (2, TOKENS), generator=torch.Generator().manual_seed(0))}
    if lengths is not None:
        inputs["attention_mask"] = padding_mask(lengths, TOKENS).long()
    layouts = []
    kernel = lsg_flex._flex_kernel

    def recording_kernel(signature):
        layouts.append(signature.validity)
        return kernel(signature)

    monkeypatch.setattr(lsg_flex, "_flex_kernel", recording_kernel)
    torch.compiler.reset()
    with torch.no_grad():
        eager = model(**inputs).last_hidden_state
        layouts.clear()
        compiled = torch.compile(model, fullgraph=True)(**inputs).last_hidden_state

    assert set(layouts) == {"none" if lengths is None else "per key"}  # flex ran in the graph
    torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=0)
