"""lsg_converter: turn pretrained BERT-family (MPNet and DeBERTa-v2/v3 included), BART, mBART and Pegasus
checkpoints into LSG models for long inputs.

    from lsg_converter import LSGConverter
    model, tokenizer = LSGConverter(max_sequence_length=4096).convert_from_pretrained("bert-base-uncased")

Importing the package registers the LSG configs and models with transformers' Auto classes, so that
saved LSG checkpoints also load without ``trust_remote_code`` while the package is installed.
"""

from ._version import __version__
from .architectures import ARCHITECTURES, register_auto_classes
from .card import model_card
from .converter import LSGConverter
from .errors import (
    CorruptCheckpointError,
    HubError,
    InvalidSettingsError,
    LSGError,
    MissingDependencyError,
    OutputExistsError,
    SourceNotFoundError,
    UnknownSettingError,
    UnsafeCheckpointError,
    UnsupportedModelError,
)
from .push import push_converted
from .saving import save_converted
from .models.lsg_sparse import SPARSITY_TYPES
from .models.configuration_lsg_bert import LSGBertConfig
from .models.modeling_lsg_bert import (  # one class per head the config lists
    LSGBertForMaskedLM,
    LSGBertForMultipleChoice,
    LSGBertForNextSentencePrediction,
    LSGBertForPreTraining,
    LSGBertForQuestionAnswering,
    LSGBertForSequenceClassification,
    LSGBertForTokenClassification,
    LSGBertLMHeadModel,
    LSGBertModel,
)
from .models.configuration_lsg_roberta import LSGRobertaConfig
from .models.modeling_lsg_roberta import (  # one class per head the config lists
    LSGRobertaForCausalLM,
    LSGRobertaForMaskedLM,
    LSGRobertaForMultipleChoice,
    LSGRobertaForQuestionAnswering,
    LSGRobertaForSequenceClassification,
    LSGRobertaForTokenClassification,
    LSGRobertaModel,
)
from .models.configuration_lsg_distilbert import LSGDistilBertConfig
from .models.modeling_lsg_distilbert import (  # one class per head the config lists
    LSGDistilBertForMaskedLM,
    LSGDistilBertForMultipleChoice,
    LSGDistilBertForQuestionAnswering,
    LSGDistilBertForSequenceClassification,
    LSGDistilBertForTokenClassification,
    LSGDistilBertModel,
)
from .models.configuration_lsg_albert import LSGAlbertConfig
from .models.modeling_lsg_albert import (  # one class per head the config lists
    LSGAlbertForMaskedLM,
    LSGAlbertForMultipleChoice,
    LSGAlbertForPreTraining,
    LSGAlbertForQuestionAnswering,
    LSGAlbertForSequenceClassification,
    LSGAlbertForTokenClassification,
    LSGAlbertModel,
)
from .models.configuration_lsg_electra import LSGElectraConfig
from .models.modeling_lsg_electra import (  # one class per head the config lists
    LSGElectraForCausalLM,
    LSGElectraForMaskedLM,
    LSGElectraForMultipleChoice,
    LSGElectraForPreTraining,
    LSGElectraForQuestionAnswering,
    LSGElectraForSequenceClassification,
    LSGElectraForTokenClassification,
    LSGElectraModel,
)
from .models.configuration_lsg_camembert import LSGCamembertConfig
from .models.modeling_lsg_camembert import (  # one class per head the config lists
    LSGCamembertForCausalLM,
    LSGCamembertForMaskedLM,
    LSGCamembertForMultipleChoice,
    LSGCamembertForQuestionAnswering,
    LSGCamembertForSequenceClassification,
    LSGCamembertForTokenClassification,
    LSGCamembertModel,
)
from .models.configuration_lsg_xlm_roberta import LSGXLMRobertaConfig
from .models.modeling_lsg_xlm_roberta import (  # one class per head the config lists
    LSGXLMRobertaForCausalLM,
    LSGXLMRobertaForMaskedLM,
    LSGXLMRobertaForMultipleChoice,
    LSGXLMRobertaForQuestionAnswering,
    LSGXLMRobertaForSequenceClassification,
    LSGXLMRobertaForTokenClassification,
    LSGXLMRobertaModel,
)
from .models.configuration_lsg_bart import LSGBartConfig
from .models.modeling_lsg_bart import (  # one class per head the config lists
    LSGBartForCausalLM,
    LSGBartForConditionalGeneration,
    LSGBartForQuestionAnswering,
    LSGBartForSequenceClassification,
    LSGBartModel,
)
from .models.configuration_lsg_mbart import LSGMBartConfig
from .models.modeling_lsg_mbart import (  # one class per head the config lists
    LSGMBartForCausalLM,
    LSGMBartForConditionalGeneration,
    LSGMBartForQuestionAnswering,
    LSGMBartForSequenceClassification,
    LSGMBartModel,
)
from .models.configuration_lsg_pegasus import LSGPegasusConfig
from .models.modeling_lsg_pegasus import (  # one class per head the config lists
    LSGPegasusForCausalLM,
    LSGPegasusForConditionalGeneration,
    LSGPegasusModel,
)

