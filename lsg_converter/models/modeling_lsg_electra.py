"""LSG-ELECTRA: the ELECTRA heads of transformers with LSG attention and global tokens.

Each head ``LSGElectra<Head>`` is the mixin below plus ``Electra<Head>``; the heads are listed in
LSGElectraConfig. The global tokens live in the embedding space (``embedding_size`` wide): they are
prepended before `embeddings.LayerNorm`, then `embeddings_project` (present when ``embedding_size``
differs from ``hidden_size``) maps them to ``hidden_size`` with the other tokens.
"""

from transformers.models.electra import modeling_electra

from .configuration_lsg_electra import LSGElectraConfig
from .lsg_model import LSGModelMixin, define_lsg_heads


class LSGElectraMixin(LSGModelMixin):
    """Same places as BERT: `embeddings.global_embeddings`, prepended before `embeddings.LayerNorm`."""

    config_class = LSGElectraConfig


define_lsg_heads(LSGElectraMixin, modeling_electra, globals())
