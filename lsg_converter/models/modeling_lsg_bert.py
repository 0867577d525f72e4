"""LSG-BERT: the BERT heads of transformers with LSG attention and global tokens.

Each head ``LSGBert<Head>`` is the mixin below plus ``Bert<Head>``; the heads are listed in LSGBertConfig.
"""

from transformers.models.bert import modeling_bert

from .configuration_lsg_bert import LSGBertConfig
from .lsg_model import LSGModelMixin, define_lsg_heads


class LSGBertMixin(LSGModelMixin):
    """BERT keeps its global tokens in `embeddings` and prepends them before `embeddings.LayerNorm`."""

    config_class = LSGBertConfig


define_lsg_heads(LSGBertMixin, modeling_bert, globals())
