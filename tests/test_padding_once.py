"""What the layers of a forward pass make from its padding mask alone is made once per pass, not per layer
(issue 48): the padded masks, the blocks that hold a real token, the backends' plans (sdpa's window views
and block masks, flex_attention's row bounds). Host synchronisations, which stall a GPU's launch queue,
then do not grow with the layers; a mask changed between two forwards is read anew.
"""

import dataclasses
import gc
import weakref

import pytest
import torch

from helpers import host_syncs, padding_mask
from lsg_converter import LSGBertConfig, LSGBertForMaskedLM
from lsg_converter.models import lsg_attention
from lsg_converter.models.lsg_pattern import give_padding_plans, padding_plans_of
from test_conventions import batch, tiny_lsg

TOKENS = 1000  # 16 blocks of 64, the last one padded to whole blocks
BACKEND_CASES = [("sdpa", False), ("sdpa", True), ("flex_attention", False)]  # flex: forward only on the CPU
BACKEND_IDS = ["sdpa-inference", "sdpa-with-gradients", "flex_attention-inference"]


def lsg_bert(layers: int, backend: str, sparsity_type: str = "none") -> LSGBertForMaskedLM:
    """A tiny LSG-BERT with the conversion's defaults (local and global keys only), or sparse keys of
    `sparsity_type`, in eval mode."""
    torch.manual_seed(0)
    config = LSGBertConfig(vocab_size=100, hidden_size=32, num_attention_heads=4, intermediate_size=37,
                           num_hidden_layers=layers, max_position_embeddings=TOKENS + 100, block_size=64,
                           sparse_block_size=0 if sparsity_type == "none" else 64, sparsity_factor=4,
                           sparsity_type=sparsity_type, num_global_tokens=1, attn_implementation=backend)  # fmt: skip
    return LSGBertForMaskedLM(config).eval()


