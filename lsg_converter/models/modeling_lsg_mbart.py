"""LSG-mBART (and BARThez): the mBART heads of transformers with an LSG encoder.

Each head ``LSGMBart<Head>`` is the mixin below plus ``MBart<Head>``; the heads are listed in
LSGMBartConfig. As in BART, the decoder's self- and cross-attention stay dense with the KV
cache, and ``LSGMBartForCausalLM`` is the pretrained decoder alone, dense, with a longer position table.
"""

from transformers.models.mbart import modeling_mbart

from .configuration_lsg_mbart import LSGMBartConfig
from .lsg_model import LSGModelMixin, define_lsg_heads


class LSGMBartMixin(LSGModelMixin):
    """The global tokens live in the encoder and join after embed_scale * tokens + positions."""

    config_class = LSGMBartConfig
    lsg_embeddings = "encoder"
    lsg_prepend_before = "encoder.layernorm_embedding"


define_lsg_heads(LSGMBartMixin, modeling_mbart, globals())
