"""A padded batch of very different lengths, read without gradients by an encoder base model, runs as
groups of rows truncated to their own lengths (lsg_recorder.LengthGroups): each real token gets the output
it gets in one pass, and the layers run on the groups' tokens only (issue 35's mixed-padding case)."""

import pytest
import torch

from helpers import TINY_CONFIGS, padded_batch, save_tiny_source
from lsg_converter import ARCHITECTURES, LSGConverter
from lsg_converter.models.lsg_sparse import SPARSITY_TYPES

ENCODERS = [arch for arch in ARCHITECTURES if not TINY_CONFIGS[arch]().is_encoder_decoder]
LENGTHS, TOTAL = [400, 60, 150, 50], 400  # groups: [400], [150], [60, 50]
GROUP_TOKENS = [(1, 400), (1, 150), (2, 60)]  # (rows, length) of each group


def base_model(arch, tmp_path, head=None, **settings):
    """The tiny `arch` source's base model (or `head`) converted (block 16, 2 global tokens unless `settings` say)."""
    head = head or next(head for head in ARCHITECTURES[arch].heads if head.endswith("Model") and "LMHead" not in head)
    source = save_tiny_source(tmp_path / arch, arch, head)
    settings = {"block_size": 16, "sparse_block_size": 16, "num_global_tokens": 2, **settings}
    model, _ = LSGConverter(max_sequence_length=512).convert_from_pretrained(source, **settings)
    return model.eval()


def assert_each_row_gets_its_output_alone(model, arch):
    """The mixed batch's real tokens against each row run alone, truncated to its length."""
    input_ids, attention_mask = padded_batch(LENGTHS, TOTAL, arch)

    with torch.no_grad():
        batch = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        for row, length in enumerate(LENGTHS):
            alone = model(input_ids=input_ids[row : row + 1, :length]).last_hidden_state[0]
            torch.testing.assert_close(batch[row, :length], alone, atol=1e-5, rtol=1e-5)


def layer_inputs(model, inputs):
    """(rows, tokens) of every output of the first feed-forward layer during one forward (in the caller's grad mode)."""
    first = next(module for name, module in model.named_modules() if name.endswith(("intermediate", "ffn", "ff", "mlp")))
    shapes = []
    handle = first.register_forward_hook(lambda module, args, output: shapes.append(tuple(output.shape[:2])))
    try:
        output = model(**inputs)
    finally:
        handle.remove()
    return output, shapes


@pytest.mark.parametrize("arch", ENCODERS)
def test_each_row_of_a_batch_of_very_different_lengths_gets_its_output_alone(arch, tmp_path):
    assert_each_row_gets_its_output_alone(base_model(arch, tmp_path), arch)


@pytest.mark.parametrize("sparsity_type", SPARSITY_TYPES)
def test_every_sparsity_type_gives_each_row_its_output_alone(sparsity_type, tmp_path):
    assert_each_row_gets_its_output_alone(base_model("bert", tmp_path, sparsity_type=sparsity_type, sparsity_factor=4), "bert")


@pytest.mark.parametrize("arch", ENCODERS)
def test_the_layers_of_a_batch_of_very_different_lengths_run_on_each_group_s_own_length(arch, tmp_path):
    model = base_model(arch, tmp_path)
    input_ids, attention_mask = padded_batch(LENGTHS, TOTAL, arch)

    with torch.no_grad():
        _, shapes = layer_inputs(model, dict(input_ids=input_ids, attention_mask=attention_mask))

    assert set(shapes) == {(rows, length + model.config.num_global_tokens) for rows, length in GROUP_TOKENS}


def test_hidden_states_and_pooler_output_come_back_in_the_batch_s_row_order(tmp_path):
    model = base_model("bert", tmp_path)
    input_ids, attention_mask = padded_batch(LENGTHS, TOTAL)

    with torch.no_grad():
        batch = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        alone = [model(input_ids=input_ids[row : row + 1, :length], output_hidden_states=True)
                 for row, length in enumerate(LENGTHS)]

    assert len(batch.hidden_states) == model.config.num_hidden_layers + 1
    for row, (output, length) in enumerate(zip(alone, LENGTHS)):
        torch.testing.assert_close(batch.pooler_output[row], output.pooler_output[0], atol=1e-5, rtol=1e-5)
        for batch_state, state in zip(batch.hidden_states, output.hidden_states):
            assert batch_state.shape[:2] == (len(LENGTHS), TOTAL)
            torch.testing.assert_close(batch_state[row, :length], state[0], atol=1e-5, rtol=1e-5)


def test_padding_past_a_group_s_length_gets_zeros(tmp_path):
    model = base_model("bert", tmp_path)
    input_ids, attention_mask = padded_batch(LENGTHS, TOTAL)

    with torch.no_grad():
        output = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    for row, group_length in [(1, 60), (2, 150), (3, 60)]:
        assert not output[row, group_length:].any()


@pytest.mark.parametrize("case", ["left padding", "gradients", "train mode", "attention weights", "tuple"])
def test_a_batch_runs_in_one_pass_where_groups_could_differ(case, tmp_path):
    model = base_model("bert", tmp_path)
    input_ids, attention_mask = padded_batch(LENGTHS, TOTAL)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask)
    if case == "left padding":
        inputs = {name: value.flip(1) for name, value in inputs.items()}
    if case == "train mode":
        model.train()
    if case == "attention weights":
        model.set_attn_implementation("eager")
        inputs["output_attentions"] = True
    if case == "tuple":
        inputs["return_dict"] = False

    with torch.enable_grad() if case == "gradients" else torch.no_grad():
        _, shapes = layer_inputs(model, inputs)

    assert set(shapes) == {(len(LENGTHS), TOTAL + model.config.num_global_tokens)}


def test_a_head_runs_a_batch_of_very_different_lengths_as_groups_too(tmp_path):
    """The recorder inside a head (its bert) runs the same steps as the bare model, LengthGroups included."""
    model = base_model("bert", tmp_path, head="BertForMaskedLM")
    input_ids, attention_mask = padded_batch(LENGTHS, TOTAL)

    with torch.no_grad():
        output, shapes = layer_inputs(model, dict(input_ids=input_ids, attention_mask=attention_mask))
        for row, length in enumerate(LENGTHS):
            alone = model(input_ids=input_ids[row : row + 1, :length]).logits[0]
            torch.testing.assert_close(output.logits[row, :length], alone, atol=1e-5, rtol=1e-5)

    assert set(shapes) == {(rows, length + model.config.num_global_tokens) for rows, length in GROUP_TOKENS}
