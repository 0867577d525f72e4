"""What turns a Hugging Face model class into an LSG one: its config keys, its global tokens, its heads.

* `LSGConfigMixin` adds the LSG keys to a configuration class and fills its ``auto_map``.
* `LSGModelMixin` adds the global-token table to a model and the modules that carry the tokens, its
  own modules adopted into classes that add one step each (lsg_global_tokens, visible in
  ``print(model)``): the global tokens are prepended before the embedding normalisation (or, without
  one, the first encoder layer) and dropped again at the encoder output; the hidden states returned
  leave them out too. Its self-attention layers reach the LSG attention of the chosen backend as its
  ``lsg_attention`` says (lsg_attention_layers) and get an O(n) padding mask (lsg_recorder).
* Each architecture file states its heads as classes (``class LSGBertForMaskedLM(LSGBertMixin,
  BertForMaskedLM)``), one per head its config lists; the mixin registers them for remote-code saving.

An architecture file only names its modules; the attention itself lives in `lsg_attention`.
This file travels with saved models as remote code: it imports torch, transformers and, of this folder,
lsg_attention, lsg_attention_layers, lsg_defaults, lsg_global_tokens, lsg_layout, lsg_recorder, lsg_settings
and lsg_transformers only.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
from torch import nn
from transformers import PreTrainedModel

from .lsg_attention import (
    DEFAULT_BACKEND,
    CrossAttentionRole,
    DispatchConfig,
    dense_backend,
    lsg_backend,
    public_name,
    registered_attention,
)
from .lsg_defaults import LSG_DEFAULTS, MAX_GLOBAL_TOKENS
from .lsg_settings import LSGSettings
from .lsg_attention_layers import AttentionReach, DispatchedAttention, recorded_modules
from .lsg_global_tokens import (
    DropsGlobalTokens,
    GivesGlobalTokensPosition0,
    GlobalTokens,
    PrependsGlobalTokens,
    RecordsTokenStates,
    ShiftsPastLength,
    adopt_step,
)
from .lsg_layout import LSGLayout
from .lsg_recorder import (
    ArgumentRewrite,
    CarriesAndDropsGlobalTokens,
    CarriesGlobalTokens,
    RecorderForward,
    RecorderSteps,
    SeesGlobalStates,
)
from .lsg_transformers import (
    attn_implementation,
    clear_auto_class,
    init_weights,
    past_length,
    store_attn_implementation,
    warn_if_untested_transformers,
)

POOLER_KEY = "add_pooling_layer"  # config key: whether the base model holds a pooler (see LSGModelMixin)
KEPT_WEIGHTS_KEY = "kept_source_weights"  # config key: source tensors held under their own names

# Keys the 2023 reference wrote into its configs that mean nothing here.
LEGACY_CONFIG_KEYS = ("base_model_prefix",)
# LSG keys whose presence, under a plain model_type ("bert", ...), marks a config of the 2023 reference.
REFERENCE_CONFIG_MARKERS = ("block_size", "num_global_tokens")
# Source settings that change attention in a way LSG does not carry -> (the values it can carry, what to do
# instead). Relative position embeddings add learned distance terms inside attention.
UNSUPPORTED_SETTINGS: dict[str, tuple[tuple[Any, ...], str]] = {
    "position_embedding_type": (
        (None, "absolute"),
        "convert a checkpoint with absolute positions, or a model of a family whose relative positions LSG "
        "carries (MPNet, DeBERTa-v2/v3, T5, mT5, UMT5) or of one with rotary positions (ModernBERT, NomicBERT, "
        "GTE, jina-embeddings-v3, EuroBERT)",
    ),
}

# The heads every BERT-like encoder has (suffixes of the Hugging Face class names).
ENCODER_HEADS = (
    "Model",
    "ForMaskedLM",
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForQuestionAnswering",
    "ForMultipleChoice",
)
# The heads of the encoders with rotary positions in transformers (NomicBERT, GTE, EuroBERT).
ROTARY_ENCODER_HEADS = ("Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification")
# Head suffix -> transformers Auto class; every other "For..." suffix maps to "AutoModel" + suffix.
AUTO_CLASS_OF_HEAD = {
    "Model": "AutoModel",
    "LMHeadModel": "AutoModelForCausalLM",
    "ForConditionalGeneration": "AutoModelForSeq2SeqLM",
    "EncoderModel": "AutoModelForTextEncoding",  # the encoder of an encoder-decoder model alone (T5EncoderModel)
}


# --------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------


class LSGConfigMixin:
    """Adds the LSG keys to a Hugging Face configuration class.

    Keys (their defaults: the class's ``lsg_defaults``, a table of lsg_defaults.py, `LSG_DEFAULTS` unless
    the family adds keys or states values of its own):
        block_size: local block size ``b``; each block sees its previous, own and next block.
        sparse_block_size: ``s``, sparse keys taken on each side of the local window.
        sparsity_factor: ``f``, compression of the sparse context (``f`` tokens -> 1 key).
        sparsity_type: one of `SPARSITY_TYPES`.
        num_global_tokens: ``g`` global tokens prepended to the sequence (0 to `MAX_GLOBAL_TOKENS`).
        pool_with_global: output of the first real token := output of global token 0.
        mask_first_token: hide the first real token as a key (it duplicates global 0).
        adaptive: pad inputs to a multiple of ``block_size`` instead of refusing them.
        lsh_num_pre_rounds: hashing rounds before the final one for ``sparsity_type="lsh"``.
        lsh_seed: seed of the random hyperplanes of ``sparsity_type="lsh"``.
        legacy_sparse_window (on when the config was written by the 2023 reference, see
            `is_reference_config`): reproduce the reference's right sparse window, which starts two
            compressed tokens early when ``block_size == sparsity_factor`` (see
            `lsg_attention.right_sparse_window_shift`); models trained with the reference learned it.
        global_token_position (models with relative position terms only): where the global tokens sit
            in those terms.
        pass_global_tokens_to_decoder (encoder-decoder models only): the encoder output keeps the
            global tokens in front and the decoder attends to them.

    The config validates its LSG keys when built (`validate_lsg_settings`), unless built with
    ``validate_settings=False`` by a caller that validates them itself, once (the converter, which
    also knows the length the model will read).

    In an encoder-decoder architecture only the encoder is LSG: its decoder-only head (ForCausalLM)
    is the pretrained decoder, dense, without global tokens (see `lsg_dense_decoder`).

    Subclasses set ``model_type`` (``"lsg-<base>"``), ``lsg_heads`` (head suffixes: ``"Model"``,
    ``"ForMaskedLM"``, ...) and, for encoder-decoder models, ``lsg_defaults = SEQ2SEQ_DEFAULTS``
    (lsg_defaults.py).
    The class is named ``LSG<Base>Config`` and lives in ``configuration_lsg_<base>.py``, its heads
    ``LSG<Base><suffix>`` in ``modeling_lsg_<base>.py``: the ``auto_map`` is derived from that.
    """

    lsg_heads: tuple[str, ...] = ()
    lsg_defaults: dict[str, Any] = LSG_DEFAULTS
    # The implementations transformers' own attention runs in the architecture's dense layers (a decoder),
    # where that is not every one LSG has (None): another asked for runs sdpa there, or eager where sdpa is
    # not among them (lsg_attention.dense_backend). The T5 family's (configuration_lsg_t5.py).
    lsg_dense_implementations: tuple[str, ...] | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # transformers turns config classes into dataclasses and would give a subclass without its
        # own __init__ a generated one; keep the LSG one.
        if "__init__" not in cls.__dict__:
            cls.__init__ = LSGConfigMixin.__init__
        super().__init_subclass__(**kwargs)
        cls.register_for_auto_class()  # save_pretrained copies its file beside the weights

    def __init__(self, *, validate_settings: bool = True, **kwargs: Any) -> None:
        defaults = {**self.lsg_defaults, "legacy_sparse_window": is_reference_config(kwargs)}
        lsg_values = {key: kwargs.pop(key, default) for key, default in defaults.items()}
        for key in LEGACY_CONFIG_KEYS:
            kwargs.pop(key, None)
        kwargs.pop("model_type", None)  # legacy checkpoints say "bert", "roberta", ...
        kwargs.pop("auto_map", None)
        super().__init__(**kwargs)
        self.auto_map = self.lsg_auto_map()
        if lsg_values["sparsity_type"] is None:
            lsg_values["sparsity_type"] = "none"
        for key, value in lsg_values.items():
            setattr(self, key, value)
        if validate_settings:
            validate_lsg_settings(self)
        if not self.lsg_dense_decoder:  # refused here already: a model built from it has no backend for it
            lsg_backend(attn_implementation(self))

    @classmethod
    def lsg_base_name(cls) -> str:
        """Prefix of the Hugging Face classes this architecture extends ("Bert" for LSGBertConfig)."""
        return cls.__name__.removeprefix("LSG").removesuffix("Config")

    @classmethod
    def lsg_file_stem(cls) -> str:
        """What the architecture's file names end with ("lsg_bert" for model_type "lsg-bert")."""
        return cls.model_type.replace("-", "_")

    @classmethod
    def lsg_auto_map(cls) -> dict[str, str]:
        """Auto class -> "file.Class" for the config and every head, as saved in config.json."""
        stem = cls.lsg_file_stem()
        auto_map = {"AutoConfig": f"configuration_{stem}.{cls.__name__}"}
        for suffix in cls.lsg_heads:
            auto_class = AUTO_CLASS_OF_HEAD.get(suffix, f"AutoModel{suffix}")
            auto_map[auto_class] = f"modeling_{stem}.LSG{cls.lsg_base_name()}{suffix}"
        return auto_map

    @property
    def lsg_settings(self) -> LSGSettings:
        """The LSG keys of this config as one frozen value (`LSGSettings`): what a model built from it
        resolves once and hands its LSG layers (`LSGModelMixin.__init__`)."""
        return LSGSettings.of(self)

    @property
    def lsg_dense_decoder(self) -> bool:
        """True for the decoder-only head (ForCausalLM) of an encoder-decoder architecture.

        LSG replaces encoder self-attention only, so that head is the pretrained decoder as it was:
        dense causal attention with its KV cache, no global tokens; only its position table grows.
        """
        return bool(getattr(self, "is_decoder", False)) and "pass_global_tokens_to_decoder" in self.lsg_defaults


