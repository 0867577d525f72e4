"""Long-document adaptation (issue 34): a converted sentence-transformers model trained on unlabeled long
texts with sentence-transformers' trainer. Tiny models and a few steps: the figures are in
benchmarks/bench_adaptation.py."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import TrainerCallback

from helpers import save_tiny_mean_embedder
from lsg_converter import LSGConverter, encode_spans, model_card, save_converted
from lsg_converter.adaptation import (
    CPU_CAPABILITIES_WITHOUT_BF16,
    SpanRankingLoss,
    adapt_converted_model,
    adapt_to_long_documents,
    document_rounds,
    round_batch_sampler,
)
from lsg_converter.errors import (
    InvalidSettingsError,
    OutputExistsError,
    OutputNotReplaceableError,
    TrainingTextsError,
    UnsupportedModelError,
)

pytest.importorskip("datasets")
from sentence_transformers import SentenceTransformer  # noqa: E402

LENGTH = 512


def long_texts(count: int, words: int, seed: int = 0) -> list[str]:
    """`count` texts of `words` words drawn from a small vocabulary, each with words of its own, so that a
    passage can tell its document from the others."""
    generator = random.Random(seed)
    common = "the king and queen of a land far away spoke to their people about war peace bread and gold".split()
    texts = []
    for index in range(count):
        own = [f"{name}{index}" for name in ("alpha", "river", "stone", "tower")]
        texts.append(" ".join(generator.choice(common + own * 3) for _ in range(words)))
    return texts


@pytest.fixture(scope="module")
def source_folder(minilm_path, tmp_path_factory) -> Path:
    """A tiny sentence-transformers model (`save_tiny_mean_embedder`) reading 100 tokens."""
    return save_tiny_mean_embedder(tmp_path_factory.mktemp("adaptation-source"), minilm_path, max_seq_length=100)


def convert(source: Path, folder: Path, **settings) -> Path:
    """`source` converted to 512 tokens (block 16) and saved into `folder`."""
    model, tokenizer = LSGConverter(max_sequence_length=LENGTH).convert_from_pretrained(
        str(source), block_size=16, sparse_block_size=16, **settings
    )
    return save_converted(model, tokenizer, folder)


@pytest.fixture(scope="module")
def converted_folder(source_folder, tmp_path_factory) -> Path:
    return convert(source_folder, tmp_path_factory.mktemp("adaptation") / "converted", num_global_tokens=1)


class SlowSteps(TrainerCallback):
    """A clock on which each optimizer step takes `seconds` (`clock`, given to adapt_to_long_documents as its time
    source); records the learning rate each step applies and, before each step, what `before_step` returns."""

    def __init__(self, seconds: float, before_step=lambda: None) -> None:
        self.now, self.seconds, self.before_step = 0.0, seconds, before_step
        self.learning_rates, self.seen_before_steps = [], []

    def clock(self) -> float:
        return self.now

    def on_step_begin(self, args, state, control, **kwargs):
        self.seen_before_steps.append(self.before_step())

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        self.now += self.seconds
        self.learning_rates.append(optimizer.param_groups[0]["lr"])


def in_batch_loss(model: SentenceTransformer, texts: list[str]) -> float:
    """The adaptation's objective on `texts`' (passage, rest of the document) pairs: the cross-entropy of
    each passage over all the documents, scaled cosines (MultipleNegativesRankingLoss, scale 20)."""
    (pairs,) = document_rounds(texts, model.tokenizer, model.max_seq_length - 2, 64, 32)
    with torch.no_grad():
        passages = model.encode([pair.passages[0] for pair in pairs], convert_to_tensor=True)
        documents = model.encode([pair.document for pair in pairs], convert_to_tensor=True)
    scores = 20 * F.normalize(passages, dim=-1) @ F.normalize(documents, dim=-1).T
    return F.cross_entropy(scores, torch.arange(len(pairs))).item()


def test_adapting_a_few_steps_lowers_the_models_own_training_loss(converted_folder):
    texts = long_texts(8, 1500)
    model = SentenceTransformer(str(converted_folder), trust_remote_code=True)
    before = in_batch_loss(model, texts)

    adapt_to_long_documents(model, texts, train="all", batch_size=8, epochs=2, learning_rate=1e-3, seed=0)

    assert in_batch_loss(model, texts) < 0.8 * before


def test_adapting_in_bfloat16_mixed_precision_lowers_the_loss_and_keeps_float32_weights(converted_folder):
    texts = long_texts(8, 1500)
    model = SentenceTransformer(str(converted_folder), trust_remote_code=True)
    before = in_batch_loss(model, texts)

    adapt_to_long_documents(model, texts, train="all", batch_size=8, epochs=2, learning_rate=1e-3, bf16=True, seed=0)

    assert in_batch_loss(model, texts) < 0.8 * before
    assert {parameter.dtype for parameter in model.parameters()} == {torch.float32}


WITHOUT_BF16_KERNELS = not torch.cuda.is_available() and torch.backends.cpu.get_cpu_capability() in CPU_CAPABILITIES_WITHOUT_BF16


@pytest.mark.skipif(not WITHOUT_BF16_KERNELS, reason="a CPU with AVX512 (or a GPU) has bfloat16 kernels")
def test_bf16_on_a_cpu_without_avx512_is_warned_about_in_one_line(converted_folder, caplog):
    with caplog.at_level("WARNING", logger="lsg_converter"):
        adapt_to_long_documents(converted_folder, long_texts(4, 1500), batch_size=4, max_steps=1, bf16=True)

    (warning,) = [record.getMessage() for record in caplog.records if "bf16=True" in record.getMessage()]
    assert "without AVX512" in warning and warning.endswith("leave bf16 off.")


@pytest.mark.skipif(WITHOUT_BF16_KERNELS, reason="a CPU without AVX512 is warned about")
def test_bf16_where_bfloat16_has_kernels_is_not_warned_about(converted_folder, caplog):
    with caplog.at_level("WARNING", logger="lsg_converter"):
        adapt_to_long_documents(converted_folder, long_texts(4, 1500), batch_size=4, max_steps=1, bf16=True)

    assert "bf16=True" not in caplog.text


def test_a_model_adapted_in_bfloat16_runs_in_float32_afterwards(converted_folder, tmp_path):
    model = adapt_to_long_documents(
        converted_folder, long_texts(4, 1500), output_path=tmp_path / "adapted", batch_size=4, max_steps=1, bf16=True
    )

    loaded = SentenceTransformer(str(tmp_path / "adapted"), trust_remote_code=True)
    texts = long_texts(1, 400, seed=5)
    torch.testing.assert_close(model.encode(texts), loaded.encode(texts), atol=1e-6, rtol=0)


def test_a_budget_of_three_slow_steps_plans_its_warm_up_on_them_and_reaches_the_peak_learning_rate(converted_folder):
    """137 s per step (a busy 2-core machine): 7 minutes buy 3 steps of the dozens the epochs hold; planned on
    the epochs' steps, all 3 would stay inside the warm-up."""
    slow = SlowSteps(137)
    adapt_to_long_documents(
        converted_folder, long_texts(8, 1500), batch_size=2, learning_rate=1e-3, max_minutes=7,
        clock=slow.clock, callbacks=[slow],
    )

    assert len(slow.learning_rates) == 3
    assert slow.learning_rates[-1] == pytest.approx(1e-3)


