"""LSG models under `torch.compile(fullgraph=True)`: one graph for the whole model (no graph break, no
host synchronisation), and a call without a padding mask known to mask no key, so that the flex
backend reads the layer's keys where they lie with a mask_mod that reads no tensor.

Graph breaks are counted by dynamo's tracing alone (`torch._dynamo.explain`): no kernel is compiled.
"""

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

from helpers import lsg_self_attention, padding_mask, run_without_lsg_converter, save_tiny_source
from lsg_converter import LSGBertConfig, LSGBertForMaskedLM, LSGBertModel, LSGConverter, save_converted
from lsg_converter.models import lsg_attention, lsg_flex

TOKENS = 300  # 19 blocks of 16, the last one padded
# (family, head) x backend: flex_attention runs forward only on the CPU (no gradients); the seq2seq
# families' decoders run transformers' own attention, whose flex path is not ours to make compilable
FAMILIES = {
    "bert": "BertForMaskedLM",
    "mpnet": "MPNetForMaskedLM",
    "deberta-v2": "DebertaV2ForMaskedLM",
    "bart": "BartForConditionalGeneration",
    "t5": "T5ForConditionalGeneration",
}
CASES = [(family, "sdpa") for family in FAMILIES] + [
    (family, "flex_attention") for family in FAMILIES if not FAMILIES[family].endswith("ConditionalGeneration")
]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """family -> its tiny LSG model (block 16, one global token)."""
    models = {}
    for family, head in FAMILIES.items():
        source = save_tiny_source(tmp_path_factory.mktemp(family), family, head)
        models[family], _ = LSGConverter(max_sequence_length=512).convert_from_pretrained(
            str(source), block_size=16, sparse_block_size=16, sparsity_type="norm", num_global_tokens=1
        )
    return models


def inputs_of(model, masked: bool) -> dict:
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, 90, (2, TOKENS), generator=generator)
    inputs = {"input_ids": input_ids}
    if masked:
        inputs["attention_mask"] = padding_mask([TOKENS, 250], TOKENS).long()
    if model.config.is_encoder_decoder:
        inputs["decoder_input_ids"] = input_ids[:, :20]
    return inputs


def graph_breaks(model, inputs) -> list[str]:
    torch.compiler.reset()
    explanation = torch._dynamo.explain(lambda: model(**inputs))()
    return [str(reason.reason).splitlines()[0] for reason in explanation.break_reasons]


@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "padded"])
@pytest.mark.parametrize("family, backend", CASES, ids=[f"{family}-{backend}" for family, backend in CASES])
def test_the_whole_model_traces_as_one_graph(converted, family, backend, masked):
    model = converted[family]
    model.set_attn_implementation(backend)
    model.eval()

    with torch.no_grad():
        assert graph_breaks(model, inputs_of(model, masked)) == []


@pytest.mark.parametrize("backend", ["sdpa", "flex_attention"])
def test_a_bare_model_traces_as_one_graph(backend):
    """A bare model runs the LSG steps around its own forward (`lsg_recorder.RecorderForward`)."""
    config = LSGBertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=37, max_position_embeddings=512, block_size=16, attn_implementation=backend)
    model = LSGBertModel(config, add_pooling_layer=False).eval()

    with torch.no_grad():
        assert graph_breaks(model, inputs_of(model, masked=True)) == []


def test_a_training_step_traces_as_one_graph_with_dropout(converted):
    model = converted["bert"]
    model.set_attn_implementation("sdpa")
    model.config.attention_probs_dropout_prob = 0.1
    model.train()

    try:
        assert graph_breaks(model, inputs_of(model, masked=True)) == []
    finally:
        model.config.attention_probs_dropout_prob = 0.0
        model.eval()


