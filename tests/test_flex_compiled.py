"""flex_attention compiled by inductor on the CPU, as the backend runs it: equal to the sdpa backend,
within its compile budget, falling back to sdpa (never to uncompiled flex), and O(n) in memory.

Each compile costs seconds to tens of seconds here. The compiled kernels are process-wide (one per
`lsg_flex.KernelSignature`), so the tests share them: the equality tests compile one kernel per
pattern (with or without sparse keys, bidirectional or causal, with position terms), whatever the
sparsity type. The same kernel lowering serves CUDA (where tests/test_gpu.py checks gradients too).
"""

import logging
import resource

import pytest
import torch
from torch._dynamo.utils import counters

from helpers import lsg_config, lsg_self_attention, padding_mask
from test_position_terms import BUCKETS, clamped_bucket
from lsg_converter import LSGBertConfig, LSGBertModel
from lsg_converter.models import lsg_flex
from lsg_converter.models.lsg_pattern import PositionTerms
from lsg_converter.models.lsg_sparse import SPARSITY_TYPES

HEADS, HEAD_DIM = 2, 16
NUM_GLOBAL, TOKENS = 2, 75  # 10 blocks of 8, the last one padded

@pytest.fixture(autouse=True)
def flex_kernel():
    """The compiled kernel the backend chooses (overrides conftest's uncompiled one)."""


def random_qkv(batch, length, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, HEADS, length, HEAD_DIM, generator=generator) for _ in range(3)]


def both_backends(inputs, mask, config, **options):
    """(sdpa output, flex output) of the same inference call."""
    with torch.no_grad():
        return [lsg_self_attention(*inputs, mask, config, backend=backend, **options) for backend in ("sdpa", "flex_attention")]


def assert_flex_ran_and_equals_sdpa(sdpa, flex, mask):
    real = mask[:, None, :, None].expand_as(sdpa)
    torch.testing.assert_close(flex[real], sdpa[real], atol=1e-5, rtol=0)
    assert not torch.equal(flex, sdpa)  # another kernel ran: not the sdpa fallback


def unique_graphs() -> int:
    return counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("sparsity_type", SPARSITY_TYPES)
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_compiled_flex_forward_equals_sdpa_forward(sparsity_type, causal):
    if causal and sparsity_type == "bos_pooling":
        pytest.skip("bos_pooling is refused for decoders")
    config = lsg_config(block_size=8, sparse_block_size=8, sparsity_type=sparsity_type, num_global_tokens=NUM_GLOBAL)
    length = NUM_GLOBAL + TOKENS
    mask = padding_mask([length, NUM_GLOBAL + 50], length)

    sdpa, flex = both_backends(random_qkv(2, length), mask, config, causal=causal)

    assert_flex_ran_and_equals_sdpa(sdpa, flex, mask)


@pytest.mark.parametrize("sparsity_type", ["none", "pooling"])
def test_compiled_flex_forward_equals_sdpa_forward_on_left_padded_rows_with_the_first_token_masked(sparsity_type):
    config = lsg_config(block_size=8, sparse_block_size=8, sparsity_type=sparsity_type, num_global_tokens=NUM_GLOBAL,
                        mask_first_token=True)
    length = NUM_GLOBAL + TOKENS
    mask = torch.ones(2, length, dtype=torch.bool)
    mask[1, NUM_GLOBAL : NUM_GLOBAL + 30] = False  # row 1: 30 tokens of padding, then 45 tokens

    sdpa, flex = both_backends(random_qkv(2, length, seed=2), mask, config)

    assert_flex_ran_and_equals_sdpa(sdpa, flex, mask)


@pytest.mark.parametrize("kind", ["unpadded", "padded", "hole"])
def test_compiled_flex_dropout_hides_the_same_keys_as_sdpa(kind):
    # blocks of a whole tile: the kernel skips the mask_mod on full tiles, where DropKey must hide keys too
    config = lsg_config(block_size=128, sparse_block_size=0, sparsity_type="none", num_global_tokens=1)
    length = 1 + 512
    mask = padding_mask([length, length if kind == "unpadded" else 1 + 300], length)
    if kind == "hole":
        mask[1] = True
        mask[1, 1 + 200 : 1 + 210] = False
    inputs, outputs = random_qkv(2, length, seed=3), []

    for backend in ("sdpa", "flex_attention"):
        torch.manual_seed(5)  # the same DropKey draws
        with torch.no_grad():
            outputs.append(lsg_self_attention(*inputs, mask, config, backend=backend, dropout=0.3))

    assert_flex_ran_and_equals_sdpa(*outputs, mask)


