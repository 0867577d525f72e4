"""LSG-DeBERTa-v2: DeBERTa's c2p and p2c terms reach every block through the position terms.

The exact checks of issue 26 on two tiny random models: a v3-like one (shared, normalised relative
embeddings in log buckets, no absolute positions) and a v2-like one (absolute positions, raw relative
distances, separate position projections, the ConvLayer after the first layer). The block-local
oracle: with no global tokens and no sparse keys, LSG-DeBERTa is the SOURCE model run with a
block-local (B, L, L) attention mask, so each block gets the dense model's c2p and p2c terms. Then the
three backends against each other for every sparsity type with global tokens, padding invariance,
and memory that grows with the length, not its square. (Equality with the source when one block
covers the input, for every head, and remote-code loading are in test_architectures.)
"""

import contextlib

import pytest
import torch
import transformers
from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

from helpers import TINY_CONFIGS, TINY_LENGTH, VOCAB, OpRecorder, padded_batch
from lsg_converter import LSGConverter, LSGDebertaV2Config, LSGDebertaV2Model
from lsg_converter.models.lsg_sparse import SPARSITY_TYPES
from lsg_converter.models.modeling_lsg_deberta_v2 import column_of, relative_embedding_columns
from lsg_converter.positions import tiled_position_rows

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

LENGTH = 100
BLOCK = 16
HEADS = [
    "DebertaV2Model",
    "DebertaV2ForMaskedLM",
    "DebertaV2ForSequenceClassification",
    "DebertaV2ForTokenClassification",
    "DebertaV2ForQuestionAnswering",
    "DebertaV2ForMultipleChoice",
]
# v3: TINY_CONFIGS["deberta-v2"] as it is. v2: absolute positions and token types, relative distances
# without buckets (up to max_position_embeddings), pos_key_proj / pos_query_proj, a ConvLayer.
VARIANTS = {
    "v3": {},
    "v2": dict(
        position_biased_input=True, position_buckets=-1, norm_rel_ebd="none", share_att_key=False,
        conv_kernel_size=3, type_vocab_size=2,
    ),
}


def tiny_config(variant: str) -> transformers.DebertaV2Config:
    config = TINY_CONFIGS["deberta-v2"]()
    config.update(VARIANTS[variant])
    return config


def sharpen(model: torch.nn.Module) -> torch.nn.Module:
    """Scale the tiny random model's content and position projections up: its attention is then far
    from uniform, so that c2p, p2c, the blocks and the padding make a difference the tests can see."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("query_proj.weight", "key_proj.weight", "pos_key_proj.weight", "pos_query_proj.weight")):
                parameter.mul_(4)
    return model


def sharp_source(folder, variant: str, head: str) -> transformers.PreTrainedModel:
    """A tiny random DeBERTa `head` of `variant`, sharpened, saved into `folder` (and returned)."""
    config = tiny_config(variant)
    config.num_labels = 2 if head.endswith("QuestionAnswering") else 3
    torch.manual_seed(0)
    source = sharpen(getattr(transformers, head)(config)).eval()
    source.save_pretrained(folder)
    return source


def lsg_deberta(variant: str, **settings) -> LSGDebertaV2Model:
    values = {**tiny_config(variant).to_dict(), "max_position_embeddings": 1024, **settings}
    for key in ("model_type", "transformers_version"):
        values.pop(key)
    torch.manual_seed(0)
    return sharpen(LSGDebertaV2Model(LSGDebertaV2Config(**values))).eval()


def head_inputs(head: str, lengths=(LENGTH, 70), total=LENGTH) -> dict[str, torch.Tensor]:
    input_ids, attention_mask = padded_batch(list(lengths), total, "deberta-v2")
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask)
    if head.endswith("ForMultipleChoice"):
        inputs = {name: tensor[:, None].repeat(1, 2, 1) for name, tensor in inputs.items()}
    return inputs


@contextlib.contextmanager
def block_local_attention(source: transformers.PreTrainedModel, block: int):
    """Run `source` with a block-local attention mask: its encoder takes a (B, L, L) mask, built here from
    the (B, L) padding mask it is given: query q sees key k iff |q // b - k // b| <= 1 and k is a token.
    (The source's ConvLayer cannot take the bool token mask its encoder derives from a 3D mask, as
    torch has no 1 - bool: it gets the same mask as 0s and 1s.)"""

    def local_mask(encoder, args, kwargs):
        hidden_states, padding = args[:2]
        position = torch.arange(padding.shape[1])
        local = (position[:, None] // block - position[None, :] // block).abs() <= 1
        return (hidden_states, (local[None] & padding.bool()[:, None, :]).long(), *args[2:]), kwargs

    def integer_mask(conv, args):
        return (*args[:2], args[2].long())

    encoder = source.base_model.encoder
    handles = [encoder.register_forward_pre_hook(local_mask, with_kwargs=True)]
    if encoder.conv is not None:
        handles.append(encoder.conv.register_forward_pre_hook(integer_mask))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def token_rows(output: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The rows of real tokens of a per-token output (all of a per-sequence one)."""
    if output.shape[: attention_mask.dim()] == attention_mask.shape:
        return output[attention_mask.bool()]
    return output


