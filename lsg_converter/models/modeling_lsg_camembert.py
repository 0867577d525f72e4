"""LSG-CamemBERT: the CamemBERT heads of transformers with LSG attention and global tokens.

Each head ``LSGCamembert<Head>`` is the mixin below plus ``Camembert<Head>``; the heads are listed in
LSGCamembertConfig. Positions keep RoBERTa's padding_idx convention (2 offset rows).
"""

from transformers.models.camembert import modeling_camembert

from .configuration_lsg_camembert import LSGCamembertConfig
from .lsg_model import LSGModelMixin, define_lsg_heads


class LSGCamembertMixin(LSGModelMixin):
    """Same places as RoBERTa: `embeddings.global_embeddings`, prepended before `embeddings.LayerNorm`."""

    config_class = LSGCamembertConfig
    lsg_positions_after_padding = True


define_lsg_heads(LSGCamembertMixin, modeling_camembert, globals())
