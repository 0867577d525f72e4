"""The global tokens' distances in the encoders with rotary positions, clamped to the trained length
(`lsg_rotary.GlobalDistanceClamp`): a block that ends past the trained length T reads the global keys rotated
on to position end - T, and the global queries read its keys rotated back as far.

The oracle rotates the raw keys straight to the clamped positions with the family's own rotary module and
`apply_rotary_pos_emb`, and attends densely under the LSG mask.
"""

import importlib
from types import SimpleNamespace

import pytest
import torch
import transformers

from helpers import TINY_CONFIGS, TINY_LENGTH, outputs_per_backend, padded_batch, save_tiny_source
from lsg_converter import ARCHITECTURES, LSGConverter
from lsg_converter.models import lsg_attention as lsg_attention_module
from lsg_converter.models.lsg_attention import AttentionPath, lsg_attention
from lsg_converter.models.lsg_defaults import LSG_DEFAULTS
from lsg_converter.models.lsg_rotary import GlobalDistanceClamp
from lsg_converter.models.lsg_settings import LSGSettings

ROTARY = [arch for arch, spec in ARCHITECTURES.items() if spec.layout.rotary_embeddings]
BACKENDS = ["eager", "sdpa", "flex_attention"]
BLOCK, NUM_GLOBAL = 16, 2
LONG = 4 * TINY_LENGTH  # the converted length: blocks past the trained length


