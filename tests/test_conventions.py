"""transformers' conventions on the outputs of LSG models, as code written for the source models expects them.

The global tokens are the model's own business: every hidden state returned has the input's length,
``hidden_states`` has one entry per layer plus the embeddings, the last one is ``last_hidden_state``.
The models are tiny, built from their config classes, and run on the LSG path (inputs longer than
two blocks, not a multiple of the block size, with sparse keys and two global tokens).
"""

import pytest
import torch

from helpers import TINY_CONFIGS, padded_batch
from lsg_converter import ARCHITECTURES

LSG_PATH = dict(block_size=4, sparse_block_size=4, sparsity_factor=2, num_global_tokens=2)
LENGTH = 19  # > 2 blocks and not a multiple of block_size: blocks, sparse keys and the attention's own padding
ENCODER_DECODERS = [arch for arch in ARCHITECTURES if TINY_CONFIGS[arch]().is_encoder_decoder]
ENCODERS = [arch for arch in ARCHITECTURES if arch not in ENCODER_DECODERS]


def tiny_lsg(arch, head="Model", **settings):
    """A tiny random LSG `head` ("Model", "ForMaskedLM", ...) of `arch`, in eval mode; config: LSG_PATH + settings."""
    values = {**TINY_CONFIGS[arch]().to_dict(), **LSG_PATH, **settings}
    for key in ("model_type", "transformers_version"):  # a plain model_type + LSG keys reads as a 2023 checkpoint
        values.pop(key)
    config_class = ARCHITECTURES[arch].config_class()
    config = config_class(**values)
    torch.manual_seed(0)
    head_class = getattr(ARCHITECTURES[arch].modeling_module(), f"LSG{config_class.lsg_base_name()}{head}")
    return head_class(config).eval()


def batch(arch):
    """Two rows of LENGTH and LENGTH - 6 tokens (right padding); decoder inputs for encoder-decoders."""
    input_ids, attention_mask = padded_batch([LENGTH, LENGTH - 6], LENGTH, arch)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask)
    if arch in ENCODER_DECODERS:
        inputs["decoder_input_ids"] = input_ids[:, :5]
    return inputs


def encoder_hidden_states(arch, output):
    return output.encoder_hidden_states if arch in ENCODER_DECODERS else output.hidden_states


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_hidden_states_are_the_embeddings_and_every_layer_at_the_input_length(arch):
    model = tiny_lsg(arch)

    with torch.no_grad():
        hidden_states = encoder_hidden_states(arch, model(**batch(arch), output_hidden_states=True))

    assert len(hidden_states) == model.config.num_hidden_layers + 1
    assert [tuple(state.shape) for state in hidden_states] == [(2, LENGTH, model.config.hidden_size)] * len(hidden_states)


@pytest.mark.parametrize("arch", ENCODERS)
def test_last_hidden_state_is_the_last_of_the_hidden_states(arch):
    model = tiny_lsg(arch)

    with torch.no_grad():
        output = model(**batch(arch), output_hidden_states=True)

    assert torch.equal(output.hidden_states[-1], output.last_hidden_state)


@pytest.mark.parametrize("pass_global_tokens_to_decoder", [False, True])
@pytest.mark.parametrize("arch", ENCODER_DECODERS)
def test_last_encoder_hidden_state_is_the_encoder_output_without_the_global_tokens_it_passes(
    arch, pass_global_tokens_to_decoder
):
    model = tiny_lsg(arch, pass_global_tokens_to_decoder=pass_global_tokens_to_decoder)
    passed = model.config.num_global_tokens if pass_global_tokens_to_decoder else 0  # in front of the decoder's keys

    with torch.no_grad():
        output = model(**batch(arch), output_hidden_states=True)

    assert output.encoder_last_hidden_state.shape[1] == passed + LENGTH
    assert torch.equal(output.encoder_hidden_states[-1], output.encoder_last_hidden_state[:, passed:])