@pytest.mark.parametrize("sparsity_type", ["none", "norm"])
def test_compiled_flex_forward_equals_sdpa_forward_with_position_terms(sparsity_type):
    config = lsg_config(block_size=8, sparse_block_size=8, sparsity_type=sparsity_type, num_global_tokens=NUM_GLOBAL)
    length = NUM_GLOBAL + TOKENS
    mask = padding_mask([length, NUM_GLOBAL + 50], length)
    generator = torch.Generator().manual_seed(1)
    terms = PositionTerms(
        bucket=clamped_bucket,
        table=torch.randn(HEADS, BUCKETS, generator=generator),
        query_rows=torch.randn(2, HEADS, length, BUCKETS, generator=generator),
        key_rows=torch.randn(2, HEADS, length, BUCKETS, generator=generator),
        global_position=3,
    )

    sdpa, flex = both_backends(random_qkv(2, length), mask, config, position_terms=terms)

    assert_flex_ran_and_equals_sdpa(sdpa, flex, mask)


def test_compiled_flex_runs_deberta_s_c2p_and_p2c_as_sdpa_does():
    """DeBERTa's log buckets (looked up, as flex's CPU lowering takes no tensor built inside a score_mod)."""
    from test_deberta import head_inputs, lsg_deberta

    model = lsg_deberta("v3", block_size=16, sparse_block_size=16, num_global_tokens=2)
    inputs = head_inputs("DebertaV2Model")
    outputs = []
    for backend in ("sdpa", "flex_attention"):
        model.set_attn_implementation(backend)
        with torch.no_grad():
            outputs.append(model(**inputs).last_hidden_state[:, None])  # (B, 1, L, hidden)

    assert_flex_ran_and_equals_sdpa(*outputs, inputs["attention_mask"].bool())


LONG_BERT = dict(  # 2 heads of 16, as random_qkv: the attention-only tests below reuse its kernel
    hidden_size=32, num_hidden_layers=2, num_attention_heads=HEADS, intermediate_size=37, vocab_size=99,
    max_position_embeddings=8192, block_size=128, sparse_block_size=128, sparsity_type="norm", num_global_tokens=1,
)