def inputs(padded: bool) -> dict:
    input_ids = torch.randint(5, 100, (2, TOKENS), generator=torch.Generator().manual_seed(0))
    if not padded:
        return {"input_ids": input_ids}
    return {"input_ids": input_ids, "attention_mask": padding_mask([TOKENS, 3 * TOKENS // 4], TOKENS).long()}


def syncs_of_a_forward(
    layers: int, backend: str, with_gradients: bool, padded: bool = True, sparsity_type: str = "none"
) -> list[str]:
    """The host syncs of a forward after a first one (what depends on the shape alone is made once)."""
    torch.compiler.reset()  # uncompiled flex_attention runs through torch.compile: no recompiles piled up by other tests
    model = lsg_bert(layers, backend, sparsity_type)
    batch = inputs(padded)
    with torch.set_grad_enabled(with_gradients):
        model(**batch)
        return host_syncs(lambda: model(**batch))


@pytest.mark.parametrize("backend, with_gradients", BACKEND_CASES, ids=BACKEND_IDS)
def test_host_syncs_of_a_padded_batch_do_not_grow_with_the_layers(backend, with_gradients):
    one_layer = syncs_of_a_forward(1, backend, with_gradients)
    two_layers = syncs_of_a_forward(2, backend, with_gradients)

    assert two_layers == one_layer


@pytest.mark.parametrize("sparsity_type", ["pooling", "stride", "bos_pooling"])
@pytest.mark.parametrize("backend, with_gradients", BACKEND_CASES, ids=BACKEND_IDS)
def test_host_syncs_of_a_padded_batch_with_sparse_keys_of_the_padding_alone_do_not_grow_with_the_layers(
    backend, with_gradients, sparsity_type
):
    one_layer = syncs_of_a_forward(1, backend, with_gradients, sparsity_type=sparsity_type)
    two_layers = syncs_of_a_forward(2, backend, with_gradients, sparsity_type=sparsity_type)

    assert two_layers == one_layer


@pytest.mark.parametrize("backend, with_gradients", BACKEND_CASES, ids=BACKEND_IDS)
def test_an_unpadded_batch_makes_no_host_sync(backend, with_gradients):
    assert syncs_of_a_forward(2, backend, with_gradients, padded=False) == []


@pytest.mark.parametrize("backend", ["sdpa", "flex_attention"])
def test_a_mask_changed_in_place_between_two_forwards_is_read_anew(backend):
    model = lsg_bert(2, backend)
    batch = inputs(padded=True)
    mask = batch["attention_mask"]

    with torch.no_grad():
        before = model(**batch).logits
        mask[1, TOKENS // 2 :] = 0  # the same tensor, fewer real tokens
        after = model(**batch).logits
        fresh = model(input_ids=batch["input_ids"], attention_mask=mask.clone()).logits

    torch.testing.assert_close(after, fresh, rtol=0, atol=0)
    assert not torch.allclose(after[1, : TOKENS // 2], before[1, : TOKENS // 2])


def memos_found_in(model, monkeypatch, **inputs) -> list:
    """The padding plans each LSG layer's call finds (`padding_plans_of`) in a forward of `model` without gradients."""
    found = []
    memo_of = lsg_attention.padding_plans_of

    def recorded_memo(mask):
        found.append(memo_of(mask))
        return found[-1]

    monkeypatch.setattr(lsg_attention, "padding_plans_of", recorded_memo)
    with torch.no_grad():
        model(**inputs)
    return found


def tensors_in(held) -> list[torch.Tensor]:
    """The tensors padding plans hold, in their dicts, dataclasses, tuples and lists."""
    if isinstance(held, torch.Tensor):
        return [held]
    if dataclasses.is_dataclass(held):
        held = [getattr(held, field.name) for field in dataclasses.fields(held)]
    if isinstance(held, dict):
        held = list(held.values())
    if isinstance(held, (tuple, list)):
        return [tensor for item in held for tensor in tensors_in(item)]
    return []


def test_what_a_pass_made_goes_with_its_mask_when_the_pass_returns(monkeypatch):
    model = lsg_bert(1, "sdpa")
    found = memos_found_in(model, monkeypatch, **inputs(padded=True))
    made = [weakref.ref(tensor) for tensor in tensors_in(found.pop())]
    found.clear()

    gc.collect()
    assert made and all(tensor() is None for tensor in made)


def test_each_pass_has_plans_of_its_own(monkeypatch):
    model = lsg_bert(1, "sdpa")
    batch = inputs(padded=True)

    first = memos_found_in(model, monkeypatch, **batch)
    second = memos_found_in(model, monkeypatch, **batch)

    assert first[0] is not None and second[0] is not None and first[0] is not second[0]


@pytest.mark.parametrize("arch", ["bert", "bart", "t5", "mpnet", "deberta-v2"])
def test_every_lsg_layer_of_every_family_finds_the_padding_its_pass_shares(arch, monkeypatch):
    model = tiny_lsg(arch)

    found = memos_found_in(model, monkeypatch, **batch(arch))

    assert len(found) == (model.config.num_layers if arch == "t5" else model.config.num_hidden_layers)
    assert found[0] is not None and all(memo is found[0] for memo in found)


@pytest.mark.parametrize("arch, kinds", [("bert", 1), ("bart", 1), ("t5", 1), ("mpnet", 1), ("deberta-v2", 1), ("modernbert", 2)])
def test_the_recorder_plans_the_padding_of_each_kind_of_layer_once_before_the_layers_run(arch, kinds, monkeypatch):
    model = tiny_lsg(arch)
    events = []
    make_plan, plans_of = lsg_attention.padding_plan, lsg_attention.padding_plans_of

    def recorded_plan(*args, **kwargs):
        events.append("plan")
        return make_plan(*args, **kwargs)

    def recorded_layer(mask):
        events.append("layer")
        return plans_of(mask)

    monkeypatch.setattr(lsg_attention, "padding_plan", recorded_plan)
    monkeypatch.setattr(lsg_attention, "padding_plans_of", recorded_layer)
    with torch.no_grad():
        model(**batch(arch))

    layers = model.config.num_layers if arch == "t5" else model.config.num_hidden_layers
    assert events == ["plan"] * kinds + ["layer"] * layers  # ModernBERT: its full and its sliding layers


@pytest.mark.parametrize("arch", ["t5", "mpnet"])
def test_host_syncs_of_a_padded_batch_with_position_terms_do_not_grow_with_the_layers(arch):
    layers_key = "num_layers" if arch == "t5" else "num_hidden_layers"
    inputs_of_arch = batch(arch)
    syncs = []
    for layers in (1, 2):
        model = tiny_lsg(arch, **{layers_key: layers, "sparsity_type": "none", "sparse_block_size": 0})
        with torch.no_grad():
            model(**inputs_of_arch)  # what depends on the shape alone is made once
            syncs.append(host_syncs(lambda: model(**inputs_of_arch)))

    assert syncs[1] == syncs[0]


def syncs_of_a_checkpointed_training_step(layers: int) -> list[str]:
    """The host syncs of a training step (forward and backward) with gradient checkpointing, whose backward
    runs each layer's forward again, after a first step."""
    model = lsg_bert(layers, "sdpa")
    for dropout in model.modules():  # no DropKey, which each layer draws anew
        if isinstance(dropout, torch.nn.Dropout):
            dropout.p = 0.0
    model.gradient_checkpointing_enable()
    model.train()
    batch = inputs(padded=True)

    def step():
        model(**batch).logits.square().mean().backward()

    step()
    return host_syncs(step)


def test_layers_run_again_by_gradient_checkpointing_find_what_their_pass_made():
    assert syncs_of_a_checkpointed_training_step(2) == syncs_of_a_checkpointed_training_step(1)


def test_a_mask_no_recorder_made_has_no_plans():
    mask = torch.ones(2, 8, dtype=torch.bool)
    assert padding_plans_of(mask) is None

    give_padding_plans(mask, {})
    assert padding_plans_of(mask) == {} and padding_plans_of(mask.clone()) is None