class Rotation:
    """The rotary positions of a tiny random source of `arch`: its own module and `apply_rotary_pos_emb`."""

    def __init__(self, arch: str) -> None:
        self.source = transformers.AutoModel.from_config(TINY_CONFIGS[arch]())
        self.apply = importlib.import_module(type(self.source).__module__).apply_rotary_pos_emb
        modernbert = arch == "modernbert"
        self.layer_type = ("full_attention",) if modernbert else ()
        self.frequencies = "full_attention_inv_freq" if modernbert else "inv_freq"
        # the first rotation of a process may round large angles otherwise than the next ones (seen here with torch
        # 2.13 on the CPU: 5e-4 at 500 radians, in one process in four): made once before any that is compared
        self(torch.zeros(1, 1, 1, self.source.config.hidden_size // 4), torch.zeros(1, dtype=torch.long))

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x (B, H, N, D) rotated to `positions` (N,) directly."""
        cos, sin = self.source.rotary_emb(x, positions[None], *self.layer_type)
        return self.apply(x, x, cos, sin)[0]


def oracle(rotation: Rotation, query, key, value, padding_mask, shifts):
    """Dense LSG attention (blocks of BLOCK, NUM_GLOBAL global tokens, no sparse keys) over raw (unrotated)
    `query`, `key`, `value` (B, H, g + t, D): the tokens at their positions, the global tokens at position 0;
    a token query of block j reads the global keys at position shifts[j], a global query reads a token key of
    block j at its position less shifts[j]."""
    num_tokens = key.shape[2] - NUM_GLOBAL
    token_positions = torch.arange(num_tokens)
    block_of = token_positions // BLOCK
    positions = torch.cat([torch.zeros(NUM_GLOBAL, dtype=torch.long), token_positions])
    rotated_queries, rotated_keys = rotation(query, positions), rotation(key, positions)
    scores = rotated_queries @ rotated_keys.transpose(-1, -2)  # (B, H, L, L)
    global_keys = key[:, :, :NUM_GLOBAL]
    for block in range(num_tokens // BLOCK):
        rows = NUM_GLOBAL + block * BLOCK + torch.arange(BLOCK)
        moved = rotation(global_keys, shifts[block].repeat(NUM_GLOBAL))  # (B, H, g, D) at the block's shift
        scores[:, :, rows, :NUM_GLOBAL] = rotated_queries[:, :, rows] @ moved.transpose(-1, -2)
    moved_back = rotation(key[:, :, NUM_GLOBAL:], token_positions - shifts[block_of])
    scores[:, :, :NUM_GLOBAL, NUM_GLOBAL:] = rotated_queries[:, :, :NUM_GLOBAL] @ moved_back.transpose(-1, -2)
    local = (block_of[:, None] - block_of[None, :]).abs() <= 1
    allowed = torch.ones(len(positions), len(positions), dtype=torch.bool)
    allowed[NUM_GLOBAL:, NUM_GLOBAL:] = local
    allowed = allowed & padding_mask[:, None, None, :]
    weights = torch.softmax((scores * query.shape[-1] ** -0.5).masked_fill(~allowed, float("-inf")), dim=-1)
    return weights @ value


@pytest.mark.parametrize("arch", ROTARY)
def test_a_block_past_the_trained_length_reads_the_global_tokens_at_a_distance_within_it(arch):
    rotation = Rotation(arch)
    heads, head_dim = 4, rotation.source.config.hidden_size // 4
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(2, heads, NUM_GLOBAL + LONG, head_dim, generator=generator) for _ in range(3))
    padding_mask = torch.ones(2, NUM_GLOBAL + LONG, dtype=torch.bool)
    padding_mask[1, NUM_GLOBAL + LONG - 40 :] = False
    settings = LSGSettings.of(SimpleNamespace(**{**LSG_DEFAULTS, "block_size": BLOCK, "num_global_tokens": NUM_GLOBAL, "sparsity_type": "none"}))
    clamp = GlobalDistanceClamp(rotation.source, "rotary_emb", rotation.frequencies, TINY_LENGTH)
    shifts = clamp.block_shifts(LONG // BLOCK, BLOCK, torch.device("cpu"))
    positions = torch.cat([torch.zeros(NUM_GLOBAL, dtype=torch.long), torch.arange(LONG)])
    rotated_query, rotated_key = rotation(query, positions), rotation(key, positions)

    expected = oracle(rotation, query, key, value, padding_mask, shifts)
    unclamped = oracle(rotation, query, key, value, padding_mask, torch.zeros_like(shifts))
    real = padding_mask[:, None, :, None]
    for backend in BACKENDS:
        output, _ = lsg_attention(rotated_query, rotated_key, value, padding_mask, settings, backend=backend, global_clamp=clamp)
        torch.testing.assert_close(output * real, expected * real, atol=1e-5, rtol=0)
    # the clamp moves the far blocks' outputs far more than the error: the check bites
    assert ((unclamped - expected) * real).abs().max() > 100 * ((output - expected) * real).abs().max().clamp(min=1e-7)
    assert shifts[: TINY_LENGTH // BLOCK].eq(0).all() and shifts[-1] == LONG - TINY_LENGTH


def clamped_call(arch, backend, requires_grad=False):
    """An LSG call past the trained length (a padded batch) with the clamp of `arch`'s rotary module:
    (output, (query, key, value), padding mask)."""
    rotation = Rotation(arch)
    heads, head_dim = 4, rotation.source.config.hidden_size // 4
    generator = torch.Generator().manual_seed(0)
    tensors = [torch.randn(2, heads, NUM_GLOBAL + LONG, head_dim, generator=generator) for _ in range(3)]
    for x in tensors:
        x.requires_grad_(requires_grad)
    padding_mask = torch.ones(2, NUM_GLOBAL + LONG, dtype=torch.bool)
    padding_mask[1, NUM_GLOBAL + LONG - 40 :] = False
    settings = LSGSettings.of(SimpleNamespace(**{**LSG_DEFAULTS, "block_size": BLOCK, "num_global_tokens": NUM_GLOBAL, "sparsity_type": "none"}))
    clamp = GlobalDistanceClamp(rotation.source, "rotary_emb", rotation.frequencies, TINY_LENGTH)
    output, _ = lsg_attention(*tensors, padding_mask, settings, backend=backend, global_clamp=clamp)
    return output, tensors, padding_mask


@pytest.mark.parametrize("arch", ["modernbert", "eurobert"])
def test_the_clamped_gradients_are_the_same_on_every_backend(arch):
    gradients = {}
    for backend in BACKENDS:
        output, tensors, padding_mask = clamped_call(arch, backend, requires_grad=True)
        weights = torch.randn(output.shape, generator=torch.Generator().manual_seed(1))
        (output * weights * padding_mask[:, None, :, None]).sum().backward()
        gradients[backend] = [x.grad for x in tensors]
    for backend in ("eager", "flex_attention"):
        for gradient, expected in zip(gradients[backend], gradients["sdpa"]):
            torch.testing.assert_close(gradient, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_clamped_calls_on_the_cpu_read_the_local_keys_as_views(training, monkeypatch):
    chosen = []
    choose = lsg_attention_module.choose_path
    monkeypatch.setattr(lsg_attention_module, "choose_path", lambda backend, job: chosen.append(choose(backend, job)) or chosen[-1])
    with torch.set_grad_enabled(training):
        for backend in BACKENDS:
            clamped_call("modernbert", backend, requires_grad=training)
    expected = [AttentionPath.EAGER, AttentionPath.WINDOW_VIEWS, AttentionPath.WINDOW_VIEWS]
    assert [path for path, _ in chosen] == expected


def converted(arch, folder, **settings):
    source_dir = save_tiny_source(folder / "source", arch, ARCHITECTURES[arch].base_head)
    converter = LSGConverter(max_sequence_length=LONG)
    model, _ = converter.convert_from_pretrained(str(source_dir), block_size=BLOCK, num_global_tokens=NUM_GLOBAL, **settings)
    return model.eval()


@pytest.mark.parametrize("arch", ROTARY)
def test_every_backend_gives_the_same_clamped_outputs(arch, tmp_path):
    model = converted(arch, tmp_path)
    input_ids, attention_mask = padded_batch([LONG, LONG - 50], LONG, arch)

    outputs = outputs_per_backend(model, BACKENDS, input_ids=input_ids, attention_mask=attention_mask)
    real = attention_mask.bool()
    for backend in ("eager", "flex_attention"):
        torch.testing.assert_close(outputs[backend][real], outputs["sdpa"][real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ROTARY)
def test_the_clamp_changes_only_inputs_longer_than_the_trained_length_and_turns_off(arch, tmp_path):
    clamped = converted(arch, tmp_path / "on")
    unclamped = converted(arch, tmp_path / "off", clamp_global_distances=False)
    assert clamped.config.clamp_global_distances and not unclamped.config.clamp_global_distances

    def outputs(length):
        input_ids, attention_mask = padded_batch([length], length, arch)
        with torch.no_grad():
            return [model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state for model in (clamped, unclamped)]

    within, beyond = outputs(TINY_LENGTH), outputs(LONG)
    torch.testing.assert_close(within[0], within[1], atol=0, rtol=0)
    # the tiny random models' scores are small, so rotations move their outputs little (9e-6 to 3e-3): the
    # exact figures are the oracle's (test_a_block_past_the_trained_length_...); here, that the clamp acts
    assert (beyond[0] - beyond[1]).abs().max() > 1e-6


def test_modernbert_clamps_its_full_attention_layers_only(tmp_path):
    model = converted("modernbert", tmp_path)
    roles = {layer.attention_type: layer.attn.lsg_role for layer in model.layers}
    assert roles["full_attention"].global_clamp is not None
    assert roles["sliding_attention"].global_clamp is None


@pytest.mark.parametrize("arch", ["eurobert", "modernbert"])
def test_one_exported_program_clamps_past_the_trained_length_and_serves_every_length(arch, tmp_path):
    from torch.export import Dim, export

    model = converted(arch, tmp_path)
    dynamic = {"input_ids": {1: Dim.AUTO}, "attention_mask": {1: Dim.AUTO}}

    def inputs(length):
        input_ids = torch.randint(5, 90, (1, length), generator=torch.Generator().manual_seed(length))
        return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}

    program = export(model, (), inputs(300), dynamic_shapes=dynamic)

    assert [(bounds.lower, bounds.upper) for bounds in program.range_constraints.values()] == [(2, LONG)]
    for length in (2, 40, TINY_LENGTH, 300, LONG):  # within the trained length, then past it
        with torch.no_grad():
            torch.testing.assert_close(program.module()(**inputs(length))[0], model(**inputs(length))[0], atol=1e-5, rtol=0)