def is_reference_config(values: dict[str, Any]) -> bool:
    """Whether config values (a config.json, or a config's ``to_dict()``) were written by the 2023
    reference: a plain model_type ("bert", "roberta", ...) that carries the LSG keys."""
    model_type = values.get("model_type") or ""
    return bool(model_type) and not model_type.startswith("lsg-") and all(key in values for key in REFERENCE_CONFIG_MARKERS)


def validate_lsg_settings(config: Any, max_length: int | None = None) -> None:
    """Raise ValueError, saying what to change, if the LSG keys of `config` cannot work, or if `config`
    holds a setting (`UNSUPPORTED_SETTINGS`) that LSG attention does not implement.

    With `max_length` (the length the model will read), blocks longer than that are refused too.
    Messages name the keys as ``key=value``, the way they are passed in Python.
    """
    for key, (supported, instead) in UNSUPPORTED_SETTINGS.items():
        value = getattr(config, key, None)
        if value not in supported:
            raise ValueError(
                f"{key}={value!r} changes attention in a way LSG does not implement (only "
                f"{' or '.join(repr(v) for v in supported if v is not None)} converts): {instead}."
            )
    position = getattr(config, "global_token_position", 0)
    if isinstance(position, bool) or not isinstance(position, int):
        raise ValueError(f"global_token_position={position!r} is not an integer: use a token position (0: the first token's).")
    causal_lsg = getattr(config, "is_decoder", False) and not getattr(config, "lsg_dense_decoder", False)
    LSGSettings.of(config).validate(max_length, causal=causal_lsg)


