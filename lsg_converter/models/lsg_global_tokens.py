"""The global tokens of an LSG model: put in front of the sequence, taken out of what the model returns.

`GlobalTokens` holds the hooks (and the steps of lsg_recorder.RecorderSteps) that do it; what one
forward pass decided lives in a `ForwardCall`, opened by the recorder's steps and read by the hooks.

This file travels with saved models as remote code: it imports torch and transformers only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from .lsg_transformers import past_length, with_past_length


@dataclass
class ForwardCall:
    """What one forward pass of a model's recorder decided, for the hooks of `GlobalTokens` to read.

    recording: the pass returns hidden_states (as ``capture_outputs`` decides it).
    returns_tuple: its caller asked for ``return_dict=False``.
    prepended: the global tokens were put in front (a causal decoder continuing from its cache holds them
        there already: that pass prepends nothing).
    token_states: (B, t, E) per hidden state recorded so far.
    """

    recording: bool
    returns_tuple: bool
    prepended: bool = False
    token_states: list[torch.Tensor] = field(default_factory=list)


class GlobalTokens:
    """The hooks that put the global tokens in front of the sequence and take them out again.

    Every layer carries ``g`` global states followed by the ``t`` token states. What the model
    returns holds the tokens only, as the source model's outputs do: ``last_hidden_state`` and every
    entry of ``hidden_states`` are ``(B, t, E)``, ``hidden_states[-1] == last_hidden_state``. With
    ``pool_with_global`` the first token's row is global token 0's state, in every one of them.

    Encoder-decoder models with ``pass_global_tokens_to_decoder`` are the one exception: their
    ``encoder_last_hidden_state`` keeps the ``g`` global states in front (the decoder attends to them;
    checkpoints of the 2023 reference depend on it) and pools nothing, while ``encoder_hidden_states``
    hold the tokens only, so ``encoder_hidden_states[-1] == encoder_last_hidden_state[:, g:]``.

    transformers records ``hidden_states`` with forward hooks on the layers of the model whose
    forward is decorated with ``capture_outputs`` (the "recorder": the base model, or the encoder of
    an encoder-decoder model). While a forward pass records them, the hooks here take each layer's
    token rows out of its input and output and rebuild the layer states from those rows, so that the
    rows returned lie on the autograd path (``hidden_states[i].retain_grad()`` gets a gradient); at
    the end they replace the recorded states, which still hold the global tokens.

    Each forward pass of the recorder opens a `ForwardCall` (`open`) and closes it when it returns or
    raises (`close`); the hooks read the innermost open one (`current`), so a forward pass run from
    inside another (a hook calling the model) keeps its own. Outside a forward pass of the recorder (a
    module called on its own) the hooks leave the calls as they are.

    A causal decoder that continues from its cache (a past length > 0, see lsg_transformers.past_length)
    already holds the global tokens there: that forward pass prepends nothing, drops nothing, and counts
    its positions from the first real token.
    """

    def __init__(self, table: nn.Embedding, config: Any, output_tuple: Callable[[Any], tuple] | None = None) -> None:
        self.table = table
        self.config = config
        self.output_tuple = output_tuple  # the recorder's tuple of its ModelOutput (None: ModelOutput.to_tuple)
        self.calls: list[ForwardCall] = []  # the forward passes under way, innermost last

    @property
    def current(self) -> ForwardCall | None:
        """The innermost forward pass under way, or None outside any."""
        return self.calls[-1] if self.calls else None

    @property
    def pools(self) -> bool:
        """Whether the first token's output is global token 0's (pool_with_global, in an encoder whose
        output drops the global tokens; a causal decoder's global 0 does not see the text)."""
        config = self.config
        passes_global_tokens = getattr(config, "pass_global_tokens_to_decoder", False)
        return config.pool_with_global and not getattr(config, "is_decoder", False) and not passes_global_tokens

    def splits_states(self, call: ForwardCall | None) -> bool:
        """Whether `call` carries global tokens that the hidden states it returns leave out."""
        return call is not None and call.recording and call.prepended and self.config.num_global_tokens > 0

    def token_rows(self, states: torch.Tensor) -> torch.Tensor:
        """(B, g + t, E) -> (B, t, E): the tokens' states, the first one global 0's if `pools`."""
        num_global = self.config.num_global_tokens
        if self.pools:
            return torch.cat([states[:, :1], states[:, num_global + 1 :]], dim=1)
        return states[:, num_global:]

    def split_states(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, g + t, E) -> (token rows (B, t, E), the same states rebuilt from those rows (B, g + t, E))."""
        num_global = self.config.num_global_tokens
        rows = self.token_rows(states)
        if self.pools:  # rows[:, 0] is global 0; the first token's own row sits among the others
            rebuilt = torch.cat([rows[:, :1], states[:, 1 : num_global + 1], rows[:, 1:]], dim=1)
        else:
            rebuilt = torch.cat([states[:, :num_global], rows], dim=1)
        return rows, rebuilt

    def open(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Before the recorder's forward: open its `ForwardCall` and have it return a ModelOutput (turned
        into a tuple in `finish`); -> the forward's keyword arguments."""
        def asked(name: str, default: bool) -> bool:  # a head passes its own argument on, None included
            value = kwargs.get(name)
            return bool(getattr(self.config, name, default) if value is None else value)

        recording, returns_tuple = asked("output_hidden_states", False), not asked("return_dict", True)
        self.calls.append(ForwardCall(recording=recording, returns_tuple=returns_tuple))
        return {**kwargs, "return_dict": True}

    def close(self) -> None:
        """After the recorder's forward, returned or raised: close its `ForwardCall`."""
        self.calls.pop()

    def before_embeddings(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict] | None:
        """Forward pre-hook of the embedding module: decide whether this pass carries global tokens."""
        call = self.current
        if call is None:
            return None
        cached = past_length(kwargs)
        call.prepended = not cached
        if cached:
            kwargs = with_past_length(kwargs, cached - self.config.num_global_tokens)
        return args, kwargs

    def prepend(self, module: nn.Module, args: tuple) -> tuple:
        """Forward pre-hook of the module the global tokens join before: (B, t, E) -> (B, g + t, E)."""
        call = self.current
        if call is None or not call.prepended:
            return args
        embeddings = args[0]
        global_tokens = self.table.weight[: self.config.num_global_tokens].to(embeddings.dtype)
        global_tokens = global_tokens.unsqueeze(0).expand(embeddings.shape[0], -1, -1)
        return (torch.cat([global_tokens, embeddings], dim=1), *args[1:])

    def layer_input(self, layer: nn.Module, args: tuple) -> tuple | None:
        """Forward pre-hook of every recorded layer: the first layer's input is hidden state 0."""
        call = self.current
        if not self.splits_states(call) or call.token_states:
            return None
        rows, states = self.split_states(args[0])
        call.token_states.append(rows)
        return (states, *args[1:])

    def layer_output(self, layer: nn.Module, args: tuple, output: Any) -> Any:
        """Forward hook of every recorded layer: its output is the next hidden state."""
        call = self.current
        if not self.splits_states(call):
            return output
        if isinstance(output, tuple):
            rows, states = self.split_states(output[0])
            output = (states, *output[1:])
        else:
            rows, output = self.split_states(output)
        call.token_states.append(rows)
        return output

    def drop(self, encoder: nn.Module, args: tuple, output: Any) -> Any:
        """Forward hook of the encoder (or step of lsg_recorder.RecorderSteps where it is the recorder):
        (B, g + t, E) -> (B, t, E), after pool_with_global (see `pools`).

        Encoder-decoder models with ``pass_global_tokens_to_decoder`` keep the global states: the
        decoder attends to them. The last hidden state recorded is the encoder output's token rows.
        """
        call = self.current
        if call is None or not call.prepended or not self.config.num_global_tokens:
            return output
        if getattr(self.config, "pass_global_tokens_to_decoder", False):
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
        lsg_recorder.ArgumentRewrite): the encoder output it attends to holds the g global states in
        front, so a (B, t) mask gets g columns of 1s in front; None where there is nothing to cover."""
        mask, states = arguments.get("encoder_attention_mask"), arguments.get("encoder_hidden_states")
        num_global = self.config.num_global_tokens
        if mask is None or states is None or mask.dim() != 2 or mask.shape[1] != states.shape[1] - num_global:
            return None
        return torch.cat([mask.new_ones(mask.shape[0], num_global), mask], dim=1)

    def finish(self, output: Any) -> Any:
        """After the recorder's forward: its hidden_states become the token rows (None stays None:
        ``output_hidden_states`` may select some layers only)."""
        call = self.current
        if self.splits_states(call) and output.hidden_states is not None:
            output.hidden_states = tuple(
                None if recorded is None else rows for recorded, rows in zip(output.hidden_states, call.token_states)
            )
        if not call.returns_tuple:
            return output
        return output.to_tuple() if self.output_tuple is None else self.output_tuple(output)
