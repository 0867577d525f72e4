"""LSG-Pegasus: the Pegasus heads of transformers with an LSG encoder.

Each head ``LSGPegasus<Head>`` is the mixin below plus ``Pegasus<Head>``; the heads are listed in
LSGPegasusConfig. The decoder stays dense (SDPA) with the KV cache; ``LSGPegasusForCausalLM`` is the
pretrained decoder alone. Positions are sinusoidal: the converter regenerates them at the new length.
"""

from typing import Any

from transformers.models.pegasus import modeling_pegasus

from .configuration_lsg_pegasus import LSGPegasusConfig
from .lsg_model import LSGModelMixin, define_lsg_heads


class LSGPegasusMixin(LSGModelMixin):
    """Pegasus is pre-norm with no norm after its embeddings: the global tokens live in the encoder
    and join before its first layer, after embed_scale * tokens + positions and the embedding dropout.
    """

    config_class = LSGPegasusConfig
    lsg_embeddings = "encoder"
    lsg_prepend_before = "encoder.layers.0"

    def __init__(self, config: LSGPegasusConfig, *args: Any, **kwargs: Any) -> None:
        if config.encoder_layerdrop and not config.lsg_dense_decoder:
            raise ValueError(
                "LSG-Pegasus joins its global tokens at the first encoder layer, which LayerDrop could skip: "
                "set encoder_layerdrop=0."
            )
        super().__init__(config, *args, **kwargs)


define_lsg_heads(LSGPegasusMixin, modeling_pegasus, globals())
