"""The architecture table: every fact the converter needs about a source model type, in one place.

Adding an architecture = a configuration/modeling pair under `models/` plus one row here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

import transformers

from .errors import UnsupportedModelError
from .models.lsg_attention import lsg_auto_classes


@dataclass(frozen=True)
class Architecture:
    """How one source model type becomes LSG.

    Attributes:
        model_type: the source's ``config.model_type`` ("bert").
        lsg_model_type: the converted model's ``model_type`` ("lsg-bert").
        module: file stem under ``lsg_converter/models`` ("lsg_bert" -> modeling_lsg_bert.py); its
            config's ``lsg_auto_map`` lists the heads.
        default_head: head used when the source config names none.
        base_model_prefix: attribute of a head that holds the base model ("bert").
        position_table: position embedding module, relative to the base model.
        position_offset: rows in front of the learned positions kept once (2 for RoBERTa and BART).
        token_type_table: token type embedding module, if the model has token types.
        word_embeddings: token embedding module, relative to the base model.
        global_embeddings: where the LSG global token table lives, relative to the base model.
    """

    model_type: str
    lsg_model_type: str
    module: str
    default_head: str
    base_model_prefix: str
    position_table: str
    word_embeddings: str
    global_embeddings: str
    position_offset: int = 0
    token_type_table: str | None = None

    def modeling_module(self) -> ModuleType:
        return importlib.import_module(f"lsg_converter.models.modeling_{self.module}")

    def config_class(self) -> type:
        module = importlib.import_module(f"lsg_converter.models.configuration_{self.module}")
        return next(
            obj for obj in vars(module).values() if getattr(obj, "model_type", None) == self.lsg_model_type
        )

    @property
    def heads(self) -> dict[str, str]:
        """Source head class name -> LSG head class name ("BertForMaskedLM" -> "LSGBertForMaskedLM")."""
        return {name.removeprefix("LSG"): name for name in lsg_auto_classes(self.config_class()).values()}

    def lsg_class(self, head: str) -> type:
        """LSG class for a source head name ("BertForMaskedLM") or an LSG one ("LSGBertForMaskedLM")."""
        lsg_name = self.heads.get(head, head if head in self.heads.values() else None)
        if lsg_name is None:
            known = ", ".join(sorted(self.heads))
            raise UnsupportedModelError(f"Unknown {self.model_type} head {head!r}: use --architecture with one of {known}.")
        return getattr(self.modeling_module(), lsg_name)


ARCHITECTURES: dict[str, Architecture] = {
    "bert": Architecture(
        model_type="bert",
        lsg_model_type="lsg-bert",
        module="lsg_bert",
        default_head="BertForPreTraining",
        base_model_prefix="bert",
        position_table="embeddings.position_embeddings",
        word_embeddings="embeddings.word_embeddings",
        global_embeddings="embeddings.global_embeddings",
        token_type_table="embeddings.token_type_embeddings",
    ),
}

LSG_MODEL_TYPES = {arch.lsg_model_type: arch for arch in ARCHITECTURES.values()}


def find_architecture(model_type: str) -> Architecture:
    """Row for a source or LSG model type; a clear error listing the supported ones otherwise."""
    arch = ARCHITECTURES.get(model_type) or LSG_MODEL_TYPES.get(model_type)
    if arch is None:
        supported = ", ".join(sorted(ARCHITECTURES))
        raise UnsupportedModelError(f"Model type {model_type!r} cannot be converted: supported types are {supported}.")
    return arch


def register_auto_classes() -> None:
    """Let transformers' Auto classes load LSG checkpoints natively while lsg_converter is installed."""
    for arch in ARCHITECTURES.values():
        config_class = arch.config_class()
        modeling = arch.modeling_module()
        transformers.AutoConfig.register(arch.lsg_model_type, config_class, exist_ok=True)
        for auto_class, class_name in lsg_auto_classes(config_class).items():
            getattr(transformers, auto_class).register(config_class, getattr(modeling, class_name), exist_ok=True)
