"""LSG-DeBERTa-v2: the DeBERTa-v2 and v3 heads of transformers with LSG attention and global tokens.

DeBERTa's disentangled attention adds two relative position terms to each score q_i . k_j / sqrt(3d):
content-to-position (c2p), query i's content against the embedding of the distance, Q_i . PosK[c],
and position-to-content (p2c), key j's content against it, K_j . PosQ[c], where c is the column
``clamp(span - bucket(j - i), 0, 2 span - 1)`` of the relative embeddings (DeBERTa's bucket: exact
below position_buckets / 2, logarithmic up to max_relative_positions in v3; none in v2). transformers
builds an (L, L) mask, (L, L) relative positions and, per layer and head, (L, L) c2p and p2c scores.

Here each layer projects the shared relative embeddings as the source does and hands LSG attention
the rows ``Q . PosK^T`` (one per query) and ``K . PosQ^T`` (one per key), (B, H, g + t, 2 span), as
`lsg_pattern.PositionTerms` with DeBERTa's column function: every (query, key) pair LSG evaluates gets
the source's c2p and p2c terms, block by block; a sparse key the rows of what it compresses, the
global tokens ``config.global_token_position`` (0, the [CLS] position). Four source modules are
swapped (`SwappedAttention`), each overriding only what LSG changes:

* the embeddings multiply by the padding mask with the global tokens covered (the source's mask
  multiplication after the LayerNorm would not fit the longer sequence);
* the encoder passes the O(n) padding mask and the relative embeddings on, without building the
  (L, L) mask and relative positions;
* each layer runs the encoder's ConvLayer (DeBERTa-v2 xlarge / xxlarge, after the first layer) itself,
  over the tokens with the global tokens kept out, so that its output is the hidden state recorded;
* the attention computes queries, keys, values and the position rows and calls LSG attention.

v3 has no absolute positions (position_biased_input=False): nothing is tiled, the global tokens are
the [CLS] / [MASK] embeddings. v2 checkpoints with a position table have it tiled like BERT's.

Each head ``LSGDebertaV2<Head>`` is the mixin below plus ``DebertaV2<Head>``, one class per head
listed in LSGDebertaV2Config.
"""

from __future__ import annotations

import functools
import math

import torch

from .configuration_lsg_deberta_v2 import LSGDebertaV2Config
from .lsg_attention import key_padding_mask
from .lsg_attention_layers import SwappedAttention, adopted, swapped_attention_forward
from .lsg_global_tokens import DropsGlobalTokens, RecordsTokenStates
from .lsg_layout import LSGLayout
from .lsg_model import LSGModelMixin
from .lsg_pattern import PositionTerms
from .lsg_recorder import CarriesGlobalTokens
from .lsg_transformers import transformers_names

with transformers_names():  # one line naming both versions if a release removed one of these
    from transformers.modeling_outputs import BaseModelOutput
    from transformers.models.deberta_v2.modeling_deberta_v2 import (
        DebertaV2Embeddings,
        DebertaV2Encoder,
        DebertaV2ForMaskedLM,
        DebertaV2ForMultipleChoice,
        DebertaV2ForQuestionAnswering,
        DebertaV2ForSequenceClassification,
        DebertaV2ForTokenClassification,
        DebertaV2Layer,
        DebertaV2Model,
        DisentangledSelfAttention,
        make_log_bucket_position,
    )


