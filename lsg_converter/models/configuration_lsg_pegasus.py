"""Configuration of LSG-Pegasus: PegasusConfig plus the LSG keys (see lsg_model.LSGConfigMixin).

Only the encoder's self-attention is LSG; ``pass_global_tokens_to_decoder`` (default:
`lsg_defaults.SEQ2SEQ_DEFAULTS`) lets the decoder's cross-attention see the encoder's global tokens.
"""

from typing import Any

from transformers import PegasusConfig

from .lsg_defaults import SEQ2SEQ_DEFAULTS
from .lsg_model import LSGConfigMixin


class LSGPegasusConfig(LSGConfigMixin, PegasusConfig):
    """PegasusConfig with the LSG keys; loads reference-format configs (model_type "pegasus") too."""

    model_type = "lsg-pegasus"
    lsg_heads = ("Model", "ForConditionalGeneration", "ForCausalLM")
    lsg_defaults = SEQ2SEQ_DEFAULTS

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self.encoder_layerdrop and not self.lsg_dense_decoder:
            raise ValueError(
                "LSG-Pegasus joins its global tokens at the first encoder layer, which LayerDrop could skip: "
                "set encoder_layerdrop=0."
            )
