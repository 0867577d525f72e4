"""LSG-RoBERTa: the RoBERTa heads of transformers with LSG attention and global tokens.

Each head ``LSGRoberta<Head>`` is the mixin below plus ``Roberta<Head>``; the heads are listed in
LSGRobertaConfig. Positions keep RoBERTa's padding_idx convention (2 offset rows).
"""

from transformers.models.roberta import modeling_roberta

from .configuration_lsg_roberta import LSGRobertaConfig
from .lsg_model import LSGModelMixin, define_lsg_heads


class LSGRobertaMixin(LSGModelMixin):
    """Same places as BERT: `embeddings.global_embeddings`, prepended before `embeddings.LayerNorm`."""

    config_class = LSGRobertaConfig
    lsg_positions_after_padding = True


define_lsg_heads(LSGRobertaMixin, modeling_roberta, globals())