# --------------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------------


class InputLengthCheck:
    """Forward pre-hook of a module that receives the token ids (the embeddings, an encoder, a decoder).

    Refuses an input longer than the position table with a ValueError that names both lengths, where
    the model would otherwise fail deep inside (an IndexError or a size mismatch in the embeddings).
    A decoder's length counts its cache, less the `cached_global_tokens` it holds in front (an LSG
    decoder's global tokens, which the past length its embeddings receive counts).
    """

    def __init__(self, config: Any, layout: LSGLayout, name: str, cached_global_tokens: int = 0) -> None:
        self.config = config
        self.layout = layout
        self.name = name
        self.cached_global_tokens = cached_global_tokens

    @property
    def max_length(self) -> int:
        """Tokens the position table holds (`LSGLayout.max_input_length`)."""
        return self.layout.max_input_length(self.config)

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        candidates = (kwargs.get("input_ids"), kwargs.get("inputs_embeds"), *args)
        tokens = next((value for value in candidates if isinstance(value, torch.Tensor)), None)
        if tokens is None:
            return
        cached = max(past_length(kwargs) - self.cached_global_tokens, 0)
        length = tokens.shape[1] + cached
        if length > self.max_length:
            counted = " (cache included)" if cached else ""
            raise ValueError(
                f"The {self.name} has {length} tokens{counted}, more than the {self.max_length} this model reads: "
                f"truncate it (tokenizer(..., truncation=True, max_length={self.max_length})) or convert the source "
                "model again with a larger max length."
            )


