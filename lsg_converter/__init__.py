"""lsg_converter: turn pretrained encoder and encoder-decoder checkpoints into LSG models for long inputs:
BERT, RoBERTa, DistilBERT, ALBERT, ELECTRA, CamemBERT, XLM-RoBERTa, MPNet and DeBERTa-v2 (DeBERTa-v3 too);
BART, mBART, Pegasus, T5 (v1.1, Flan-T5), mT5 and UMT5; and the encoders with rotary positions ModernBERT
(gte-modernbert, modernbert-embed), NomicBERT (nomic-embed-text), GTE (gte-*-en-v1.5, gte-multilingual;
transformers 5.18 or newer), jina-embeddings-v3 and EuroBERT.

    from lsg_converter import LSGConverter
    model, tokenizer = LSGConverter(max_sequence_length=4096).convert_from_pretrained("bert-base-uncased")

Importing the package registers the LSG configs and models with transformers' Auto classes, so that
saved LSG checkpoints also load without ``trust_remote_code`` while the package is installed.
"""

from ._version import __version__
from .architectures import ARCHITECTURES, lsg_classes, register_auto_classes
from .card import model_card
from .converter import LSGConverter
from .errors import (
    CorruptCheckpointError,
    HubError,
    InsufficientMemoryError,
    InvalidSettingsError,
    LSGError,
    MissingDependencyError,
    OutputExistsError,
    OutputNotReplaceableError,
    OutputNotWritableError,
    OutputOverlapsSourceError,
    SourceNotFoundError,
    UnknownSettingError,
    UnsafeCheckpointError,
    UnsupportedModelError,
)
from .push import push_converted
from .saving import save_converted
from .spans import SpanEmbeddings, encode_spans
from .models.lsg_sparse import SPARSITY_TYPES

register_auto_classes()

# Every LSG config and head class, by name, read from the architecture table (one class statement per
# head in each models/modeling_lsg_<arch>.py): ``from lsg_converter import LSGBertForMaskedLM``.
LSG_CLASSES = lsg_classes()
globals().update(LSG_CLASSES)

__all__ = [
    "ARCHITECTURES",
    "CorruptCheckpointError",
    "HubError",
    "InsufficientMemoryError",
    "InvalidSettingsError",
    "LSGConverter",
    "LSGError",
    "LSG_CLASSES",
    "MissingDependencyError",
    "OutputExistsError",
    "OutputNotReplaceableError",
    "OutputNotWritableError",
    "OutputOverlapsSourceError",
    "SPARSITY_TYPES",
    "SourceNotFoundError",
    "SpanEmbeddings",
    "UnknownSettingError",
    "UnsafeCheckpointError",
    "UnsupportedModelError",
    "__version__",
    "encode_spans",
    "model_card",
    "push_converted",
    "save_converted",
    *LSG_CLASSES,
]
