"""Configuration of LSG-BART: BartConfig plus the LSG keys (see lsg_model.LSGConfigMixin).

Only the encoder's self-attention is LSG; ``pass_global_tokens_to_decoder`` (default:
`lsg_defaults.SEQ2SEQ_DEFAULTS`) lets the decoder's cross-attention see the encoder's global tokens.
"""

from transformers import BartConfig

from .lsg_defaults import SEQ2SEQ_DEFAULTS
from .lsg_model import LSGConfigMixin


class LSGBartConfig(LSGConfigMixin, BartConfig):
    """BartConfig with the LSG keys; loads reference-format configs (model_type "bart") too."""

    model_type = "lsg-bart"
    lsg_heads = (
        "Model", "ForConditionalGeneration", "ForCausalLM", "ForSequenceClassification", "ForQuestionAnswering"
    )
    lsg_defaults = SEQ2SEQ_DEFAULTS
