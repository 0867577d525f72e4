"""Helpers shared by the test modules: tiny source models of every architecture, inputs, processes."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from types import SimpleNamespace

import torch
import transformers
from safetensors.torch import load_file
from torch.utils._python_dispatch import TorchDispatchMode

from lsg_converter.models.lsg_attention import lsg_attention
from lsg_converter.models.lsg_defaults import LSG_DEFAULTS

REPO_ROOT = Path(__file__).resolve().parents[1]
# Checkpoints the 2023 reference converted, with its outputs (see fixtures/README.md); part of the repository.
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "reference-lsg-0.1.9"
REFERENCE_CASES = ("bart-norm", "bert-norm", "bert-pooling", "distilbert-none", "roberta-pooling")
VOCAB = 99
TINY_LENGTH = 128  # tokens the tiny sources read (RoBERTa's table has 2 more rows)
PAD_ID = {
    "bert": 0, "distilbert": 0, "roberta": 1, "bart": 1, "albert": 0, "electra": 0, "camembert": 1, "xlm-roberta": 1,
    "mbart": 1, "pegasus": 0, "mpnet": 1, "deberta-v2": 0, "t5": 0, "mt5": 0, "umt5": 0, "nomic_bert": 0, "gte": 1, "eurobert": 1,
    "modernbert": 0, "jina_embeddings_v3": 1,
}
EOS_ID = 2
SHARED = dict(vocab_size=VOCAB)
T5_SHAPE = dict(
    d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4, feed_forward_proj="gated-gelu", decoder_start_token_id=0,
    eos_token_id=EOS_ID, max_position_embeddings=TINY_LENGTH, **SHARED,
)
TINY_CONFIGS = {
    "bert": lambda: transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=TINY_LENGTH, **SHARED,
    ),
    "roberta": lambda: transformers.RobertaConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=TINY_LENGTH + 2, **SHARED,
    ),
    "distilbert": lambda: transformers.DistilBertConfig(
        dim=32, n_layers=2, n_heads=4, hidden_dim=37, max_position_embeddings=TINY_LENGTH, **SHARED
    ),
    # ALBERT and ELECTRA factorise their embeddings: global tokens live in the narrower embedding space
    "albert": lambda: transformers.AlbertConfig(
        embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=TINY_LENGTH, **SHARED,
    ),
    "electra": lambda: transformers.ElectraConfig(
        embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=TINY_LENGTH, **SHARED,
    ),
    "camembert": lambda: transformers.CamembertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=TINY_LENGTH + 2, **SHARED,
    ),
    "xlm-roberta": lambda: transformers.XLMRobertaConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=TINY_LENGTH + 2, **SHARED,
    ),
    "bart": lambda: transformers.BartConfig(
        d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=TINY_LENGTH, **SHARED,
    ),
    "mbart": lambda: transformers.MBartConfig(
        d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=TINY_LENGTH, scale_embedding=True, **SHARED,
    ),
    "mpnet": lambda: transformers.MPNetConfig(  # relative position bias: 32 buckets up to distance 128
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=TINY_LENGTH + 2, **SHARED,
    ),
    # DeBERTa-v3's attention: c2p and p2c from shared, normalised relative embeddings in 32 log buckets
    # (exact below 16, up to 128); no absolute positions, no token types
    "deberta-v2": lambda: transformers.DebertaV2Config(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=TINY_LENGTH, relative_attention=True, position_buckets=32, pos_att_type=["p2c", "c2p"],
        position_biased_input=False, norm_rel_ebd="layer_norm", share_att_key=True, type_vocab_size=0, **SHARED,
    ),
    # NomicBERT: rotary positions (no table), SwiGLU, BERT's post-norm layers
    "nomic_bert": lambda: transformers.NomicBertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=TINY_LENGTH, **SHARED,
    ),
    # GTE: NomicBERT's shape with GELU and a token type table of one row (gte-*-en-v1.5)
    "gte": lambda: transformers.GteConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=TINY_LENGTH, **SHARED,
    ),
    # EuroBERT: Llama-shaped, 2 key/value heads for 4 query heads, no token types
    "eurobert": lambda: transformers.EuroBertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=37,
        max_position_embeddings=TINY_LENGTH, pad_token_id=1, bos_token_id=0, eos_token_id=EOS_ID, mask_token_id=4, **SHARED,
    ),
    # ModernBERT: every third layer full attention, the others a window of 16 (8 each side), RoPE per layer type
    "modernbert": lambda: transformers.ModernBertConfig(
        hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37, local_attention=16,
        global_attn_every_n_layers=3, max_position_embeddings=TINY_LENGTH, pad_token_id=0, bos_token_id=EOS_ID + 1,
        cls_token_id=EOS_ID + 1, sep_token_id=EOS_ID, eos_token_id=EOS_ID, **SHARED,
    ),
    # jina-embeddings-v3: an XLM-RoBERTa body with rotary positions (no table)
    "jina_embeddings_v3": lambda: transformers.JinaEmbeddingsV3Config(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=TINY_LENGTH, type_vocab_size=2, **SHARED,
    ),
    "pegasus": lambda: transformers.PegasusConfig(  # pad 0, eos 1 as in google/pegasus-*
        d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=TINY_LENGTH, scale_embedding=True, **SHARED,
    ),
    # T5: a relative bias only (32 buckets up to distance 128), unscaled scores, gated-GELU as in T5 v1.1 and
    # Flan-T5; a T5 config names no length (the layout's 512): this one says it reads TINY_LENGTH
    "t5": lambda: transformers.T5Config(**T5_SHAPE),
    "mt5": lambda: transformers.MT5Config(**T5_SHAPE),
    "umt5": lambda: transformers.UMT5Config(**T5_SHAPE),  # a bias table in every layer
}


# The files a saved model carries as remote code ("{stem}": its model_type with "_" for "-", as "lsg_bert"):
# the architecture's pair and every file of lsg_converter/models/ they import.
REMOTE_CODE_FILES = (
    "configuration_{stem}.py",
    "modeling_{stem}.py",
    "lsg_model.py",
    "lsg_attention_layers.py",
    "lsg_global_tokens.py",
    "lsg_layout.py",
    "lsg_recorder.py",
    "lsg_attention.py",
    "lsg_pattern.py",
    "lsg_settings.py",
    "lsg_defaults.py",
    "lsg_sparse.py",
    "lsg_rotary.py",
    "lsg_sdpa.py",
    "lsg_eager.py",
    "lsg_flex.py",
    "lsg_transformers.py",
)
# The files of lsg_converter/models/ beyond `REMOTE_CODE_FILES` that an architecture's pair imports, by
# model_type (T5's bias; mT5 adopts T5's attention).
BORROWED_FILES = {
    "lsg-t5": ("lsg_t5_bias.py",),
    "lsg-mt5": ("configuration_lsg_t5.py", "modeling_lsg_t5.py", "lsg_t5_bias.py"),
    "lsg-umt5": ("configuration_lsg_t5.py", "lsg_t5_bias.py"),
}


def remote_code_files(config: type[transformers.PretrainedConfig] | transformers.PretrainedConfig) -> tuple[str, ...]:
    """The files `save_pretrained` writes beside the weights of a model of the LSG config (or config class)
    `config`: `REMOTE_CODE_FILES` and its family's `BORROWED_FILES`."""
    stem = config.lsg_file_stem()
    return tuple(name.format(stem=stem) for name in REMOTE_CODE_FILES) + BORROWED_FILES.get(config.model_type, ())


