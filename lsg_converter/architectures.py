"""The architecture table: every fact the converter needs about a source model type, in one place.

Adding an architecture = a configuration/modeling pair under `models/` plus one row here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
import transformers
from packaging.version import Version
from torch import nn

from .errors import UnsupportedModelError
from .models.lsg_layout import LSGLayout
from .models.lsg_model import lsg_auto_classes

# The Auto class of the heads that generate left to right: converted with config.is_decoder = True (causal LSG).
CAUSAL_AUTO_CLASS = "AutoModelForCausalLM"
# Head converted when the source names none: the first of these the architecture has (the head that
# holds the whole pretrained model: BERT's masked LM and next sentence, BART's generator, ...).
DEFAULT_HEAD_SUFFIXES = ("ForPreTraining", "ForConditionalGeneration", "ForMaskedLM")


def max_length_of(model: nn.Module) -> int:
    """Tokens an LSG model reads, as the model computes it for its own input check (`LSGLayout.max_input_length`)."""
    return model.lsg_layout.max_input_length(model.config)


@dataclass(frozen=True)
class Architecture:
    """A source model type the converter turns into LSG: a row of the table, and what it reads from the
    architecture's two files under `models/`.

    The heads, their Auto classes and the default head come from the configuration class; where the
    position tables, the token type table and the global tokens are, from the model mixin's
    `LSGLayout` (`layout`).

    Attributes:
        model_type: the source's ``config.model_type`` ("bert"); the converted model's is "lsg-bert",
            its files ``models/configuration_lsg_bert.py`` and ``models/modeling_lsg_bert.py``
            (dashes become underscores: "xlm-roberta" -> ``modeling_lsg_xlm_roberta.py``).
    """

    model_type: str

    @property
    def layout(self) -> LSGLayout:
        """Where the architecture's modules are (the ``lsg_layout`` of its model classes)."""
        return self.lsg_class(self.base_head).lsg_layout

    def sinusoid_layout(self, config: Any) -> str | None:
        """The layout of the sinusoidal position tables of a model with `config`; None where they are learned."""
        return self.layout.sinusoid_layout(config)

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
    def default_head(self) -> str:
        """Source name of the head converted when the source names none: the first of
        `DEFAULT_HEAD_SUFFIXES` the config class lists ("BertForPreTraining", "RobertaForMaskedLM")."""
        base_name = self.config_class().lsg_base_name()
        return next(f"{base_name}{suffix}" for suffix in DEFAULT_HEAD_SUFFIXES if f"{base_name}{suffix}" in self.heads)

    @property
    def heads(self) -> dict[str, str]:
        """Source head class name -> LSG head class name ("BertForMaskedLM" -> "LSGBertForMaskedLM")."""
        return {name.removeprefix("LSG"): name for name in lsg_auto_classes(self.config_class()).values()}

    @property
    def auto_classes(self) -> dict[str, str]:
        """LSG head class name -> its transformers Auto class ("LSGBertForMaskedLM" -> "AutoModelForMaskedLM")."""
        return {name: auto_class for auto_class, name in lsg_auto_classes(self.config_class()).items()}

    def is_causal(self, head: str) -> bool:
        """Whether the head (a source name or an LSG one) generates left to right (LMHeadModel, ForCausalLM)."""
        return self.auto_classes.get(self.heads.get(head, head)) == CAUSAL_AUTO_CLASS

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
        return {name: modules[name] for name in self.layout.position_tables if name in modules}

    def position_offset_of(self, model: nn.Module) -> int:
        """Rows in front of the learned positions of an LSG model's tables, which no token reaches and
        which are kept once: the rows of its first position table beyond `max_length_of` (2 for RoBERTa's
        padding rows and BART's offset, 0 for the others)."""
        first_table = next(iter(self.position_tables_in(model.base_model).values()), None)
        return 0 if first_table is None else first_table.weight.shape[0] - max_length_of(model)

    @property
    def position_offset(self) -> int:
        """`position_offset_of` the bare model of the default configuration (built on the meta device)."""
        with torch.device("meta"):
            model = self.lsg_class(self.base_head)(self.config_class()())
        return self.position_offset_of(model)

    def position_rows(self, model: nn.Module) -> torch.Tensor | None:
        """The rows of an LSG model's first position table after the offset rows, detached: (positions, E).

        Their count is the length the model reads (512 for BERT and RoBERTa). None for a model without
        a position table (DeBERTa-v3: relative positions only)."""
        table = next(iter(self.position_tables_in(model.base_model).values()), None)
        return None if table is None else table.weight.detach()[self.position_offset_of(model) :]

    def token_type_row(self, model: nn.Module) -> torch.Tensor | None:
        """The type-0 row of the model's token type table, detached: (E,); None where it has none (the
        architecture's, or a config with type_vocab_size=0)."""
        if self.layout.token_type_table is None:
            return None
        table = dict(model.base_model.named_modules()).get(self.layout.token_type_table)
        return None if table is None else table.weight.detach()[0]


