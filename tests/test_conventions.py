"""transformers' conventions on the outputs of LSG models, as code written for the source models expects them.

The global tokens are the model's own business: every hidden state returned has the input's length,
``hidden_states`` has one entry per layer plus the embeddings, the last one is ``last_hidden_state``.
The models are tiny, built from their config classes, and run on the LSG path (inputs longer than
two blocks, not a multiple of the block size, with sparse keys and two global tokens).
"""

import copy
import logging

import pytest
import torch

from helpers import TINY_CONFIGS, padded_batch
from lsg_converter import ARCHITECTURES
from lsg_converter.models.lsg_attention import DEFAULT_BACKEND, lsg_backend

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


# --------------------------------------------------------------------------------------------------
# Attentions and attn_implementation
# --------------------------------------------------------------------------------------------------

IMPLEMENTATIONS = ["eager", "sdpa", "flex_attention"]


def encoder_attentions(arch, output):
    return output.encoder_attentions if arch in ENCODER_DECODERS else output.attentions


def main_output(arch, output):
    return output.last_hidden_state


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_attentions_are_one_per_layer_of_batch_heads_length_length(arch):
    model = tiny_lsg(arch, attn_implementation="eager")

    with torch.no_grad():
        attentions = encoder_attentions(arch, model(**batch(arch), output_attentions=True))

    heads = model.config.num_attention_heads
    assert [tuple(weights.shape) for weights in attentions] == [(2, heads, LENGTH, LENGTH)] * model.config.num_hidden_layers


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_eager_gives_the_outputs_of_sdpa(arch):
    model = tiny_lsg(arch, attn_implementation="sdpa")
    inputs = batch(arch)
    real = inputs["attention_mask"].bool() if arch in ENCODERS else slice(None)

    with torch.no_grad():
        sdpa = main_output(arch, model(**inputs))
        model.set_attn_implementation("eager")
        eager = main_output(arch, model(**inputs, output_attentions=True))

    torch.testing.assert_close(eager[real], sdpa[real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_attentions_get_gradients_once_retained(arch):
    model = tiny_lsg(arch, attn_implementation="eager")

    output = model(**batch(arch), output_attentions=True)
    attentions = encoder_attentions(arch, output)[0]
    attentions.retain_grad()
    main_output(arch, output).flatten()[0].backward()

    assert attentions.grad is not None


def test_attentions_of_the_global_tokens_are_left_out_and_rows_keep_the_tokens_share():
    model = tiny_lsg("bert", attn_implementation="eager", sparsity_type="none")
    inputs = batch("bert")

    with torch.no_grad():
        attentions = model(**inputs, output_attentions=True).attentions[0]

    row_sums = attentions.sum(dim=-1)[inputs["attention_mask"].bool()[:, None, :].expand(-1, 4, -1)]
    assert (row_sums < 1).all() and (row_sums > 0).all()  # the rest went to the 2 global tokens
    block = torch.arange(LENGTH) // LSG_PATH["block_size"]
    outside = (block[:, None] - block[None, :]).abs() > 1
    assert (attentions[:, :, outside] == 0).all()


def test_a_config_that_asks_for_attentions_and_eager_returns_them():
    model = tiny_lsg("bert", attn_implementation="eager", output_attentions=True)

    with torch.no_grad():
        output = model(**batch("bert"))

    assert len(output.attentions) == 2


def test_output_attentions_without_eager_says_how_to_get_them_and_returns_none(caplog):
    model = tiny_lsg("bert", attn_implementation="sdpa")
    logging.Logger.warning_once.cache_clear()

    with caplog.at_level("WARNING", logger="lsg_converter"), torch.no_grad():
        output = model(**batch("bert"), output_attentions=True)

    assert output.attentions == ()
    assert "model.set_attn_implementation('eager') for output_attentions=True" in caplog.text


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_attn_implementation_reads_back_as_chosen_in_the_config_from_pretrained_and_after_a_switch(tmp_path, implementation):
    model = tiny_lsg("bert", "ForMaskedLM", attn_implementation=implementation)
    assert lsg_backend(model.config._attn_implementation) == implementation
    model.save_pretrained(tmp_path)

    loaded = type(model).from_pretrained(tmp_path, attn_implementation=implementation)
    other = "sdpa" if implementation != "sdpa" else "eager"
    loaded.set_attn_implementation(other)

    assert lsg_backend(loaded.bert.config._attn_implementation) == other


def test_attn_implementation_left_unset_reads_back_as_transformers_default_and_runs_the_default_chosen_per_call():
    model = tiny_lsg("bert")

    assert model.config._attn_implementation == "sdpa"
    assert lsg_backend(model.encoder.layer[0].attention.self.config._attn_implementation) == DEFAULT_BACKEND


def test_flash_attention_is_refused_naming_the_valid_implementations():
    with pytest.raises(ValueError, match='"eager", "sdpa", "flex_attention"'):
        tiny_lsg("bert").set_attn_implementation("flash_attention_2")


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_the_lsg_layers_receive_a_padding_mask_of_one_row_whatever_the_implementation(implementation):
    model = tiny_lsg("bert", attn_implementation=implementation)
    masks = []
    for layer in model.encoder.layer:
        layer.attention.self.register_forward_pre_hook(
            lambda module, args, kwargs: masks.append(kwargs["attention_mask"]), with_kwargs=True
        )

    with torch.no_grad():
        model(**batch("bert"))

    num_global = model.config.num_global_tokens
    assert [tuple(mask.shape) for mask in masks] == [(2, 1, 1, num_global + LENGTH)] * 2


def test_the_padding_mask_gains_the_global_tokens_columns_where_they_join():
    model = tiny_lsg("bert")
    masks = []
    model.encoder.layer[0].attention.self.register_forward_pre_hook(
        lambda module, args, kwargs: masks.append(kwargs["attention_mask"]), with_kwargs=True
    )
    inputs = batch("bert")

    with torch.no_grad():
        model(**inputs)

    num_global = model.config.num_global_tokens
    rows = masks[0][:, 0, 0]
    assert rows[:, :num_global].all() and torch.equal(rows[:, num_global:], inputs["attention_mask"].bool())


@pytest.mark.parametrize("form", ["bool", "additive"])
def test_a_padding_mask_given_with_unit_dimensions_reads_as_its_rows(form):
    model = tiny_lsg("bert")
    inputs = batch("bert")
    mask = inputs["attention_mask"][:, None, None, :]
    if form == "additive":
        mask = (1.0 - mask.float()) * torch.finfo(torch.float32).min
    else:
        mask = mask.bool()

    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
        output = model(input_ids=inputs["input_ids"], attention_mask=mask).last_hidden_state

    torch.testing.assert_close(output, expected, atol=0, rtol=0)


def test_a_mask_of_every_query_and_key_is_refused_with_what_to_pass():
    model = tiny_lsg("bert")
    inputs = batch("bert")
    full_mask = inputs["attention_mask"].bool()[:, None, None, :].expand(-1, 1, LENGTH, -1)

    with pytest.raises(ValueError, match=r"pass attention_mask as a 2D tensor of 1s \(tokens\) and 0s \(padding\)"):
        model(input_ids=inputs["input_ids"], attention_mask=full_mask)


def test_a_copied_model_switches_its_own_layers_only():
    model = tiny_lsg("bert", attn_implementation="sdpa")
    copied = copy.deepcopy(model)

    copied.set_attn_implementation("eager")
    with torch.no_grad():
        copied_attentions = copied(**batch("bert"), output_attentions=True).attentions
        original_attentions = model(**batch("bert"), output_attentions=True).attentions

    assert lsg_backend(model.config._attn_implementation) == "sdpa"
    assert len(copied_attentions) == 2 and original_attentions == ()


@pytest.mark.parametrize("pass_global_tokens_to_decoder", [False, True])
def test_the_decoder_of_an_encoder_decoder_runs_the_chosen_implementation_over_the_input_tokens(pass_global_tokens_to_decoder):
    model = tiny_lsg("bart", attn_implementation="eager", pass_global_tokens_to_decoder=pass_global_tokens_to_decoder)
    inputs = batch("bart")

    with torch.no_grad():
        output = model(**inputs, output_attentions=True)

    assert [tuple(weights.shape) for weights in output.decoder_attentions] == [(2, 4, 5, 5)] * 2
    assert [tuple(weights.shape) for weights in output.cross_attentions] == [(2, 4, 5, LENGTH)] * 2
    second_row = output.cross_attentions[0][1]  # column j is input token j; 6 padding tokens at the end
    assert (second_row[..., -6:] == 0).all() and (second_row[..., :-6] > 0).all()


def test_cross_attentions_get_gradients_once_retained():
    model = tiny_lsg("bart", attn_implementation="eager", pass_global_tokens_to_decoder=True)

    output = model(**batch("bart"), output_attentions=True)
    cross_attentions = output.cross_attentions[0]
    cross_attentions.retain_grad()
    output.last_hidden_state.flatten()[0].backward()

    assert cross_attentions.grad is not None


def test_cached_generation_gives_the_same_tokens_on_eager_and_sdpa():
    model = tiny_lsg("bert", "LMHeadModel", is_decoder=True, sparsity_type="pooling", attn_implementation="sdpa")
    input_ids = batch("bert")["input_ids"][:1]
    settings = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False, use_cache=True)

    sdpa = model.generate(input_ids=input_ids, **settings)
    model.set_attn_implementation("eager")

    assert torch.equal(model.generate(input_ids=input_ids, **settings), sdpa)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_calling_forward_directly_gives_what_calling_the_model_gives(implementation):
    """sentence-transformers calls model.forward(...) rather than model(...)."""
    model = tiny_lsg("bert", attn_implementation=implementation)

    with torch.no_grad():
        called = model(**batch("bert"), output_hidden_states=True)
        direct = model.forward(**batch("bert"), output_hidden_states=True)

    torch.testing.assert_close(direct.last_hidden_state, called.last_hidden_state, atol=0, rtol=0)
    assert [state.shape for state in direct.hidden_states] == [state.shape for state in called.hidden_states]


def test_a_copied_model_runs_its_own_weights():
    model = tiny_lsg("bert")
    copied = copy.deepcopy(model)
    with torch.no_grad():
        copied.encoder.layer[0].attention.self.query.weight.mul_(2)

        original_output = model(**batch("bert")).last_hidden_state
        copied_output = copied(**batch("bert")).last_hidden_state

    assert not torch.allclose(original_output, copied_output)
    torch.testing.assert_close(model(**batch("bert")).last_hidden_state, original_output, atol=0, rtol=0)


@pytest.mark.parametrize("arch", ["bert", "bart"])
def test_the_model_exports_with_torch_export_and_gives_its_outputs(arch):
    model = tiny_lsg(arch)
    inputs = {**batch(arch), "use_cache": False} if arch in ENCODER_DECODERS else batch(arch)  # a cache is no tensor

    with torch.no_grad():
        expected = main_output(arch, model(**inputs))
        program = torch.export.export(model, args=(), kwargs=inputs, strict=False)
        exported = main_output(arch, program.module()(**inputs))

    torch.testing.assert_close(exported, expected, atol=1e-5, rtol=1e-5)


# The models whose recorder is the model itself (LSGBertModel: steps in its forward), a module inside it
# (the bert of LSGBertForMaskedLM: steps as its hooks) and an encoder holding its own embeddings (BART's).
RECORDERS = [("bert", "Model"), ("bert", "ForMaskedLM"), ("bart", "Model")]


def first_layer(model):
    """The first layer the recorder records as a hidden state."""
    return next(module for name, module in model.named_modules() if name.endswith(("encoder.layer.0", "encoder.layers.0")))


def main_rows(output):
    """What a model returns first (last_hidden_state or logits) and its hidden states."""
    hidden_states = output.encoder_hidden_states if "encoder_hidden_states" in output else output.hidden_states
    return output[0], hidden_states


@pytest.mark.parametrize("arch, head", RECORDERS)
def test_a_forward_pass_that_raised_leaves_the_next_one_as_a_fresh_model_runs_it(arch, head):
    model = tiny_lsg(arch, head)
    with torch.no_grad():
        expected = main_rows(model(**batch(arch), output_hidden_states=True))

    def fail(module, args, output):
        raise RuntimeError("failed inside the forward pass")

    handle = first_layer(model).register_forward_hook(fail)
    with pytest.raises(RuntimeError, match="failed inside"), torch.no_grad():
        model(**batch(arch), output_hidden_states=True, return_dict=False)
    handle.remove()
    with torch.no_grad():
        output = main_rows(model(**batch(arch), output_hidden_states=True))

    torch.testing.assert_close(output, expected, atol=0, rtol=0)


def test_a_forward_pass_that_raised_leaves_no_call_open():
    model = tiny_lsg("bert")
    long_input = torch.ones(1, model.config.max_position_embeddings + 1, dtype=torch.long)

    with pytest.raises(ValueError, match="more than"), torch.no_grad():
        model(input_ids=long_input, output_hidden_states=True)

    assert model.lsg_forward_steps.global_tokens.call is None


def test_an_input_refused_by_the_encoder_leaves_the_next_forward_pass_as_it_was():
    """BART's encoder holds its embeddings: the length check refuses the input in the encoder's own pre-hooks."""
    model = tiny_lsg("bart")
    with torch.no_grad():
        expected = main_rows(model(**batch("bart"), output_hidden_states=True))
    long_input = torch.ones(1, model.config.max_position_embeddings + 1, dtype=torch.long)

    with pytest.raises(ValueError, match="more than"), torch.no_grad():
        model(input_ids=long_input, decoder_input_ids=long_input[:, :3], output_hidden_states=True)
    with torch.no_grad():
        output = main_rows(model(**batch("bart"), output_hidden_states=True))

    torch.testing.assert_close(output, expected, atol=0, rtol=0)


@pytest.mark.parametrize("arch, head", RECORDERS)
def test_a_forward_pass_run_from_inside_another_leaves_the_outer_one_its_own_state(arch, head):
    """A hook that runs the model on other inputs, without hidden states, in the middle of a pass that returns them."""
    model = tiny_lsg(arch, head)
    with torch.no_grad():
        expected = main_rows(model(**batch(arch), output_hidden_states=True))
    other = {name: tensor[:1, :11] for name, tensor in batch(arch).items()}
    nested = []

    def run_nested(module, args, output):
        if not nested:  # the nested pass runs this hook too
            nested.append("running")
            nested[0] = model(**other, return_dict=False)

    handle = first_layer(model).register_forward_hook(run_nested)
    with torch.no_grad():
        output = main_rows(model(**batch(arch), output_hidden_states=True))
    handle.remove()

    torch.testing.assert_close(output, expected, atol=0, rtol=0)
    assert isinstance(nested[0], tuple) and nested[0][0].shape[:2] == (1, 5 if arch == "bart" else 11)
