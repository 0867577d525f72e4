"""How an LSG model's attention implementation is chosen, and what its config says.

An LSG model's config names its attention as transformers' own models do: ``_attn_implementation`` reads
back "eager", "sdpa" or "flex_attention" as it was asked (the config, ``from_pretrained``,
``set_attn_implementation``), "sdpa" where it was left unset (transformers' default; the layers then run
`lsg_attention.choose_path`), in every family, on the model and on every model inside it; no config
names an internal registration. The assertions of transformers' own common tests
(``test_can_set_attention_dynamically``, ``test_sdpa_can_dispatch_non_composite_models``) hold for every
head of every family. The LSG layers dispatch on the LSG attention registered for that backend through
the config they hold (`lsg_attention.DispatchConfig`), which runs what each module's role, decided when
the model was built, says: LSG attention with the settings the model resolved then (no config is read
per call). An encoder-decoder model's decoder runs transformers' own attention.
"""

import copy
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
from lsg_converter.models.lsg_attention import DEFAULT_BACKEND, DispatchConfig, dense_backend, lsg_backend, registered_attention
from lsg_converter.models.lsg_settings import LSGSettings
from test_conventions import LENGTH, batch, tiny_lsg

BACKENDS = ["eager", "sdpa", "flex_attention"]
SEQ2SEQ_SOURCES = {"bart": "BartModel", "t5": "T5Model"}
# every head of every family: (arch, head suffix), a dense decoder-only head (ForCausalLM of BART-likes) aside
HEADS = [
    (arch, head)
    for arch, spec in ARCHITECTURES.items()
    for head in spec.config_class().lsg_heads
    if not (head == "ForCausalLM" and TINY_CONFIGS[arch]().is_encoder_decoder)
]


def head_class(arch: str, head: str) -> type:
    config_class = ARCHITECTURES[arch].config_class()
    return getattr(ARCHITECTURES[arch].modeling_module(), f"LSG{config_class.lsg_base_name()}{head}")


def tiny_config(arch: str, head: str):
    """The config `tiny_lsg` builds its model from (a decoder-only head's is a decoder)."""
    model = tiny_lsg(arch, head, is_decoder=head in ("ForCausalLM", "LMHeadModel"))
    return copy.deepcopy(model.config)


def configs_of(model: torch.nn.Module) -> list:
    """The config of `model` and of every model inside it (T5's stacks hold copies of their own)."""
    return [module.config for module in model.modules() if isinstance(module, transformers.PreTrainedModel)]


@pytest.mark.parametrize("arch, head", HEADS)
def test_set_attn_implementation_reads_back_on_the_model_and_every_sub_config(arch, head):
    """transformers' test_can_set_attention_dynamically, on every head of every family."""
    config = tiny_config(arch, head)
    config._attn_implementation = "eager"
    model = head_class(arch, head)(config)
    assert model.config._attn_implementation == "eager"
    assert head_class(arch, head)._can_set_attn_implementation()

    model.set_attn_implementation("sdpa")
    assert model.config._attn_implementation == "sdpa"
    for subconfig_key in model.config.sub_configs:
        assert getattr(model.config, subconfig_key)._attn_implementation == "sdpa"

    with pytest.raises(ValueError, match='Specified `attn_implementation="foo"` is not supported'):
        model.set_attn_implementation("foo")
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("arch, head", HEADS)
def test_from_pretrained_reads_back_each_implementation_asked_for(arch, head, tmp_path):
    """transformers' test_sdpa_can_dispatch_non_composite_models, on every head of every family, and
    flex_attention likewise."""
    head_class(arch, head)(tiny_config(arch, head)).save_pretrained(tmp_path)

    loaded = {backend: head_class(arch, head).from_pretrained(tmp_path, attn_implementation=backend) for backend in BACKENDS}

    assert {backend: model.config._attn_implementation for backend, model in loaded.items()} == {backend: backend for backend in BACKENDS}
    assert not [name for name, module in loaded["eager"].named_modules() if "Sdpa" in type(module).__name__]
    loaded["eager"].set_attn_implementation("flex_attention")
    assert loaded["eager"].config._attn_implementation == "flex_attention"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_no_config_names_an_internal_registration(arch, backend):
    model = tiny_lsg(arch, ARCHITECTURES[arch].default_head.removeprefix(ARCHITECTURES[arch].config_class().lsg_base_name()))
    model.set_attn_implementation(backend)

    names = {config._attn_implementation for config in configs_of(model)}

    assert names <= set(BACKENDS) and lsg_attention.LSG_ATTENTION not in str(model.config.to_dict())


@pytest.mark.parametrize("arch", ["bert", "bart"])
def test_the_lsg_layers_dispatch_on_the_registered_attention_of_the_backend_the_config_names(arch):
    model = tiny_lsg(arch, attn_implementation="eager")
    dispatching = [module for module in model.modules() if isinstance(vars(module).get("config"), DispatchConfig)]
    roles = (lsg_attention.SelfAttentionRole, lsg_attention.CrossAttentionRole)
    assert dispatching and all(isinstance(module.lsg_role, roles) for module in dispatching)

    model.config._attn_implementation = "flex_attention"

    assert {module.config._attn_implementation for module in dispatching} == {registered_attention("flex_attention")}
    assert all(module.config.hidden_size == model.config.hidden_size for module in dispatching)


def test_set_attn_implementation_takes_transformers_per_sub_config_form():
    model = tiny_lsg("bert", attn_implementation="sdpa")

    model.set_attn_implementation({"": "eager"})
    assert model.config._attn_implementation == "eager"
    model.set_attn_implementation({})  # no sub-config is named: nothing changes
    assert model.config._attn_implementation == "eager"


def test_an_implementation_left_unset_reads_sdpa_and_runs_the_device_default():
    model = tiny_lsg("bert")
    layer = model.encoder.layer[0].attention.self

    assert model.config._attn_implementation == "sdpa"
    assert lsg_backend(layer.config._attn_implementation) == DEFAULT_BACKEND
    model.set_attn_implementation("sdpa")
    assert lsg_backend(layer.config._attn_implementation) == "sdpa"
    model.set_attn_implementation(None)
    assert lsg_backend(layer.config._attn_implementation) == DEFAULT_BACKEND


def test_t5_names_the_backend_in_its_encoder_stack_and_what_its_dense_decoder_runs_in_its_decoder_stack():
    model = tiny_lsg("t5", "ForConditionalGeneration", attn_implementation="eager")
    assert (model.encoder.config._attn_implementation, model.decoder.config._attn_implementation) == ("eager", "eager")

    model.set_attn_implementation("flex_attention")

    decoder_runs = dense_backend(model.config, "flex_attention")
    assert (model.config._attn_implementation, model.encoder.config._attn_implementation) == ("flex_attention", "flex_attention")
    assert model.decoder.config._attn_implementation == decoder_runs != "flex_attention"


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

    assert model.config._attn_implementation == backend
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