def test_a_budget_says_after_its_first_step_how_many_steps_it_buys(converted_folder, caplog):
    slow = SlowSteps(137, before_step=lambda: caplog.text)
    with caplog.at_level("WARNING", logger="lsg_converter"):
        adapt_to_long_documents(
            converted_folder, long_texts(8, 1500), batch_size=2, max_minutes=7, clock=slow.clock, callbacks=[slow]
        )

    said = "The first step took 137 s: max_minutes=7 buys 3 of the "
    assert said not in slow.seen_before_steps[0]
    assert said in slow.seen_before_steps[1]


def test_a_first_step_longer_than_the_budget_is_the_only_one_and_is_said(converted_folder, caplog):
    slow = SlowSteps(251)
    with caplog.at_level("WARNING", logger="lsg_converter"):
        adapt_to_long_documents(
            converted_folder, long_texts(4, 1500), batch_size=2, max_minutes=2, clock=slow.clock, callbacks=[slow]
        )

    assert len(slow.learning_rates) == 1
    assert "The first step took 251 s, more than max_minutes=2" in caplog.text


def test_each_round_cuts_other_documents_and_passages_from_the_texts(minilm_path):
    from transformers import AutoTokenizer

    texts = long_texts(3, 1500)
    rounds = document_rounds(texts, AutoTokenizer.from_pretrained(minilm_path), 300, 32, 64, rounds=2)

    assert len(rounds) == 2
    assert {pair.document for pair in rounds[0]}.isdisjoint(pair.document for pair in rounds[1])
    assert all(any(pair.passages[0] in text for text in texts) for made in rounds for pair in made)