@pytest.mark.slow
def test_a_model_fed_ten_lengths_with_mixed_padding_compiles_at_most_twice_per_validity_read(monkeypatch):
    """Norm's selection leaves the padding of some rows' last chunk among their compressed keys: those calls
    read each key's validity, the others the rows' bounds; each kernel compiles at most twice."""
    torch.manual_seed(0)
    model = LSGBertModel(LSGBertConfig(**LONG_BERT, attn_implementation="flex_attention")).eval()
    generator = torch.Generator().manual_seed(0)
    graphs_before = unique_graphs()
    layouts = set()
    kernel = lsg_flex._flex_kernel

    def recording_kernel(signature):
        layouts.add(signature.validity)
        return kernel(signature)

    monkeypatch.setattr(lsg_flex, "_flex_kernel", recording_kernel)

    for length in [1000, 1800, 2500, 3100, 4096, 4700, 5500, 6300, 7200, 8000]:  # 4096: whole blocks, no padding copy
        input_ids = torch.randint(3, 99, (2, length), generator=generator)
        attention_mask = padding_mask([length, length * 2 // 3], length).long()
        with torch.no_grad():
            model.set_attn_implementation("flex_attention")
            flex = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            model.set_attn_implementation("sdpa")
            sdpa = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        assert_flex_ran_and_equals_sdpa(sdpa[:, None], flex[:, None], attention_mask.bool())  # (B, 1, L, hidden)

    assert layouts <= {"per key", "row bounds"}
    assert unique_graphs() - graphs_before <= lsg_flex.MAX_COMPILES * len(layouts)


@pytest.mark.parametrize("hole", [False, True], ids=["row-bounds", "per-key"])
def test_a_batch_of_another_size_compiles_once_more_and_still_runs_flex(hole, monkeypatch, caplog):
    # the second compile makes the batch dynamic: its generated code must build (torch 2.13's CPU inductor
    # fails on some equivalent forms of the mask_mod there, and the call then runs sdpa)
    # a pattern of its own: the kernels are process-wide, and another test's compiles would spend its budget
    config = lsg_config(block_size=16, sparse_block_size=8, sparsity_type="norm", num_global_tokens=3)
    length = 3 + 96  # whole blocks
    logging.Logger.warning_once.cache_clear()

    for batch in (1, 2):
        mask = padding_mask([length] * batch, length)
        mask[-1, 3 + 30 : 3 + 36] = not hole
        sdpa, flex = both_backends(random_qkv(batch, length), mask, config)
        assert_flex_ran_and_equals_sdpa(sdpa, flex, mask)
    assert "LSG runs its sdpa backend" not in caplog.text


def run_with_kernel(monkeypatch, kernel, lengths, config):
    """(sdpa, flex) outputs of each length, flex through `kernel` (its warnings not yet given)."""
    monkeypatch.setattr(lsg_flex, "_flex_kernel", lambda signature: kernel)
    logging.Logger.warning_once.cache_clear()
    outputs = []
    for length in lengths:
        outputs.append(both_backends(random_qkv(1, length), padding_mask([length], length), config))
    return outputs


def test_a_call_past_the_compile_budget_runs_sdpa_with_one_warning(monkeypatch, caplog):
    kernel = lsg_flex.CompiledFlexAttention("lsg_flex_attention_test_budget", max_compiles=1)
    config = lsg_config(block_size=8, sparse_block_size=8, sparsity_type="none", num_global_tokens=1)
    graphs_before = unique_graphs()

    (sdpa, flex), *past_budget = run_with_kernel(monkeypatch, kernel, [1 + 40, 1 + 56, 1 + 64], config)

    assert unique_graphs() - graphs_before == 1
    assert_flex_ran_and_equals_sdpa(sdpa, flex, torch.ones(1, 41, dtype=torch.bool))
    assert all(torch.equal(flex, sdpa) for sdpa, flex in past_budget)  # the sdpa backend ran them
    assert caplog.text.count("LSG runs its sdpa backend") == 1


def test_a_failed_compile_runs_sdpa_with_one_warning_and_is_not_retried(monkeypatch, caplog):
    def failing_compile(graph, example_inputs):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(lsg_flex.CompiledFlexAttention, "_counted_inductor", staticmethod(failing_compile))
    kernel = lsg_flex.CompiledFlexAttention("lsg_flex_attention_test_failure")
    config = lsg_config(block_size=8, sparse_block_size=8, sparsity_type="none", num_global_tokens=1)

    outputs = run_with_kernel(monkeypatch, kernel, [1 + 40, 1 + 40, 1 + 56], config)

    assert all(torch.equal(flex, sdpa) for sdpa, flex in outputs)
    assert kernel.compiles_left == 0
    assert caplog.text.count("LSG runs its sdpa backend") == 1


@pytest.mark.slow
def test_a_32k_token_forward_through_compiled_flex_stays_linear_in_memory():
    config = lsg_config(block_size=128, sparse_block_size=128, sparsity_type="norm", num_global_tokens=1)
    length = 32_768  # one fp32 score matrix of one head: 4 GiB
    inputs = random_qkv(2, length)  # the shapes of LONG_BERT: its dynamic kernel serves
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB

    with torch.no_grad():
        flex = lsg_self_attention(*inputs, None, config, backend="flex_attention")
    rise_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) / 1024

    assert rise_mib < 512, f"peak memory rose by {rise_mib:.0f} MiB"
    with torch.no_grad():
        sdpa = lsg_self_attention(*inputs, None, config, backend="sdpa")
    assert_flex_ran_and_equals_sdpa(sdpa, flex, torch.ones(2, length, dtype=torch.bool))