def lsg_config(**overrides) -> SimpleNamespace:
    """The LSG keys alone (the reference defaults with `overrides`), as the attention core reads them."""
    return SimpleNamespace(**{**LSG_DEFAULTS, **overrides})


def lsg_self_attention(*args, **kwargs) -> torch.Tensor:
    """The output of `lsg_attention` (same arguments): (B, H, q, D)."""
    return lsg_attention(*args, **kwargs)[0]


def saved_bytes(attention, qkv: list[torch.Tensor]) -> int:
    """Bytes one call holds until its backward: its inputs, its output and what autograd saved, each storage once."""
    storages = {x.untyped_storage().data_ptr(): x.untyped_storage().nbytes() for x in qkv}

    def pack(tensor):
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        output = attention(*qkv)
    storages[output.untyped_storage().data_ptr()] = output.untyped_storage().nbytes()
    return sum(storages.values())


def padding_mask(lengths, total) -> torch.Tensor:
    """(B, total) bool: row i is True on its first lengths[i] positions."""
    return torch.arange(total)[None, :] < torch.tensor(lengths)[:, None]


def is_causal_head(head: str) -> bool:
    return head.endswith(("LMHeadModel", "ForCausalLM"))


def save_tiny_source(folder: Path, arch: str, head: str, seed: int = 0) -> Path:
    """A tiny random `head` of `arch` saved with save_pretrained (no tokenizer)."""
    config = TINY_CONFIGS[arch]()
    config.is_decoder = is_causal_head(head)
    # question answering needs 2 labels (start, end); 3 elsewhere, as BART reads a 2-label config as 3
    config.num_labels = 2 if head.endswith("QuestionAnswering") else 3
    torch.manual_seed(seed)
    getattr(transformers, head)(config).save_pretrained(folder)
    return folder


