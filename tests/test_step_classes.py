"""Every module of an LSG model has a class with source code: the modules the global tokens pass through are
adopted into step classes (lsg_global_tokens.GlobalTokenStep) written out in lsg_converter/models, where grep
and ``inspect.getsource`` find each name ``print(model)`` shows (issue 67)."""

import copy
import inspect
import pickle
import re

import pytest
import torch
from torch import nn
from transformers.models.bert.modeling_bert import BertIntermediate

from helpers import TINY_CONFIGS, is_causal_head, padded_batch
from lsg_converter import ARCHITECTURES
from lsg_converter.models.configuration_lsg_bert import LSGBertConfig
from lsg_converter.models.lsg_global_tokens import (
    GlobalTokens,
    GlobalTokenStep,
    PrependsGlobalTokens,
    RecordsTokenStates,
    adopt_step,
)

LSG_PATH = dict(block_size=4, sparse_block_size=4, sparsity_factor=2, num_global_tokens=2)


def settings_built(arch: str) -> list[dict]:
    """The LSG settings the suite builds `arch` with that change which modules take a step."""
    settings = [{}]
    if TINY_CONFIGS[arch]().is_encoder_decoder:
        settings.append(dict(pass_global_tokens_to_decoder=True))  # the decoder sees the global states
    if arch == "deberta-v2":
        settings.append(dict(embedding_size=16))  # the global tokens join before the projection
    return settings


def tiny_lsg(arch: str, head: str, **settings) -> nn.Module:
    """A tiny random LSG `head` ("BertForMaskedLM") of `arch`, a causal one a decoder; config: LSG_PATH + settings."""
    source = TINY_CONFIGS[arch]()
    source.is_decoder = is_causal_head(head)
    values = {**source.to_dict(), **LSG_PATH, **settings}
    for key in ("model_type", "transformers_version"):  # a plain model_type + LSG keys reads as a 2023 checkpoint
        values.pop(key)
    torch.manual_seed(0)
    return getattr(ARCHITECTURES[arch].modeling_module(), f"LSG{head}")(ARCHITECTURES[arch].config_class()(**values))


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_every_module_of_every_head_has_a_class_statement_and_each_step_class_is_one_of_lsg_converter_models(arch):
    step_classes = set()
    for head in ARCHITECTURES[arch].heads:
        for settings in settings_built(arch):
            for module in tiny_lsg(arch, head, **settings).modules():
                module_class = type(module)
                assert re.search(rf"^class {module_class.__name__}\(", inspect.getsource(module_class), re.M), module_class
                if isinstance(module, GlobalTokenStep):
                    assert module_class.__module__.startswith("lsg_converter.models."), module_class
                    step_classes.add(module_class.__name__)

    assert step_classes, f"no module of {arch} takes a step of the global tokens"


def test_the_names_printed_are_those_of_the_step_classes():
    printed = str(tiny_lsg("bert", "BertForMaskedLM")) + str(tiny_lsg("t5", "T5Model", pass_global_tokens_to_decoder=True))

    for name in (
        "BertModelWithGlobalTokens", "GlobalTokensBeforeLayerNorm", "BertEncoderDroppingGlobalTokens",
        "BertLayerRecordingTokenStates", "GlobalTokensBeforeT5BlockRecordingTokenStates", "T5BlockRecordingTokenStates",
        "T5StackDroppingGlobalTokens", "T5StackSeeingGlobalTokens",
    ):
        assert f" {name}(" in printed, name


def test_pickles_and_deep_copies_keep_every_step_class_and_the_outputs():
    model = tiny_lsg("t5", "T5EncoderModel").eval()  # its first block takes two steps
    input_ids, attention_mask = padded_batch([19, 13], 19, "t5")

    with torch.no_grad():
        expected = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        for duplicate in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            assert [type(module) for module in duplicate.modules()] == [type(module) for module in model.modules()]
            output = duplicate(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            torch.testing.assert_close(output, expected, atol=0, rtol=0)


@pytest.mark.parametrize(
    "module,step,statement,home",
    [
        (nn.GELU(), PrependsGlobalTokens, "class GlobalTokensBeforeGELU(PrependsGlobalTokens, GELU)", "lsg_global_tokens.py"),
        (
            BertIntermediate(LSGBertConfig(hidden_size=8, intermediate_size=16)),
            RecordsTokenStates,
            "class BertIntermediateRecordingTokenStates(RecordsTokenStates, BertIntermediate)",
            "modeling_lsg_bert.py",
        ),
    ],
)
def test_a_module_without_its_step_class_is_refused_naming_the_class_to_write_and_where(module, step, statement, home):
    config = LSGBertConfig()
    global_tokens = GlobalTokens(nn.Embedding(4, 8), config)

    with pytest.raises(LookupError) as refusal:
        adopt_step(nn.Sequential(module), "0", step, global_tokens)

    assert f"`{statement}`" in str(refusal.value) and f"in {home}, in the folder of this file" in str(refusal.value)


def test_a_step_class_is_named_as_its_step_says():
    with pytest.raises(TypeError, match="named LinearRecordingTokenStates, not RecordingLinear"):

        class RecordingLinear(RecordsTokenStates, nn.Linear):
            """Misnamed: print(model) would not say which step the module takes."""
