"""LSG on the encoders with rotary positions (NomicBERT; the families of `ROTARY`): their attention rotates
the queries and keys before transformers' attention interface, so LSG attention receives them rotated and
its local keys see their true distances; the global tokens sit at position 0 of the rotary module.

The oracles are the source models themselves: run with a block-local mask, they are an LSG model without
global tokens or sparse keys; run on the global tokens' rows put in front of the tokens at position 0, they
are an LSG model whose blocks cover the whole input.
"""

import pytest
import torch
import transformers

from packaging.version import Version

from helpers import TINY_CONFIGS, TINY_LENGTH, block_local_mask, outputs_per_backend, padded_batch, save_tiny_source
from lsg_converter import ARCHITECTURES, InvalidSettingsError, LSGConverter, UnsupportedModelError
from lsg_converter.architectures import NEWER_MODEL_TYPES, find_architecture

BACKENDS = ["eager", "sdpa", "flex_attention"]
ROTARY = [arch for arch, spec in ARCHITECTURES.items() if spec.layout.rotary_embeddings]
BLOCK = 16


def additive(allowed: torch.Tensor) -> torch.Tensor:
    return torch.where(allowed, 0.0, torch.finfo(torch.float32).min)


def source_mask(source, full: torch.Tensor, positions: torch.Tensor, attention_mask: torch.Tensor):
    """The 4D additive mask the source runs with: `full` (B, 1, L, L), and for ModernBERT, whose sliding layers
    see the keys within half their window, a mask per kind of layer, the window read on `positions` (L,)."""
    if source.config.model_type != "modernbert":
        return full
    window = (positions[:, None] - positions[None, :]).abs() <= source.config.sliding_window
    sliding = additive(window[None, None] & attention_mask.bool()[:, None, None, :])
    return {"full_attention": full, "sliding_attention": sliding}


def source_and_converted(arch, folder, **settings):
    """The tiny random bare model of `arch` (eager: it takes an additive 4D mask) and its LSG conversion."""
    source_dir = save_tiny_source(folder / "source", arch, ARCHITECTURES[arch].base_head)
    source = transformers.AutoModel.from_pretrained(source_dir, attn_implementation="eager").eval()
    model, _ = LSGConverter(max_sequence_length=TINY_LENGTH).convert_from_pretrained(str(source_dir), **settings)
    return source, model.eval()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ROTARY)
def test_without_global_tokens_or_sparse_keys_lsg_equals_the_source_under_a_block_local_mask(arch, backend, tmp_path):
    source, model = source_and_converted(arch, tmp_path, num_global_tokens=0, block_size=BLOCK, sparsity_type="none")
    model.set_attn_implementation(backend)
    input_ids, attention_mask = padded_batch([TINY_LENGTH, 70], TINY_LENGTH, arch)

    with torch.no_grad():
        output = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        positions = torch.arange(TINY_LENGTH)
        oracle_mask = source_mask(source, block_local_mask(attention_mask, BLOCK), positions, attention_mask)
        oracle = source(input_ids=input_ids, attention_mask=oracle_mask).last_hidden_state
        dense = source(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    real = attention_mask.bool()[..., None]
    torch.testing.assert_close(output * real, oracle * real, atol=1e-5, rtol=0)
    # the oracle differs from dense attention far more than from LSG: the check bites
    assert ((output - dense) * real).abs().max() > 10 * ((output - oracle) * real).abs().max().clamp(min=1e-7)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ROTARY)
def test_the_global_tokens_are_read_at_position_0_of_the_rotary_positions(arch, backend, tmp_path):
    num_global = 2
    source, model = source_and_converted(
        arch, tmp_path, num_global_tokens=num_global, block_size=TINY_LENGTH, pool_with_global=False
    )
    model.set_attn_implementation(backend)
    global_rows = model.lsg_global_embeddings.weight[:num_global]
    with torch.no_grad():
        global_rows.normal_(generator=torch.Generator().manual_seed(0))
    input_ids, attention_mask = padded_batch([TINY_LENGTH - 8, 70], TINY_LENGTH - 8, arch)
    batch = input_ids.shape[0]
    # the source adds its type-0 row to every row it embeds: the global rows in front, less that row, are them
    type_table = ARCHITECTURES[arch].layout.token_type_table
    type_row = 0 if type_table is None else source.get_submodule(type_table).weight[0]
    embeds = torch.cat([(global_rows - type_row).expand(batch, -1, -1), source.get_input_embeddings()(input_ids)], dim=1)
    positions = torch.cat([torch.zeros(num_global, dtype=torch.long), torch.arange(input_ids.shape[1])])
    mask = torch.cat([attention_mask.new_ones(batch, num_global), attention_mask], dim=1)
    mask = source_mask(source, additive(mask.bool()[:, None, None, :].expand(-1, -1, len(positions), -1)), positions, mask)

    with torch.no_grad():
        output = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        oracle = source(inputs_embeds=embeds, attention_mask=mask, position_ids=positions[None]).last_hidden_state[:, num_global:]
        shifted = source(inputs_embeds=embeds, attention_mask=mask).last_hidden_state[:, num_global:]

    real = attention_mask.bool()[..., None]
    torch.testing.assert_close(output * real, oracle * real, atol=1e-5, rtol=0)
    # the global tokens at positions 0 and 1 (the tokens shifted after them) give other outputs: the check bites
    assert ((output - shifted) * real).abs().max() > 10 * ((output - oracle) * real).abs().max().clamp(min=1e-7)