# Source model types that transformers brought after its oldest release we support, by that release.
NEWER_MODEL_TYPES = {"gte": "5.18.0"}
# The model types the installed transformers lacks (`find_architecture` refuses them naming the release).
MISSING_MODEL_TYPES = {
    model_type: release
    for model_type, release in NEWER_MODEL_TYPES.items()
    if Version(transformers.__version__) < Version(release)
}

# One row per source model type: its two files under models/ say the rest. BARThez checkpoints are
# mBART ones; MPNet's relative bias and DeBERTa's c2p and p2c terms are evaluated per block (their files);
# NomicBERT, GTE and EuroBERT rotate their queries and keys (lsg_layout.LSGLayout.rotary_embeddings).
ARCHITECTURES: dict[str, Architecture] = {
    model_type: Architecture(model_type)
    for model_type in (
        "bert",
        "roberta",
        "distilbert",
        "albert",
        "electra",
        "camembert",
        "xlm-roberta",
        "bart",
        "mbart",
        "pegasus",
        "mpnet",
        "deberta-v2",
        "t5",
        "mt5",
        "umt5",
        "nomic_bert",
        "gte",
        "eurobert",
        "modernbert",
        "jina_embeddings_v3",
    )
    if model_type not in MISSING_MODEL_TYPES
}

LSG_MODEL_TYPES = {arch.lsg_model_type: arch for arch in ARCHITECTURES.values()}


def find_architecture(model_type: str) -> Architecture:
    """Row for a source or LSG model type; a clear error listing the supported ones otherwise."""
    arch = ARCHITECTURES.get(model_type) or LSG_MODEL_TYPES.get(model_type)
    release = MISSING_MODEL_TYPES.get(model_type.removeprefix("lsg-"))
    if arch is None and release is not None:
        raise UnsupportedModelError(
            f"Model type {model_type!r} needs transformers {release} or newer (installed: {transformers.__version__}): "
            f'pip install -U "transformers>={release}".'
        )
    if arch is None:
        supported = ", ".join(sorted(ARCHITECTURES))
        raise UnsupportedModelError(f"Model type {model_type!r} cannot be converted: supported types are {supported}.")
    return arch


def lsg_classes() -> dict[str, type]:
    """Every LSG configuration and head class of the table, by class name."""
    classes: dict[str, type] = {}
    for arch in ARCHITECTURES.values():
        config_class = arch.config_class()
        modeling = arch.modeling_module()
        classes[config_class.__name__] = config_class
        classes.update({name: getattr(modeling, name) for name in lsg_auto_classes(config_class).values()})
    return classes


def register_auto_classes() -> None:
    """Let transformers' Auto classes load LSG checkpoints natively while lsg_converter is installed."""
    for arch in ARCHITECTURES.values():
        config_class = arch.config_class()
        modeling = arch.modeling_module()
        transformers.AutoConfig.register(arch.lsg_model_type, config_class, exist_ok=True)
        for auto_class, class_name in lsg_auto_classes(config_class).items():
            getattr(transformers, auto_class).register(config_class, getattr(modeling, class_name), exist_ok=True)
