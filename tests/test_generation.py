"""Generation: encoder-decoder models (LSG encoder, dense decoder with its cache: BART, mBART, Pegasus)
and causal LSG decoders (BERT, RoBERTa, CamemBERT, XLM-RoBERTa, ELECTRA)."""

import pytest
import torch
import transformers

from helpers import TINY_LENGTH, OpRecorder, padded_batch, save_tiny_source
from lsg_converter import ARCHITECTURES, LSGConverter

CAUSAL_HEADS = [
    ("bert", "BertLMHeadModel"),
    ("roberta", "RobertaForCausalLM"),
    ("camembert", "CamembertForCausalLM"),
    ("xlm-roberta", "XLMRobertaForCausalLM"),
    ("electra", "ElectraForCausalLM"),
]
ENCODER_DECODERS = [arch for arch, row in ARCHITECTURES.items() if row.default_head.endswith("ForConditionalGeneration")]


@pytest.fixture(scope="module", params=ENCODER_DECODERS)
def lsg_seq2seq(request, tmp_path_factory):
    """(arch, a tiny random encoder-decoder converted to 16,384 tokens with the default LSG settings)."""
    arch = request.param
    source_dir = save_tiny_source(tmp_path_factory.mktemp(arch), arch, ARCHITECTURES[arch].default_head)
    model, _ = LSGConverter(max_sequence_length=16384).convert_from_pretrained(source_dir)
    return arch, model


@pytest.mark.parametrize("arch", ENCODER_DECODERS)
def test_generation_without_global_tokens_or_sparsity_equals_the_source(arch, tmp_path):
    head = ARCHITECTURES[arch].default_head
    source_dir = save_tiny_source(tmp_path / "source", arch, head)
    source = getattr(transformers, head).from_pretrained(source_dir).eval()
    model, _ = LSGConverter(max_sequence_length=1024).convert_from_pretrained(
        source_dir, num_global_tokens=0, sparsity_type="none", block_size=64
    )
    input_ids, attention_mask = padded_batch([TINY_LENGTH, 90], TINY_LENGTH, arch)

    for settings in (dict(num_beams=1), dict(num_beams=3)):
        settings.update(max_new_tokens=20, min_new_tokens=20, do_sample=False)
        expected = source.generate(input_ids=input_ids, attention_mask=attention_mask, **settings)
        generated = model.generate(input_ids=input_ids, attention_mask=attention_mask, **settings)
        assert torch.equal(generated, expected), settings


def test_beam_search_on_a_3000_token_padded_batch_is_the_same_with_and_without_cache(lsg_seq2seq):
    arch, model = lsg_seq2seq
    input_ids, attention_mask = padded_batch([3000, 2000], 3000, arch)
    settings = dict(num_beams=3, max_new_tokens=20, min_new_tokens=20, do_sample=False)

    with_cache = model.generate(input_ids=input_ids, attention_mask=attention_mask, use_cache=True, **settings)
    without_cache = model.generate(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **settings)

    assert with_cache.shape == (2, 21)
    assert torch.equal(with_cache, without_cache)


def test_generation_of_a_padded_row_equals_the_row_alone(lsg_seq2seq):
    arch, model = lsg_seq2seq
    input_ids, attention_mask = padded_batch([3000, 2000], 3000, arch)

    batched = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=15, num_beams=2)
    alone = model.generate(input_ids=input_ids[1:, :2000], max_new_tokens=15, num_beams=2)

    assert torch.equal(batched[1], alone[0])


def test_decoder_sees_the_encoder_global_tokens(lsg_seq2seq):
    arch, model = lsg_seq2seq
    input_ids, attention_mask = padded_batch([600], 600, arch)
    encoder_output = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    assert model.config.pass_global_tokens_to_decoder
    assert encoder_output.shape[1] == model.config.num_global_tokens + 600