# rope types whose frequencies depend on the source's length (yarn, dynamic, longrope) or on a factor (linear);
# longrope's factors are one per frequency: the test spreads each over the head's (head_dim / 2)
ROPE_PARAMETERS = [
    {"rope_type": "default"},
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "dynamic", "factor": 2.0},
    {"rope_type": "yarn", "factor": 2.0},
    {"rope_type": "longrope", "short_factor": 1.0, "long_factor": 4.0, "original_max_position_embeddings": TINY_LENGTH},
]


@pytest.mark.parametrize("rope", ROPE_PARAMETERS, ids=lambda rope: rope["rope_type"])
@pytest.mark.parametrize("arch", ROTARY)
def test_the_rotary_positions_are_the_sources_at_the_longer_length(arch, rope, tmp_path):
    source_dir = tmp_path / "source"
    config = TINY_CONFIGS[arch]()
    rope = {"rope_theta": 10000.0, **rope}
    if rope["rope_type"] == "longrope":  # longrope switches to its long factors past original_max_position_embeddings
        frequencies = (getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads) // 2
        rope.update({name: [rope[name]] * frequencies for name in ("short_factor", "long_factor")})
    if getattr(config, "layer_types", None):  # ModernBERT: parameters per kind of layer
        rope = {layer_type: rope for layer_type in set(config.layer_types)}
    source = transformers.AutoModel.from_config(type(config)(**{**config.to_dict(), "rope_parameters": rope}))
    source.save_pretrained(source_dir)
    model, _ = LSGConverter(max_sequence_length=8 * TINY_LENGTH).convert_from_pretrained(str(source_dir))
    states = torch.zeros(1, 3, source.config.hidden_size)
    positions = torch.tensor([[0, TINY_LENGTH - 1, TINY_LENGTH - 1]])  # within the source's length

    longest = torch.arange(8 * TINY_LENGTH)[None]  # the converted length: a dynamic rope must not rescale there
    for layer_type in sorted(set(getattr(source.config, "layer_types", None) or [None])):
        extra = () if layer_type is None else (layer_type,)  # ModernBERT: a table per kind of layer
        # at the converted length, the source's positions rotate as in the source (nor does longrope switch factors)
        rotations = [
            model.rotary_emb(torch.zeros(1, longest.shape[1], source.config.hidden_size), longest, *extra),
            source.rotary_emb(torch.zeros(1, TINY_LENGTH, source.config.hidden_size), longest[:, :TINY_LENGTH], *extra),
        ]
        for converted, original in zip(*rotations):
            torch.testing.assert_close(converted[:, :TINY_LENGTH], original, atol=0, rtol=0)
        rotations = [module(states, positions, *extra) for module in (source.rotary_emb, model.rotary_emb)]
        for converted, original in zip(rotations[1], rotations[0]):
            torch.testing.assert_close(converted, original, atol=0, rtol=0)
    buffers = [dict(module.named_buffers()) for module in (source.rotary_emb, model.rotary_emb)]
    assert buffers[0].keys() == buffers[1].keys()
    for name, buffer in buffers[0].items():
        torch.testing.assert_close(buffers[1][name], buffer, atol=0, rtol=0)
    # the scalings the source's forward reads (transformers' dynamic update of a module with a table per kind of
    # layer also sets an unprefixed one, which its forward does not read)
    source_scaling = {name: value for name, value in vars(source.rotary_emb).items() if "attention_scaling" in name}
    assert {name: getattr(model.rotary_emb, name) for name in source_scaling} == source_scaling


@pytest.mark.compat
def test_a_family_the_installed_transformers_lacks_is_refused_naming_the_release_it_needs():
    for model_type, release in NEWER_MODEL_TYPES.items():
        if Version(transformers.__version__) >= Version(release):
            assert model_type in ARCHITECTURES
        else:
            with pytest.raises(UnsupportedModelError, match=f"needs transformers {release} or newer"):
                find_architecture(model_type)


@pytest.mark.parametrize("arch", ROTARY)
def test_settings_that_reach_beyond_the_trained_length_are_refused_naming_the_block_size_that_fits(arch, tmp_path):
    source_dir = save_tiny_source(tmp_path / "source", arch, ARCHITECTURES[arch].base_head)
    converter = LSGConverter(max_sequence_length=8 * TINY_LENGTH)

    with pytest.raises(InvalidSettingsError, match=f"farther than the {TINY_LENGTH - 1} the source was trained on .* block_size of at most 32"):
        converter.convert_from_pretrained(str(source_dir), block_size=48, sparse_block_size=16, sparsity_factor=4, sparsity_type="pooling")
    converter.convert_from_pretrained(str(source_dir), block_size=32, sparse_block_size=16, sparsity_factor=4, sparsity_type="pooling")


@pytest.mark.parametrize("sparsity_type", ["norm", "pooling", "stride", "block_stride", "bos_pooling", "lsh"])
@pytest.mark.parametrize("arch", ROTARY)
def test_every_sparsity_type_gives_the_same_outputs_on_every_backend(arch, sparsity_type, tmp_path):
    _, model = source_and_converted(
        arch, tmp_path, block_size=16, sparse_block_size=8, sparsity_factor=2, sparsity_type=sparsity_type, num_global_tokens=2
    )
    input_ids, attention_mask = padded_batch([TINY_LENGTH, 70], TINY_LENGTH, arch)

    outputs = outputs_per_backend(model, BACKENDS, input_ids=input_ids, attention_mask=attention_mask)
    real = attention_mask.bool()
    assert torch.isfinite(outputs["sdpa"][real]).all()
    for backend in ("eager", "flex_attention"):
        torch.testing.assert_close(outputs[backend][real], outputs["sdpa"][real], atol=1e-5, rtol=0)
