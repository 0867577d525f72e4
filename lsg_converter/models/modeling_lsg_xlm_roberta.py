"""LSG-XLM-RoBERTa: the XLM-RoBERTa heads of transformers with LSG attention and global tokens.

Each head ``LSGXLMRoberta<Head>`` is the mixin below plus ``XLMRoberta<Head>``; the heads are listed in
LSGXLMRobertaConfig. Positions keep RoBERTa's padding_idx convention (2 offset rows).
"""

from transformers.models.xlm_roberta import modeling_xlm_roberta

from .configuration_lsg_xlm_roberta import LSGXLMRobertaConfig
from .lsg_model import LSGModelMixin, define_lsg_heads


class LSGXLMRobertaMixin(LSGModelMixin):
    """Same places as RoBERTa: `embeddings.global_embeddings`, prepended before `embeddings.LayerNorm`."""

    config_class = LSGXLMRobertaConfig
    lsg_positions_after_padding = True


define_lsg_heads(LSGXLMRobertaMixin, modeling_xlm_roberta, globals())
