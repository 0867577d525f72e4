"""The sentence-transformers module of an LSG T5 encoder: written beside the model by lsg_converter, named
in its modules.json ("type": "lsg_sentence_transformer.LSGTransformer"), loaded from the folder by
``SentenceTransformer(folder, trust_remote_code=True)``.

sentence-transformers loads the encoder of any T5, mT5 or UMT5 config (LSG configs are subclasses) with
its own T5EncoderModel class, never the folder's remote code, and would run an LSG encoder as the dense
source model. This module is sentence-transformers' Transformer with one change: the encoder is the
folder's own text-encoding class (``AutoModelForTextEncoding``, whose ``auto_map`` entry names
``LSGT5EncoderModel`` or its mT5 / UMT5 twin). It imports sentence-transformers and transformers only.
"""

from typing import Any

from sentence_transformers.base.modules.transformer import Transformer
from transformers import AutoModelForTextEncoding, PretrainedConfig, PreTrainedModel


class LSGTransformer(Transformer):
    """sentence-transformers' Transformer module that reads the text with the folder's LSG encoder."""

    def _load_encoder_only_model(self, model_name_or_path: str, config: PretrainedConfig, **model_kwargs: Any) -> PreTrainedModel:
        return AutoModelForTextEncoding.from_pretrained(model_name_or_path, config=config, **model_kwargs)
