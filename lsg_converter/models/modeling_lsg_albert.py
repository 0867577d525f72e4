"""LSG-ALBERT: the ALBERT heads of transformers with LSG attention and global tokens.

Each head ``LSGAlbert<Head>`` is the mixin below plus ``Albert<Head>``; the heads are listed in
LSGAlbertConfig. The global tokens live in the factorised embedding space (``embedding_size`` wide):
they are prepended before `embeddings.LayerNorm` and mapped to ``hidden_size`` by the encoder's
`embedding_hidden_mapping_in` with the other tokens. The shared layers all run the one LSG attention.
"""

from transformers.models.albert import modeling_albert

from .configuration_lsg_albert import LSGAlbertConfig
from .lsg_model import LSGModelMixin, define_lsg_heads


class LSGAlbertMixin(LSGModelMixin):
    """Same places as BERT: `embeddings.global_embeddings`, prepended before `embeddings.LayerNorm`."""

    config_class = LSGAlbertConfig


define_lsg_heads(LSGAlbertMixin, modeling_albert, globals())
