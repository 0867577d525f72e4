"""The LSG settings are validated once per conversion (before anything is loaded, at the length the model
will read, for the head it builds) and once per load of a saved model."""

from __future__ import annotations

import pytest

from helpers import save_tiny_source
from lsg_converter import InvalidSettingsError, LSGConverter, save_converted
from lsg_converter.architectures import ARCHITECTURES
from lsg_converter.models.lsg_settings import LSGSettings

MAX_LENGTH = 256


@pytest.fixture
def validations(monkeypatch) -> list[tuple]:
    """The (max_length, causal) of every `LSGSettings.validate` call from now on."""
    calls = []
    validate = LSGSettings.validate

    def counted(self, max_length=None, causal=False):
        calls.append((max_length, causal))
        return validate(self, max_length, causal)

    monkeypatch.setattr(LSGSettings, "validate", counted)
    return calls


@pytest.mark.parametrize("arch", ["bert", "bart", "t5"])
def test_a_conversion_validates_its_settings_once_at_the_length_it_converts_to(arch, tmp_path, validations):
    source = save_tiny_source(tmp_path / "source", arch, ARCHITECTURES[arch].default_head)

    LSGConverter(max_sequence_length=MAX_LENGTH).convert_from_pretrained(source)

    assert validations == [(MAX_LENGTH, False)]


@pytest.mark.parametrize("arch", ["bert", "bart", "t5"])
def test_loading_a_saved_model_validates_its_settings_once(arch, tmp_path, validations):
    head = ARCHITECTURES[arch].default_head
    model, _ = LSGConverter(max_sequence_length=MAX_LENGTH).convert_from_pretrained(save_tiny_source(tmp_path / "source", arch, head))
    folder = save_converted(model, None, tmp_path / "converted")
    validations.clear()

    type(model).from_pretrained(folder)

    assert len(validations) == 1


def test_a_causal_head_asked_for_refuses_what_a_decoder_cannot_run(tmp_path, validations):
    source = save_tiny_source(tmp_path / "source", "bert", "BertForMaskedLM")

    with pytest.raises(InvalidSettingsError, match="bos_pooling.*decoder"):
        LSGConverter(max_sequence_length=MAX_LENGTH).convert_from_pretrained(
            source, architecture="BertLMHeadModel", sparsity_type="bos_pooling"
        )
    assert validations == [(MAX_LENGTH, True)]