class LSGModelMixin:
    """Turns the Hugging Face model built by ``super().__init__`` into an LSG model, in place.

    The architecture file states:
        lsg_layout: where its modules are (`LSGLayout`: the global tokens' table, where they join and
            leave, the decoder, the position tables), relative to the base model,
        lsg_attention: how LSG reaches the self-attention layers (lsg_attention_layers): by transformers'
            dispatch (`DispatchedAttention`, the default) or by swapping modules (`SwappedAttention`),
        lsg_recorded_outputs: output name -> the layer class that produces it, for a model that builds
            its outputs by hand (MPNet, T5 before transformers 5.2x: no ``_can_record_outputs``); None:
            the recorder's own (and the decoder's, for "cross_attentions").
        lsg_output_tuple: the tuple the recorder returns for ``return_dict=False``, made from its
            ModelOutput (the LSG steps run it with return_dict=True), where it is not
            ``ModelOutput.to_tuple()``: MPNet's keeps a None pooler output, whose place its heads count on.
    The hidden states are recorded (see `GlobalTokens`) by the encoder if it is a Hugging Face model
    of its own (BART's), otherwise by the base model, on the layers its ``_can_record_outputs`` names.
    The LSG steps around the recorder's forward (`RecorderSteps`) run in its ``forward``
    (`RecorderForward`): the model's own where the model is its own recorder (LSGBertModel), that of
    the step class the recorder is adopted into where it is a module inside (`CarriesGlobalTokens`).

    The decoder-only head of an encoder-decoder architecture (`LSGConfigMixin.lsg_dense_decoder`)
    has no encoder: it gets no global tokens and stays the dense source model.

    Two config keys, written by the converter, make the model hold what its source held:
        add_pooling_layer: True gives the base model its pooler even in a head built without one
            (ForMaskedLM keeps the source's pooler); False builds the bare model without one.
        kept_source_weights: ``{name: {"shape": [...], "dtype": "float32"}}``, source tensors that the
            class does not use (a ColBERT projection), held as buffers under their own names so that
            they are saved and loaded with the model.
    Every model refuses an input longer than its position table (`InputLengthCheck`).

    A class that joins the mixin to a Hugging Face model class is a head: named ``LSG<Base><suffix>``
    for a suffix its ``config_class`` lists, it is registered for remote-code saving (`__init_subclass__`).
    """

    # the attention implementations LSG attention has a backend for (transformers reads these flags)
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_flash_attn = False
    _supports_attention_backend = False

    lsg_layout: LSGLayout = LSGLayout()
    lsg_attention: AttentionReach = DispatchedAttention()
    lsg_recorded_outputs: dict[str, type[nn.Module]] | None = None
    lsg_output_tuple: Callable[[Any], tuple] | None = None

    forward = RecorderForward()
    lsg_forward_steps: RecorderSteps | None = None  # where the model is its own recorder (see `forward`)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Register a head for remote-code saving under its Auto class (``save_pretrained`` then copies the
        architecture's files beside the weights); any other subclass of a head is not registered."""
        super().__init_subclass__(**kwargs)
        if not issubclass(cls, PreTrainedModel):
            return
        auto_class = {name: auto_class for auto_class, name in lsg_auto_classes(cls.config_class).items()}.get(cls.__name__)
        if auto_class is None:
            clear_auto_class(cls)
        else:
            cls.register_for_auto_class(auto_class)

    def __init__(self, config, *args: Any, **kwargs: Any) -> None:
        warn_if_untested_transformers()
        holds_pooler = getattr(config, POOLER_KEY, None)
        if holds_pooler is False and POOLER_KEY in inspect.signature(super().__init__).parameters:
            kwargs.setdefault(POOLER_KEY, False)
        super().__init__(config, *args, **kwargs)  # built under the registered attention's name (`get_correct_attn_implementation`)
        base = getattr(self, self.base_model_prefix, self)
        if holds_pooler:
            self._add_missing_pooler(base)
        for name, spec in (getattr(config, KEPT_WEIGHTS_KEY, None) or {}).items():
            self._hold_kept_weight(name, spec)
        decoder = dict(base.named_children()).get(self.lsg_layout.decoder)
        if decoder is not None:
            check = InputLengthCheck(self.config, self.lsg_layout, "decoder input")
            decoder.register_forward_pre_hook(check, with_kwargs=True)
        if self.config.lsg_dense_decoder:
            return
        encoder = base.get_submodule(self.lsg_layout.encoder)
        recorder = encoder if isinstance(encoder, PreTrainedModel) else base
        # resolved once, for every LSG layer, by this file's copy of the code: a saved model's config class comes
        # from another copy of its remote code, whose settings the core would resolve again at every call
        settings = LSGSettings.of(self.config)
        settings.pattern(causal=bool(getattr(self.config, "is_decoder", False)))  # built now, not in a compiled forward
        self.lsg_attention.apply(recorder, self.config, settings)  # before from_pretrained loads the weights
        passes_to_decoder = bool(getattr(self.config, "pass_global_tokens_to_decoder", False)) and decoder is not None
        global_tokens = self._adopt_global_token_steps(base, encoder, recorder, passes_to_decoder)
        if passes_to_decoder:
            self._pass_global_tokens(base, global_tokens)
        self._name_attention(lsg_backend(attn_implementation(config)))

    def _adopt_global_token_steps(
        self, base: nn.Module, encoder: nn.Module, recorder: nn.Module, passes_to_decoder: bool
    ) -> GlobalTokens:
        """The modules that carry the global tokens (see `GlobalTokens`), each adopted into a class that
        adds its step (lsg_global_tokens.adopt_step): the recorded layers split their token rows out,
        the encoder drops the global tokens, the prepend point puts them in front, the rotary position
        modules give them position 0, a causal decoder's embeddings count a cached step's positions without
        them, and the recorder runs its forward inside the `RecorderSteps` (the model's own forward where the
        model is the recorder; an encoder that is the recorder also drops the tokens). The input length is
        checked by a hook of the embeddings."""
        layout = self.lsg_layout
        embeddings = base.get_submodule(layout.embeddings)
        global_tokens = GlobalTokens(embeddings.global_embeddings, self.config, self.lsg_output_tuple, passes_to_decoder)
        for layer in recorded_modules(recorder, "hidden_states", self.lsg_recorded_outputs):
            adopt_step(base, module_name(base, layer), RecordsTokenStates, global_tokens)
        if encoder is not recorder:
            adopt_step(base, layout.encoder, DropsGlobalTokens, global_tokens)
        adopt_step(base, module_name(base, layout.prepend_point(base)), PrependsGlobalTokens, global_tokens)
        for name in layout.rotary_embeddings:
            adopt_step(base, name, GivesGlobalTokensPosition0, global_tokens)
        if getattr(self.config, "is_decoder", False):
            embeddings = adopt_step(base, layout.embeddings, ShiftsPastLength, global_tokens)
        else:
            embeddings = base.get_submodule(layout.embeddings)
        check = InputLengthCheck(self.config, layout, "input", cached_global_tokens=self.config.num_global_tokens)
        embeddings.register_forward_pre_hook(check, with_kwargs=True)
        steps = RecorderSteps(recorder, global_tokens, drops=recorder is self and encoder is recorder)
        if recorder is self:
            self.lsg_forward_steps = steps
        else:
            step = CarriesAndDropsGlobalTokens if encoder is recorder else CarriesGlobalTokens
            adopt_step(self, module_name(self, recorder), step, global_tokens).lsg_forward_steps = steps
        return global_tokens

    def _pass_global_tokens(self, base: nn.Module, global_tokens: GlobalTokens) -> None:
        """Let the decoder's cross-attention see the encoder's global states (``pass_global_tokens_to_decoder``):
        the decoder, adopted into `SeesGlobalStates`, widens its encoder mask over them; its cross-attention
        layers run the global-state attention (their `CrossAttentionRole`)."""
        name = self.lsg_layout.decoder
        cover = ArgumentRewrite(base.get_submodule(name), "encoder_attention_mask", global_tokens.covered_encoder_mask)
        decoder = adopt_step(base, name, SeesGlobalStates, global_tokens)
        decoder.lsg_encoder_mask = cover
        role = CrossAttentionRole(self.config.num_global_tokens)
        # the attention module, or a layer around it (T5's)
        for layer in recorded_modules(decoder, "cross_attentions", self.lsg_recorded_outputs):
            for module in layer.modules():
                if "config" in vars(module):  # the module that dispatches on its config
                    module.lsg_role = role
                    module.config = DispatchConfig(module.config)

    def post_init(self) -> None:
        """Add the table of global tokens before transformers initialises the weights (the Hugging Face
        class calls this at the end of its ``__init__``): `_init_weights` then draws it like every other
        embedding, also when a checkpoint lacks it."""
        if not self.config.lsg_dense_decoder:
            width = self.get_input_embeddings().embedding_dim  # the summed embeddings the global tokens join
            self.base_model.get_submodule(self.lsg_layout.embeddings).global_embeddings = nn.Embedding(MAX_GLOBAL_TOKENS, width)
        super().post_init()

    @classmethod
    def _can_set_attn_implementation(cls) -> bool:
        """Whether ``set_attn_implementation`` may switch the model after loading: always, as every attention
        layer dispatches on the config's name at each call. transformers guesses it from the source of the
        architecture's file, where a swapped attention module (MPNet, DeBERTa) does not match its
        pattern, and transformers before 5.2x then ignored the switch with a warning."""
        return True

    def get_correct_attn_implementation(self, requested_attention: str | None, is_init_check: bool = False) -> str:
        """transformers' check of an ``attn_implementation`` (when the model is built, loaded or switched): an
        LSG model takes "eager", "sdpa", "flex_attention" or None (chosen per call, `lsg_attention.choose_path`: sdpa, or
        flex_attention on CUDA where it is faster, per call), and its config names it as transformers does
        (None: "sdpa"). While the model is built, the name is that of the registered LSG attention of the
        backend (`lsg_attention.registered_attention`), which every source class built inside it accepts
        (MPNet's and DeBERTa's take neither sdpa nor flex_attention, T5's before transformers 5.2x eager
        only); the finished model names the backend (`_name_attention`). A dense decoder-only head takes what
        transformers takes."""
        if self.config.lsg_dense_decoder:
            return super().get_correct_attn_implementation(requested_attention, is_init_check)
        backend = lsg_backend(requested_attention)
        return registered_attention(backend) if is_init_check else public_name(backend)

    def set_attn_implementation(self, attn_implementation: str | dict | None, **kwargs: Any) -> None:
        """Switch the attention of the model, as transformers' ``set_attn_implementation``: "eager", "sdpa",
        "flex_attention", or None for the default; the config of the model and of every model inside it say
        so (a decoder's dense layers: what they run of it, `lsg_attention.dense_backend`). Other values
        raise ValueError."""
        if self.config.lsg_dense_decoder:
            super().set_attn_implementation(attn_implementation, **kwargs)
            return
        if isinstance(attn_implementation, dict):  # transformers' per-sub-config form: LSG configs have none
            if "" not in attn_implementation:
                return
            attn_implementation = attn_implementation[""]
        self._name_attention(lsg_backend(attn_implementation))

    def _name_attention(self, backend: str) -> None:
        """Name `backend` in the config of the model and of every model inside it with a config of its own
        (T5's stacks) as transformers names it (`lsg_attention.public_name`; under the decoder, what its dense
        layers run, `lsg_attention.dense_backend`), and let the LSG layers' `DispatchConfig` know whether it
        is the device default."""
        decoder = getattr(self.base_model, self.lsg_layout.decoder, None)
        decoder_models = set(decoder.modules()) if isinstance(decoder, nn.Module) else set()
        for module in self.modules():
            if isinstance(module, PreTrainedModel):
                in_decoder = module in decoder_models
                store_attn_implementation(module.config, dense_backend(module.config, backend) if in_decoder else public_name(backend))
            dispatch = vars(module).get("config")
            if isinstance(dispatch, DispatchConfig):
                dispatch.device_default = backend == DEFAULT_BACKEND

    @property
    def lsg_global_embeddings(self) -> nn.Embedding | None:
        """The table of global tokens (None in a dense decoder-only head, which has none)."""
        if self.config.lsg_dense_decoder:
            return None
        return self.base_model.get_submodule(self.lsg_layout.embeddings).global_embeddings

    def _add_missing_pooler(self, base: nn.Module) -> None:
        """Give `base` the pooler modules its class builds with add_pooling_layer=True, where the head
        built it without (BertForMaskedLM): the pooler is then only held, the head's outputs are unchanged."""
        if POOLER_KEY not in inspect.signature(type(base).__init__).parameters:
            return
        with torch.device("meta"):
            pooled = type(base)(self.config, **{POOLER_KEY: True})
        reference = next(base.parameters())
        for name, module in pooled.named_children():
            if name in vars(base) and vars(base)[name] is None:  # pooler (ALBERT: also pooler_activation)
                module = module.to_empty(device=reference.device).to(reference.dtype)
                for submodule in module.modules():
                    init_weights(self, submodule)
                setattr(base, name, module)

    def _hold_kept_weight(self, name: str, spec: dict[str, Any]) -> None:
        """Register the buffer `name` ("linear.weight"), adding empty modules on its path where needed."""
        *path, leaf = name.split(".")
        owner: nn.Module = self
        for part in path:
            child = dict(owner.named_children()).get(part)
            if child is None:
                if hasattr(owner, part):
                    raise ValueError(f"Cannot keep the source tensor {name}: {part} is something else in {type(self).__name__}.")
                child = nn.Module()
                owner.add_module(part, child)
            owner = child
        if hasattr(owner, leaf):
            raise ValueError(f"Cannot keep the source tensor {name}: {type(self).__name__} already has it.")
        owner.register_buffer(leaf, torch.zeros(spec["shape"], dtype=getattr(torch, spec["dtype"])))


# --------------------------------------------------------------------------------------------------
# Auto registration
# --------------------------------------------------------------------------------------------------


def lsg_auto_classes(config_class: type) -> dict[str, str]:
    """Auto class name -> LSG class name, for every head of `config_class`."""
    return {
        auto_class: path.rsplit(".", 1)[-1]
        for auto_class, path in config_class.lsg_auto_map().items()
        if auto_class != "AutoConfig"
    }


def module_name(root: nn.Module, module: nn.Module) -> str:
    """The name of `module` in `root` ("" for root itself)."""
    return next(name for name, candidate in root.named_modules() if candidate is module)
