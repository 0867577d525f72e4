"""lsg_converter: turn pretrained BERT-family checkpoints into LSG models that read long inputs.

    from lsg_converter import LSGConverter
    model, tokenizer = LSGConverter(max_sequence_length=4096).convert_from_pretrained("bert-base-uncased")

Importing the package registers the LSG configs and models with transformers' Auto classes, so that
saved LSG checkpoints also load without ``trust_remote_code`` while the package is installed.
"""

from .architectures import ARCHITECTURES, register_auto_classes
from .converter import LSGConverter, save_converted
from .errors import (
    InvalidSettingsError,
    LSGError,
    OutputExistsError,
    SourceNotFoundError,
    UnsupportedModelError,
)
from .models.configuration_lsg_bert import LSGBertConfig
from .models.lsg_attention import SPARSITY_TYPES
from .models.modeling_lsg_bert import (
    LSGBertForMaskedLM,
    LSGBertForMultipleChoice,
    LSGBertForNextSentencePrediction,
    LSGBertForPreTraining,
    LSGBertForQuestionAnswering,
    LSGBertForSequenceClassification,
    LSGBertForTokenClassification,
    LSGBertModel,
)

__version__ = "0.2.0"

register_auto_classes()

__all__ = [
    "ARCHITECTURES",
    "SPARSITY_TYPES",
    "InvalidSettingsError",
    "LSGBertConfig",
    "LSGBertForMaskedLM",
    "LSGBertForMultipleChoice",
    "LSGBertForNextSentencePrediction",
    "LSGBertForPreTraining",
    "LSGBertForQuestionAnswering",
    "LSGBertForSequenceClassification",
    "LSGBertForTokenClassification",
    "LSGBertModel",
    "LSGConverter",
    "LSGError",
    "OutputExistsError",
    "SourceNotFoundError",
    "UnsupportedModelError",
    "save_converted",
]