@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("backend", ["sdpa", "eager", "flex_attention"])
def test_without_global_tokens_or_sparse_keys_it_is_the_source_with_a_block_local_mask(backend, variant, head, tmp_path):
    source = sharp_source(tmp_path / "source", variant, head)
    model, _ = LSGConverter(max_sequence_length=1024).convert_from_pretrained(
        str(tmp_path / "source"), num_global_tokens=0, block_size=BLOCK, sparsity_type="none"
    )
    model.eval().set_attn_implementation(backend)
    inputs = head_inputs(head)

    with torch.no_grad():
        output = model(**inputs)[0]
        with block_local_attention(source, BLOCK):
            oracle = source(**inputs)[0]
        dense = source(**inputs)[0]

    output, oracle, dense = (token_rows(x, inputs["attention_mask"]) for x in (output, oracle, dense))
    torch.testing.assert_close(output, oracle, atol=1e-5, rtol=0)
    # the oracle differs from dense attention far more than from LSG: the check bites
    assert (output - dense).abs().max() > 10 * (output - oracle).abs().max().clamp(min=1e-7)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_hidden_state_equals_the_source_s_the_conv_output_included(variant, tmp_path):
    sharp_source(tmp_path / "source", variant, "DebertaV2Model")
    source = transformers.DebertaV2Model.from_pretrained(tmp_path / "source").eval()
    model, _ = LSGConverter(max_sequence_length=1024).convert_from_pretrained(
        str(tmp_path / "source"), num_global_tokens=0, block_size=64, sparsity_type="none"
    )
    inputs = head_inputs("DebertaV2Model")

    with torch.no_grad():
        expected = source(**inputs, output_hidden_states=True).hidden_states
        output = model(**inputs, output_hidden_states=True).hidden_states

    assert len(output) == len(expected) == 3
    for lsg, dense in zip(output, expected):
        torch.testing.assert_close(token_rows(lsg, inputs["attention_mask"]), token_rows(dense, inputs["attention_mask"]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("sparsity_type", SPARSITY_TYPES)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_backend_gives_the_same_output_with_global_tokens_and_sparse_keys(variant, sparsity_type):
    model = lsg_deberta(variant, block_size=BLOCK, sparse_block_size=BLOCK, sparsity_type=sparsity_type, num_global_tokens=2)
    inputs = head_inputs("DebertaV2Model")
    outputs = {}
    for backend in ("sdpa", "eager", "flex_attention"):
        model.set_attn_implementation(backend)
        with torch.no_grad():
            outputs[backend] = model(**inputs).last_hidden_state

    torch.testing.assert_close(outputs["eager"], outputs["sdpa"], atol=1e-5, rtol=0)
    torch.testing.assert_close(outputs["flex_attention"], outputs["sdpa"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("sparsity_type", ["norm", "pooling", "lsh"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_padded_row_equals_the_same_row_alone(variant, sparsity_type):
    model = lsg_deberta(variant, block_size=BLOCK, sparse_block_size=BLOCK, sparsity_type=sparsity_type, num_global_tokens=2)
    inputs = head_inputs("DebertaV2Model")

    with torch.no_grad():
        batched = model(**inputs).last_hidden_state
        alone = model(**{name: tensor[1:, :70] for name, tensor in inputs.items()}).last_hidden_state

    torch.testing.assert_close(batched[1, :70], alone[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("span,buckets,max_position", [(256, 256, 512), (512, -1, 512), (16, 16, 128)])
def test_the_column_of_every_distance_is_the_one_c2p_and_p2c_read_in_the_source(span, buckets, max_position):
    relative = torch.arange(-20_000, 20_001)  # key position - query position

    def bucket(distance):
        if buckets > 0:
            return make_log_bucket_position(distance, buckets, max_position).long()
        return distance

    columns, reach = relative_embedding_columns(span, buckets, max_position, relative.device)
    looked_up = column_of(relative, columns, reach)

    assert torch.equal(looked_up, (bucket(-relative) + span).clamp(0, 2 * span - 1))  # c2p: bucket(query - key)
    assert torch.equal(looked_up, (-bucket(relative) + span).clamp(0, 2 * span - 1))  # p2c: -bucket(key - query)


@pytest.mark.parametrize("position_term", ["c2p", "p2c"])
def test_each_position_term_changes_the_output(position_term):
    model = lsg_deberta("v3", block_size=BLOCK, sparse_block_size=BLOCK, num_global_tokens=1)
    inputs = head_inputs("DebertaV2Model")
    with torch.no_grad():
        both = model(**inputs).last_hidden_state
        for layer in model.encoder.layer:
            layer.attention.self.pos_att_type = [term for term in ("c2p", "p2c") if term != position_term]
        without = model(**inputs).last_hidden_state

    assert (both - without).abs().max() > 1e-3


def test_hidden_states_and_attentions_leave_the_global_tokens_out():
    model = lsg_deberta("v2", block_size=BLOCK, sparse_block_size=BLOCK, num_global_tokens=2)
    model.set_attn_implementation("eager")
    inputs = head_inputs("DebertaV2Model")
    with torch.no_grad():
        output = model(**inputs, output_hidden_states=True, output_attentions=True)

    assert [tuple(state.shape) for state in output.hidden_states] == [(2, LENGTH, 32)] * 3
    torch.testing.assert_close(output.hidden_states[-1], output.last_hidden_state)
    assert [tuple(weights.shape) for weights in output.attentions] == [(2, 4, LENGTH, LENGTH)] * 2


def test_the_relative_reach_stays_the_source_s_when_the_length_grows(tmp_path):
    sharp_source(tmp_path / "source", "v3", "DebertaV2Model")  # max_relative_positions=-1: 128, its length
    model, _ = LSGConverter(max_sequence_length=1024).convert_from_pretrained(str(tmp_path / "source"))
    model.save_pretrained(tmp_path / "converted")
    reloaded = LSGDebertaV2Model.from_pretrained(tmp_path / "converted")

    assert reloaded.config.max_position_embeddings == 1024
    assert reloaded.config.max_relative_positions == TINY_LENGTH
    assert {layer.attention.self.max_relative_positions for layer in reloaded.encoder.layer} == {TINY_LENGTH}


def test_v3_has_no_position_table_and_its_global_tokens_are_the_first_and_mask_embeddings(tmp_path):
    sharp_source(tmp_path / "source", "v3", "DebertaV2Model")
    pieces = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]", *(f"w{index}" for index in range(5, VOCAB))]
    transformers.DebertaV2Tokenizer(vocab=[(piece, 0.0) for piece in pieces]).save_pretrained(tmp_path / "source")
    model, tokenizer = LSGConverter(max_sequence_length=1024).convert_from_pretrained(
        str(tmp_path / "source"), num_global_tokens=3
    )
    words = model.embeddings.word_embeddings.weight

    assert model.embeddings.position_embeddings is None
    assert (tokenizer.cls_token_id, tokenizer.mask_token_id) == (1, 4)
    torch.testing.assert_close(model.embeddings.global_embeddings.weight[:3], words[[1, 4, 4]], atol=0, rtol=0)
    assert model(**head_inputs("DebertaV2Model", (1000,), 1000)).last_hidden_state.shape == (1, 1000, 32)


def test_v2_position_table_is_tiled_like_bert_s(tmp_path):
    source = sharp_source(tmp_path / "source", "v2", "DebertaV2Model")
    model, _ = LSGConverter(max_sequence_length=1000).convert_from_pretrained(str(tmp_path / "source"))

    expected = source.embeddings.position_embeddings.weight[tiled_position_rows(TINY_LENGTH, 1000, "body")]
    torch.testing.assert_close(model.embeddings.position_embeddings.weight, expected, atol=0, rtol=0)


def test_narrow_embeddings_carry_the_global_tokens_before_their_projection(tmp_path):
    model = lsg_deberta("v3", embedding_size=16, block_size=BLOCK, sparse_block_size=BLOCK, num_global_tokens=2)
    inputs = head_inputs("DebertaV2Model")
    with torch.no_grad():
        output = model(**inputs).last_hidden_state

    assert model.embeddings.global_embeddings.embedding_dim == 16
    assert output.shape == (2, LENGTH, 32) and output.isfinite().all()


def test_no_tensor_grows_with_the_square_of_the_length():
    model = lsg_deberta("v3", block_size=BLOCK, sparse_block_size=BLOCK, num_global_tokens=1)

    def largest_tensor(length):
        inputs = head_inputs("DebertaV2Model", (length,), length)
        with torch.no_grad(), OpRecorder() as ops:
            model(**inputs)
        return ops.largest

    assert largest_tensor(1024) <= 2.1 * largest_tensor(512)


def test_a_16384_token_forward_and_a_4096_token_training_step_run_in_o_n_memory():
    model = lsg_deberta("v2", max_position_embeddings=16384, max_relative_positions=TINY_LENGTH, num_global_tokens=1)
    largest = {}
    for length in (8192, 16384):
        with torch.no_grad(), OpRecorder() as ops:
            output = model(**head_inputs("DebertaV2Model", (length,), length)).last_hidden_state
        largest[length] = ops.largest
    assert output.isfinite().all()
    assert largest[16384] <= 2.1 * largest[8192]

    model.train().activation_checkpointing_enable()
    loss = model(**head_inputs("DebertaV2Model", (4096, 3000), 4096)).last_hidden_state.square().mean()
    loss.backward()
    attention = model.encoder.layer[0].attention.self
    for parameter in (attention.query_proj.weight, attention.pos_key_proj.weight, model.encoder.rel_embeddings.weight):
        assert parameter.grad is not None and parameter.grad.isfinite().all() and parameter.grad.abs().sum() > 0
