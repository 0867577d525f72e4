"""Loading from a source: the LSG class with the source's weights, the tokenizer, and one report of
what the load initialised, kept or dropped (transformers' own load report hidden)."""

from __future__ import annotations

import logging as pylogging
import pickle
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

from huggingface_hub.hf_api import ModelInfo
from safetensors import SafetensorError
from tokenizers import Tokenizer
from transformers import AutoTokenizer, BertTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import cached_file, logging

from .checkpoint import read_tensors
from .errors import CorruptCheckpointError, listed, one_line, require
from .sources import download_hub_files, hub_file_names

logger = logging.get_logger(__name__)

# tokenizer_config.json keys that transformers copies from tokenizer.json's truncation and padding
TOKENIZER_LENGTH_SETTINGS = ("max_length", "stride", "truncation_strategy", "pad_to_multiple_of")
# Suffixes of the files tokenizers read: JSON (tokenizer.json, vocab.json, special tokens), text
# (vocab.txt, merges.txt) and sentencepiece models.
TOKENIZER_FILE_SUFFIXES = (".json", ".txt", ".model")
# The tokenizers library's file, which transformers reads first where a source has one.
FAST_TOKENIZER_FILE = "tokenizer.json"
# A BERT-style WordPiece vocabulary, one token a line.
VOCABULARY_FILE = "vocab.txt"
# The smallest share of a model's ids that its tokenizer holds: an embedding table may have spare rows
# (padded to a multiple of 64 or 128, reserved ids), never as many as the tokens it was trained on.
MIN_VOCABULARY_SHARE = 0.5


def load_model(
    lsg_class: type,
    source: str,
    config: Any,
    token: str | bool | None,
    device_map: str | None = None,
    source_labels: int | None = None,
) -> tuple[PreTrainedModel, dict[str, Any]]:
    """`lsg_class` loaded from `source` with `config`, and transformers' loading info (missing,
    unexpected and mismatched keys). The load report is not logged: `report_loading` says what matters.
    A `device_map` (the converter's dry runs on the meta device) needs accelerate.

    `source_labels` is the number of labels of the source's config: where `config` has another
    (num_labels=), the source weights sized by the labels (a classifier's) are newly initialised at
    config.num_labels, and listed as the loading info's mismatched keys. Any other weight whose shape
    is not the model's is a CorruptCheckpointError."""
    if device_map is not None:
        require("accelerate", f"Converting {source!r} (its heads are tried on the {device_map} device)")
    relabel = source_labels is not None and source_labels != config.num_labels
    try:
        with _load_report_hidden():
            model, loading_info = lsg_class.from_pretrained(
                source, config=config, token=token, device_map=device_map, output_loading_info=True,
                ignore_mismatched_sizes=relabel,
            )
    except (SafetensorError, pickle.UnpicklingError, EOFError, RuntimeError, OSError, ValueError) as error:
        raise CorruptCheckpointError(
            f"Cannot read the weights of {source!r} ({one_line(error, 200)}): the file is truncated "
            "or corrupt, or does not match its config.json; download or save the model again."
        ) from error
    misfits = [
        f"{name} {list(theirs)} (the model's: {list(ours)})"
        for name, theirs, ours in sorted(loading_info["mismatched_keys"])
        if not _sized_by_labels(theirs, ours, source_labels, config.num_labels)
    ]
    if misfits:
        raise CorruptCheckpointError(
            f"The weights of {source!r} do not match its config.json ({listed(misfits, 2)}): download or save the "
            "model again."
        )
    return model, loading_info


def _sized_by_labels(theirs: Iterable[int], ours: Iterable[int], source_labels: int | None, labels: int) -> bool:
    """Whether a source weight of shape `theirs` and the model's of shape `ours` differ only in one size, the
    source's number of labels in `theirs` and the model's in `ours` (a classifier's rows)."""
    theirs, ours = tuple(theirs), tuple(ours)
    differing = [(mine, other) for mine, other in zip(theirs, ours) if mine != other]
    return len(theirs) == len(ours) and differing == [(source_labels, labels)]