@pytest.mark.parametrize("pool_with_global", [True, False])
def test_each_hidden_state_is_its_layer_state_without_the_global_tokens(pool_with_global):
    model = tiny_lsg("bert", pool_with_global=pool_with_global)
    num_global = model.config.num_global_tokens
    layer_states = []  # what the layers really carry: (B, g + t, E), the first layer's input then every output
    model.encoder.layer[0].register_forward_pre_hook(lambda layer, args: layer_states.append(args[0]))
    for layer in model.encoder.layer:
        layer.register_forward_hook(lambda layer, args, output: layer_states.append(output))

    with torch.no_grad():
        hidden_states = model(**batch("bert"), output_hidden_states=True).hidden_states

    assert len(layer_states) == len(hidden_states)
    for returned, carried in zip(hidden_states, layer_states):
        first_token = carried[:, 0] if pool_with_global else carried[:, num_global]  # global 0 or the token itself
        assert torch.equal(returned[:, 0], first_token)
        assert torch.equal(returned[:, 1:], carried[:, num_global + 1 :])


def test_hidden_states_selected_by_index_are_those_of_the_full_list():
    model = tiny_lsg("bert")
    inputs = batch("bert")

    with torch.no_grad():
        every = model(**inputs, output_hidden_states=True).hidden_states
        selected = model(**inputs, output_hidden_states=[0, -1]).hidden_states

    assert selected[1] is None
    assert torch.equal(selected[0], every[0]) and torch.equal(selected[-1], every[-1])


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_returning_hidden_states_leaves_the_outputs_unchanged(arch):
    model = tiny_lsg(arch)
    inputs = batch(arch)

    with torch.no_grad():
        plain = model(**inputs)
        recording = model(**inputs, output_hidden_states=True)

    assert torch.equal(recording.last_hidden_state, plain.last_hidden_state)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_hidden_states_get_gradients_once_retained(arch):
    model = tiny_lsg(arch)

    output = model(**batch(arch), output_hidden_states=True)
    hidden_states = encoder_hidden_states(arch, output)
    for state in hidden_states:
        state.retain_grad()
    output.last_hidden_state.sum().backward()

    assert all(state.grad is not None and state.grad.abs().sum() > 0 for state in hidden_states)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_encoder_with_return_dict_false_returns_the_tuple_of_its_model_output(arch):
    model = tiny_lsg(arch, pass_global_tokens_to_decoder=False) if arch in ENCODER_DECODERS else tiny_lsg(arch)
    encoder = model.get_encoder() if arch in ENCODER_DECODERS else model
    inputs = {name: batch(arch)[name] for name in ("input_ids", "attention_mask")}

    with torch.no_grad():
        as_tuple = encoder(**inputs, output_hidden_states=True, return_dict=False)
        as_output = encoder(**inputs, output_hidden_states=True)

    assert isinstance(as_tuple, tuple)
    assert torch.equal(as_tuple[0], as_output.last_hidden_state)
    assert all(torch.equal(a, b) for a, b in zip(as_tuple[-1], as_output.hidden_states, strict=True))


def test_a_cached_decoding_step_returns_the_hidden_states_of_its_new_token():
    model = tiny_lsg("bert", "LMHeadModel", is_decoder=True)
    input_ids, attention_mask = padded_batch([LENGTH, LENGTH], LENGTH)

    with torch.no_grad():
        prompt = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=True, output_hidden_states=True)
        step = model(
            input_ids=input_ids[:, -1:],
            attention_mask=torch.cat([attention_mask, attention_mask[:, -1:]], dim=1),
            past_key_values=prompt.past_key_values,
            output_hidden_states=True,
        )

    assert {tuple(state.shape) for state in prompt.hidden_states} == {(2, LENGTH, model.config.hidden_size)}
    assert {tuple(state.shape) for state in step.hidden_states} == {(2, 1, model.config.hidden_size)}


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_the_global_token_table_is_drawn_as_the_model_draws_its_other_embeddings(arch):
    source = TINY_CONFIGS[arch]()
    std_key = "init_std" if hasattr(source, "init_std") else "initializer_range"  # BART-likes name it init_std
    model = tiny_lsg(arch, **{std_key: 0.5})

    global_std = model.lsg_global_embeddings.weight.std().item()
    word_std = model.get_input_embeddings().weight.std().item()

    assert global_std == pytest.approx(word_std, rel=0.1)
