"""The attention swap of lsg_attention_layers.SwappedAttention, proven on BERT.

MPNet and DeBERTa-v2 compute attention by hand, so LSG cannot reach them through transformers'
attention interface: their mixin swaps their attention modules. Here a test-only architecture swaps
BertSelfAttention for a hand-written module that reuses its query/key/value layers and calls the LSG
core; it must be LSGBertModel, reached another way: same outputs, same parameter names, same checkpoint.
"""

import pytest
import torch
from torch import nn
from transformers.models.bert.modeling_bert import BertSelfAttention

from helpers import TINY_CONFIGS, padded_batch
from lsg_converter import LSGBertConfig, LSGBertModel
from lsg_converter.models.lsg_attention_layers import SwappedAttention, swapped_attention_forward

LSG_PATH = dict(block_size=4, sparse_block_size=4, sparsity_factor=2, num_global_tokens=2)
LENGTH = 19  # > 2 blocks and not a multiple of block_size: blocks, sparse keys and the attention's own padding


class HandWrittenSelfAttention(nn.Module):
    """BertSelfAttention written by hand, as MPNet's and DeBERTa's are: it keeps the query, key and value
    layers of the module it replaces (and so their parameter names) and calls the LSG core itself."""

    def __init__(self, source: BertSelfAttention, config: LSGBertConfig) -> None:
        super().__init__()
        self.config = config
        self.query, self.key, self.value, self.dropout = source.query, source.key, source.value, source.dropout
        self.head_size = source.attention_head_size
        self.is_causal = source.is_causal

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs):
        shape = (*hidden_states.shape[:-1], -1, self.head_size)  # (B, N, H, D)
        query, key, value = (layer(hidden_states).view(shape).transpose(1, 2) for layer in (self.query, self.key, self.value))
        output, weights = swapped_attention_forward(self, query, key, value, attention_mask, scaling=self.head_size**-0.5)
        return output.reshape(*hidden_states.shape[:-1], -1), weights  # (B, N, H * D)


class SwappedBertModel(LSGBertModel):
    """LSGBertModel whose self-attention modules are swapped rather than reached by dispatch."""

    lsg_attention = SwappedAttention((BertSelfAttention, HandWrittenSelfAttention))


def tiny_config(**settings) -> LSGBertConfig:
    values = {**TINY_CONFIGS["bert"]().to_dict(), **LSG_PATH, **settings}
    for key in ("model_type", "transformers_version"):  # a plain model_type + LSG keys reads as a 2023 checkpoint
        values.pop(key)
    return LSGBertConfig(**values)


def batch() -> dict[str, torch.Tensor]:
    input_ids, attention_mask = padded_batch([LENGTH, LENGTH - 6], LENGTH)
    return dict(input_ids=input_ids, attention_mask=attention_mask)


def dispatched_and_swapped(**settings) -> tuple[LSGBertModel, SwappedBertModel]:
    torch.manual_seed(0)
    dispatched = LSGBertModel(tiny_config(**settings)).eval()
    swapped = SwappedBertModel(tiny_config(**settings)).eval()
    swapped.load_state_dict(dispatched.state_dict(), strict=True)
    return dispatched, swapped


def test_every_self_attention_module_is_swapped_and_no_other():
    _, swapped = dispatched_and_swapped()

    swapped_modules = [name for name, module in swapped.named_modules() if isinstance(module, HandWrittenSelfAttention)]

    assert swapped_modules == [f"encoder.layer.{i}.attention.self" for i in range(swapped.config.num_hidden_layers)]
    assert not any(isinstance(module, BertSelfAttention) for module in swapped.modules())


def test_the_swapped_model_has_the_parameter_names_of_the_dispatched_one():
    dispatched, swapped = dispatched_and_swapped()

    assert list(swapped.state_dict()) == list(dispatched.state_dict())


@pytest.mark.parametrize("implementation", ["eager", "sdpa", "flex_attention"])
@pytest.mark.parametrize("sparsity_type", ["norm", "bos_pooling"])
def test_the_swapped_model_gives_the_outputs_of_the_dispatched_one(implementation, sparsity_type):
    dispatched, swapped = dispatched_and_swapped(attn_implementation=implementation, sparsity_type=sparsity_type)

    with torch.no_grad():
        expected = dispatched(**batch(), output_hidden_states=True)
        output = swapped(**batch(), output_hidden_states=True)

    torch.testing.assert_close(output.last_hidden_state, expected.last_hidden_state, atol=0, rtol=0)
    for state, expected_state in zip(output.hidden_states, expected.hidden_states, strict=True):
        torch.testing.assert_close(state, expected_state, atol=0, rtol=0)


@pytest.mark.compat  # transformers before 5.2x refused the switch for a swapped attention module
def test_the_swapped_modules_follow_a_switch_of_attention_implementation():
    dispatched, swapped = dispatched_and_swapped(attn_implementation="sdpa")
    dispatched.set_attn_implementation("eager")
    swapped.set_attn_implementation("eager")

    with torch.no_grad():
        expected = dispatched(**batch()).last_hidden_state
        output = swapped(**batch()).last_hidden_state

    torch.testing.assert_close(output, expected, atol=0, rtol=0)


def test_the_swapped_model_reloads_from_its_checkpoint_and_from_a_dispatched_one(tmp_path):
    dispatched, swapped = dispatched_and_swapped()
    with torch.no_grad():
        expected = dispatched(**batch()).last_hidden_state
    swapped.save_pretrained(tmp_path / "swapped")
    dispatched.save_pretrained(tmp_path / "dispatched")

    for folder in ("swapped", "dispatched"):
        reloaded = SwappedBertModel.from_pretrained(tmp_path / folder).eval()
        with torch.no_grad():
            output = reloaded(**batch()).last_hidden_state
        assert isinstance(reloaded.encoder.layer[0].attention.self, HandWrittenSelfAttention)
        torch.testing.assert_close(output, expected, atol=0, rtol=0)
    assert not (tmp_path / "swapped" / "test_attention_swap.py").exists(), "a class outside the heads saved as remote code"
