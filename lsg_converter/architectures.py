"""The architecture table: every fact the converter needs about a source model type, in one place.

Adding an architecture = a configuration/modeling pair under `models/` plus one row here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

import torch
import transformers
from torch import nn

from .errors import UnsupportedModelError
from .models.lsg_model import lsg_auto_classes

# Heads that generate left to right: converted with config.is_decoder = True (causal LSG).
CAUSAL_HEAD_SUFFIXES = ("LMHeadModel", "ForCausalLM")


@dataclass(frozen=True)
class Architecture:
    """How one source model type becomes LSG.

    Attributes:
        model_type: the source's ``config.model_type`` ("bert"); the converted model's is "lsg-bert",
            its files ``models/configuration_lsg_bert.py`` and ``models/modeling_lsg_bert.py``
            (dashes become underscores: "xlm-roberta" -> ``modeling_lsg_xlm_roberta.py``).
        default_head: head used when the source config names none.
        word_embeddings: token embedding module, relative to the base model.
        position_tables: position embedding modules, relative to the base model; the first one gives
            the global tokens their positions. A decoder-only head of an encoder-decoder architecture
            holds only the decoder's (see `position_tables_in`).
        position_offset: rows in front of the learned positions kept once (2 for RoBERTa and BART).
        sinusoidal_positions: the position tables are fixed sinusoids (Pegasus): the converter
            regenerates them at the new length instead of tiling them.
        token_type_table: token type embedding module added to the global tokens, if any.
    """

    model_type: str
    default_head: str
    word_embeddings: str = "embeddings.word_embeddings"
    position_tables: tuple[str, ...] = ("embeddings.position_embeddings",)
    position_offset: int = 0
    sinusoidal_positions: bool = False
    token_type_table: str | None = None

    @property
    def lsg_model_type(self) -> str:
        return f"lsg-{self.model_type}"

    @property
    def file_stem(self) -> str:
        """Stem of the architecture's files: "lsg_xlm_roberta" for "xlm-roberta"."""
        return self.lsg_model_type.replace("-", "_")

    def _module(self, kind: str) -> ModuleType:
        return importlib.import_module(f"lsg_converter.models.{kind}_{self.file_stem}")

    def modeling_module(self) -> ModuleType:
        return self._module("modeling")

    def config_class(self) -> type:
        module = self._module("configuration")
        return next(
            obj for obj in vars(module).values() if getattr(obj, "model_type", None) == self.lsg_model_type
        )

    @property
    def base_head(self) -> str:
        """Source name of the bare model ("BertModel"), the head converted when the source's is unknown."""
        return f"{self.config_class().lsg_base_name()}Model"

    @property
    def heads(self) -> dict[str, str]:
        """Source head class name -> LSG head class name ("BertForMaskedLM" -> "LSGBertForMaskedLM")."""
        return {name.removeprefix("LSG"): name for name in lsg_auto_classes(self.config_class()).values()}

    def lsg_class(self, head: str) -> type:
        """LSG class for a source head name ("BertForMaskedLM") or an LSG one ("LSGBertForMaskedLM")."""
        heads = self.heads
        lsg_name = heads.get(head, head if head in heads.values() else None)
        if lsg_name is None:
            known = ", ".join(sorted(heads))
            raise UnsupportedModelError(f"Unknown {self.model_type} head {head!r}: use architecture= with one of {known}.")
        return getattr(self.modeling_module(), lsg_name)

    def position_tables_in(self, base: nn.Module) -> dict[str, nn.Embedding]:
        """The position tables `base` holds, by name, in table order (a decoder-only head holds the decoder's only)."""
        modules = dict(base.named_modules())
        return {name: modules[name] for name in self.position_tables if name in modules}

    def position_rows(self, base: nn.Module) -> torch.Tensor:
        """The rows of `base`'s first position table after the offset rows, detached: (positions, E).

        Their count is the length the model reads (512 for BERT and RoBERTa)."""
        table = next(iter(self.position_tables_in(base).values()))
        return table.weight.detach()[self.position_offset :]


ARCHITECTURES: dict[str, Architecture] = {
    arch.model_type: arch
    for arch in (
        Architecture("bert", "BertForPreTraining", token_type_table="embeddings.token_type_embeddings"),
        Architecture("roberta", "RobertaForMaskedLM", position_offset=2),
        Architecture("distilbert", "DistilBertForMaskedLM"),
        Architecture("albert", "AlbertForPreTraining", token_type_table="embeddings.token_type_embeddings"),
        Architecture("electra", "ElectraForPreTraining", token_type_table="embeddings.token_type_embeddings"),
        Architecture("camembert", "CamembertForMaskedLM", position_offset=2),
        Architecture("xlm-roberta", "XLMRobertaForMaskedLM", position_offset=2),
        Architecture(
            "bart",
            "BartForConditionalGeneration",
            word_embeddings="shared",
            position_tables=("encoder.embed_positions", "decoder.embed_positions"),
            position_offset=2,
        ),
        Architecture(  # BARThez checkpoints are mBART ones: model_type "mbart"
            "mbart",
            "MBartForConditionalGeneration",
            word_embeddings="shared",
            position_tables=("encoder.embed_positions", "decoder.embed_positions"),
            position_offset=2,
        ),
        Architecture(
            "pegasus",
            "PegasusForConditionalGeneration",
            word_embeddings="shared",
            position_tables=("encoder.embed_positions", "decoder.embed_positions"),
            sinusoidal_positions=True,
        ),
    )
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
