"""Span vectors from one pass over a long text (late chunking, `lsg_converter.encode_spans`)."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from helpers import save_tiny_mean_embedder
from lsg_converter import InvalidSettingsError, LSGConverter, UnsupportedModelError, encode_spans, save_converted
from lsg_converter.spans import token_vectors

sentence_transformers = pytest.importorskip("sentence_transformers")
from sentence_transformers import SentenceTransformer  # noqa: E402

WORDS = "the king and queen of a land far away spoke to their people about war peace bread and gold".split()


def text_of(words: int, seed: int = 0) -> str:
    generator = torch.Generator().manual_seed(seed)
    return " ".join(WORDS[i] for i in torch.randint(len(WORDS), (words,), generator=generator).tolist())


@pytest.fixture(scope="module")
def source_folder(minilm_path, tmp_path_factory) -> Path:
    """A tiny sentence-transformers model with MiniLM's tokenizer, mean pooling, reading 64 tokens."""
    return save_tiny_mean_embedder(tmp_path_factory.mktemp("spans-source"), minilm_path, max_seq_length=64)


@pytest.fixture(scope="module")
def long_model(source_folder, tmp_path_factory) -> SentenceTransformer:
    """The source converted to 512 tokens (blocks of 16): it reads a text of a few hundred tokens in one pass."""
    model, tokenizer = LSGConverter(max_sequence_length=512).convert_from_pretrained(str(source_folder), block_size=16)
    folder = save_converted(model, tokenizer, tmp_path_factory.mktemp("spans-long") / "model")
    return SentenceTransformer(str(folder), trust_remote_code=True)


def test_a_span_vector_is_its_tokens_vectors_from_one_pass_pooled_and_normalised(long_model):
    text = text_of(300)
    # the token vectors of one pass over the whole text, [CLS] first and [SEP] last
    tokens = long_model.encode(text, output_value="token_embeddings", convert_to_tensor=True)[1:-1]

    (result,) = encode_spans(long_model, [text], span_tokens=50)

    assert len(tokens) > 256 and result.embeddings.shape == (-(-len(tokens) // 50), 32)
    expected = torch.stack([tokens[start : start + 50].mean(dim=0) for start in range(0, len(tokens), 50)])
    torch.testing.assert_close(result.embeddings, F.normalize(expected, dim=-1), atol=1e-5, rtol=0)


def test_the_spans_offsets_are_their_first_and_last_tokens_characters(long_model):
    text = text_of(120)
    offsets = long_model.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]

    (result,) = encode_spans(long_model, text, span_tokens=40)

    assert result.offsets == [(offsets[start][0], offsets[min(start + 40, len(offsets)) - 1][1]) for start in range(0, len(offsets), 40)]
    assert result.offsets[0][0] == 0 and result.offsets[-1][1] == len(text)


def test_character_spans_pool_the_tokens_that_overlap_them(long_model):
    text = text_of(80)
    cut = text.index(" ", len(text) // 2)
    _, vectors = token_vectors(long_model, text)
    offsets = long_model.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    first_half = sum(1 for start, _ in offsets if start < cut)

    (result,) = encode_spans(long_model, [text], spans=[[(0, cut), (cut, len(text))]])

    assert result.offsets == [(0, offsets[first_half - 1][1]), (offsets[first_half][0], len(text))]
    expected = torch.stack([vectors[:first_half].mean(dim=0), vectors[first_half:].mean(dim=0)])
    torch.testing.assert_close(result.embeddings, F.normalize(expected, dim=-1), atol=1e-5, rtol=0)


def test_a_text_longer_than_the_model_reads_takes_each_tokens_vector_from_its_most_central_window(source_folder):
    model = SentenceTransformer(str(source_folder))  # reads 64 tokens: windows of 62, 46 apart
    text = text_of(150)
    ids = model.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 150  # one token a word: windows start at 0, 46 and 88

    _, vectors = token_vectors(model, text)

    def window(start):  # the vectors of one window read alone, as a text of its own
        piece = model.tokenizer.decode(ids[start : start + 62])
        assert model.tokenizer(piece, add_special_tokens=False)["input_ids"] == ids[start : start + 62]
        return model.encode(piece, output_value="token_embeddings", convert_to_tensor=True)[1:-1]

    # a token is 53 or fewer tokens from the first window's start and 8 or more from its end up to token 53,
    # then nearer the middle of the second window up to token 97, then of the third
    torch.testing.assert_close(vectors[:54], window(0)[:54], atol=1e-5, rtol=0)
    torch.testing.assert_close(vectors[54:98], window(46)[8:52], atol=1e-5, rtol=0)
    torch.testing.assert_close(vectors[98:], window(88)[10:], atol=1e-5, rtol=0)
    assert not torch.allclose(window(0)[54:62], window(46)[8:16], atol=1e-3)  # the windows differ there: the check bites


def test_a_batch_of_texts_of_different_lengths_gives_the_spans_of_each_text_read_alone_in_the_callers_order(long_model):
    # 700 words: past the 510 tokens the model reads, two windows (read in one batch); the others one each
    texts = [text_of(words, seed) for seed, words in enumerate((30, 700, 5, 260, 120))]
    alone = encode_spans(long_model, texts, span_tokens=64, batch_size=1)

    for batch_size in (2, 8):
        batched = encode_spans(long_model, texts, span_tokens=64, batch_size=batch_size)

        assert [result.offsets for result in batched] == [result.offsets for result in alone]
        assert [len(result.offsets) for result in batched] == [1, 11, 1, 5, 2]  # the caller's order, not the length's
        for result, single in zip(batched, alone):
            torch.testing.assert_close(result.embeddings, single.embeddings, atol=1e-5, rtol=0)


@pytest.mark.parametrize("batch_size", [0, -1])
def test_a_batch_size_below_one_is_refused(long_model, batch_size):
    with pytest.raises(ValueError, match=rf"batch_size={batch_size} is no number of texts: give a whole number of at least 1"):
        encode_spans(long_model, ["a few words"], batch_size=batch_size)


def test_a_span_without_tokens_is_refused_in_one_line(long_model):
    with pytest.raises(InvalidSettingsError, match=r"The span \(5, 5\) of text 0 holds no token"):
        encode_spans(long_model, ["a few words here"], spans=[[(5, 5)]])


def test_a_model_without_a_pooling_module_is_refused(long_model):
    with pytest.raises(UnsupportedModelError, match="Pooling module"):
        encode_spans(long_model[0], ["a few words"])