def save_tiny_sentence_transformer(folder: Path, transformer_folder: Path) -> Path:
    """A tiny sentence-transformers model saved by sentence-transformers into `folder`: Transformer (the
    model in `transformer_folder`, hidden size 32) -> CLS Pooling -> Dense 32 -> 16 -> Normalize,
    max_seq_length 100."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer

    torch.manual_seed(0)
    modules = [Transformer(str(transformer_folder), max_seq_length=100), Pooling(32, "cls"), Dense(32, 16), Normalize()]
    SentenceTransformer(modules=modules).save(str(folder))
    return folder


def block_local_mask(attention_mask: torch.Tensor, block: int) -> torch.Tensor:
    """(B, 1, L, L) additive mask: query q sees key k iff |q // b - k // b| <= 1 and k is not padding: with
    it the source model is the oracle of an LSG model without global tokens or sparse keys."""
    position = torch.arange(attention_mask.shape[1])
    local = (position[:, None] // block - position[None, :] // block).abs() <= 1
    allowed = local[None, None] & attention_mask.bool()[:, None, None, :]
    return torch.where(allowed, 0.0, torch.finfo(torch.float32).min)


def save_tiny_mean_embedder(folder: Path, tokenizer_path: Path, max_seq_length: int) -> Path:
    """A tiny sentence-transformers model saved into `folder` / "source": a random 2-layer BERT of 128 positions
    (weights drawn wide enough that texts get different embeddings) with the tokenizer of `tokenizer_path` ->
    mean Pooling -> Normalize, reading `max_seq_length` tokens."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_path)
    config = transformers.BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37, max_position_embeddings=128, initializer_range=0.2,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(folder / "bert")
    tokenizer.save_pretrained(folder / "bert")
    modules = [Transformer(str(folder / "bert"), max_seq_length=max_seq_length), Pooling(32, "mean"), Normalize()]
    SentenceTransformer(modules=modules).save(str(folder / "source"))
    return folder / "source"


def outputs_per_backend(model, backends, **inputs) -> dict:
    """{backend: the last hidden states of `model` on `inputs`, without gradients, run with that backend}."""
    outputs = {}
    for backend in backends:
        model.set_attn_implementation(backend)
        with torch.no_grad():
            outputs[backend] = model(**inputs).last_hidden_state
    return outputs


