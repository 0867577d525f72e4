"""How an LSG model's attention implementation is chosen: by transformers' own mechanism alone.

The config's ``_attn_implementation`` names the LSG attention registered with transformers for the
backend asked for (`lsg_attention.registered_attention`; `lsg_attention.lsg_backend` reads the backend
back), whichever way it was asked (the config, ``from_pretrained``, ``set_attn_implementation``), in
every family. That one function runs what each module's role, decided when the model was built, says:
LSG attention in the LSG self-attention layers, with the settings the model resolved then (no config
is read per call), and transformers' own attention in an encoder-decoder model's decoder. No module
holds a view of the config.
"""

from types import SimpleNamespace

import pytest
import torch
import transformers

from helpers import TINY_CONFIGS, save_tiny_source
from lsg_converter import ARCHITECTURES, LSGConverter
from lsg_converter.models import lsg_attention
from lsg_converter.models.configuration_lsg_mt5 import LSGMT5Config
from lsg_converter.models.configuration_lsg_t5 import LSGT5Config
from lsg_converter.models.configuration_lsg_umt5 import LSGUMT5Config
from lsg_converter.models.lsg_attention import dense_backend, lsg_backend, registered_attention
from lsg_converter.models.lsg_settings import LSGSettings
from test_conventions import LENGTH, batch, tiny_lsg

BACKENDS = ["eager", "sdpa", "flex_attention"]
SWAPPED = ["mpnet", "deberta-v2", "t5"]  # families whose attention modules LSG swaps
SEQ2SEQ_SOURCES = {"bart": "BartModel", "t5": "T5Model"}


def config_holders(model: torch.nn.Module) -> list[tuple[str, object]]:
    """(module name, the config it holds) for every module of `model` that holds one."""
    return [(name, vars(module)["config"]) for name, module in model.named_modules() if "config" in vars(module)]


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_no_module_of_any_family_holds_a_view_of_its_config(arch):
    model = tiny_lsg(arch, ARCHITECTURES[arch].default_head.removeprefix(ARCHITECTURES[arch].config_class().lsg_base_name()))

    views = [name for name, config in config_holders(model) if not isinstance(config, transformers.PreTrainedConfig)]

    assert views == []


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ["bert", "bart", *SWAPPED])
def test_the_config_names_the_registered_lsg_attention_of_the_backend_asked_for(arch, backend):
    model = tiny_lsg(arch, attn_implementation=backend)

    assert model.config._attn_implementation == registered_attention(backend)
    assert lsg_backend(model.config._attn_implementation) == backend


@pytest.mark.parametrize("arch", ["bert", *SWAPPED])
def test_from_pretrained_and_set_attn_implementation_name_the_registered_attention(arch, tmp_path):
    tiny_lsg(arch).save_pretrained(tmp_path)
    model = type(tiny_lsg(arch)).from_pretrained(tmp_path, attn_implementation="eager")
    assert model.config._attn_implementation == registered_attention("eager")

    model.set_attn_implementation("flex_attention")

    assert model.config._attn_implementation == registered_attention("flex_attention")
    assert lsg_backend(model.config._attn_implementation) == "flex_attention"


def test_t5_builds_its_stacks_with_the_registered_name_and_switches_them_with_the_model():
    model = tiny_lsg("t5", "ForConditionalGeneration", attn_implementation="eager")
    assert {model.encoder.config._attn_implementation, model.decoder.config._attn_implementation} == {registered_attention("eager")}

    model.set_attn_implementation("sdpa")

    assert {model.encoder.config._attn_implementation, model.decoder.config._attn_implementation} == {registered_attention("sdpa")}


@pytest.mark.parametrize("arch", ["bart", "t5"])
def test_only_the_encoder_self_attention_layers_hold_the_lsg_role(arch):
    model = tiny_lsg(arch, "ForConditionalGeneration", pass_global_tokens_to_decoder=False)

    lsg_layers = {name for name, module in model.named_modules() if isinstance(getattr(module, "lsg_role", None), lsg_attention.SelfAttentionRole)}
    lsg_layers |= {name for name, module in model.named_modules() if isinstance(getattr(module, "lsg_settings", None), LSGSettings)}

    assert lsg_layers and all(name.startswith(("model.encoder.", "encoder.")) for name in lsg_layers)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", list(SEQ2SEQ_SOURCES))
