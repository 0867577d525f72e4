"""Configuration of LSG-mBART: MBartConfig plus the LSG keys (see lsg_model.LSGConfigMixin).

BARThez checkpoints are mBART ones (model_type "mbart") and convert with this class too. Only the
encoder's self-attention is LSG; ``pass_global_tokens_to_decoder`` (default: `lsg_defaults.SEQ2SEQ_DEFAULTS`)
lets the decoder's cross-attention see the encoder's global tokens.
"""

from transformers import MBartConfig

from .lsg_defaults import SEQ2SEQ_DEFAULTS
from .lsg_model import LSGConfigMixin


class LSGMBartConfig(LSGConfigMixin, MBartConfig):
    """MBartConfig with the LSG keys; loads reference-format configs (model_type "mbart") too."""

    model_type = "lsg-mbart"
    lsg_heads = (
        "Model", "ForConditionalGeneration", "ForCausalLM", "ForSequenceClassification", "ForQuestionAnswering"
    )
    lsg_defaults = SEQ2SEQ_DEFAULTS
