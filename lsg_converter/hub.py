"""The Hugging Face Hub: where a source is, the model card, and a push of the whole folder in one commit.

Every call to the Hub goes through `hub_errors`, which turns what huggingface_hub and its HTTP client
raise into one-line `HubError`s. A source that exists on disk is never looked up on the Hub.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx2 as httpx  # the HTTP client of huggingface_hub 2.x
import transformers
from huggingface_hub import (
    CommitOperationAdd,
    HfApi,
    ModelCard,
    ModelCardData,
    constants,
    get_token,
    is_offline_mode,
    try_to_load_from_cache,
)
from huggingface_hub.errors import HFValidationError, HfHubHTTPError, OfflineModeIsEnabled, RepositoryNotFoundError
from huggingface_hub.hf_api import ModelInfo
from huggingface_hub.utils import validate_repo_id
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging

from .architectures import find_architecture
from .errors import HubError, SourceNotFoundError, one_line

logger = logging.get_logger(__name__)

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
    "legacy_sparse_window",
)
# Settings the card lists only when True (they describe an exception, not a choice).
CARD_SETTINGS_WHEN_TRUE = ("legacy_sparse_window",)
# The head's Auto class -> the card's pipeline_tag: the tags transformers' own model cards give these
# heads (transformers.modelcard.TASK_MAPPING). None: no tag. Multiple choice is no Hub task, and a
# ForPreTraining head predicts different things per architecture (BERT's and ALBERT's masked tokens
# plus a sentence task, ELECTRA's which tokens were replaced), so no single task describes it.
PIPELINE_TAGS = {
    "AutoModel": "feature-extraction",
    "AutoModelForMaskedLM": "fill-mask",
    "AutoModelForSequenceClassification": "text-classification",
    "AutoModelForTokenClassification": "token-classification",
    "AutoModelForQuestionAnswering": "question-answering",
    "AutoModelForSeq2SeqLM": "text2text-generation",
    "AutoModelForCausalLM": "text-generation",
    "AutoModelForMultipleChoice": None,
    "AutoModelForNextSentencePrediction": None,
    "AutoModelForPreTraining": None,
}
# The tags of sentence-transformers' own cards (pipeline_tag sentence-similarity).
SENTENCE_TRANSFORMERS_TAGS = ["sentence-transformers", "sentence-similarity", "feature-extraction"]
# The usage snippets' text: replace it with a document of up to the model's length.
PLACEHOLDER_TEXT = '"Replace this with a long document. " * 100'
# What huggingface_hub raises when the Hub cannot be reached or answers with an error: its own
# HfHubHTTPError and the errors of its HTTP client (both httpx.HTTPError), OfflineModeIsEnabled (a
# ConnectionError), and the standard library's connection errors and timeouts.
HUB_ERRORS = (httpx.HTTPError, ConnectionError, TimeoutError)


@contextmanager
def hub_errors(action: str, advice: str) -> Iterator[None]:
    """Turn a Hub failure inside the block into a one-line HubError (exit code 7).

    Args:
        action: what was tried, completing "Cannot ..." (e.g. "push to 'me/model'").
        advice: what to do, ending the message (e.g. "check the network and token=").
    """
    try:
        yield
    except HUB_ERRORS as error:
        response = getattr(error, "response", None)
        if isinstance(error, OfflineModeIsEnabled):
            reason = "HF_HUB_OFFLINE=1 is set"
        elif response is not None:
            reason = f"the Hub answered HTTP {response.status_code} ({one_line(error, 200)})"
        else:
            reason = f"the Hub at {constants.ENDPOINT} is unreachable ({type(error).__name__}: {one_line(error, 200)})"
        raise HubError(f"Cannot {action}: {reason}; {advice}.") from error


def local_source(source: str | os.PathLike) -> Path | None:
    """The folder or file `source` names on disk, None when nothing is there (then it may be a Hub id)."""
    path = Path(source).expanduser()
    return path if path.exists() else None


def is_hub_id(source: str) -> bool:
    """Whether `source` is spelt like a Hub model id ("name" or "owner/name"), not like a path."""
    if source.startswith((".", "/", "~")) or os.sep in source.replace("/", ""):
        return False
    try:
        validate_repo_id(source)
    except HFValidationError:
        return False
    return True


def source_name(source: str) -> str:
    """How a card or a recorded command names a source: a local folder by its name alone (never its
    path), a Hub id as it is."""
    folder = local_source(source)
    return folder.resolve().name if folder else source


def hub_model_info(repo_id: str, token: str | bool | None = None) -> ModelInfo:
    """The Hub's record of model `repo_id` (a valid Hub id, see `is_hub_id`), in one request: no
    retries, HF_HUB_ETAG_TIMEOUT seconds at most (10 by default; the Hub's metadata timeout).

    Raises:
        SourceNotFoundError: the Hub has no model `repo_id` (or a private one the token cannot see).
        HubError: the Hub is unreachable or refuses the request.
    """
    cached = isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    advice = "set HF_HUB_OFFLINE=1 to convert the copy in the Hugging Face cache" if cached else "give a folder that exists"
    with hub_errors(f"look up {repo_id!r} on the Hub (no folder of that name here)", advice):
        try:
            return HfApi(token=token).model_info(repo_id, timeout=constants.HF_HUB_ETAG_TIMEOUT)
        except HfHubHTTPError as error:
            if isinstance(error, RepositoryNotFoundError) or error.response.status_code == 404:
                raise SourceNotFoundError(
                    f"No folder {repo_id!r} here, and no model {repo_id!r} on the Hub: check the name, "
                    "or pass token= for a private model."
                ) from error
            raise


def source_license(source: str, token: str | bool | None = None) -> str | None:
    """The license the source's model card declares, None when unknown.

    A local source: its README.md, read from disk. A Hub id: the Hub's record of it (one request), or
    its README.md in the Hugging Face cache when HF_HUB_OFFLINE=1 is set.
    """
    folder = local_source(source)
    if folder is not None:
        readme = folder / "README.md"
    elif not is_hub_id(source):
        return None
    elif is_offline_mode():
        cached = try_to_load_from_cache(source, "README.md")
        readme = Path(cached) if isinstance(cached, str) else None
    else:
        try:
            card_data = hub_model_info(source, token).card_data
        except (HubError, SourceNotFoundError) as error:
            logger.warning(f"No license is recorded in the model card: {one_line(error)}")
            return None
        return card_data.license if card_data else None
    if readme is None or not readme.is_file():
        return None
    try:
        return ModelCard.load(readme, ignore_metadata_errors=True).data.license
    except (OSError, ValueError):
        return None


def check_can_push(repo_id: str, token: str | bool | None = None) -> None:
    """Refuse, before any work, a push that cannot happen: HF_HUB_OFFLINE=1 is set, or no token is found.

    Raises:
        HubError: with what to do.
    """
    if is_offline_mode():
        raise HubError(f"Cannot push to {repo_id!r}: HF_HUB_OFFLINE=1 is set; unset it to push.")
    if token is False or (not isinstance(token, str) and get_token() is None):
        raise HubError(
            f"Cannot push to {repo_id!r}: no Hugging Face token found; pass token=, set HF_TOKEN, "
            "or log in with `hf auth login`."
        )


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

    A local source is named by its folder's name alone, without a link or its path; a Hub source links
    to its Hub page and is recorded as `base_model`. The usage snippet loads the model from where it was
    written (see `card_model_name`), with `trust_remote_code=True` on every load, with sentence-transformers
    for a sentence-transformers source (library_name and tags as sentence-transformers' own cards), with
    transformers and the head's Auto class otherwise (pipeline_tag from `PIPELINE_TAGS`).

    Args:
        repo_id: the Hub repository the card is pushed to.
        command: the command that converted the model, recorded as it is (default: the Python call).
        license: the source's license (see `source_license`).
        save_path: the folder the card is saved in (as given to `save_converted`).
        has_tokenizer: whether a tokenizer is saved or pushed with the model; without one, the
            transformers snippet runs the model on token ids instead of loading a tokenizer.
    """
    from . import __version__
    from .sbert import pipeline_of

    config = model.config
    source = config._name_or_path or "unknown"
    head = config.architectures[0] if config.architectures else type(model).__name__
    auto_class = next(auto for auto, path in config.lsg_auto_map().items() if path.endswith(f".{head}"))
    max_length = _max_length(model)
    on_hub = local_source(source) is None and is_hub_id(source)
    named_source = source_name(source)
    name = card_model_name(model, repo_id, save_path)
    if pipeline_of(model) is not None:
        library, pipeline_tag, library_tags = "sentence-transformers", "sentence-similarity", SENTENCE_TRANSFORMERS_TAGS
        usage = _sentence_transformers_usage(name, max_length)
    else:
        library, pipeline_tag, library_tags = "transformers", PIPELINE_TAGS.get(auto_class), []
        usage = _transformers_usage(model, auto_class, name, max_length, has_tokenizer)
    data = ModelCardData(
        base_model=source if on_hub else None,
        license=license,
        library_name=library,
        pipeline_tag=pipeline_tag,
        tags=[*library_tags, "lsg", "long-context", config.model_type],
    )
    settings = "\n".join(
        f"| `{key}` | `{getattr(config, key)!r}` |"
        for key in CARD_SETTINGS
        if hasattr(config, key) and (key not in CARD_SETTINGS_WHEN_TRUE or getattr(config, key) is True)
    )
    how = command or f"LSGConverter(max_sequence_length={max_length}).convert_from_pretrained({named_source!r})"
    source_mention = f"[{source}](https://huggingface.co/{source})" if on_hub else f"`{named_source}`"
    where = (
        f"from the Hub repository `{name}`"
        if repo_id
        else f"from the folder `{name}` (the folder this README.md is in): run it in the folder that holds "
        f"`{name}`, or write the folder's path instead"
    )
    content = f"""---
{data.to_yaml()}
---

# {name}

{source_mention} converted to **LSG attention** (Local + Sparse + Global) with
[lsg_converter](https://pypi.org/project/lsg-converter/): it reads up to **{max_length:,} tokens**
at O(n) cost, with the source's pretrained weights and no retraining (fine-tuning on long inputs is
still recommended). Head: `{head}`, model type `{config.model_type}`.

## LSG settings

| setting | value |
|---|---|
{settings}

## How it was converted

```bash
{how}
```

lsg_converter {__version__}, transformers {transformers.__version__}. The modeling code travels with the
weights (`trust_remote_code=True`); `lsg_converter` need not be installed to use the model.

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
    return default_folder_name(model.config._name_or_path or "model", _max_length(model))


def saved_folder_name(save_path: str | os.PathLike) -> str:
    """The name of the folder `save_converted` writes for `save_path` (which it resolves)."""
    return Path(save_path).resolve().name


def default_folder_name(source: str, max_length: int) -> str:
    """The folder a conversion of `source` to `max_length` tokens is saved to by default:
    "<source's name>-lsg-<max_length>", the source's name without a Hub id's owner."""
    return f"{source_name(source).rpartition('/')[2]}-lsg-{max_length}"


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
# converted without a tokenizer (its source had none): token ids of the source's vocabulary, up to {max_length:,}
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


def push_converted(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    repo_id: str,
    *,
    private: bool = False,
    token: str | bool | None = None,
    commit_message: str | None = None,
    card: ModelCard | None = None,
    folder: str | os.PathLike | None = None,
) -> str:
    """Push weights, config, remote code, tokenizer and model card to `repo_id` in one commit.

    Args:
        folder: an already saved copy of the model (from `save_converted`) to upload as it is;
            without it the model is saved to a temporary folder first.
        card: the README.md; default: `model_card(model, repo_id)` with the source's license.
    Returns:
        The URL of the commit.
    Raises:
        HubError: the Hub is unreachable or refuses the token or the repository; HF_HUB_OFFLINE=1 is
            set or no token is found (refused before anything is saved).
    """
    from .converter import save_converted

    check_can_push(repo_id, token)
    with tempfile.TemporaryDirectory(prefix="lsg-push-") as staging:
        if folder is None:
            folder = save_converted(model, tokenizer, Path(staging) / "model")
        folder = Path(folder)
        if not (folder / "README.md").is_file():
            card = card or model_card(
                model,
                repo_id,
                license=source_license(model.config._name_or_path, token),
                has_tokenizer=tokenizer is not None,
            )
            card.save(folder / "README.md")
        operations = [
            CommitOperationAdd(path_in_repo=path.relative_to(folder).as_posix(), path_or_fileobj=str(path))
            for path in sorted(folder.rglob("*"))
            if path.is_file()
        ]
        api = HfApi(token=token)
        with hub_errors(f"push to {repo_id!r}", "check the network, the repository name and token="):
            api.create_repo(repo_id, private=private, exist_ok=True)
            commit = api.create_commit(
                repo_id,
                operations,
                commit_message=commit_message or f"Upload {type(model).__name__} converted with lsg_converter",
            )
    logger.info(f"Pushed {len(operations)} files to {repo_id}.")
    return commit.commit_url


def _max_length(model: PreTrainedModel) -> int:
    """Tokens the model reads: rows of its position table after the offset rows."""
    arch = find_architecture(model.config.model_type)
    return arch.position_rows(model.base_model).shape[0]