def test_the_decoder_of_an_encoder_decoder_model_runs_transformers_attention_of_the_backend(arch, backend, tmp_path):
    source_class = getattr(transformers, SEQ2SEQ_SOURCES[arch])
    # transformers' T5 flex attention fails on a batch of two: the LSG-T5 decoder runs sdpa where flex is asked
    source_backend = "sdpa" if (arch, backend) == ("t5", "flex_attention") else backend
    source_dir = save_tiny_source(tmp_path, arch, SEQ2SEQ_SOURCES[arch])
    source = source_class.from_pretrained(source_dir, attn_implementation=source_backend)
    model, _ = LSGConverter(max_sequence_length=256).convert_from_pretrained(str(source_dir), pass_global_tokens_to_decoder=False)
    model.set_attn_implementation(backend)
    decoder_inputs = batch(arch)["input_ids"][:2, :7]
    encoder_states = torch.randn(2, LENGTH, source.config.d_model, generator=torch.Generator().manual_seed(0))
    encoder_mask = batch(arch)["attention_mask"]

    with torch.no_grad():
        expected = source.decoder(input_ids=decoder_inputs, encoder_hidden_states=encoder_states, encoder_attention_mask=encoder_mask)
        output = model.eval().get_decoder()(
            input_ids=decoder_inputs, encoder_hidden_states=encoder_states, encoder_attention_mask=encoder_mask
        )

    assert model.config._attn_implementation == registered_attention(backend)
    torch.testing.assert_close(output.last_hidden_state, expected.last_hidden_state, atol=1e-5, rtol=0)


def test_a_forward_reads_no_settings_from_a_config(monkeypatch):
    model = tiny_lsg("bert", attn_implementation="sdpa")
    read_from = []
    settings_of = LSGSettings.of.__func__

    def recording_of(cls, config):
        read_from.append(type(config).__name__)
        return settings_of(cls, config)

    monkeypatch.setattr(LSGSettings, "of", classmethod(recording_of))
    with torch.no_grad():
        model(**batch("bert"))

    assert [name for name in read_from if name != "LSGSettings"] == []


def test_the_lsg_layers_run_the_settings_the_model_resolved_when_built():
    model = tiny_lsg("bert")

    roles = [module.lsg_role for module in model.modules() if isinstance(getattr(module, "lsg_role", None), lsg_attention.SelfAttentionRole)]

    assert len(roles) == model.config.num_hidden_layers
    assert all(role.settings is LSGSettings.of(model.config) for role in roles)


def test_dense_decoder_only_head_keeps_the_names_of_transformers(tmp_path):
    model = tiny_lsg("bart", "ForCausalLM", is_decoder=True, attn_implementation="eager")
    assert model.config._attn_implementation == "eager"

    model.set_attn_implementation("sdpa")

    assert model.config._attn_implementation == "sdpa"
    assert lsg_attention.LSG_ATTENTION not in model.config._attn_implementation


def test_an_eager_model_asked_for_its_attentions_saves_and_turns_them_on_through_its_config(tmp_path):
    model = tiny_lsg("bert", attn_implementation="eager", output_attentions=True)
    model.save_pretrained(tmp_path)
    other = tiny_lsg("bert", attn_implementation="eager")

    other.config.output_attentions = True

    with torch.no_grad():
        assert len(other(**batch("bert")).attentions) == other.config.num_hidden_layers


@pytest.mark.parametrize(
    "implementations, asked, runs",
    [
        (("eager", "sdpa"), "flex_attention", "sdpa"),  # T5's decoder: its flex attention fails at batch 2
        (("eager",), "sdpa", "eager"),  # T5's before transformers 5.2x: attention by hand
        (("eager", "sdpa"), "sdpa", "sdpa"),
        (None, "flex_attention", "flex_attention"),
    ],
)
def test_dense_layers_run_the_backend_asked_where_their_architecture_has_it_else_sdpa_or_eager(implementations, asked, runs):
    config = SimpleNamespace(lsg_dense_implementations=implementations)

    assert dense_backend(config, asked) == runs


def test_the_t5_family_dense_layers_run_what_the_installed_transformers_has_but_flex():
    from transformers.models.t5.modeling_t5 import T5PreTrainedModel

    expected = ("eager", "sdpa") if T5PreTrainedModel._supports_sdpa else ("eager",)
    for config_class in (LSGT5Config, LSGMT5Config, LSGUMT5Config):
        assert config_class.lsg_dense_implementations == expected