def load_tokenizer(
    source: str, token: str | bool | None, config: Any, record: ModelInfo | None = None
) -> PreTrainedTokenizerBase | None:
    """The source's tokenizer, when it fits the model of `config` (see `tokenizer_misfit`).

    With `record` (the Hub's record of a Hub id) its tokenizer files are downloaded first
    (`sources.download_hub_files`: a failing download is a HubError, not a model without tokenizer).
    A tokenizer that does not fit is never returned: a warning says why, and the source's vocab.txt,
    where it has one, is read as the BERT WordPiece vocabulary it is (`vocabulary_tokenizer`;
    rxnmapper's ALBERT ships a vocab.txt that transformers 5 loads as a 5-token AlbertTokenizer).
    A tokenizer.json that cannot be read is left out: the tokenizer is rebuilt from the source's other
    tokenizer files, with a warning (`_rebuilt_tokenizer`; CorruptCheckpointError where they make none
    that fits). None, with a warning, when the source has no tokenizer, it cannot be read, or nothing fits."""
    if record is not None:
        download_hub_files(record, tokenizer_file_names(hub_file_names(record)), token)
    tokenizer = _source_tokenizer(source, token, config)
    misfit = tokenizer_misfit(tokenizer, config) if tokenizer is not None else None
    if misfit is None:
        return tokenizer
    replacement = vocabulary_tokenizer(source, token)
    if replacement is not None and tokenizer_misfit(replacement, config) is None:
        logger.warning(
            f"The source's tokenizer does not fit the model ({misfit}): its {VOCABULARY_FILE} is read as a BERT "
            f"WordPiece vocabulary instead ({type(replacement).__name__}, {len(replacement)} tokens, "
            f"{'lowercased' if replacement.do_lower_case else 'cased'}); check that it splits your text as the source's did."
        )
        return replacement
    logger.warning(f"The source's tokenizer does not fit the model ({misfit}): no tokenizer is returned or saved.")
    return None


def tokenizer_file_names(names: Iterable[str]) -> set[str]:
    """The files of a model's folder a tokenizer may read: those at its root with a suffix of
    `TOKENIZER_FILE_SUFFIXES` (tokenizer.json, tokenizer_config.json, vocab.txt, merges.txt,
    spiece.model, ...), weight indexes aside."""
    return {
        name for name in names
        if "/" not in name and name.endswith(TOKENIZER_FILE_SUFFIXES) and not name.endswith(".index.json")
    }


def tokenizer_misfit(tokenizer: PreTrainedTokenizerBase, config: Any) -> str | None:
    """Why `tokenizer` does not fit the model of `config` (None when it does): more tokens than the
    model has ids, fewer than `MIN_VOCABULARY_SHARE` of them (a tokenizer built without its
    vocabulary), or a special token id (pad, bos, eos) other than the config's."""
    name = type(tokenizer).__name__
    vocab_size = getattr(config, "vocab_size", None)
    if vocab_size and not MIN_VOCABULARY_SHARE * vocab_size <= len(tokenizer) <= vocab_size:
        return f"the source's {name} has {len(tokenizer)} tokens, the model {vocab_size} ids"
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        theirs, ours = getattr(tokenizer, key, None), getattr(config, key, None)
        if theirs is not None and ours is not None and theirs != ours:
            return f"the source's {name} has {key} {theirs}, the model {ours}"
    return None


def vocabulary_tokenizer(source: str, token: str | bool | None) -> BertTokenizer | None:
    """A BertTokenizer reading the source's vocab.txt (None when it has none): a WordPiece vocabulary,
    lowercasing only when the vocabulary holds no uppercase token besides its bracketed special ones."""
    vocabulary = cached_file(
        source, VOCABULARY_FILE, token=token,
        _raise_exceptions_for_missing_entries=False, _raise_exceptions_for_connection_errors=False,
    )
    if not vocabulary:
        return None
    words = Path(vocabulary).read_text(encoding="utf-8").splitlines()
    cased = any(word != word.lower() for word in words if not (word.startswith("[") and word.endswith("]")))
    return BertTokenizer(vocab=vocabulary, do_lower_case=not cased)


