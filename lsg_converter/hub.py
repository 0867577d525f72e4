"""Publishing converted models: the model card, and a push of the whole folder in one commit."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import transformers
from huggingface_hub import CommitOperationAdd, HfApi, ModelCard, ModelCardData
from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging

from .architectures import find_architecture
from .errors import HubError, one_line

logger = logging.get_logger(__name__)

CITATION = """@inproceedings{condevaux2023lsg,
  title     = {{LSG} Attention: Extrapolation of pretrained Transformers to long sequences},
  author    = {Condevaux, Charles and Harispe, S{\\'e}bastien},
  booktitle = {Advances in Knowledge Discovery and Data Mining (PAKDD 2023)},
  year      = {2023},
  publisher = {Springer},
  eprint    = {2210.15497},
  archivePrefix = {arXiv}
}"""
CARD_SETTINGS = (
    "block_size",
    "sparse_block_size",
    "sparsity_factor",
    "sparsity_type",
    "num_global_tokens",
    "pool_with_global",
    "mask_first_token",
    "adaptive",
    "pass_global_tokens_to_decoder",
)
HUB_ERRORS = (HfHubHTTPError, OfflineModeIsEnabled, ConnectionError, TimeoutError)


def source_license(source: str, token: str | bool | None = None) -> str | None:
    """The license in the source's model card (local README.md or the Hub's), None when unknown."""
    readme = Path(source) / "README.md"
    try:
        card = ModelCard.load(readme if readme.is_file() else source, token=token, ignore_metadata_errors=True)
    except (*HUB_ERRORS, OSError, ValueError):
        return None
    return card.data.license


def model_card(
    model: PreTrainedModel,
    repo_id: str | None = None,
    command: str | None = None,
    license: str | None = None,
) -> ModelCard:
    """The README.md of a converted model: base model, length, LSG settings, how it was made, usage, citation."""
    from . import __version__

    config = model.config
    source = config._name_or_path or "unknown"
    head = config.architectures[0] if config.architectures else type(model).__name__
    auto_class = next(auto for auto, path in config.lsg_auto_map().items() if path.endswith(f".{head}"))
    max_length = _max_length(model)
    name = repo_id or f"{Path(source).name}-lsg-{max_length}"
    is_local = Path(source).exists()
    data = ModelCardData(
        base_model=None if is_local else source,
        license=license,
        library_name="transformers",
        tags=["lsg", "long-context", config.model_type],
    )
    settings = "\n".join(
        f"| `{key}` | `{getattr(config, key)!r}` |" for key in CARD_SETTINGS if hasattr(config, key)
    )
    how = command or f"LSGConverter(max_sequence_length={max_length}).convert_from_pretrained({source!r})"
    content = f"""---
{data.to_yaml()}
---

# {name}

[{source}]({source if is_local else f"https://huggingface.co/{source}"}) converted to **LSG attention** (Local + Sparse + Global) with
[lsg_converter](https://pypi.org/project/lsg-converter/): it reads up to **{max_length:,} tokens**
at O(n) cost, with the source's pretrained weights and no retraining (fine-tuning on long inputs is
still recommended). Head: `{head}`, model type `{config.model_type}`.

## LSG settings

| setting | value |
|---|---|
{settings}

## How it was converted

```bash
{how}
```

lsg_converter {__version__}, transformers {transformers.__version__}. The modeling code travels with the
weights (`trust_remote_code=True`); `lsg_converter` need not be installed to use the model.

## Usage

```python
from transformers import {auto_class}, AutoTokenizer

model = {auto_class}.from_pretrained("{name}", trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained("{name}")
inputs = tokenizer(long_text, return_tensors="pt", truncation=True, max_length={max_length})
outputs = model(**inputs)
```

## Citation

```bibtex
{CITATION}
```
"""
    return ModelCard(content)


def push_converted(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    repo_id: str,
    *,
    private: bool = False,
    token: str | bool | None = None,
    commit_message: str | None = None,
    card: ModelCard | None = None,
    folder: str | os.PathLike | None = None,
) -> str:
    """Push weights, config, remote code, tokenizer and model card to `repo_id` in one commit.

    Args:
        folder: an already saved copy of the model (from `save_converted`) to upload as it is;
            without it the model is saved to a temporary folder first.
        card: the README.md; default: `model_card(model, repo_id)` with the source's license.
    Returns:
        The URL of the commit.
    Raises:
        HubError: the Hub is unreachable or refuses the token or the repository.
    """
    from .converter import save_converted

    with tempfile.TemporaryDirectory(prefix="lsg-push-") as staging:
        if folder is None:
            folder = save_converted(model, tokenizer, Path(staging) / "model")
        folder = Path(folder)
        if not (folder / "README.md").is_file():
            card = card or model_card(model, repo_id, license=source_license(model.config._name_or_path, token))
            card.save(folder / "README.md")
        operations = [
            CommitOperationAdd(path_in_repo=path.relative_to(folder).as_posix(), path_or_fileobj=str(path))
            for path in sorted(folder.rglob("*"))
            if path.is_file()
        ]
        api = HfApi(token=token)
        try:
            api.create_repo(repo_id, private=private, exist_ok=True)
            commit = api.create_commit(
                repo_id,
                operations,
                commit_message=commit_message or f"Upload {type(model).__name__} converted with lsg_converter",
            )
        except HUB_ERRORS as error:
            raise HubError(
                f"Could not push to {repo_id!r} ({type(error).__name__}: {one_line(error, 200)}): "
                "check the network, the repository name and --token."
            ) from error
    logger.info(f"Pushed {len(operations)} files to {repo_id}.")
    return commit.commit_url


def _max_length(model: PreTrainedModel) -> int:
    """Tokens the model reads: rows of its position table after the offset rows."""
    arch = find_architecture(model.config.model_type)
    return arch.position_rows(model.base_model).shape[0]

