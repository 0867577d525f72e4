"""Configuration of LSG-T5 (T5, T5 v1.1, Flan-T5 checkpoints): T5Config plus the LSG keys (see
lsg_model.LSGConfigMixin), ``global_token_position`` (where the global tokens sit in T5's relative
position bias) and ``max_position_embeddings``, the tokens the model reads (T5 has no position table:
a source config names no length, the converted one does).

The facts of the T5 family (T5, mT5, UMT5) live here, where mT5's and UMT5's pairs import them from:
its heads, its defaults and its layout.
"""

from typing import Any

from transformers import T5Config

from .lsg_defaults import SEQ2SEQ_DEFAULTS
from .lsg_layout import LSGLayout
from .lsg_model import LSGConfigMixin
from .lsg_transformers import dense_implementations, transformers_names

with transformers_names():
    from transformers.models.t5.modeling_t5 import T5PreTrainedModel

# The heads of T5, mT5 and UMT5.
T5_HEADS = (
    "Model",
    "ForConditionalGeneration",
    "EncoderModel",
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForQuestionAnswering",
)
# T5 reads its first token as a word (it has no [CLS] or <s>): the first token keeps its own output
# (pool_with_global off); the global tokens sit at position 0 of the relative bias, where that token is.
T5_DEFAULTS: dict[str, Any] = {**SEQ2SEQ_DEFAULTS, "pool_with_global": False, "global_token_position": 0}
# Where the encoder is: the global tokens live in the stack and join before its first block (the stack
# applies its one dropout module to the embeddings and again to its output, so that is no place to join);
# no position table, and a config that names no length reads the 512 tokens T5 was trained on.
T5_LAYOUT = LSGLayout(embeddings="encoder", prepend_before=("encoder.block.0",), position_tables=(), pretrained_length=512)



def t5_dense_implementations(model_class: type) -> tuple[str, ...]:
    """What the dense decoder of a T5-family model (`model_class`, transformers' PreTrainedModel of the
    family) runs of transformers' attention: not flex_attention, whose T5 indexes its (1, H, q, k) position
    bias by batch and fails on a batch of 2 or more (5.24); eager only before transformers 5.2x."""
    return tuple(name for name in dense_implementations(model_class) if name != "flex_attention")


class LSGT5Config(LSGConfigMixin, T5Config):
    """T5Config with the LSG keys."""

    model_type = "lsg-t5"
    lsg_heads = T5_HEADS
    lsg_defaults = T5_DEFAULTS
    lsg_dense_implementations = t5_dense_implementations(T5PreTrainedModel)
