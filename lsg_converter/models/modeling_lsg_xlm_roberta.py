"""LSG-XLM-RoBERTa: the XLM-RoBERTa heads of transformers with LSG attention and global tokens.

Each head ``LSGXLMRoberta<Head>`` is the mixin below plus ``XLMRoberta<Head>``, one class per head listed in
LSGXLMRobertaConfig. Positions keep RoBERTa's padding_idx convention (2 offset rows).
"""

from .configuration_lsg_xlm_roberta import LSGXLMRobertaConfig
from .lsg_layout import LSGLayout
from .lsg_model import LSGModelMixin
from .lsg_transformers import transformers_names

with transformers_names():  # one line naming both versions if a release removed one of these
    from transformers.models.xlm_roberta.modeling_xlm_roberta import (
        XLMRobertaForCausalLM,
        XLMRobertaForMaskedLM,
        XLMRobertaForMultipleChoice,
        XLMRobertaForQuestionAnswering,
        XLMRobertaForSequenceClassification,
        XLMRobertaForTokenClassification,
        XLMRobertaModel,
    )


class LSGXLMRobertaMixin(LSGModelMixin):
    """Same places as RoBERTa: `embeddings.global_embeddings`, prepended before `embeddings.LayerNorm`."""

    config_class = LSGXLMRobertaConfig
    lsg_layout = LSGLayout(positions_after_padding=True)


class LSGXLMRobertaModel(LSGXLMRobertaMixin, XLMRobertaModel):
    """XLMRobertaModel with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGXLMRobertaForMaskedLM(LSGXLMRobertaMixin, XLMRobertaForMaskedLM):
    """XLMRobertaForMaskedLM with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGXLMRobertaForSequenceClassification(LSGXLMRobertaMixin, XLMRobertaForSequenceClassification):
    """XLMRobertaForSequenceClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGXLMRobertaForTokenClassification(LSGXLMRobertaMixin, XLMRobertaForTokenClassification):
    """XLMRobertaForTokenClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGXLMRobertaForQuestionAnswering(LSGXLMRobertaMixin, XLMRobertaForQuestionAnswering):
    """XLMRobertaForQuestionAnswering with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGXLMRobertaForMultipleChoice(LSGXLMRobertaMixin, XLMRobertaForMultipleChoice):
    """XLMRobertaForMultipleChoice with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGXLMRobertaForCausalLM(LSGXLMRobertaMixin, XLMRobertaForCausalLM):
    """XLMRobertaForCausalLM with LSG attention (Local + Sparse + Global) and global tokens."""
