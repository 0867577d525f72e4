"""An LSG model's forward is its own modules, in forward order: the global tokens join and leave at
modules ``print(model)`` shows, not at hooks, and the model keeps its source's parameter names."""

import pytest
import torch
import transformers

from helpers import TINY_CONFIGS, is_causal_head
from lsg_converter import ARCHITECTURES
from lsg_converter.models.lsg_global_tokens import DropsGlobalTokens, PrependsGlobalTokens, RecordsTokenStates

# (arch, head): the bare model, a head whose recorder is a module inside it, an encoder-decoder model
# whose encoder is its recorder, and the two families with swapped attention
CASES = [
    ("bert", "BertModel"),
    ("bert", "BertForMaskedLM"),
    ("bart", "BartForConditionalGeneration"),
    ("pegasus", "PegasusForConditionalGeneration"),
    ("mpnet", "MPNetForMaskedLM"),
    ("deberta-v2", "DebertaV2ForMaskedLM"),
]


def lsg_model(arch: str, head: str, **config_overrides) -> torch.nn.Module:
    config = TINY_CONFIGS[arch]()
    config.is_decoder = is_causal_head(head)
    lsg_config_class = ARCHITECTURES[arch].config_class()
    config = lsg_config_class(**{**config.to_dict(), "num_global_tokens": 2, **config_overrides})
    return ARCHITECTURES[arch].lsg_class(head)(config)


def forward_hooks(model: torch.nn.Module) -> int:
    return sum(len(module._forward_hooks) + len(module._forward_pre_hooks) for module in model.modules())


def test_a_twelve_layer_bert_carries_at_most_four_forward_hooks():
    model = lsg_model("bert", "BertForMaskedLM", num_hidden_layers=12)
    assert forward_hooks(model) <= 4


@pytest.mark.parametrize("arch,head", CASES)
def test_print_shows_where_the_global_tokens_join_and_leave(arch, head):
    model = lsg_model(arch, head)
    printed = repr(model)
    for step in (PrependsGlobalTokens, RecordsTokenStates):
        assert sum(isinstance(module, step) for module in model.modules()) >= 1
    assert "GlobalTokensBefore" in printed and "RecordingTokenStates" in printed


def test_a_bert_encoder_drops_the_global_tokens_in_its_own_module():
    model = lsg_model("bert", "BertModel")
    assert isinstance(model.encoder, DropsGlobalTokens)
    assert isinstance(model.encoder, transformers.models.bert.modeling_bert.BertEncoder)


@pytest.mark.parametrize("arch,head", CASES)
def test_the_adopted_modules_keep_the_source_parameter_names(arch, head):
    source = getattr(transformers, head)(TINY_CONFIGS[arch]())
    model = lsg_model(arch, head)
    added = {name for name in model.state_dict() if "global_embeddings" in name}
    assert set(model.state_dict()) - added == set(source.state_dict())


def test_every_recorded_layer_of_a_layer_stack_records_token_states():
    model = lsg_model("bert", "BertModel", num_hidden_layers=3)
    assert all(isinstance(layer, RecordsTokenStates) for layer in model.encoder.layer)
