"""Which head a conversion builds: each candidate is loaded on the meta device (no weights read into
memory) to see which source weights it would hold and which it would lack."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedModel
from transformers.utils import logging

from .architectures import Architecture
from .errors import CorruptCheckpointError, InvalidSettingsError, listed
from .loading import load_model, loading_messages_hidden, missing_weights
from .lsg_config import build_lsg_config

logger = logging.get_logger(__name__)

# The heads with labels (a classifier of config.num_labels outputs): those num_labels= acts on.
LABELLED_HEAD_SUFFIXES = ("ForSequenceClassification", "ForTokenClassification")


@dataclass
class DryRun:
    """A head loaded on the meta device (no weights read into memory): what it would hold and lack."""

    lsg_class: type
    config: Any
    model: PreTrainedModel  # on the meta device: shapes only
    missing: list[str]  # weights the source lacks (newly initialised), the global token table aside
    # (a classifier the source has for another number of labels is not: see `loading.load_model`)
    unexpected: set[str]  # source tensors the class does not hold


def _dry_run(
    arch: Architecture, source: str, source_config: Any, settings: dict[str, Any], lsg_class: type, token: Any
) -> DryRun:
    config = build_lsg_config(arch, source_config, lsg_class, settings)
    with loading_messages_hidden():
        model, info = load_model(
            lsg_class, source, config, token, device_map="meta", source_labels=source_config.num_labels
        )
    return DryRun(lsg_class, config, model, missing_weights(info), set(info["unexpected_keys"]))


def choose_head(
    arch: Architecture,
    source: str,
    source_config: Any,
    settings: dict[str, Any],
    architecture: str | None,
    token: Any,
) -> DryRun:
    """The head to build, tried on the meta device: `architecture` when asked for; else the source
    config's first architecture if the weights hold it; else the head whose weights the source holds
    (of those, the one that leaves the fewest source tensors unused; the bare model if none).

    InvalidSettingsError where `settings` give num_labels and that head has no labels (`check_labels_apply`)."""
    run = _chosen_head(arch, source, source_config, settings, architecture, token)
    check_labels_apply(arch, run.lsg_class, settings, architecture)
    return run


def check_labels_apply(arch: Architecture, lsg_class: type, settings: dict[str, Any], architecture: str | None) -> None:
    """InvalidSettingsError where `settings` give num_labels and `lsg_class` (the head built: `architecture`,
    else the source's) is no head with labels (`LABELLED_HEAD_SUFFIXES`): the number would set nothing."""
    labels = settings.get("num_labels")
    if labels is None or lsg_class.__name__.endswith(LABELLED_HEAD_SUFFIXES):
        return
    labelled = [head for head in arch.heads if head.endswith(LABELLED_HEAD_SUFFIXES)]
    built = f"architecture={architecture}" if architecture else "the source's head"
    advice = (
        f"pass architecture= with one of {', '.join(labelled)}, or leave num_labels= out"
        if labelled
        else f"no {arch.model_type} head has labels: leave num_labels= out"
    )
    raise InvalidSettingsError(
        f"num_labels={labels} sets the labels of a classification head, and this conversion builds "
        f"{lsg_class.__name__} ({built}): {advice}."
    )


def _chosen_head(
    arch: Architecture,
    source: str,
    source_config: Any,
    settings: dict[str, Any],
    architecture: str | None,
    token: Any,
) -> DryRun:
    def attempt(head: str) -> DryRun:
        return _dry_run(arch, source, source_config, settings, arch.lsg_class(head), token)

    if architecture:
        return attempt(architecture)
    heads = arch.heads
    named = (source_config.architectures or [None])[0]
    if named in heads or named in heads.values():
        run = attempt(named)
        if not run.missing:
            return run
        reason = f"config.json names {named}, but the weights lack {listed(run.missing)}"
        advice = f"pass architecture={named!r} to build it with those weights newly initialised"
    elif named:
        reason = f"The source's architecture {named!r} is no {arch.model_type} head"
        advice = f"pass architecture= with one of {', '.join(sorted(heads))} to build another head"
    else:
        reason, advice = "config.json names no architecture", ""
    is_decoder = bool(getattr(source_config, "is_decoder", False))
    candidates = [arch.default_head, *(head for head in heads if head != arch.default_head)]
    runs = []
    for head in candidates:
        if head == named or arch.is_causal(head) != is_decoder:
            continue
        try:
            runs.append(attempt(head))
        except CorruptCheckpointError:  # the weights do not fit this head (a classifier of another size)
            continue
    supported = [run for run in runs if not run.missing]
    if not supported:
        base = next(run for run in runs if run.lsg_class is arch.lsg_class(arch.base_head))
        raise CorruptCheckpointError(
            f"The weights of {source} lack {listed(base.missing)}, which every {arch.model_type} model needs: "
            "download or save the model again."
        )
    chosen = min(supported, key=lambda run: len(run.unexpected))  # the first of equals: candidates' order
    message = f"{reason}: its weights are converted as {chosen.lsg_class.__name__}, the head they hold"
    if advice:
        logger.warning(f"{message}; {advice}.")
    else:
        logger.info(f"{message}.")
    return chosen
