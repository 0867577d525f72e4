"""LSG-MPNet: MPNet's relative position bias reaches every block through the position terms.

The exact checks of issue 23 on tiny random models: the block-local oracle (with no global tokens and
no sparse keys, LSG-MPNet is the SOURCE model run with a block-local attention mask, so each block
gets the dense model's bias), the three backends against each other for every sparsity type with
global tokens, padding invariance, and memory that grows with the length, not its square.
(Equality with the source when one block covers the input, for every head, and remote-code loading
are in test_architectures, which covers every architecture.)
"""

import pytest
import torch
import transformers

from helpers import TINY_CONFIGS, OpRecorder, block_local_mask, padded_batch, save_tiny_source
from lsg_converter import LSGConverter, LSGMPNetConfig, LSGMPNetModel
from lsg_converter.models.lsg_sparse import SPARSITY_TYPES

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

LENGTH = 100
BLOCK = 16


def sharpen(model: torch.nn.Module) -> torch.nn.Module:
    """Scale the tiny random model's queries, keys and position bias up: its attention is then far from
    uniform, so that the bias, the blocks and the padding make a difference the tests can see."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("attn.q.weight", "attn.k.weight")):
                parameter.mul_(4)
            if name.endswith("relative_attention_bias.weight"):
                parameter.normal_(std=2)
    return model


def lsg_mpnet(**settings) -> LSGMPNetModel:
    values = {**TINY_CONFIGS["mpnet"]().to_dict(), "max_position_embeddings": 1026, **settings}
    for key in ("model_type", "transformers_version"):
        values.pop(key)
    torch.manual_seed(0)
    return sharpen(LSGMPNetModel(LSGMPNetConfig(**values))).eval()


def sharp_source(folder, head: str) -> transformers.PreTrainedModel:
    """A tiny random MPNet `head`, sharpened, saved into `folder` (and returned)."""
    source = sharpen(getattr(transformers, head).from_pretrained(save_tiny_source(folder, "mpnet", head))).eval()
    source.save_pretrained(folder)
    return source


@pytest.mark.parametrize("head", ["MPNetModel", "MPNetForMaskedLM", "MPNetForSequenceClassification"])
@pytest.mark.parametrize("backend", ["sdpa", "eager", "flex_attention"])
def test_without_global_tokens_or_sparse_keys_it_is_the_source_with_a_block_local_mask(head, backend, tmp_path):
    source = sharp_source(tmp_path / "source", head)
    model, _ = LSGConverter(max_sequence_length=512).convert_from_pretrained(
        str(tmp_path / "source"), num_global_tokens=0, block_size=BLOCK, sparsity_type="none"
    )
    model.eval().set_attn_implementation(backend)
    input_ids, attention_mask = padded_batch([LENGTH, 70], LENGTH, "mpnet")

    with torch.no_grad():
        output = model(input_ids=input_ids, attention_mask=attention_mask)[0]
        oracle = source(input_ids=input_ids, attention_mask=block_local_mask(attention_mask, BLOCK))[0]
        dense = source(input_ids=input_ids, attention_mask=attention_mask)[0]

    real = attention_mask.bool()[..., None] if output.dim() == 3 else torch.ones_like(output, dtype=torch.bool)
    torch.testing.assert_close(output * real, oracle * real, atol=1e-5, rtol=0)
    # the oracle differs from dense attention far more than from LSG: the check bites
    assert ((output - dense) * real).abs().max() > 10 * ((output - oracle) * real).abs().max().clamp(min=1e-7)


@pytest.mark.parametrize("sparsity_type", SPARSITY_TYPES)
def test_every_backend_gives_the_same_output_with_global_tokens_and_sparse_keys(sparsity_type):
    model = lsg_mpnet(block_size=BLOCK, sparse_block_size=BLOCK, sparsity_type=sparsity_type, num_global_tokens=2)
    input_ids, attention_mask = padded_batch([LENGTH, 70], LENGTH, "mpnet")
    outputs = {}
    for backend in ("sdpa", "eager", "flex_attention"):
        model.set_attn_implementation(backend)
        with torch.no_grad():
            outputs[backend] = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    torch.testing.assert_close(outputs["eager"], outputs["sdpa"], atol=1e-5, rtol=0)
    torch.testing.assert_close(outputs["flex_attention"], outputs["sdpa"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("sparsity_type", ["norm", "pooling", "lsh"])
def test_a_padded_row_equals_the_same_row_alone(sparsity_type):
    model = lsg_mpnet(block_size=BLOCK, sparse_block_size=BLOCK, sparsity_type=sparsity_type, num_global_tokens=2)
    input_ids, attention_mask = padded_batch([LENGTH, 70], LENGTH, "mpnet")

    with torch.no_grad():
        batched = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        alone = model(input_ids=input_ids[1:, :70], attention_mask=attention_mask[1:, :70]).last_hidden_state

    torch.testing.assert_close(batched[1, :70], alone[0], atol=1e-5, rtol=0)


def test_the_relative_position_bias_changes_the_output():
    model = lsg_mpnet(block_size=BLOCK, sparse_block_size=BLOCK, num_global_tokens=1)
    input_ids, attention_mask = padded_batch([LENGTH], LENGTH, "mpnet")
    with torch.no_grad():
        with_bias = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        model.encoder.relative_attention_bias.weight.zero_()
        without_bias = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    assert (with_bias - without_bias).abs().max() > 1e-3


def test_hidden_states_and_attentions_leave_the_global_tokens_out():
    model = lsg_mpnet(block_size=BLOCK, sparse_block_size=BLOCK, num_global_tokens=2)
    model.set_attn_implementation("eager")
    input_ids, attention_mask = padded_batch([LENGTH, 70], LENGTH, "mpnet")
    with torch.no_grad():
        output = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, output_attentions=True)

    assert [tuple(state.shape) for state in output.hidden_states] == [(2, LENGTH, 32)] * 3
    torch.testing.assert_close(output.hidden_states[-1], output.last_hidden_state)
    assert [tuple(weights.shape) for weights in output.attentions] == [(2, 4, LENGTH, LENGTH)] * 2


def test_a_global_token_position_that_is_not_an_integer_is_refused():
    with pytest.raises(ValueError, match="global_token_position=0.5 is not an integer"):
        lsg_mpnet(global_token_position=0.5)


def test_no_tensor_grows_with_the_square_of_the_length():
    model = lsg_mpnet(block_size=BLOCK, sparse_block_size=BLOCK, num_global_tokens=1)

    def largest_tensor(length):
        input_ids, attention_mask = padded_batch([length], length, "mpnet")
        with torch.no_grad(), OpRecorder() as ops:
            model(input_ids=input_ids, attention_mask=attention_mask)
        return ops.largest

    assert largest_tensor(1024) <= 2.1 * largest_tensor(512)