def test_a_saved_model_loaded_with_its_code_compiles_without_an_lru_cache_warning(tmp_path):
    """transformers loads a saved model's config class and model classes from two copies of its code: the
    settings the config resolves (another copy's class) reach a compiled forward as the model's settings,
    not through `LSGSettings.of`'s cache, on which dynamo warns (UserWarning, on stderr)."""
    source = save_tiny_source(tmp_path / "source", "bert", "BertForMaskedLM")
    model, tokenizer = LSGConverter(max_sequence_length=512).convert_from_pretrained(
        str(source), block_size=16, sparse_block_size=16, sparsity_type="norm", num_global_tokens=1
    )
    folder = save_converted(model, tokenizer, tmp_path / "saved")

    process = run_without_lsg_converter(
        f"""
        import warnings, torch, transformers
        warnings.simplefilter("always")
        model = transformers.AutoModelForMaskedLM.from_pretrained({str(folder)!r}, trust_remote_code=True).eval()
        compiled = torch.compile(model, backend="eager", fullgraph=True)  # dynamo traces as inductor would
        with torch.no_grad():
            compiled(input_ids=torch.randint(5, 90, (2, {TOKENS})))
        print("COMPILED", type(model).__module__)
        """,
        cwd=tmp_path,
    )

    assert process.returncode == 0, process.stderr[-2000:]
    assert "COMPILED transformers_modules." in process.stdout, process.stdout
    assert "lru_cache" not in process.stderr + process.stdout, process.stderr[-2000:]


def test_a_call_without_a_mask_reaches_the_attention_as_no_mask(monkeypatch):
    config = LSGBertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=37, max_position_embeddings=512, block_size=16, num_global_tokens=1)
    model = LSGBertForMaskedLM(config).eval()
    input_ids = torch.randint(5, 100, (2, TOKENS))
    plans = []
    blocked = lsg_attention._blocked_attention

    def recording_blocked(query, key, value, plan, *args, **kwargs):
        plans.append(plan)
        return blocked(query, key, value, plan, *args, **kwargs)

    monkeypatch.setattr(lsg_attention, "_blocked_attention", recording_blocked)
    with torch.no_grad():
        without = model(input_ids=input_ids).logits
        with_ones = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).logits

    # both layers of the call without a mask know no key is masked without reading a mask; a mask of the
    # user's own is read
    assert [plan.no_masked_keys for plan in plans] == [True, True, False, False]
    torch.testing.assert_close(without, with_ones, rtol=0, atol=0)


@pytest.mark.parametrize(
    "sparsity_type, sparse_block_size, tokens",
    [("none", 0, TOKENS), ("norm", 16, 288)],  # sparse keys: 18 whole blocks, every compressed key valid
    ids=["local", "sparse"],
)
def test_compiled_flex_reads_no_keys_validity_when_no_key_is_masked(
    sparsity_type, sparse_block_size, tokens, monkeypatch
):
    config = LSGBertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                           intermediate_size=37, max_position_embeddings=512, block_size=16,
                           sparse_block_size=sparse_block_size, sparsity_type=sparsity_type, num_global_tokens=1,
                           attn_implementation="flex_attention")
    model = LSGBertForMaskedLM(config).eval()
    layouts = []
    flex_path = lsg_attention.PATH_FUNCTIONS[lsg_attention.AttentionPath.FLEX]

    def recording(job, validity):
        layouts.append(validity)
        return flex_path(job, validity)

    monkeypatch.setitem(lsg_attention.PATH_FUNCTIONS, lsg_attention.AttentionPath.FLEX, recording)
    torch.compiler.reset()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        compiled(input_ids=torch.randint(5, 100, (1, tokens)))

    assert layouts == [None]  # the pattern's rule alone: no validity read


def test_the_whole_sequence_path_hands_the_kernel_the_layers_own_tensors(monkeypatch):
    config = LSGBertConfig(vocab_size=100, hidden_size=32, num_attention_heads=4, block_size=16, sparse_block_size=0,
                           sparsity_type="none", num_global_tokens=2)
    heads, head_dim, length = 4, 8, 2 + TOKENS
    # the layout of a model's projections: (B, L, H, D) memory seen as (B, H, L, D)
    query, key, value = (torch.randn(1, length, heads, head_dim).transpose(1, 2) for _ in range(3))
    kernel_inputs = []

    def recording_kernel(signature):
        def kernel(*inputs, **options):
            kernel_inputs.extend(inputs)
            return flex_attention(*inputs, **options)
        return kernel

    monkeypatch.setattr(lsg_flex, "_flex_kernel", recording_kernel)
    with torch.no_grad():
        lsg_self_attention(query, key, value, None, config, backend="flex_attention")

    assert [x.data_ptr() for x in kernel_inputs] == [x.data_ptr() for x in (query, key, value)]
    assert [x.shape for x in kernel_inputs] == [x.shape for x in (query, key, value)]
