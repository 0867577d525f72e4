"""LSG-Pegasus: the Pegasus heads of transformers with an LSG encoder.

Each head ``LSGPegasus<Head>`` is the mixin below plus ``Pegasus<Head>``; the heads are listed in
LSGPegasusConfig. The decoder stays dense with the KV cache; ``LSGPegasusForCausalLM`` is the
pretrained decoder alone. Positions are sinusoidal: the converter regenerates them at the new length.
"""

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


define_lsg_heads(LSGPegasusMixin, modeling_pegasus, globals())