def padded_batch(lengths, total, arch="bert", seed=0):
    """(input_ids, attention_mask): random tokens (no pad/eos ids), each row ending in eos, right padding."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, VOCAB, (len(lengths), total), generator=generator)
    attention_mask = (torch.arange(total)[None, :] < torch.tensor(lengths)[:, None]).long()
    input_ids[torch.arange(len(lengths)), torch.tensor(lengths) - 1] = EOS_ID
    return input_ids.masked_fill(attention_mask == 0, PAD_ID[arch]), attention_mask


def run_without_lsg_converter(script: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run python code in a fresh process in which `import lsg_converter` fails."""
    preamble = "import sys\nsys.modules['lsg_converter'] = None\n"
    environment = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-c", preamble + textwrap.dedent(script)],
        cwd=cwd,
        env=environment,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )


class OpRecorder(TorchDispatchMode):
    """Records every torch operation that runs under it (forward and backward): its name and the shapes
    of the tensors it produced (none for views, which produce no new memory)."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, list[torch.Size]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        outputs = [] if func.is_view else result if isinstance(result, (tuple, list)) else [result]
        self.ops.append((func.overloadpacket.__name__, [t.shape for t in outputs if isinstance(t, torch.Tensor)]))
        return result

    @property
    def largest(self) -> int:
        """Element count of the largest tensor any operation produced."""
        return max((shape.numel() for _, shapes in self.ops for shape in shapes), default=0)

    def count(self, name: str) -> int:
        """How many times the aten operation `name` (e.g. "_softmax") ran."""
        return sum(op == name for op, _ in self.ops)

    def outputs_of_at_least(self, elements: int) -> list[str]:
        """Names of the operations that produced a tensor of at least `elements` elements."""
        return [name for name, shapes in self.ops if any(shape.numel() >= elements for shape in shapes)]

    def largest_rows_made_by(self, name: str, row_size: int) -> int:
        """Element count of the largest tensor of rows of `row_size` (its last size) that the aten operation
        `name` produced (0 where it made none): e.g. keys gathered by "index", rows of the head size."""
        return max((shape.numel() for op, shapes in self.ops if op == name for shape in shapes if shape[-1] == row_size), default=0)


# aten operations that read a value of a tensor on the host (on a GPU, waiting for the device): item, bool
# and int of a tensor run `_local_scalar_dense`; nonzero and equal return what they read
HOST_SYNC_OPS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::equal")


def host_syncs(call) -> list[str]:
    """The host synchronisations `call()` makes, by name: the `HOST_SYNC_OPS` torch's profiler records, and
    each `Tensor.tolist` call, which on the CPU reads the memory without an operation (Python's profile hook
    sees it). Neither changes what runs: compiled kernels (flex_attention) run as they are."""
    listed = []

    def observe(frame, event, function):
        if event == "c_call" and getattr(function, "__name__", "") == "tolist":
            listed.append("tolist")

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        sys.setprofile(observe)
        try:
            call()
        finally:
            sys.setprofile(None)
    return sorted(listed + [event.name for event in profiler.events() if event.name in HOST_SYNC_OPS])


def reference_cases() -> list[str]:
    """Names of the checkpoints the 2023 reference converted, under FIXTURES: all of REFERENCE_CASES,
    or the test collection fails (a missing fixture must not shrink the suite silently)."""
    found = sorted(case.name for case in FIXTURES.glob("*") if (case / "case.json").is_file())
    assert found == sorted(REFERENCE_CASES), f"{FIXTURES} holds {found}, expected {sorted(REFERENCE_CASES)}"
    return found


def assert_reproduces_reference(model, case: str) -> None:
    """`model`'s outputs on the fixture's inputs equal the reference's within 1e-4 (real tokens)."""
    reference = load_file(FIXTURES / case / "reference_io.safetensors")
    inputs = {name: reference[name] for name in ("input_ids", "attention_mask", "decoder_input_ids") if name in reference}
    real = reference["attention_mask"].bool()
    with torch.no_grad():
        output = model(**inputs)
    if "encoder_last_hidden_state" in reference:  # seq2seq: the encoder output keeps its global tokens
        num_global = output.encoder_last_hidden_state.shape[1] - real.shape[1]
        encoder_real = torch.nn.functional.pad(real, (num_global, 0), value=True)
        assert (output.logits - reference["logits"]).abs().max() <= 1e-4
        difference = output.encoder_last_hidden_state - reference["encoder_last_hidden_state"]
        assert difference[encoder_real].abs().max() <= 1e-4
    else:
        with torch.no_grad():
            sequence_output = model.base_model(**inputs).last_hidden_state
        assert (output.logits - reference["logits"])[real].abs().max() <= 1e-4
        assert (sequence_output - reference["sequence_output"])[real].abs().max() <= 1e-4


