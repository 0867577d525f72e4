"""LSG-DistilBERT: the DistilBERT heads of transformers with LSG attention and global tokens.

Each head ``LSGDistilBert<Head>`` is the mixin below plus ``DistilBert<Head>``; the heads are listed in
LSGDistilBertConfig. ``inputs_embeds`` works like ``input_ids``: the global tokens join at the norm.
"""

from transformers.models.distilbert import modeling_distilbert

from .configuration_lsg_distilbert import LSGDistilBertConfig
from .lsg_model import LSGModelMixin, define_lsg_heads


class LSGDistilBertMixin(LSGModelMixin):
    """DistilBERT's encoder is called `transformer`."""

    config_class = LSGDistilBertConfig
    lsg_encoder = "transformer"


define_lsg_heads(LSGDistilBertMixin, modeling_distilbert, globals())