def relative_embedding_columns(span: int, buckets: int, max_position: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """The column of DeBERTa's relative embeddings for each r = key position - query position in
    [-reach, reach]: (2 reach + 1,) int64, entry r + reach; beyond `reach` (returned) the column no
    longer changes.

    c2p reads column clamp(bucket(i - j) + span, 0, 2 span - 1) for query i and key j, p2c column
    clamp(-bucket(j - i) + span, 0, 2 span - 1); DeBERTa's bucket (make_log_bucket_position: exact below
    buckets / 2, logarithmic up to max_position; none in v2 without buckets) is odd, so both are this
    one column. Computed once per call by the source's own function and looked up (`column_of`), so
    that the score_mod of flex_attention gathers integers instead of evaluating logarithms."""
    reach = 2 * max(span, max_position)  # |r| >= max_position: the last bucket; |r| >= span: clamped
    distance = -torch.arange(-reach, reach + 1, device=device)  # DeBERTa's relative position: query - key
    if buckets > 0 and max_position > 0:
        distance = make_log_bucket_position(distance, buckets, max_position).long()
    return (distance + span).clamp(0, 2 * span - 1), reach


def column_of(relative: torch.Tensor, columns: torch.Tensor, reach: int) -> torch.Tensor:
    """The relative-embedding column of each r = key position - query position (int64, elementwise),
    looked up in `relative_embedding_columns`."""
    return columns[relative.clamp(-reach, reach) + reach]


class LSGDebertaV2Embeddings(DebertaV2Embeddings):
    """DebertaV2Embeddings whose padding mask covers the global tokens, prepended before its LayerNorm
    (or before the projection to hidden_size, where it has one)."""

    def forward(self, input_ids=None, token_type_ids=None, position_ids=None, mask=None, inputs_embeds=None):
        # the source's dropout after its mask product: the same as the product after the dropout
        embeddings = super().forward(input_ids, token_type_ids, position_ids, None, inputs_embeds)  # (B, g + t, E)
        covered = None if mask is None else key_padding_mask(mask, embeddings.shape[1], self.config.num_global_tokens)  # (B, g + t) bool
        if covered is None:  # no token masked
            return embeddings
        return embeddings * covered[..., None].to(embeddings.dtype)


class LSGDisentangledSelfAttention(DisentangledSelfAttention):
    """DisentangledSelfAttention through LSG attention, its c2p and p2c terms as `PositionTerms` rows."""

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        output_attentions: bool = False,
        query_states: torch.Tensor | None = None,
        relative_pos: torch.Tensor | None = None,
        rel_embeddings: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if query_states is not None or relative_pos is not None:
            raise ValueError(
                "LSG-DeBERTa evaluates relative positions block by block: call the attention without "
                "query_states= or relative_pos=."
            )
        shape = (*hidden_states.shape[:-1], self.num_attention_heads, self.attention_head_size)  # (B, L, H, D)
        query, key, value = (
            layer(hidden_states).view(shape).transpose(1, 2) for layer in (self.query_proj, self.key_proj, self.value_proj)
        )  # (B, H, L, D)
        scale = math.sqrt(self.attention_head_size * (1 + len({"c2p", "p2c"} & set(self.pos_att_type))))
        terms = self.position_terms(query, key, rel_embeddings, scale) if self.relative_attention else None
        output, weights = swapped_attention_forward(
            self,
            query,
            key,
            value,
            attention_mask,
            scaling=1 / scale,
            position_terms=terms,
            output_attentions=output_attentions,
        )  # output: (B, L, H, D)
        return output.reshape(*hidden_states.shape[:-1], self.all_head_size), weights

    def position_terms(
        self, query: torch.Tensor, key: torch.Tensor, rel_embeddings: torch.Tensor, scale: float
    ) -> PositionTerms | None:
        """c2p as query rows Q . PosK^T and p2c as key rows K . PosQ^T, (B, H, L, 2 span), scaled as the source
        scales them; None where the config has neither."""
        span = self.pos_ebd_size
        relative_embeddings = self.pos_dropout(rel_embeddings)[: 2 * span]  # (2 span, E)

        def per_head(projection: torch.nn.Linear) -> torch.Tensor:  # (2 span, E) -> (H, D, 2 span)
            projected = projection(relative_embeddings).view(2 * span, self.num_attention_heads, -1)
            return projected.permute(1, 2, 0)

        query_rows = key_rows = None  # divided in place: the product's own memory, the source's rounding
        if "c2p" in self.pos_att_type:
            query_rows = (query @ per_head(self.key_proj if self.share_att_key else self.pos_key_proj)).div_(scale)
        if "p2c" in self.pos_att_type:
            key_rows = (key @ per_head(self.query_proj if self.share_att_key else self.pos_query_proj)).div_(scale)
        if query_rows is None and key_rows is None:
            return None
        columns, reach = relative_embedding_columns(span, self.position_buckets, self.max_relative_positions, query.device)
        return PositionTerms(
            bucket=functools.partial(column_of, columns=columns, reach=reach),
            query_rows=query_rows,
            key_rows=key_rows,
            global_position=self.config.global_token_position,
        )


class LSGDebertaV2Layer(DebertaV2Layer):
    """DebertaV2Layer that runs the encoder's ConvLayer, where it is given one, over its tokens (the
    global tokens kept out: their states pass as the layer left them)."""

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        query_states: torch.Tensor | None = None,
        relative_pos: torch.Tensor | None = None,
        rel_embeddings: torch.Tensor | None = None,
        output_attentions: bool = False,
        conv: torch.nn.Module | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        output, weights = super().forward(
            hidden_states, attention_mask, query_states, relative_pos, rel_embeddings, output_attentions
        )
        if conv is None:
            return output, weights
        num_global = self.config.num_global_tokens
        token_mask = key_padding_mask(attention_mask, hidden_states.shape[1], num_global)
        if token_mask is None:
            token_mask = torch.ones(hidden_states.shape[:2], dtype=torch.bool, device=hidden_states.device)
        tokens = conv(hidden_states[:, num_global:], output[:, num_global:], token_mask[:, num_global:].long())
        return torch.cat([output[:, :num_global], tokens], dim=1), weights


class LSGDebertaV2Encoder(DebertaV2Encoder):
    """DebertaV2Encoder that hands its layers the O(n) padding mask and the relative embeddings, without
    the (L, L) attention mask and relative positions of the source."""

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        output_hidden_states: bool = True,
        output_attentions: bool = False,
        query_states: torch.Tensor | None = None,
        relative_pos: torch.Tensor | None = None,
        return_dict: bool = True,
    ) -> BaseModelOutput | tuple:
        if query_states is not None or relative_pos is not None:
            raise ValueError(
                "LSG-DeBERTa evaluates relative positions block by block: call the encoder without "
                "query_states= or relative_pos=."
            )
        all_hidden_states = (hidden_states,) if output_hidden_states else None
        all_attentions = () if output_attentions else None
        rel_embeddings = self.get_rel_embedding()
        for index, layer in enumerate(self.layer):
            hidden_states, weights = layer(
                hidden_states,
                attention_mask,
                rel_embeddings=rel_embeddings,
                output_attentions=output_attentions,
                conv=self.conv if index == 0 else None,
            )
            if output_attentions:
                all_attentions += (weights,)
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
        if not return_dict:
            return tuple(v for v in (hidden_states, all_hidden_states, all_attentions) if v is not None)
        return BaseModelOutput(last_hidden_state=hidden_states, hidden_states=all_hidden_states, attentions=all_attentions)