class RecordingHub:
    """A stand-in for the Hub on 127.0.0.1, for HF_ENDPOINT: records each request as (method, path,
    Authorization header); answers the paths of `answers` with their JSON, any other with 404
    RepoNotFound, as the Hub does for a model it does not have."""

    def __init__(self, answers: dict[str, object] | None = None) -> None:
        self.requests: list[tuple[str, str, str | None]] = []
        requests, bodies = self.requests, {path: json.dumps(body).encode() for path, body in (answers or {}).items()}

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                requests.append((self.command, self.path, self.headers.get("Authorization")))
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = bodies.get(self.path.partition("?")[0])
                self.send_response(404 if body is None else 200)
                if body is None:
                    self.send_header("X-Error-Code", "RepoNotFound")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            do_HEAD = do_POST = do_PUT = do_GET

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "RecordingHub":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.server.shutdown()
        self.server.server_close()


def closed_port_endpoint() -> str:
    """An HF_ENDPOINT on 127.0.0.1 where nothing listens (a port taken, then closed): connections are refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def hub_environment(endpoint: str, hf_home: Path, token: str | None = None) -> dict[str, str]:
    """The environment of a fresh process whose Hub is `endpoint`: no HF_* variable of ours (HF_HUB_OFFLINE
    included), HF_HOME `hf_home` (created empty), HF_TOKEN `token` when given, this checkout first on
    PYTHONPATH."""
    hf_home.mkdir()
    environment = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "HUGGING_FACE"))}
    environment.pop("TRANSFORMERS_OFFLINE", None)
    python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    environment.update(HF_ENDPOINT=endpoint, HF_HOME=str(hf_home), PYTHONPATH=python_path)
    if token is not None:
        environment["HF_TOKEN"] = token
    return environment


def run_process(command: list[str], cwd: Path, environment: dict[str, str]) -> subprocess.CompletedProcess:
    """Run `command` with stdin closed and its output captured as text."""
    return subprocess.run(
        command, cwd=cwd, env=environment, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300
    )


def cli_command(*args) -> list[str]:
    """`lsg-convert *args` run by this Python, importing lsg_converter from PYTHONPATH."""
    return [sys.executable, "-m", "lsg_converter_cli", *map(str, args)]


def timed_cli_command(*args) -> list[str]:
    """`lsg-convert *args` through the CLI's main() in a fresh Python, which then prints "MAIN_SECONDS s"
    on stdout: the seconds main() ran, the interpreter's start and the imports left out (see main_seconds)."""
    script = f"""
        import sys, time
        from lsg_converter_cli import main
        start = time.monotonic()
        code = main({list(map(str, args))!r})
        print("MAIN_SECONDS", time.monotonic() - start)
        sys.exit(code)
        """
    return python_command(script)


def main_seconds(result: subprocess.CompletedProcess) -> float:
    """The seconds a `timed_cli_command` spent in main()."""
    return float(result.stdout.split("MAIN_SECONDS")[1].split()[0])


def python_command(script: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(script)]


def files_under(folder: Path) -> list[Path]:
    return sorted(path for path in Path(folder).rglob("*") if path.is_file())
