"""The CUDA paths: compiled flex_attention against the SDPA backend (outputs and gradients, fp32 and
bf16), the automatic choice of backend, LSH buckets equal on CPU and CUDA, finite fp16 outputs,
generation with and without cache. Skipped where no CUDA device is present (CI has none)."""

import pytest
import torch
import torch.nn.functional as F

from helpers import lsg_config, lsg_self_attention, padding_mask, saved_bytes
from lsg_converter import LSGBertConfig, LSGBertForMaskedLM, LSGBertLMHeadModel
from lsg_converter.models import lsg_flex
from lsg_converter.models.lsg_attention import DEFAULT_BACKEND
from lsg_converter.models.lsg_settings import LSGSettings
from lsg_converter.models.lsg_sparse import SPARSITY_TYPES, sparse_by_lsh

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

HEADS, HEAD_DIM, BLOCK = 4, 64, 64
NUM_GLOBAL, TOKENS = 2, 1000  # 16 blocks of 64, the last one padded


def assert_backends_agree(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """float32: element by element. bfloat16: the difference's norm against the tensor's (2e-2 is
    about 5 bfloat16 roundings): one element, such as a global key's gradient summed over a
    thousand queries in bfloat16, may round a few units apart in two exact backends."""
    if actual.dtype == torch.float32:
        torch.testing.assert_close(actual, expected, atol=2e-3, rtol=2e-3)
        return
    actual, expected = actual.double(), expected.double()
    relative_error = ((actual - expected).norm() / expected.norm()).item()
    assert relative_error <= 2e-2, f"relative error {relative_error:.2e} (norm of the difference / norm)"


@pytest.fixture(autouse=True)
def flex_kernel():
    """The compiled kernel the backend chooses (conftest's uncompiled one is for the CPU unit tests)."""


def random_qkv(batch, length, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.randn(batch, HEADS, length, HEAD_DIM, generator=generator).to("cuda", dtype).requires_grad_()
        for _ in range(3)
    ]


def run(backend, inputs, mask, config, seed=0, **options):
    """Output and input gradients of one backend on fresh copies of `inputs`."""
    inputs = [x.detach().clone().requires_grad_() for x in inputs]
    torch.manual_seed(seed)
    output = lsg_self_attention(*inputs, mask, config, backend=backend, **options)
    output.float().square().sum().backward()
    return output.detach(), [x.grad for x in inputs]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("sparsity_type", SPARSITY_TYPES)
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_flex_equals_sdpa_in_outputs_and_gradients(dtype, sparsity_type, causal):
    config = lsg_config(block_size=BLOCK, sparse_block_size=BLOCK, sparsity_type=sparsity_type, num_global_tokens=NUM_GLOBAL)
    length = NUM_GLOBAL + TOKENS
    inputs = random_qkv(2, length, dtype)
    mask = padding_mask([length, NUM_GLOBAL + 700], length).cuda()

    sdpa, sdpa_gradients = run("sdpa", inputs, mask, config, causal=causal)
    flex, flex_gradients = run("flex_attention", inputs, mask, config, causal=causal)

    real = mask[:, None, :, None].expand_as(sdpa)
    assert_backends_agree(flex[real], sdpa[real])
    for flex_gradient, sdpa_gradient in zip(flex_gradients, sdpa_gradients):
        assert_backends_agree(flex_gradient, sdpa_gradient)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_flex_without_padding_equals_sdpa_in_outputs_and_gradients(dtype, causal):
    """No padding mask, no sparse keys: the mask_mod is the pattern's rule alone, full tiles skip it."""
    config = lsg_config(block_size=BLOCK, sparse_block_size=0, sparsity_type="none", num_global_tokens=NUM_GLOBAL)
    inputs = random_qkv(2, NUM_GLOBAL + TOKENS, dtype)

    sdpa, sdpa_gradients = run("sdpa", inputs, None, config, causal=causal)
    flex, flex_gradients = run("flex_attention", inputs, None, config, causal=causal)

    assert_backends_agree(flex, sdpa)
    for flex_gradient, sdpa_gradient in zip(flex_gradients, sdpa_gradients):
        assert_backends_agree(flex_gradient, sdpa_gradient)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("sparsity_type", ["none", "pooling"])
@pytest.mark.parametrize("padding", ["right", "left"])
def test_flex_over_padded_rows_reads_their_bounds_and_equals_sdpa_in_outputs_and_gradients(
    dtype, sparsity_type, padding, monkeypatch
):
    """Each row's padding one run: the mask_mod reads the rows' bounds (a few numbers per row), no key's validity."""
    config = lsg_config(block_size=BLOCK, sparse_block_size=BLOCK, sparsity_type=sparsity_type, num_global_tokens=NUM_GLOBAL)
    length = NUM_GLOBAL + TOKENS
    inputs = random_qkv(2, length, dtype)
    mask = padding_mask([length, NUM_GLOBAL + 700], length)
    if padding == "left":
        mask[1] = mask[1].flip(0).roll(NUM_GLOBAL)  # the globals, then 300 tokens of padding, then 700 tokens
    mask = mask.cuda()
    layouts = []
    kernel = lsg_flex._flex_kernel
    monkeypatch.setattr(lsg_flex, "_flex_kernel", lambda signature: layouts.append(signature.validity) or kernel(signature))

    sdpa, sdpa_gradients = run("sdpa", inputs, mask, config)
    flex, flex_gradients = run("flex_attention", inputs, mask, config)

    assert layouts == ["row bounds"]
    real = mask[:, None, :, None].expand_as(sdpa)
    assert_backends_agree(flex[real], sdpa[real])
    for flex_gradient, sdpa_gradient in zip(flex_gradients, sdpa_gradients):
        assert_backends_agree(flex_gradient, sdpa_gradient)


@pytest.mark.parametrize("sparsity_type", ["none", "norm"])
def test_flex_with_a_hole_in_the_mask_and_dropout_equals_sdpa_in_outputs_and_gradients(sparsity_type, monkeypatch):
    """A hole in a row's mask: the mask_mod reads each key's validity, and DropKey's choice."""
    config = lsg_config(block_size=BLOCK, sparse_block_size=BLOCK, sparsity_type=sparsity_type, num_global_tokens=NUM_GLOBAL)
    length = NUM_GLOBAL + TOKENS
    inputs = random_qkv(2, length, torch.float32)
    mask = padding_mask([length, length], length)
    mask[1, NUM_GLOBAL + 300 : NUM_GLOBAL + 340] = False
    mask = mask.cuda()
    validity = []
    kernel = lsg_flex._flex_kernel
    monkeypatch.setattr(lsg_flex, "_flex_kernel", lambda signature: validity.append(signature.validity) or kernel(signature))

    sdpa, sdpa_gradients = run("sdpa", inputs, mask, config, seed=5, dropout=0.2)
    flex, flex_gradients = run("flex_attention", inputs, mask, config, seed=5, dropout=0.2)

    assert validity == ["per key"]
    real = mask[:, None, :, None].expand_as(sdpa)
    assert_backends_agree(flex[real], sdpa[real])
    for flex_gradient, sdpa_gradient in zip(flex_gradients, sdpa_gradients):
        assert_backends_agree(flex_gradient, sdpa_gradient)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_flex_training_call_keeps_the_layers_output_once(dtype):
    """The global queries' output is written into the kernel's own rows for them (lsg_flex.with_global_rows):
    no joined copy of the output is kept besides the one the kernel keeps for its backward."""
    config = lsg_config(block_size=BLOCK, sparse_block_size=0, sparsity_type="none", num_global_tokens=NUM_GLOBAL)
    length = 16 * BLOCK
    dense = saved_bytes(F.scaled_dot_product_attention, random_qkv(1, length, dtype))
    lsg = saved_bytes(lambda q, k, v: lsg_self_attention(q, k, v, None, config, backend="flex_attention"),
                      random_qkv(1, NUM_GLOBAL + length, dtype))

    assert lsg <= 1.1 * dense  # queries, keys, values, output and the log-sum-exps (1.25x with a joined copy)


def test_a_compiled_model_trains_as_the_eager_one_on_flex_attention():
    torch.manual_seed(0)
    config = LSGBertConfig(**{**TINY_BERT, "sparse_block_size": 0, "sparsity_type": "none"}, attn_implementation="flex_attention")
    model = LSGBertForMaskedLM(config).cuda().eval()
    input_ids = torch.randint(3, 99, (1, TOKENS), device="cuda")

    def gradients(forward):
        model.zero_grad(set_to_none=True)
        forward(input_ids=input_ids).logits.float().square().mean().backward()
        return [parameter.grad.clone() for parameter in model.parameters() if parameter.grad is not None]

    eager = gradients(model)
    torch.compiler.reset()
    compiled = gradients(torch.compile(model, fullgraph=True))

    assert len(compiled) == len(eager)
    for compiled_gradient, eager_gradient in zip(compiled, eager):
        torch.testing.assert_close(compiled_gradient, eager_gradient, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("backend", ["sdpa", "flex_attention"])
def test_cuda_outputs_and_gradients_equal_the_cpu_ones_in_float32(backend):
    """The global queries run `few_query_attention` on CUDA (SDPA on the CPU); every other query too is checked."""
    config = lsg_config(block_size=BLOCK, sparse_block_size=BLOCK, sparsity_type="norm", num_global_tokens=NUM_GLOBAL)
    length = NUM_GLOBAL + TOKENS
    inputs = [x.detach().float().cpu() for x in random_qkv(2, length, torch.float32)]
    mask = padding_mask([length, NUM_GLOBAL + 700], length)

    cuda, cuda_gradients = run(backend, [x.cuda() for x in inputs], mask.cuda(), config)
    cpu, cpu_gradients = run("sdpa", inputs, mask, config)

    real = mask[:, None, :, None].expand_as(cpu)
    torch.testing.assert_close(cuda.cpu()[real], cpu[real], atol=2e-3, rtol=2e-3)
    for cuda_gradient, cpu_gradient in zip(cuda_gradients, cpu_gradients):
        torch.testing.assert_close(cuda_gradient.cpu(), cpu_gradient, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_flex_dropout_hides_the_same_keys_as_sdpa_on_cuda(causal):
    config = lsg_config(block_size=BLOCK, sparse_block_size=BLOCK, num_global_tokens=NUM_GLOBAL)
    length = NUM_GLOBAL + TOKENS
    inputs = random_qkv(2, length, torch.float32, seed=1)
    mask = padding_mask([length, NUM_GLOBAL + 500], length).cuda()

    sdpa, _ = run("sdpa", inputs, mask, config, seed=5, dropout=0.2, causal=causal)
    flex, _ = run("flex_attention", inputs, mask, config, seed=5, dropout=0.2, causal=causal)

    real = mask[:, None, :, None].expand_as(sdpa)
    torch.testing.assert_close(flex[real], sdpa[real], atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("sparsity_type", SPARSITY_TYPES)
@pytest.mark.parametrize("backend", ["sdpa", "flex_attention"])
def test_fp16_outputs_are_finite(sparsity_type, backend):
    config = lsg_config(block_size=BLOCK, sparse_block_size=BLOCK, sparsity_type=sparsity_type, num_global_tokens=NUM_GLOBAL)
    length = NUM_GLOBAL + TOKENS
    inputs = random_qkv(2, length, torch.float16)
    mask = padding_mask([length, NUM_GLOBAL + 300], length).cuda()

    output, gradients = run(backend, inputs, mask, config)

    assert torch.isfinite(output).all() and all(torch.isfinite(g).all() for g in gradients)


def test_lsh_buckets_are_the_same_on_cpu_and_cuda():
    config = LSGSettings.of(lsg_config(block_size=BLOCK, sparse_block_size=BLOCK, sparsity_type="lsh", lsh_seed=11))
    generator = torch.Generator().manual_seed(0)
    keys, values = (torch.randn(2, HEADS, 1024, HEAD_DIM, generator=generator, dtype=torch.float64) for _ in range(2))
    mask = padding_mask([1024, 700], 1024)

    cpu_keys, [cpu_values], cpu_mask = sparse_by_lsh(None, keys, [values], mask, config, HEAD_DIM**-0.5)
    cuda_keys, [cuda_values], cuda_mask = sparse_by_lsh(
        None, keys.cuda(), [values.cuda()], mask.cuda(), config, HEAD_DIM**-0.5
    )

    assert torch.equal(cuda_mask.cpu(), cpu_mask)
    torch.testing.assert_close(cuda_keys.cpu(), cpu_keys, atol=1e-10, rtol=0)
    torch.testing.assert_close(cuda_values.cpu(), cpu_values, atol=1e-10, rtol=0)


TINY_BERT = dict(
    hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512, vocab_size=99,
    max_position_embeddings=2048, block_size=BLOCK, sparse_block_size=BLOCK, num_global_tokens=NUM_GLOBAL,
)


def default_attention_output(mask, dtype):
    """The outputs of one call of the default backend, flex_attention and sdpa, over 4,096 tokens."""
    config = lsg_config(block_size=BLOCK, sparse_block_size=0, sparsity_type="none", num_global_tokens=NUM_GLOBAL)
    inputs = [x.detach() for x in random_qkv(1 if mask is None else 2, NUM_GLOBAL + 4096, dtype)]
    with torch.no_grad():
        return [lsg_self_attention(*inputs, mask, config, backend=backend) for backend in (DEFAULT_BACKEND, "flex_attention", "sdpa")]


def test_the_default_runs_flex_attention_on_an_unpadded_bf16_input_of_4096_tokens():
    default, flex, sdpa = default_attention_output(None, torch.bfloat16)

    torch.testing.assert_close(default, flex, atol=0, rtol=0)
    assert not torch.equal(default, sdpa)  # another kernel really ran


@pytest.mark.parametrize("case", ["padded", "float32"])
def test_the_default_runs_sdpa_where_flex_attention_was_not_measured_faster(case):
    length = NUM_GLOBAL + 4096
    mask = padding_mask([length, NUM_GLOBAL + 3000], length).cuda() if case == "padded" else None

    default, _, sdpa = default_attention_output(mask, torch.bfloat16 if case == "padded" else torch.float32)

    torch.testing.assert_close(default, sdpa, atol=0, rtol=0)


@pytest.mark.parametrize("block_size", [64, 128, 170, 256])
def test_sdpa_backend_trains_in_bf16_at_every_block_size(block_size):
    """cuDNN's SDPA kernels failed here at block 128 (385 keys, 'misaligned address'): LSG does not use them."""
    config = lsg_config(block_size=block_size, sparse_block_size=0, sparsity_type="none", num_global_tokens=1)
    generator = torch.Generator().manual_seed(0)
    inputs = [torch.randn(1, 12, 1 + 4096, HEAD_DIM, generator=generator).to("cuda", torch.bfloat16) for _ in range(3)]
    reference_inputs = [x.detach().float().requires_grad_() for x in inputs]

    output, gradients = run("sdpa", inputs, None, config)
    reference, reference_gradients = run("sdpa", reference_inputs, None, config)

    torch.testing.assert_close(output.float(), reference, atol=3e-2, rtol=3e-2)
    for gradient, reference_gradient in zip(gradients, reference_gradients):
        assert torch.isfinite(gradient).all()
        torch.testing.assert_close(gradient.float(), reference_gradient, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("backend", ["sdpa", "flex_attention"])
def test_generation_is_the_same_with_and_without_cache(backend):
    torch.manual_seed(0)
    config = LSGBertConfig(**TINY_BERT, is_decoder=True, sparsity_type="pooling", attn_implementation=backend)
    model = LSGBertLMHeadModel(config).cuda().eval()
    input_ids = torch.randint(3, 99, (1, 700), device="cuda")
    settings = dict(max_new_tokens=40, min_new_tokens=40, do_sample=False)

    with_cache = model.generate(input_ids=input_ids, use_cache=True, **settings)
    without_cache = model.generate(input_ids=input_ids, use_cache=False, **settings)

    assert torch.equal(with_cache, without_cache)


def test_generation_is_the_same_on_both_backends():
    torch.manual_seed(0)
    model = LSGBertLMHeadModel(LSGBertConfig(**TINY_BERT, is_decoder=True, sparsity_type="pooling")).cuda().eval()
    input_ids = torch.randint(3, 99, (1, 700), device="cuda")
    settings = dict(max_new_tokens=40, min_new_tokens=40, do_sample=False, use_cache=False)

    model.set_attn_implementation("sdpa")
    sdpa = model.generate(input_ids=input_ids, **settings)
    model.set_attn_implementation("flex_attention")

    assert torch.equal(model.generate(input_ids=input_ids, **settings), sdpa)