# The modules the global tokens pass through, each adopted into the class that adds its step (lsg_global_tokens)
class LSGDebertaV2LayerRecordingTokenStates(RecordsTokenStates, LSGDebertaV2Layer):
    """LSGDebertaV2Layer recording the token rows of its states (`RecordsTokenStates`)."""


class LSGDebertaV2EncoderDroppingGlobalTokens(DropsGlobalTokens, LSGDebertaV2Encoder):
    """LSGDebertaV2Encoder: its output leaves the global tokens out (`DropsGlobalTokens`)."""


class DebertaV2ModelWithGlobalTokens(CarriesGlobalTokens, DebertaV2Model):
    """DebertaV2Model inside a head: its forward runs inside the model's `RecorderSteps` (`CarriesGlobalTokens`)."""


class LSGDebertaV2Mixin(LSGModelMixin):
    """BERT's places (`embeddings.global_embeddings`, prepended before `embeddings.LayerNorm`, or before
    `embeddings.embed_proj` where the embeddings are narrower than the layers); the embeddings, encoder,
    layers and self-attention swapped; outputs built by hand, so their layers are named here."""

    config_class = LSGDebertaV2Config
    lsg_attention = SwappedAttention(
        (DebertaV2Embeddings, adopted(LSGDebertaV2Embeddings)),
        (DebertaV2Encoder, adopted(LSGDebertaV2Encoder)),
        (DebertaV2Layer, adopted(LSGDebertaV2Layer)),
        (DisentangledSelfAttention, adopted(LSGDisentangledSelfAttention)),
    )
    lsg_recorded_outputs = {"hidden_states": DebertaV2Layer, "attentions": LSGDisentangledSelfAttention}
    # The global tokens join before the projection to hidden_size where the embeddings have one (they
    # are embedding_size wide, like the global tokens), else before the LayerNorm; v3 has no position table.
    lsg_layout = LSGLayout(
        prepend_before=("embeddings.embed_proj", "embeddings.LayerNorm"),
        token_type_table="embeddings.token_type_embeddings",
    )


class LSGDebertaV2Model(LSGDebertaV2Mixin, DebertaV2Model):
    """DebertaV2Model with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGDebertaV2ForMaskedLM(LSGDebertaV2Mixin, DebertaV2ForMaskedLM):
    """DebertaV2ForMaskedLM with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGDebertaV2ForSequenceClassification(LSGDebertaV2Mixin, DebertaV2ForSequenceClassification):
    """DebertaV2ForSequenceClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGDebertaV2ForTokenClassification(LSGDebertaV2Mixin, DebertaV2ForTokenClassification):
    """DebertaV2ForTokenClassification with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGDebertaV2ForQuestionAnswering(LSGDebertaV2Mixin, DebertaV2ForQuestionAnswering):
    """DebertaV2ForQuestionAnswering with LSG attention (Local + Sparse + Global) and global tokens."""


class LSGDebertaV2ForMultipleChoice(LSGDebertaV2Mixin, DebertaV2ForMultipleChoice):
    """DebertaV2ForMultipleChoice with LSG attention (Local + Sparse + Global) and global tokens."""
