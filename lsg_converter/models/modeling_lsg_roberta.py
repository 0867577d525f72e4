"""LSG-RoBERTa: the RoBERTa heads of transformers with LSG attention and global tokens.

Each head ``LSGRoberta<Head>`` is the mixin below plus ``Roberta<Head>``, one class per head listed in
LSGRobertaConfig. Positions keep RoBERTa's padding_idx convention (2 offset rows).
"""

from .configuration_lsg_roberta import LSGRobertaConfig
from .lsg_layout import LSGLayout
from .lsg_model import LSGModelMixin
from .lsg_transformers import transformers_names

with transformers_names():  # one line naming both versions if a release removed one of these
    from transformers.models.roberta.modeling_roberta import (
        RobertaForCausalLM,
        RobertaForMaskedLM,
        RobertaForMultipleChoice,
        RobertaForQuestionAnswering,
        RobertaForSequenceClassification,
        RobertaForTokenClassification,
        RobertaModel,
    )


class LSGRobertaMixin(LSGModelMixin):
    """Same places as BERT: `embeddings.global_embeddings`, prepended before `embeddings.LayerNorm`."""

    config_class = LSGRobertaConfig
    lsg_layout = LSGLayout(positions_after_padding=True)


class LSGRobertaModel(LSGRobertaMixin, RobertaModel):
    """RobertaModel with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGRobertaForMaskedLM(LSGRobertaMixin, RobertaForMaskedLM):
    """RobertaForMaskedLM with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGRobertaForSequenceClassification(LSGRobertaMixin, RobertaForSequenceClassification):
    """RobertaForSequenceClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGRobertaForTokenClassification(LSGRobertaMixin, RobertaForTokenClassification):
    """RobertaForTokenClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGRobertaForQuestionAnswering(LSGRobertaMixin, RobertaForQuestionAnswering):
    """RobertaForQuestionAnswering with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGRobertaForMultipleChoice(LSGRobertaMixin, RobertaForMultipleChoice):
    """RobertaForMultipleChoice with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGRobertaForCausalLM(LSGRobertaMixin, RobertaForCausalLM):
    """RobertaForCausalLM with LSG attention (Local + Sparse + Global) and global tokens."""
