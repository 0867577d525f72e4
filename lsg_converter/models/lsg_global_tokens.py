"""The global tokens of an LSG model: put in front of the sequence, taken out of what the model returns.

`GlobalTokens` does it, in steps that modules of the model run inside their own forward: the model's
modules at those places are adopted into classes that add the step (`adopt_step`), written out in each
architecture's file (`GlobalTokenStep`), so ``print(model)`` shows where the tokens join
(`PrependsGlobalTokens`), where the layers record their token rows (`RecordsTokenStates`) and where
they leave (`DropsGlobalTokens`). What one forward pass decided is one `ForwardCall`, made by the
recorder's step (lsg_recorder.RecorderSteps) and held, for the length of that pass, as the model's
`GlobalTokens.call`, where those modules read it.

This file travels with saved models as remote code: it imports torch, transformers and, of this folder,
lsg_layout and lsg_transformers only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from transformers import PreTrainedModel

from .lsg_layout import adopt
from .lsg_transformers import past_length, record_outputs_like_source, with_past_length


@dataclass
class ForwardCall:
    """What one forward pass of a model's recorder decided, for the steps of `GlobalTokens` to read.

    recording: the pass returns hidden_states (as ``capture_outputs`` decides it).
    returns_tuple: its caller asked for ``return_dict=False``.
    prepended: the global tokens are put in front (not by a causal decoder continuing from its cache,
        which holds them there already, see `GlobalTokens.embeddings_arguments`).
    token_states: (B, t, E) per hidden state recorded so far.
    """

    recording: bool
    returns_tuple: bool
    prepended: bool
    token_states: list[torch.Tensor] = field(default_factory=list)


class GlobalTokens:
    """The steps that put the global tokens in front of the sequence and take them out again.

    Every layer carries ``g`` global states followed by the ``t`` token states. What the model
    returns holds the tokens only, as the source model's outputs do: ``last_hidden_state`` and every
    entry of ``hidden_states`` are ``(B, t, E)``, ``hidden_states[-1] == last_hidden_state``. With
    ``pool_with_global`` the first token's row is global token 0's state, in every one of them.

    Encoder-decoder models with ``pass_global_tokens_to_decoder`` (`passes_to_decoder`; not their
    encoder-only heads, as T5EncoderModel) are the one exception: their
    ``encoder_last_hidden_state`` keeps the ``g`` global states in front (the decoder attends to them;
    checkpoints of the 2023 reference depend on it) and pools nothing, while ``encoder_hidden_states``
    hold the tokens only, so ``encoder_hidden_states[-1] == encoder_last_hidden_state[:, g:]``.

    transformers records ``hidden_states`` with forward hooks on the layers of the model whose
    forward is decorated with ``capture_outputs`` (the "recorder": the base model, or the encoder of
    an encoder-decoder model). While a forward pass records them, the recorded layers (`RecordsTokenStates`) take each layer's
    token rows out of its input and output and rebuild the layer states from those rows, so that the
    rows returned lie on the autograd path (``hidden_states[i].retain_grad()`` gets a gradient); at
    the end they replace the recorded states, which still hold the global tokens.

    Each forward pass of the recorder makes its `ForwardCall` (`open`) and holds it as `call` while it
    runs (lsg_recorder.RecorderSteps), the enclosing pass's call given back when it returns or raises: a
    forward pass run from inside another (a hook calling the model) has its own. Outside a forward pass
    of the recorder (a module called on its own) `call` is None and the steps leave their inputs as they are.

    A causal decoder that continues from its cache (a past length > 0, see lsg_transformers.past_length)
    already holds the global tokens there: that forward pass prepends nothing, drops nothing, and counts
    its positions from the first real token.
    """

    def __init__(
        self,
        table: nn.Embedding,
        config: Any,
        output_tuple: Callable[[Any], tuple] | None = None,
        passes_to_decoder: bool = False,
    ) -> None:
        self.table = table
        self.config = config
        self.passes_to_decoder = passes_to_decoder  # the encoder output keeps the global states for a decoder
        self.output_tuple = output_tuple  # the recorder's tuple of its ModelOutput (None: ModelOutput.to_tuple)
        self.call: ForwardCall | None = None  # the forward pass under way (set by the recorder's step)

    @property
    def pools(self) -> bool:
        """Whether the first token's output is global token 0's (pool_with_global, in an encoder whose
        output drops the global tokens; a causal decoder's global 0 does not see the text)."""
        config = self.config
        return config.pool_with_global and not getattr(config, "is_decoder", False) and not self.passes_to_decoder

    def splits_states(self, call: ForwardCall | None) -> bool:
        """Whether `call` carries global tokens that the hidden states it returns leave out."""
        return call is not None and call.recording and call.prepended and self.config.num_global_tokens > 0

    def token_rows(self, states: torch.Tensor) -> torch.Tensor:
        """(B, g + t, E) -> (B, t, E): the tokens' states, the first one global 0's if `pools`."""
        num_global = self.config.num_global_tokens
        tokens = states[:, num_global:]
        if not self.pools:
            return tokens
        # the first row taken from global 0 by a select, not a concatenation around a (t - 1)-row slice: a
        # graph torch.export traces then serves a 2-token input too (a 1-row dimension is specialised)
        first = torch.arange(tokens.shape[1], device=states.device)[None, :, None] == 0
        return torch.where(first, states[:, :1], tokens)

    def split_states(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, g + t, E) -> (token rows (B, t, E), the same states rebuilt from those rows (B, g + t, E))."""
        num_global = self.config.num_global_tokens
        rows = self.token_rows(states)
        if self.pools:  # rows[:, 0] is global 0; the first token's own row sits among the others
            rebuilt = torch.cat([rows[:, :1], states[:, 1 : num_global + 1], rows[:, 1:]], dim=1)
        else:
            rebuilt = torch.cat([states[:, :num_global], rows], dim=1)
        return rows, rebuilt

    def open(self, arguments: dict[str, Any]) -> ForwardCall:
        """The `ForwardCall` of a forward pass of the recorder, made from its arguments (a dict by name): a
        pass that continues from a cache (a causal decoder's decoding step) prepends nothing."""
        def asked(name: str, default: bool) -> bool:  # a head passes its own argument on, None included
            value = arguments.get(name)
            return bool(getattr(self.config, name, default) if value is None else value)

        return ForwardCall(
            recording=asked("output_hidden_states", False),
            returns_tuple=not asked("return_dict", True),
            prepended=not past_length(arguments),
        )

    def embeddings_arguments(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments of a causal decoder's embeddings (`ShiftsPastLength`): a step that
        continues from the cache (which holds the global tokens) counts its positions from the first real token."""
        call = self.call
        if call is None or call.prepended:
            return kwargs
        return with_past_length(kwargs, past_length(kwargs) - self.config.num_global_tokens)

    def prepend(self, embeddings: torch.Tensor) -> torch.Tensor:
        """(B, t, E) -> (B, g + t, E): the summed embeddings with the global tokens in front (`PrependsGlobalTokens`)."""
        call = self.call
        if call is None or not call.prepended:
            return embeddings
        global_tokens = self.table.weight[: self.config.num_global_tokens].to(embeddings.dtype)
        global_tokens = global_tokens.unsqueeze(0).expand(embeddings.shape[0], -1, -1)
        return torch.cat([global_tokens, embeddings], dim=1)

    def positions(self, position_ids: torch.Tensor) -> torch.Tensor:
        """(B or 1, t) -> (B or 1, g + t): the position ids a rotary module turns into its rotations, the global
        tokens' in front, each at position 0 (`GivesGlobalTokensPosition0`): every token sees a global key at
        the distance its own position, as it sees the first token."""
        call = self.call
        if call is None or not call.prepended:
            return position_ids
        global_positions = position_ids.new_zeros(*position_ids.shape[:-1], self.config.num_global_tokens)
        return torch.cat([global_positions, position_ids], dim=-1)

    def layer_input(self, states: torch.Tensor) -> torch.Tensor:
        """The input of a recorded layer (`RecordsTokenStates`): the first layer's is hidden state 0."""
        call = self.call
        if not self.splits_states(call) or call.token_states:
            return states
        rows, states = self.split_states(states)
        call.token_states.append(rows)
        return states

    def layer_output(self, output: Any) -> Any:
        """The output of a recorded layer (`RecordsTokenStates`): the next hidden state."""
        call = self.call
        if not self.splits_states(call):
            return output
        if isinstance(output, tuple):
            rows, states = self.split_states(output[0])
            output = (states, *output[1:])
        else:
            rows, output = self.split_states(output)
        call.token_states.append(rows)
        return output

    def drop(self, output: Any) -> Any:
        """The encoder's output (`DropsGlobalTokens`): (B, g + t, E) -> (B, t, E), after pool_with_global
        (see `pools`).

        Encoder-decoder models with ``pass_global_tokens_to_decoder`` keep the global states: the
        decoder attends to them. The last hidden state recorded is the encoder output's token rows.
        """
        call = self.call
        if call is None or not call.prepended or not self.config.num_global_tokens:
            return output
        if self.passes_to_decoder:
            if self.splits_states(call):
                call.token_states[-1], output.last_hidden_state = self.split_states(output.last_hidden_state)
            return output
        output.last_hidden_state = self.token_rows(output.last_hidden_state)
        if getattr(output, "hidden_states", None) is not None:  # an encoder that returns them itself (DeBERTa's,
            # whose model reads its output from the last one)
            output.hidden_states = (*output.hidden_states[:-1], output.last_hidden_state)
        if self.splits_states(call):
            call.token_states[-1] = output.last_hidden_state
        return output

    def covered_encoder_mask(self, arguments: dict[str, Any]) -> torch.Tensor | None:
        """The decoder's ``encoder_attention_mask`` (``pass_global_tokens_to_decoder``, see
        lsg_recorder.SeesGlobalStates): the encoder output it attends to holds the g global states in
        front, so a (B, t) mask gets g columns of 1s in front; None where there is nothing to cover."""
        mask, states = arguments.get("encoder_attention_mask"), arguments.get("encoder_hidden_states")
        num_global = self.config.num_global_tokens
        if mask is None or states is None or mask.dim() != 2 or mask.shape[1] != states.shape[1] - num_global:
            return None
        return torch.cat([mask.new_ones(mask.shape[0], num_global), mask], dim=1)

    def finish(self, output: Any) -> Any:
        """After the recorder's forward: its hidden_states become the token rows (None stays None:
        ``output_hidden_states`` may select some layers only)."""
        call = self.call
        if self.splits_states(call) and output.hidden_states is not None:
            output.hidden_states = tuple(
                None if recorded is None else rows for recorded, rows in zip(output.hidden_states, call.token_states)
            )
        if not call.returns_tuple:
            return output
        return output.to_tuple() if self.output_tuple is None else self.output_tuple(output)


# --------------------------------------------------------------------------------------------------
# The modules of the global tokens: a model's own modules, adopted into a class that adds one step
# --------------------------------------------------------------------------------------------------


# The step classes by (step, source class): filled by their class statements (`GlobalTokenStep.__init_subclass__`).
STEP_CLASSES: dict[tuple[type[GlobalTokenStep], type[nn.Module]], type[nn.Module]] = {}


class GlobalTokenStep:
    """Base of the steps of the global tokens (`PrependsGlobalTokens`, ...), each added to a module's own forward
    by a step class written out for that module's class: ``class <label>(step, source class)``, as
    ``class BertLayerRecordingTokenStates(RecordsTokenStates, BertLayer)`` in modeling_lsg_bert.py (those of
    torch's own modules at the end of this file; a module that takes two steps, T5's first block, has a step
    class of a step class).

    `adopt_step` turns a module of the model into an instance of its step class (`step_class`): it keeps the
    module's submodules, parameters, buffers and hooks under their names (checkpoints load as they are),
    and ``print(model)`` names the step (``label``, formatted with the module's class name). Its modules are
    pickled and copied as those of any class a file defines.
    """

    label: str
    lsg_global_tokens: GlobalTokens

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A step class (a module's class) is entered in `STEP_CLASSES` under its (step, source class), named
        as the step's ``label`` says (a module run again, as transformers runs a remote file whose code changed,
        enters its classes anew). One of a Hugging Face model (a recorder, a decoder) records the outputs its
        source class records: transformers looks them up by the name of a model's class (lsg_transformers)."""
        super().__init_subclass__(**kwargs)
        if not issubclass(cls, nn.Module):
            return  # a step
        step, source = cls.__bases__
        name = step.label.format(source.__name__)
        if cls.__name__ != name:
            raise TypeError(f"The class adding {step.__name__} to {source.__name__} is named {name}, not {cls.__name__}.")
        STEP_CLASSES[step, source] = cls
        if issubclass(cls, PreTrainedModel):
            record_outputs_like_source(cls)


class PrependsGlobalTokens(GlobalTokenStep):
    """The module the global tokens join before (`LSGLayout.prepend_before`): its input gets them in front."""

    label = "GlobalTokensBefore{}"

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return super().forward(self.lsg_global_tokens.prepend(hidden_states), *args, **kwargs)


class RecordsTokenStates(GlobalTokenStep):
    """A layer whose states are hidden states: their token rows are recorded on the autograd path."""

    label = "{}RecordingTokenStates"

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        hidden_states = self.lsg_global_tokens.layer_input(hidden_states)
        return self.lsg_global_tokens.layer_output(super().forward(hidden_states, *args, **kwargs))


class DropsGlobalTokens(GlobalTokenStep):
    """The encoder (`LSGLayout.encoder`): its output leaves the global tokens out."""

    label = "{}DroppingGlobalTokens"

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.lsg_global_tokens.drop(super().forward(*args, **kwargs))


class GivesGlobalTokensPosition0(GlobalTokenStep):
    """A rotary position module (`LSGLayout.rotary_embeddings`): its position ids get the global tokens' in front."""

    label = "{}WithGlobalTokensAtPosition0"

    def forward(self, states: torch.Tensor, position_ids: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return super().forward(states, self.lsg_global_tokens.positions(position_ids), *args, **kwargs)


class ShiftsPastLength(GlobalTokenStep):
    """The embeddings of a causal LSG decoder: a cached step counts its positions from the first real token."""

    label = "{}AfterGlobalTokens"

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return super().forward(*args, **self.lsg_global_tokens.embeddings_arguments(kwargs))


def step_class(step: type[GlobalTokenStep], module_class: type[nn.Module], model_type: str) -> type[nn.Module]:
    """The step class written out for ``(step, module_class)`` (`STEP_CLASSES`), for a model of the LSG
    `model_type` ("lsg-bert"), whose architecture file is where a missing one is to be written."""
    found = STEP_CLASSES.get((step, module_class))
    if found is None:
        torch_module = module_class.__module__.startswith("torch.")
        home = "lsg_global_tokens.py" if torch_module else f"modeling_{model_type.replace('-', '_')}.py"
        raise LookupError(
            f"No step class adds {step.__name__} to {module_class.__module__}.{module_class.__qualname__}: write "
            f"`class {step.label.format(module_class.__name__)}({step.__name__}, {module_class.__name__})` and its "
            f"docstring in {home}, in the folder of this file."
        )
    return found


def adopt_step(model: nn.Module, name: str, step: type[GlobalTokenStep], global_tokens: GlobalTokens) -> nn.Module:
    """Put in place of the module `name` of `model` an instance of its step class (`step_class`) that holds
    the module's state as it is (see `GlobalTokenStep`); -> the new module."""
    module = model.get_submodule(name)
    adopted = adopt(module, step_class(step, type(module), global_tokens.config.model_type))
    adopted.lsg_global_tokens = global_tokens
    if name:
        model.set_submodule(name, adopted)
    return adopted


class GlobalTokensBeforeLayerNorm(PrependsGlobalTokens, nn.LayerNorm):
    """The embeddings' LayerNorm, its input given the global tokens in front (`PrependsGlobalTokens`)."""


class GlobalTokensBeforeLinear(PrependsGlobalTokens, nn.Linear):
    """A projection of the embeddings (DeBERTa's ``embed_proj``), its input given the global tokens in front
    (`PrependsGlobalTokens`)."""