@pytest.mark.parametrize("arch", ENCODER_DECODERS)
def test_without_passing_global_tokens_the_encoder_returns_one_state_per_token(arch, tmp_path):
    source_dir = save_tiny_source(tmp_path / "source", arch, ARCHITECTURES[arch].default_head)
    model, _ = LSGConverter(max_sequence_length=1024).convert_from_pretrained(
        source_dir, pass_global_tokens_to_decoder=False, num_global_tokens=2
    )
    input_ids, attention_mask = padded_batch([600, 400], 600, arch)

    with torch.no_grad():
        output = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids[:, :8])
    generated = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=5)

    assert output.encoder_last_hidden_state.shape[1] == 600
    assert generated.shape[0] == 2


def test_16k_token_encoder_pass_and_greedy_generation_build_no_quadratic_tensor(lsg_seq2seq):
    arch, model = lsg_seq2seq
    length = 16384
    input_ids, attention_mask = padded_batch([length], length, arch)

    with torch.no_grad(), OpRecorder() as tracker:
        generated = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=5, min_new_tokens=5)

    assert generated.shape == (1, 6)
    # an (L, L) tensor has 268M elements; the largest LSG builds is linear, (B, H, L, g + 3b) scores with
    # position terms (T5's: 8.3M at b = 42)
    assert tracker.largest < length * length // 16, f"a tensor of {tracker.largest} elements was built"


def causal_model(tmp_path, arch, head, sparsity_type="norm"):
    source_dir = save_tiny_source(tmp_path / "source", arch, head)
    model, _ = LSGConverter(max_sequence_length=1024).convert_from_pretrained(
        source_dir, block_size=8, sparse_block_size=8, sparsity_factor=2, num_global_tokens=2, sparsity_type=sparsity_type
    )
    return model


@pytest.mark.compat
@pytest.mark.parametrize("sparsity_type", ["norm", "pooling", "stride", "lsh", "none"])
@pytest.mark.parametrize("arch,head", CAUSAL_HEADS)
def test_causal_generation_is_the_same_with_and_without_cache(arch, head, sparsity_type, tmp_path):
    model = causal_model(tmp_path, arch, head, sparsity_type)
    prompt, _ = padded_batch([40, 40], 40, arch)  # 40 > 2 blocks: the prompt runs the blocked path

    settings = dict(max_new_tokens=40, min_new_tokens=40, do_sample=False)

    with_cache = model.generate(prompt, use_cache=True, **settings)
    without_cache = model.generate(prompt, use_cache=False, **settings)

    assert with_cache.shape == (2, 80)
    assert torch.equal(with_cache, without_cache)


@pytest.mark.compat
@pytest.mark.parametrize("arch,head", CAUSAL_HEADS)
def test_causal_forward_step_by_step_with_cache_equals_one_full_pass(arch, head, tmp_path):
    model = causal_model(tmp_path, arch, head)
    input_ids, _ = padded_batch([70, 70], 70, arch)

    with torch.no_grad():
        full = model(input_ids=input_ids).logits
        output = model(input_ids=input_ids[:, :30], use_cache=True)
        steps = [output.logits]
        for start in range(30, 70, 4):
            output = model(input_ids=input_ids[:, start : start + 4], past_key_values=output.past_key_values, use_cache=True)
            steps.append(output.logits)

    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch,head", CAUSAL_HEADS)
def test_causal_outputs_do_not_depend_on_later_tokens(arch, head, tmp_path):
    model = causal_model(tmp_path, arch, head)
    input_ids, _ = padded_batch([70], 70, arch)
    changed = input_ids.clone()
    changed[:, 50:] = 7

    with torch.no_grad():
        original, altered = model(input_ids=input_ids).logits, model(input_ids=changed).logits

    torch.testing.assert_close(altered[:, :50], original[:, :50], atol=0, rtol=0)
    assert not torch.allclose(altered[:, 50:], original[:, 50:])


def test_bos_pooling_is_refused_for_a_causal_decoder(tmp_path):
    from lsg_converter import InvalidSettingsError

    source_dir = save_tiny_source(tmp_path / "source", "bert", "BertLMHeadModel")
    with pytest.raises(InvalidSettingsError, match="bos_pooling.*pooling"):
        LSGConverter(max_sequence_length=512).convert_from_pretrained(source_dir, sparsity_type="bos_pooling")