def test_each_pair_names_the_text_it_was_cut_from(minilm_path):
    from transformers import AutoTokenizer

    texts = long_texts(3, 1500)
    (pairs,) = document_rounds(texts, AutoTokenizer.from_pretrained(minilm_path), 300, 32, 64, in_document_share=1.0)

    assert {pair.text for pair in pairs} == {0, 1, 2}
    assert all(pair.document in texts[pair.text] for pair in pairs)


@pytest.mark.parametrize("share, kept", [(1.0, True), (0.0, False)])
def test_the_in_document_share_leaves_the_passage_in_its_document_or_cuts_it_out(minilm_path, share, kept):
    from transformers import AutoTokenizer

    (pairs,) = document_rounds(long_texts(3, 1500), AutoTokenizer.from_pretrained(minilm_path), 300, 32, 64,
                               in_document_share=share)

    assert all((pair.passages[0] in pair.document) == kept for pair in pairs)


@pytest.mark.parametrize("share", [1.0, 0.0], ids=["in the document", "cut out"])
@pytest.mark.parametrize("count", [1, 3])
def test_each_passages_place_is_the_token_where_it_lies_or_lay(minilm_path, share, count):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    texts = long_texts(3, 1500)
    (pairs,) = document_rounds(texts, tokenizer, 300, 32, 64, in_document_share=share, passages_per_document=count)

    for pair in pairs:
        offsets = tokenizer(pair.document, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        assert len(pair.passages) == len(pair.places) == count
        for passage, place in zip(pair.passages, pair.places):
            if share:  # the passage's middle token
                start = pair.document.index(passage)
                assert start <= offsets[place][0] < start + len(passage)
            else:  # the tokens before it are the text that came before the passage, those from it on the text after it
                (text,) = [text for text in texts if passage in text]
                passage_start = text.index(passage)
                before = pair.document[: offsets[place - 1][1]] if place else ""  # a cut at the start: none
                assert text[:passage_start].rstrip().endswith(before.split()[-1] if before else "")
                assert text[passage_start + len(passage) :].lstrip().startswith(pair.document[offsets[place][0] :].split()[0])
                assert passage not in pair.document


def span_loss_by_encode_spans(model: SentenceTransformer, pairs, span_tokens: int) -> float:
    """The spans objective computed from `encode_spans`' span vectors and `encode`'s passage vectors: the
    cross-entropy of each passage over every span of every document, its target the span of its place."""
    spans = encode_spans(model, [pair.document for pair in pairs], span_tokens=span_tokens)
    every_span = torch.cat([F.normalize(text.embeddings, dim=-1) for text in spans])
    firsts = [sum(len(text.offsets) for text in spans[:index]) for index in range(len(spans))]
    scores, targets = [], []
    for index in range(len(pairs[0].passages)):
        passages = model.encode([pair.passages[index] for pair in pairs], convert_to_tensor=True)
        scores.append(20 * F.normalize(passages, dim=-1) @ every_span.T)
        targets += [first + min(pair.places[index] // span_tokens, len(text.offsets) - 1) for first, pair, text in zip(firsts, pairs, spans)]
    return F.cross_entropy(torch.cat(scores), torch.tensor(targets)).item()


@pytest.mark.parametrize("count", [1, 2])
def test_the_span_loss_ranks_each_passage_against_every_span_that_encode_spans_gives(converted_folder, count):
    model = SentenceTransformer(str(converted_folder), trust_remote_code=True)
    (pairs,) = document_rounds(long_texts(4, 1500), model.tokenizer, model.max_seq_length - 2, 32, 64,
                               passages_per_document=count)  # fmt: skip
    span_tokens = 98  # the tiny source's window body
    columns = [[pair.passages[index] for pair in pairs] for index in range(count)] + [[pair.document for pair in pairs]]
    labels = torch.tensor([[place // span_tokens for place in pair.places] for pair in pairs])

    with torch.no_grad():
        loss = SpanRankingLoss(model.eval(), span_tokens)([model.tokenize(texts) for texts in columns], labels).item()

    assert loss == pytest.approx(span_loss_by_encode_spans(model, pairs, span_tokens), rel=1e-4)


def test_adapting_on_spans_with_several_passages_per_document_lowers_the_span_loss(converted_folder):
    texts = long_texts(8, 1500)
    model = SentenceTransformer(str(converted_folder), trust_remote_code=True)
    (pairs,) = document_rounds(texts, model.tokenizer, model.max_seq_length - 2, 64, 32, passages_per_document=2, seed=1)
    before = span_loss_by_encode_spans(model, pairs, 98)

    adapt_to_long_documents(model, texts, objective="spans", passages_per_document=2, batch_size=4, epochs=2,
                            learning_rate=1e-3, seed=0)  # fmt: skip

    assert span_loss_by_encode_spans(model, pairs, 98) < 0.8 * before
    adaptation = model[0].auto_model.lsg_adaptation
    assert (adaptation.objective, adaptation.passages_per_document) == ("spans", 2)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"objective": "passages"}, "objective='passages' is not one of documents, spans"),
        ({"negatives": "same-play"}, "negatives='same-play' is not one of any, same-text"),
        ({"objective": "spans", "mini_batch_size": 2}, "spans objective has no cached loss"),
        ({"passages_per_document": 0}, "passages_per_document=0 is no number of passages"),
        ({"passages_per_document": 2}, "Several passages per document need objective='spans'"),
        ({"long_batch_size": 0}, "long_batch_size=0 is no number of documents"),
    ],
    ids=["unknown objective", "unknown negatives", "spans with a mini batch", "no passage", "several passages without spans",
         "no long document a step"],
)
def test_settings_of_the_objective_that_cannot_run_are_refused_and_nothing_is_written(converted_folder, tmp_path, settings, message):
    with pytest.raises(InvalidSettingsError, match=message):
        adapt_to_long_documents(converted_folder, long_texts(4, 1500), output_path=tmp_path / "adapted", **settings)

    assert not (tmp_path / "adapted").exists()


def test_a_batch_holds_pairs_of_one_round_only():
    """Each round holds each document once: a batch within a round never gives a document as its own
    passage's negative."""
    sampler = round_batch_sampler([5, 7, 6])(list(range(18)), batch_size=3, drop_last=True)

    batches = list(sampler)

    rounds = [range(0, 5), range(5, 12), range(12, 18)]
    assert len(batches) == len(sampler) == 1 + 2 + 2
    assert all(any(set(batch) <= set(made) for made in rounds) for batch in batches)
    assert len({index for batch in batches for index in batch}) == 15


def test_same_text_batches_hold_the_documents_of_one_text_each_round():
    """Two rounds of 3 texts, 4 documents of each: with batches of 4 every batch is one text's documents,
    and each round's batches are its own rows, its 3 texts."""
    row_texts = [row // 4 % 3 for row in range(24)]
    sampler = round_batch_sampler([12, 12], row_texts)(list(range(24)), batch_size=4, drop_last=True)

    batches = list(sampler)

    assert len(batches) == 6
    assert all(len({row_texts[row] for row in batch}) == 1 for batch in batches)
    assert [{row_texts[batch[0]] for batch in half} for half in (batches[:3], batches[3:])] == [{0, 1, 2}] * 2
    assert all(set(batch) <= set(range(12)) for batch in batches[:3])


def test_training_the_new_positions_keeps_the_embedding_of_a_text_the_source_could_read(source_folder, tmp_path):
    folder = convert(source_folder, tmp_path / "converted", num_global_tokens=0, sparsity_type="none")
    model = SentenceTransformer(str(folder), trust_remote_code=True)
    short = ["a short sentence about a king", "bread and gold"]
    table = model[0].auto_model.embeddings.position_embeddings.weight
    before_rows, before_short = table.detach().clone(), model.encode(short, convert_to_tensor=True)

    adapt_to_long_documents(model, long_texts(4, 1500), train="positions", batch_size=4, max_steps=3, learning_rate=1e-2)

    pretrained = model[0].auto_model.config.pretrained_positions
    assert torch.equal(table[:pretrained], before_rows[:pretrained])
    assert not torch.equal(table[pretrained:], before_rows[pretrained:])
    assert torch.equal(model.encode(short, convert_to_tensor=True), before_short)


def test_after_adapting_every_parameter_trains_again(converted_folder):
    """What the adaptation froze, and the hook that kept the pretrained position rows, end with it: a
    later fine-tuning reaches the whole model."""
    model = SentenceTransformer(str(converted_folder), trust_remote_code=True)
    adapt_to_long_documents(model, long_texts(4, 1500), train="positions+global", batch_size=4, max_steps=1)

    model(model.tokenize(["a short sentence"]))["sentence_embedding"].sum().backward()

    transformer = model[0].auto_model
    assert all(parameter.requires_grad for parameter in transformer.parameters())
    assert transformer.embeddings.position_embeddings.weight.grad[:100].abs().sum() > 0


def test_the_adapted_model_is_saved_and_loads_as_before(converted_folder, tmp_path):
    model = adapt_to_long_documents(
        converted_folder, long_texts(4, 1500), output_path=tmp_path / "adapted", batch_size=4, max_steps=1
    )

    loaded = SentenceTransformer(str(tmp_path / "adapted"), trust_remote_code=True)
    assert loaded.max_seq_length == LENGTH
    texts = long_texts(1, 400, seed=5)
    torch.testing.assert_close(loaded.encode(texts), model.encode(texts), atol=1e-6, rtol=0)


def test_no_texts_is_one_line_and_nothing_is_written(converted_folder, tmp_path):
    with pytest.raises(TrainingTextsError, match="No texts to adapt on"):
        adapt_to_long_documents(converted_folder, ["", "  "], output_path=tmp_path / "adapted")
    with pytest.raises(TrainingTextsError, match="No texts at"):
        adapt_to_long_documents(converted_folder, tmp_path / "missing", output_path=tmp_path / "adapted")

    assert not (tmp_path / "adapted").exists()


def test_texts_shorter_than_two_blocks_are_refused_and_nothing_is_written(converted_folder, tmp_path):
    with pytest.raises(TrainingTextsError, match="at least 32 tokens .two blocks."):
        adapt_to_long_documents(converted_folder, long_texts(10, 12), output_path=tmp_path / "adapted")

    assert not (tmp_path / "adapted").exists()


def own_length_model(source_folder: Path, folder: Path) -> SentenceTransformer:
    """The source converted to its own 128 positions in 2 blocks of 64, no global tokens, no sparse keys (as
    the fair control is): a window's body (126 tokens) is under two blocks."""
    model, tokenizer = LSGConverter(max_sequence_length=128).convert_from_pretrained(
        str(source_folder), block_size=64, num_global_tokens=0, sparsity_type="none"
    )
    return SentenceTransformer(str(save_converted(model, tokenizer, folder)), trust_remote_code=True)


def test_a_model_adapted_at_its_own_length_takes_documents_of_a_whole_window(source_folder, tmp_path):
    model = own_length_model(source_folder, tmp_path / "own-length")

    adapt_to_long_documents(model, long_texts(4, 800), passage_tokens=32, batch_size=2, max_steps=2, seed=0)

    adaptation = model[0].auto_model.lsg_adaptation
    assert adaptation.documents >= 2 and adaptation.steps == 2 and adaptation.max_tokens == 128


def test_too_few_documents_are_counted_in_plain_words(converted_folder, tmp_path):
    with pytest.raises(TrainingTextsError, match=r"The texts given \(1 text\) give 0 documents of at least 32 tokens"):
        adapt_to_long_documents(converted_folder, long_texts(1, 12), output_path=tmp_path / "adapted")


def test_an_in_document_share_out_of_0_to_1_is_refused_and_nothing_is_written(converted_folder, tmp_path):
    with pytest.raises(InvalidSettingsError, match="give a number from 0 to 1"):
        adapt_to_long_documents(converted_folder, long_texts(4, 1500), in_document_share=1.5, output_path=tmp_path / "adapted")

    assert not (tmp_path / "adapted").exists()


def test_a_source_share_out_of_0_to_1_is_refused_and_nothing_is_written(converted_folder, tmp_path):
    with pytest.raises(InvalidSettingsError, match="source_share=1.0 is no share"):
        adapt_to_long_documents(converted_folder, long_texts(4, 1500), source_share=1.0, output_path=tmp_path / "adapted")

    assert not (tmp_path / "adapted").exists()


def test_a_short_share_out_of_0_to_1_is_refused_and_nothing_is_written(converted_folder, tmp_path):
    with pytest.raises(InvalidSettingsError, match="short_share=1.0 is no share"):
        adapt_to_long_documents(converted_folder, long_texts(4, 1500), short_share=1.0, output_path=tmp_path / "adapted")

    assert not (tmp_path / "adapted").exists()


def test_a_short_share_whose_documents_cannot_hold_a_passage_and_as_much_more_is_refused(converted_folder, tmp_path):
    with pytest.raises(InvalidSettingsError, match=r"own length \(126 tokens\) to hold 1 passage of 64 tokens"):
        adapt_to_long_documents(converted_folder, long_texts(4, 1500), short_share=0.5, output_path=tmp_path / "adapted")

    assert not (tmp_path / "adapted").exists()


class DocumentLengths(TrainerCallback):
    """Records, at the start of each training, the longest document of its dataset in tokens."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.longest = tokenizer, []

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        documents = list(train_dataloader.dataset["document"])
        self.longest.append(max(len(ids) for ids in self.tokenizer(documents)["input_ids"]))


def test_a_short_share_trains_first_on_documents_of_the_sources_own_length_then_at_the_models(converted_folder):
    model = SentenceTransformer(str(converted_folder), trust_remote_code=True)
    lengths = DocumentLengths(model.tokenizer)

    adapt_to_long_documents(
        model, long_texts(6, 1500), passage_tokens=32, batch_size=2, max_steps=4, short_share=0.5, callbacks=[lengths]
    )

    adaptation = model[0].auto_model.lsg_adaptation
    assert (adaptation.steps, adaptation.short_steps, adaptation.short_tokens) == (4, 2, 128)
    assert lengths.longest[0] <= 128 < lengths.longest[1] <= LENGTH


class StepDocuments(TrainerCallback):
    """Records, at the start of each training, how many documents its steps read."""

    def __init__(self) -> None:
        self.documents: list[int] = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.documents.append(args.per_device_train_batch_size)


def test_a_long_batch_size_gives_the_steps_at_the_models_length_their_own_number_of_documents(converted_folder):
    model = SentenceTransformer(str(converted_folder), trust_remote_code=True)
    steps = StepDocuments()

    adapt_to_long_documents(
        model, long_texts(6, 1500), passage_tokens=32, batch_size=4, long_batch_size=2, max_steps=4, short_share=0.5,
        callbacks=[steps],
    )

    adaptation = model[0].auto_model.lsg_adaptation
    assert steps.documents == [4, 2]
    assert (adaptation.short_batch_size, adaptation.batch_size) == (4, 2)


def test_a_long_batch_size_without_a_short_share_gives_every_step_its_number_of_documents(converted_folder):
    model = SentenceTransformer(str(converted_folder), trust_remote_code=True)
    steps = StepDocuments()

    adapt_to_long_documents(model, long_texts(6, 1500), batch_size=4, long_batch_size=2, max_steps=1, callbacks=[steps])

    assert steps.documents == [2]
    assert (model[0].auto_model.lsg_adaptation.short_batch_size, model[0].auto_model.lsg_adaptation.batch_size) == (0, 2)


def test_a_budget_with_a_short_share_gives_the_short_part_its_share_and_the_long_part_what_is_left(converted_folder):
    slow = SlowSteps(60)
    model = adapt_to_long_documents(
        converted_folder, long_texts(6, 1500), passage_tokens=32, batch_size=2, max_minutes=5, short_share=0.4,
        clock=slow.clock, callbacks=[slow],
    )

    adaptation = model[0].auto_model.lsg_adaptation
    assert (adaptation.short_steps, adaptation.steps) == (2, 5)


def test_a_model_adapted_at_its_own_length_trains_at_it_whatever_its_short_share(source_folder, tmp_path):
    model = own_length_model(source_folder, tmp_path / "own-length")

    adapt_to_long_documents(model, long_texts(4, 800), passage_tokens=32, batch_size=2, max_steps=2, short_share=0.5)

    adaptation = model[0].auto_model.lsg_adaptation
    assert (adaptation.steps, adaptation.short_steps) == (2, 0)


class TrainedWeights(TrainerCallback):
    """Keeps the model's weights as the training left them, before anything moves them back."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.weights = {name: weight.detach().clone() for name, weight in model.state_dict().items()}


def test_a_source_share_leaves_each_weight_that_share_of_the_way_back_to_the_given_one(converted_folder):
    given = SentenceTransformer(str(converted_folder), trust_remote_code=True).state_dict()
    trained = TrainedWeights()
    blended = adapt_to_long_documents(
        SentenceTransformer(str(converted_folder), trust_remote_code=True), long_texts(4, 1500), batch_size=4,
        max_steps=2, learning_rate=1e-3, source_share=0.25, seed=0, callbacks=[trained],
    ).state_dict()

    assert any(not torch.equal(trained.weights[name], weight) for name, weight in given.items())
    for name, weight in given.items():
        expected = torch.lerp(trained.weights[name], weight, 0.25) if weight.is_floating_point() else weight
        torch.testing.assert_close(blended[name], expected)


def test_a_sentence_transformers_model_that_is_not_lsg_is_refused(source_folder, tmp_path):
    with pytest.raises(UnsupportedModelError, match="convert it first"):
        adapt_to_long_documents(source_folder, long_texts(4, 1500), output_path=tmp_path / "adapted")

    assert not (tmp_path / "adapted").exists()


def test_a_folder_that_is_not_a_sentence_transformers_model_is_refused(tiny_bert_dir, tmp_path):
    with pytest.raises(UnsupportedModelError, match="no sentence-transformers model"):
        adapt_to_long_documents(tiny_bert_dir, long_texts(4, 1500), output_path=tmp_path / "adapted")


def test_an_existing_output_is_kept_without_overwrite(converted_folder, tmp_path):
    (tmp_path / "adapted").mkdir()
    (tmp_path / "adapted" / "notes.txt").write_text("mine")

    with pytest.raises(OutputExistsError):
        adapt_to_long_documents(converted_folder, long_texts(4, 1500), output_path=tmp_path / "adapted")

    assert (tmp_path / "adapted" / "notes.txt").read_text() == "mine"


def test_a_folder_of_the_users_files_is_kept_with_overwrite_too(converted_folder, tmp_path):
    (tmp_path / "adapted").mkdir()
    (tmp_path / "adapted" / "notes.txt").write_text("mine")

    with pytest.raises(OutputNotReplaceableError, match="holds notes.txt and no model's config.json"):
        adapt_to_long_documents(converted_folder, long_texts(4, 1500), output_path=tmp_path / "adapted", overwrite=True)

    assert (tmp_path / "adapted" / "notes.txt").read_text() == "mine"


def texts_folder(folder: Path, count: int = 4) -> Path:
    """`count` long texts as .txt files in `folder`."""
    folder.mkdir()
    for index, text in enumerate(long_texts(count, 1500)):
        (folder / f"{index}.txt").write_text(text)
    return folder


def test_lsg_convert_adapt_on_converts_adapts_and_saves_a_sentence_transformers_model(source_folder, tmp_path, capsys):
    from lsg_converter_cli import main

    texts = texts_folder(tmp_path / "texts")
    arguments = [str(source_folder), "--max-len", str(LENGTH), "--block-size", "16", "--save-path", str(tmp_path / "out")]

    assert main([*arguments, "--adapt-on", str(texts), "--adapt-train", "all", "--adapt-batch-size", "4", "--adapt-bf16"]) == 0
    assert "SentenceTransformer(" in capsys.readouterr().out
    assert main([*arguments[:-1], str(tmp_path / "plain")]) == 0

    adapted = SentenceTransformer(str(tmp_path / "out"), trust_remote_code=True)
    converted = SentenceTransformer(str(tmp_path / "plain"), trust_remote_code=True)
    probe = long_texts(1, 400, seed=3)
    assert not torch.allclose(adapted.encode(probe, convert_to_tensor=True), converted.encode(probe, convert_to_tensor=True))


@pytest.mark.parametrize(
    "options, said",
    [
        (["--adapt-objective", "spans", "--adapt-passages", "2", "--adapt-batch-size", "4"],
         "each of 2 passages of each document had to find the span of its document where it lies"),
        (["--adapt-negatives", "same-text", "--adapt-batch-size", "2", "--adapt-epochs", "1"],
         "among the 2 documents of its step, cut from one text as far as it held them"),
        (["--adapt-batch-size", "4", "--adapt-long-batch-size", "2", "--adapt-epochs", "1"], "it among the 2 documents of its step"),
    ],
    ids=["spans objective, several passages", "negatives of the same text", "fewer documents a long step"],
)  # fmt: skip
def test_lsg_convert_adapts_with_the_objective_options_given_and_the_card_says_them(source_folder, tmp_path, options, said):
    from lsg_converter_cli import main

    arguments = [str(source_folder), "--max-len", str(LENGTH), "--block-size", "16", "--save-path", str(tmp_path / "out")]

    assert main([*arguments, "--adapt-on", str(texts_folder(tmp_path / "texts")), *options, "--quiet"]) == 0

    assert said in (tmp_path / "out" / "README.md").read_text()


def test_lsg_convert_adapt_on_a_missing_folder_exits_10_before_converting(source_folder, tmp_path, capsys):
    from lsg_converter_cli import main

    code = main([str(source_folder), "--max-len", str(LENGTH), "--save-path", str(tmp_path / "out"), "--adapt-on", str(tmp_path / "none")])

    assert code == 10
    assert capsys.readouterr().err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_lsg_convert_quiet_adapts_without_printing_the_trainers_logs_or_progress_bars(source_folder, tmp_path, capsys):
    from lsg_converter_cli import main

    code = main([
        str(source_folder), "--max-len", str(LENGTH), "--block-size", "16", "--save-path", str(tmp_path / "out"),
        "--adapt-on", str(texts_folder(tmp_path / "texts")), "--adapt-batch-size", "4", "--adapt-epochs", "1", "--quiet",
    ])

    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert (captured.out, captured.err) == ("", "")


def test_lsg_convert_adapt_mini_batch_size_trains_with_the_cached_loss_in_mini_batches(
    source_folder, tmp_path, monkeypatch
):
    from lsg_converter import adaptation
    from lsg_converter_cli import main

    built, build = [], adaptation.ranking_loss

    def recorded(*args, **kwargs):
        built.append(build(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(adaptation, "ranking_loss", recorded)

    code = main([
        str(source_folder), "--max-len", str(LENGTH), "--block-size", "16", "--save-path", str(tmp_path / "out"),
        "--adapt-on", str(texts_folder(tmp_path / "texts")), "--adapt-batch-size", "4", "--adapt-mini-batch-size", "2",
        "--adapt-epochs", "1", "--quiet",
    ])

    assert code == 0
    assert [type(loss).__name__ for loss in built] == ["CachedMultipleNegativesRankingLoss"]
    assert built[0].mini_batch_size == 2


def test_the_card_of_an_adapted_model_says_it_was_adapted_on_which_texts_and_how_many_steps(source_folder, tmp_path):
    converter = LSGConverter(max_sequence_length=LENGTH)
    model, tokenizer = converter.convert_from_pretrained(str(source_folder), block_size=16)

    adapt_converted_model(model, tokenizer, texts_folder(tmp_path / "my-plays"), batch_size=4, max_steps=2)

    card = model_card(model, save_path=tmp_path / "adapted").text
    assert "no retraining" not in card
    assert "**adapted to long documents**" in card
    assert "2 training steps on 4 texts from `my-plays`" in card


def test_the_card_of_a_model_adapted_at_the_sources_length_first_says_how_many_steps_were_short(source_folder, tmp_path):
    converter = LSGConverter(max_sequence_length=LENGTH)
    model, tokenizer = converter.convert_from_pretrained(str(source_folder), block_size=16)

    adapt_converted_model(
        model, tokenizer, texts_folder(tmp_path / "my-plays"), passage_tokens=32, batch_size=4, max_steps=4, short_share=0.25
    )

    card = model_card(model, save_path=tmp_path / "adapted").text
    assert "4 training steps on 4 texts" in card
    assert "the first 1 training step read documents of up to 128 tokens, the source's own length" in card


def test_the_card_of_a_model_adapted_with_fewer_documents_a_long_step_says_both_numbers(source_folder, tmp_path):
    converter = LSGConverter(max_sequence_length=LENGTH)
    model, tokenizer = converter.convert_from_pretrained(str(source_folder), block_size=16)

    adapt_converted_model(
        model, tokenizer, texts_folder(tmp_path / "my-plays"), passage_tokens=32, batch_size=4, long_batch_size=2,
        max_steps=4, short_share=0.25,
    )

    card = model_card(model, save_path=tmp_path / "adapted").text
    assert "it among the 2 documents of its step" in card
    assert "documents of up to 128 tokens, the source's own length, 4 a step" in card