from .models.configuration_lsg_mpnet import LSGMPNetConfig
from .models.modeling_lsg_mpnet import (  # one class per head the config lists
    LSGMPNetForMaskedLM,
    LSGMPNetForMultipleChoice,
    LSGMPNetForQuestionAnswering,
    LSGMPNetForSequenceClassification,
    LSGMPNetForTokenClassification,
    LSGMPNetModel,
)
from .models.configuration_lsg_deberta_v2 import LSGDebertaV2Config
from .models.modeling_lsg_deberta_v2 import (  # one class per head the config lists
    LSGDebertaV2ForMaskedLM,
    LSGDebertaV2ForMultipleChoice,
    LSGDebertaV2ForQuestionAnswering,
    LSGDebertaV2ForSequenceClassification,
    LSGDebertaV2ForTokenClassification,
    LSGDebertaV2Model,
)

register_auto_classes()

__all__ = [
    "ARCHITECTURES",
    "CorruptCheckpointError",
    "HubError",
    "InvalidSettingsError",
    "LSGAlbertConfig",
    "LSGAlbertForMaskedLM",
    "LSGAlbertForMultipleChoice",
    "LSGAlbertForPreTraining",
    "LSGAlbertForQuestionAnswering",
    "LSGAlbertForSequenceClassification",
    "LSGAlbertForTokenClassification",
    "LSGAlbertModel",
    "LSGBartConfig",
    "LSGBartForCausalLM",
    "LSGBartForConditionalGeneration",
    "LSGBartForQuestionAnswering",
    "LSGBartForSequenceClassification",
    "LSGBartModel",
    "LSGBertConfig",
    "LSGBertForMaskedLM",
    "LSGBertForMultipleChoice",
    "LSGBertForNextSentencePrediction",
    "LSGBertForPreTraining",
    "LSGBertForQuestionAnswering",
    "LSGBertForSequenceClassification",
    "LSGBertForTokenClassification",
    "LSGBertLMHeadModel",
    "LSGBertModel",
    "LSGCamembertConfig",
    "LSGCamembertForCausalLM",
    "LSGCamembertForMaskedLM",
    "LSGCamembertForMultipleChoice",
    "LSGCamembertForQuestionAnswering",
    "LSGCamembertForSequenceClassification",
    "LSGCamembertForTokenClassification",
    "LSGCamembertModel",
    "LSGConverter",
    "LSGDebertaV2Config",
    "LSGDebertaV2ForMaskedLM",
    "LSGDebertaV2ForMultipleChoice",
    "LSGDebertaV2ForQuestionAnswering",
    "LSGDebertaV2ForSequenceClassification",
    "LSGDebertaV2ForTokenClassification",
    "LSGDebertaV2Model",
    "LSGDistilBertConfig",
    "LSGDistilBertForMaskedLM",
    "LSGDistilBertForMultipleChoice",
    "LSGDistilBertForQuestionAnswering",
    "LSGDistilBertForSequenceClassification",
    "LSGDistilBertForTokenClassification",
    "LSGDistilBertModel",
    "LSGElectraConfig",
    "LSGElectraForCausalLM",
    "LSGElectraForMaskedLM",
    "LSGElectraForMultipleChoice",
    "LSGElectraForPreTraining",
    "LSGElectraForQuestionAnswering",
    "LSGElectraForSequenceClassification",
    "LSGElectraForTokenClassification",
    "LSGElectraModel",
    "LSGError",
    "LSGMBartConfig",
    "LSGMBartForCausalLM",
    "LSGMBartForConditionalGeneration",
    "LSGMBartForQuestionAnswering",
    "LSGMBartForSequenceClassification",
    "LSGMBartModel",
    "LSGMPNetConfig",
    "LSGMPNetForMaskedLM",
    "LSGMPNetForMultipleChoice",
    "LSGMPNetForQuestionAnswering",
    "LSGMPNetForSequenceClassification",
    "LSGMPNetForTokenClassification",
    "LSGMPNetModel",
    "LSGPegasusConfig",
    "LSGPegasusForCausalLM",
    "LSGPegasusForConditionalGeneration",
    "LSGPegasusModel",
    "LSGRobertaConfig",
    "LSGRobertaForCausalLM",
    "LSGRobertaForMaskedLM",
    "LSGRobertaForMultipleChoice",
    "LSGRobertaForQuestionAnswering",
    "LSGRobertaForSequenceClassification",
    "LSGRobertaForTokenClassification",
    "LSGRobertaModel",
    "LSGXLMRobertaConfig",
    "LSGXLMRobertaForCausalLM",
    "LSGXLMRobertaForMaskedLM",
    "LSGXLMRobertaForMultipleChoice",
    "LSGXLMRobertaForQuestionAnswering",
    "LSGXLMRobertaForSequenceClassification",
    "LSGXLMRobertaForTokenClassification",
    "LSGXLMRobertaModel",
    "MissingDependencyError",
    "OutputExistsError",
    "SPARSITY_TYPES",
    "SourceNotFoundError",
    "UnknownSettingError",
    "UnsafeCheckpointError",
    "UnsupportedModelError",
    "model_card",
    "push_converted",
    "save_converted",
]
