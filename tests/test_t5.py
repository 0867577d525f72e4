"""LSG-T5, mT5 and UMT5: T5's relative bias reaches every block through the position terms.

The exact checks of issue 33 on tiny random models: the block-local oracle (with no global tokens and no
sparse keys, LSG-T5 is the SOURCE model run with a block-local attention mask, so each block gets the
dense model's bias), the three backends against each other for every sparsity type with global tokens,
padding invariance, and cached beam search on 16,384 tokens equal to uncached. (Equality with the source
when one block covers the input, for every head, remote-code loading and generation against the source
are in test_architectures and test_generation, which cover every architecture.)
"""

import pytest
import torch
import transformers

from helpers import TINY_CONFIGS, block_local_mask, padded_batch, padding_mask, save_tiny_source
from lsg_converter import LSGConverter
from lsg_converter.models.lsg_sparse import SPARSITY_TYPES

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

LENGTH = 100
BLOCK = 16
FAMILIES = {"t5": "T5", "mt5": "MT5", "umt5": "UMT5"}


def sharpen(model: torch.nn.Module) -> torch.nn.Module:
    """Scale the tiny random model's queries, keys and relative bias up: its attention is then far from
    uniform, so that the bias, the blocks and the padding make a difference the tests can see."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("SelfAttention.q.weight", "SelfAttention.k.weight")):
                parameter.mul_(4)
            if name.endswith("relative_attention_bias.weight"):
                parameter.normal_(std=2)
    return model


def sharp_source(folder, arch: str, head: str) -> transformers.PreTrainedModel:
    """A tiny random `head` of `arch`, sharpened, saved into `folder` (and returned)."""
    source = getattr(transformers, head).from_pretrained(save_tiny_source(folder, arch, head))
    sharpen(source).eval().save_pretrained(folder)
    return source


def converted(folder, **settings) -> transformers.PreTrainedModel:
    model, _ = LSGConverter(max_sequence_length=16384).convert_from_pretrained(str(folder), **settings)
    return model.eval()


@pytest.mark.parametrize("arch", list(FAMILIES))
@pytest.mark.parametrize("backend", ["sdpa", "eager", "flex_attention"])
def test_without_global_tokens_or_sparse_keys_the_encoder_is_the_source_with_a_block_local_mask(arch, backend, tmp_path):
    source = sharp_source(tmp_path / "source", arch, f"{FAMILIES[arch]}EncoderModel")
    model = converted(tmp_path / "source", num_global_tokens=0, block_size=BLOCK, sparsity_type="none")
    model.set_attn_implementation(backend)
    input_ids, attention_mask = padded_batch([LENGTH, 70], LENGTH, arch)

    with torch.no_grad():
        output = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        oracle = source(input_ids=input_ids, attention_mask=block_local_mask(attention_mask, BLOCK)).last_hidden_state
        dense = source(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    real = attention_mask.bool()[..., None]
    torch.testing.assert_close(output * real, oracle * real, atol=1e-5, rtol=0)
    # the oracle differs from dense attention far more than from LSG: the check bites
    assert ((output - dense) * real).abs().max() > 10 * ((output - oracle) * real).abs().max().clamp(min=1e-7)


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_without_global_tokens_or_sparse_keys_the_generator_decodes_the_block_local_encoder_output(arch, tmp_path):
    source = sharp_source(tmp_path / "source", arch, f"{FAMILIES[arch]}ForConditionalGeneration")
    model = converted(tmp_path / "source", num_global_tokens=0, block_size=BLOCK, sparsity_type="none")
    input_ids, attention_mask = padded_batch([LENGTH, 70], LENGTH, arch)
    decoder_input_ids = input_ids[:, :9]

    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
        encoded = source.get_encoder()(input_ids=input_ids, attention_mask=block_local_mask(attention_mask, BLOCK))
        oracle = source(
            encoder_outputs=encoded, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids
        ).logits

    torch.testing.assert_close(logits, oracle, atol=1e-5, rtol=3e-6)  # logits of a sharp source reach 5: float32 rounding


@pytest.mark.parametrize("arch", ["t5", "umt5"])
@pytest.mark.parametrize("sparsity_type", SPARSITY_TYPES)
def test_every_backend_gives_the_same_output_with_global_tokens_and_sparse_keys(arch, sparsity_type, tmp_path):
    sharp_source(tmp_path / "source", arch, f"{FAMILIES[arch]}EncoderModel")
    model = converted(
        tmp_path / "source", block_size=BLOCK, sparse_block_size=BLOCK, sparsity_type=sparsity_type, num_global_tokens=2
    )
    input_ids, attention_mask = padded_batch([LENGTH, 70], LENGTH, arch)
    outputs = {}
    for backend in ("sdpa", "eager", "flex_attention"):
        model.set_attn_implementation(backend)
        with torch.no_grad():
            outputs[backend] = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    torch.testing.assert_close(outputs["eager"], outputs["sdpa"], atol=1e-5, rtol=0)
    # flex_attention's tiles put the sparse keys in a segment of their own (its online softmax adds the keys
    # in another order than SDPA's): float32 rounding, compounded by the sharp layers, reaches 1.1e-5
    torch.testing.assert_close(outputs["flex_attention"], outputs["sdpa"], atol=2e-5, rtol=0)


@pytest.mark.parametrize("arch", ["t5", "umt5"])
@pytest.mark.parametrize("sparsity_type", ["norm", "pooling", "lsh"])
def test_a_padded_row_equals_the_same_row_alone(arch, sparsity_type, tmp_path):
    sharp_source(tmp_path / "source", arch, f"{FAMILIES[arch]}ForConditionalGeneration")
    model = converted(
        tmp_path / "source", block_size=BLOCK, sparse_block_size=BLOCK, sparsity_type=sparsity_type, num_global_tokens=2
    )
    input_ids, attention_mask = padded_batch([LENGTH, 70], LENGTH, arch)
    decoder_input_ids = input_ids[:, :9]

    with torch.no_grad():
        batched = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
        alone = model(
            input_ids=input_ids[1:, :70], attention_mask=attention_mask[1:, :70], decoder_input_ids=decoder_input_ids[1:]
        ).logits

    torch.testing.assert_close(batched[1], alone[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ["t5", "umt5"])
def test_the_relative_bias_changes_the_output(arch, tmp_path):
    sharp_source(tmp_path / "source", arch, f"{FAMILIES[arch]}EncoderModel")
    model = converted(tmp_path / "source", block_size=BLOCK, sparse_block_size=BLOCK, num_global_tokens=1)
    input_ids, attention_mask = padded_batch([LENGTH], LENGTH, arch)
    with torch.no_grad():
        with_bias = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        for name, parameter in model.named_parameters():
            if name.endswith("relative_attention_bias.weight"):
                parameter.zero_()
        without_bias = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    assert (with_bias - without_bias).abs().max() > 1e-3


def test_a_t5_config_that_names_no_length_reads_the_512_tokens_t5_was_trained_on(tmp_path):
    config = TINY_CONFIGS["t5"]()
    del config.max_position_embeddings
    transformers.T5ForConditionalGeneration(config).save_pretrained(tmp_path / "source")

    model = converted(tmp_path / "source")

    assert model.config.max_position_embeddings == 16384
    assert model.config.block_size == 512 // 3
    with pytest.raises(ValueError, match="16385 tokens, more than the 16384"):
        model(input_ids=torch.ones(1, 16385, dtype=torch.long), decoder_input_ids=torch.zeros(1, 1, dtype=torch.long))


def test_beam_search_on_16384_tokens_is_the_same_with_and_without_cache(tmp_path):
    sharp_source(tmp_path / "source", "t5", "T5ForConditionalGeneration")
    model = converted(tmp_path / "source", block_size=64, sparse_block_size=64, num_global_tokens=2)
    input_ids, attention_mask = padded_batch([16384], 16384, "t5")
    settings = dict(input_ids=input_ids, attention_mask=attention_mask, num_beams=3, max_new_tokens=6, min_new_tokens=6)

    with torch.no_grad():
        cached = model.generate(**settings, use_cache=True, output_scores=True, return_dict_in_generate=True)
        uncached = model.generate(**settings, use_cache=False, output_scores=True, return_dict_in_generate=True)

    assert torch.equal(cached.sequences, uncached.sequences)
    torch.testing.assert_close(torch.stack(cached.scores), torch.stack(uncached.scores), atol=1e-4, rtol=0)


@pytest.mark.parametrize("lengths", [[LENGTH, 70], [LENGTH, LENGTH]], ids=["padded", "unpadded"])
def test_umt5_attention_reads_the_additive_mask_of_transformers_before_5_2x_as_the_padding_it_came_from(lengths, tmp_path):
    sharp_source(tmp_path / "source", "umt5", "UMT5ForConditionalGeneration")
    model = converted(tmp_path / "source", block_size=BLOCK, sparse_block_size=BLOCK, sparsity_type="norm", num_global_tokens=2)
    attention = model.encoder.block[0].layer[0].SelfAttention
    hidden_states = torch.randn(2, 2 + LENGTH, model.config.d_model, generator=torch.Generator().manual_seed(0))
    global_columns = torch.ones(2, 2, dtype=torch.bool)
    view = torch.cat([global_columns, padding_mask(lengths, LENGTH)], dim=1)[:, None, None, :]
    # (B, 1, 1, g + t): what the LSG model hands UMT5's stack; what the stack made of it before transformers 5.2x:
    # (B, 1, 1, 1, 1, g + t), 0 (-0.0) where seen
    additive = (1.0 - view[:, None, None, :].float()) * torch.finfo(torch.float32).min

    with torch.no_grad():
        from_additive, from_view = attention(hidden_states, attention_mask=additive)[0], attention(hidden_states, attention_mask=view)[0]

    torch.testing.assert_close(from_additive, from_view, atol=0, rtol=0)
