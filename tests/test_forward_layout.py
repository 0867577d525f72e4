"""An LSG model's forward is its own modules, in forward order: the global tokens join and leave at
modules ``print(model)`` shows, not at hooks, and the model keeps its source's parameter names."""

import pytest
import torch
import transformers

from helpers import TINY_CONFIGS, is_causal_head, padded_batch
from lsg_converter import ARCHITECTURES
from lsg_converter.models.lsg_global_tokens import DropsGlobalTokens, PrependsGlobalTokens, RecordsTokenStates
from lsg_converter.models.lsg_recorder import CarriesAndDropsGlobalTokens, CarriesGlobalTokens, SeesGlobalStates

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


def heads(arch: str) -> list[str]:
    """Every head the LSG config of `arch` lists, as Hugging Face class names."""
    config_class = ARCHITECTURES[arch].config_class()
    return [config_class.lsg_base_name() + suffix for suffix in config_class.lsg_heads]


def main_head(arch: str) -> str:
    """The head with the most LSG steps: the encoder-decoder's generation head, else the masked LM."""
    return next(head for head in heads(arch) if head.endswith(("ForConditionalGeneration", "ForMaskedLM")))


def model_inputs(arch: str) -> dict:
    input_ids, attention_mask = padded_batch([19, 13], 19, arch)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask)
    if TINY_CONFIGS[arch]().is_encoder_decoder:
        inputs["decoder_input_ids"] = input_ids[:, :5]
    return inputs


def test_a_twelve_layer_bert_carries_at_most_four_forward_hooks():
    model = lsg_model("bert", "BertForMaskedLM", num_hidden_layers=12)
    assert forward_hooks(model) <= 4


@pytest.mark.parametrize("arch", list(TINY_CONFIGS))
def test_every_head_of_every_family_carries_at_most_four_forward_hooks(arch):
    for head in heads(arch):
        assert forward_hooks(lsg_model(arch, head)) <= 4, head


@pytest.mark.parametrize("arch", list(TINY_CONFIGS))
def test_every_forward_hook_of_an_lsg_model_only_observes(arch):
    model = lsg_model(arch, main_head(arch)).eval()
    returned = []

    def observed(hook):
        def run(*args, **kwargs):
            returned.append(hook(*args, **kwargs))
        return run

    for module in model.modules():
        for hooks in (module._forward_hooks, module._forward_pre_hooks):
            for key, hook in list(hooks.items()):
                hooks[key] = observed(hook)
    with torch.no_grad():
        model(**model_inputs(arch))

    assert returned and all(value is None for value in returned)


@pytest.mark.parametrize("arch", list(TINY_CONFIGS))
def test_print_shows_where_the_global_tokens_join_and_leave_in_every_family(arch):
    model = lsg_model(arch, main_head(arch))
    printed = repr(model)

    assert "GlobalTokensBefore" in printed and "DroppingGlobalTokens" in printed
    for step in (PrependsGlobalTokens, DropsGlobalTokens):
        assert sum(isinstance(module, step) for module in model.modules()) == 1


@pytest.mark.parametrize("arch", list(TINY_CONFIGS))
def test_the_recorder_of_a_head_runs_the_global_token_steps_as_a_module(arch):
    model = lsg_model(arch, main_head(arch))
    recorder = next(module for module in model.modules() if isinstance(module, CarriesGlobalTokens))

    assert isinstance(recorder, transformers.PreTrainedModel) and model.lsg_forward_steps is None
    assert type(recorder).__name__ in repr(model)


@pytest.mark.parametrize("arch", ["bart", "mbart", "pegasus", "t5", "mt5", "umt5"])
def test_an_encoder_that_is_its_own_recorder_drops_the_global_tokens_and_the_decoder_widens_its_mask(arch):
    model = lsg_model(arch, main_head(arch))

    assert isinstance(model.get_encoder(), CarriesAndDropsGlobalTokens)
    assert isinstance(model.get_decoder(), SeesGlobalStates)
    assert "SeeingGlobalTokens" in repr(model)


def test_the_bare_model_runs_the_global_token_steps_in_its_own_forward():
    model = lsg_model("bert", "BertModel")
    assert model.lsg_forward_steps is not None
    assert not any(isinstance(module, CarriesGlobalTokens) for module in model.modules())


def test_a_head_records_every_hidden_state_through_its_adopted_recorder():
    model = lsg_model("bert", "BertForMaskedLM").eval()
    with torch.no_grad():
        output = model(**model_inputs("bert"), output_hidden_states=True)

    assert len(output.hidden_states) == model.config.num_hidden_layers + 1
    assert all(state.shape[1] == 19 for state in output.hidden_states)


def test_the_call_state_is_held_for_the_length_of_the_forward_only():
    model = lsg_model("bert", "BertForMaskedLM").eval()
    global_tokens = model.bert.lsg_global_tokens
    seen = []
    model.bert.encoder.layer[0].register_forward_pre_hook(lambda module, args: seen.append(global_tokens.call))
    with torch.no_grad():
        model(**model_inputs("bert"), output_hidden_states=True)

    assert seen[0] is not None and seen[0].recording and global_tokens.call is None


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