def _source_tokenizer(source: str, token: str | bool | None, config: Any) -> PreTrainedTokenizerBase | None:
    """The tokenizer transformers loads from `source`; None, with a warning, when it has none or it cannot
    be read; rebuilt without its tokenizer.json where that file is what cannot be read (`_rebuilt_tokenizer`)."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, token=token)
    except (OSError, ValueError, TypeError, KeyError) as error:  # KeyError: a tokenizer.json without its keys
        unreadable = _unreadable_tokenizer_json(source, token)
        if unreadable is not None:
            return _rebuilt_tokenizer(source, config, *unreadable)
        logger.warning(f"No tokenizer could be loaded from {source} ({one_line(error, 200)}): none is returned.")
        return None
    # transformers 5 also builds a tokenizer (of special tokens only) where there are no tokenizer files
    file_names = {"tokenizer_config.json", "tokenizer.json", *getattr(tokenizer, "vocab_files_names", {}).values()}
    resolved = (
        cached_file(
            source, name, token=token,
            _raise_exceptions_for_missing_entries=False, _raise_exceptions_for_connection_errors=False,
        )
        for name in file_names
    )
    if not any(resolved):
        logger.warning(f"{source} has no tokenizer files ({', '.join(sorted(file_names))}): no tokenizer is returned.")
        return None
    return tokenizer


def _unreadable_tokenizer_json(source: str, token: str | bool | None) -> tuple[Path, str] | None:
    """(the source's tokenizer.json, why the tokenizers library cannot read it); None when it has none or it reads."""
    found = cached_file(
        source, FAST_TOKENIZER_FILE, token=token,
        _raise_exceptions_for_missing_entries=False, _raise_exceptions_for_connection_errors=False,
    )
    if not found:
        return None
    try:
        Tokenizer.from_file(found)
    except Exception as error:  # the tokenizers library raises a bare Exception for a file it cannot read
        return Path(found), one_line(error, 200)
    return None


def _rebuilt_tokenizer(source: str, config: Any, unreadable: Path, reason: str) -> PreTrainedTokenizerBase:
    """The tokenizer transformers builds from the tokenizer files beside the `unreadable` tokenizer.json (in
    the source's folder or Hub snapshot: vocab.txt, merges.txt, spiece.model, tokenizer_config.json, ...), with
    a warning that says so; CorruptCheckpointError where they make none that fits the model of `config`."""
    folder = unreadable.parent
    names = sorted(tokenizer_file_names(path.name for path in folder.iterdir() if path.is_file()) - {unreadable.name})
    with tempfile.TemporaryDirectory() as scratch:
        for name in names:
            shutil.copyfile(folder / name, Path(scratch) / name)
        try:
            tokenizer = AutoTokenizer.from_pretrained(scratch)
        except (OSError, ValueError, TypeError, KeyError) as error:
            tokenizer, misfit = None, one_line(error, 200)
        else:
            misfit = tokenizer_misfit(tokenizer, config)
    if misfit is not None:
        raise CorruptCheckpointError(
            f"Cannot read {unreadable} ({reason}), and the source's other tokenizer files ({', '.join(names) or 'none'}) "
            f"make no tokenizer of the model ({misfit}): fix or restore the file."
        )
    tokenizer.name_or_path = source
    vocabulary = [name for name in names if name in tokenizer.vocab_files_names.values()] or names
    logger.warning(
        f"Cannot read {unreadable} ({reason}): the tokenizer is rebuilt from the source's {', '.join(vocabulary)} "
        f"({type(tokenizer).__name__}, {len(tokenizer)} tokens); check that it splits your text as the source's did, "
        "or fix the file."
    )
    return tokenizer


def drop_source_lengths(tokenizer: PreTrainedTokenizerBase) -> None:
    """Forget the truncation and padding the source's tokenizer.json sets (all-MiniLM-L6-v2: 128 tokens),
    so that the converted tokenizer cuts and pads only when asked, up to model_max_length."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        backend.no_truncation()
        backend.no_padding()
    for key in TOKENIZER_LENGTH_SETTINGS:
        tokenizer.init_kwargs.pop(key, None)


def missing_weights(loading_info: dict[str, Any]) -> list[str]:
    """The weights the source lacks, but the global token table (the converter fills it)."""
    return sorted(key for key in loading_info["missing_keys"] if "global_embeddings." not in key)


def new_weights(loading_info: dict[str, Any]) -> list[str]:
    """The weights a load initialised afresh: those the source lacks and those it has for another number
    of labels (see `load_model`)."""
    return sorted(missing_weights(loading_info) + [name for name, _, _ in loading_info["mismatched_keys"]])


def kept_weights(files: list[Path], unexpected: set[str], lsg_class: type) -> dict[str, dict[str, Any]]:
    """{name: {shape, dtype}} of the source tensors `lsg_class` does not hold, to keep under their names.

    Names that transformers renamed on loading (legacy LayerNorm gamma/beta) are not in the files:
    a warning names them as dropped."""
    tensors = read_tensors(files, unexpected)
    dropped = sorted(unexpected - set(tensors))
    if dropped:
        logger.warning(
            f"{lsg_class.__name__} does not use the source tensors {listed(dropped)}, stored under other names: "
            "they are not kept."
        )
    return {
        name: {"shape": list(tensor.shape), "dtype": str(tensor.dtype).removeprefix("torch.")}
        for name, tensor in sorted(tensors.items())
    }


def report_loading(model: PreTrainedModel, loading_info: dict[str, Any], kept: dict[str, Any]) -> None:
    """One line for the weights the source lacks, one for those it has for another number of labels, one
    for the kept source tensors, one for any dropped."""
    name = type(model).__name__
    missing = missing_weights(loading_info)
    if missing:
        logger.warning(
            f"{name} is a new head for this source: {listed(missing)} are newly initialised (random); train them before use."
        )
    resized = [f"{key} {list(theirs)} -> {list(ours)}" for key, theirs, ours in sorted(loading_info["mismatched_keys"])]
    if resized:
        logger.warning(
            f"{name} has a new classifier for num_labels={model.config.num_labels}: {listed(resized)} are newly "
            "initialised (random), replacing the source's; train them before use."
        )
    if kept:
        logger.warning(f"{name} does not use {listed(kept)} of the source: kept in the model under their own names.")
    unused = sorted(loading_info["unexpected_keys"])
    if unused:
        logger.warning(f"{name} drops the source tensors {listed(unused)}.")


class _TransformersMessagesFilter(pylogging.Filter):
    """Drops transformers' load report (the converter reports what it found itself), or every message."""

    def __init__(self, everything: bool) -> None:
        super().__init__()
        self.everything = everything

    def filter(self, record: pylogging.LogRecord) -> bool:
        return not self.everything and "LOAD REPORT" not in record.getMessage()


@contextmanager
def _filtered_loading_messages(everything: bool) -> Iterator[None]:
    loggers = [logging.get_logger(name) for name in ("transformers.modeling_utils", "transformers.core_model_loading")]
    messages_filter = _TransformersMessagesFilter(everything)
    for loading_logger in loggers:
        loading_logger.addFilter(messages_filter)
    try:
        yield
    finally:
        for loading_logger in loggers:
            loading_logger.removeFilter(messages_filter)


def _load_report_hidden() -> Any:
    """Hide transformers' load report: `report_loading` names the new, kept and dropped weights."""
    return _filtered_loading_messages(everything=False)


@contextmanager
def loading_messages_hidden() -> Iterator[None]:
    """Hide every loading message and the progress bar: the dry runs that choose the head."""
    bar_was_enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        with _filtered_loading_messages(everything=True):
            yield
    finally:
        if bar_was_enabled:
            logging.enable_progress_bar()
