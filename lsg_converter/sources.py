"""Where a source is (a folder on disk or a Hub id), its configuration and its license; and the one
translation of Hub errors.

Every call to the Hub goes through `hub_errors`, which turns what huggingface_hub and its HTTP client
raise into one-line `HubError`s. A source that exists on disk is never looked up on the Hub.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

import huggingface_hub
from huggingface_hub import (
    HfApi,
    ModelCard,
    constants,
    get_hf_file_metadata,
    hf_hub_download,
    hf_hub_url,
    is_offline_mode,
    try_to_load_from_cache,
)
from huggingface_hub.errors import HFValidationError, HfHubHTTPError, OfflineModeIsEnabled, RepositoryNotFoundError
from huggingface_hub.hf_api import ModelInfo
from huggingface_hub.utils import set_client_factory, validate_repo_id
from huggingface_hub.utils._http import default_client_factory
from transformers import AutoConfig
from transformers.utils import CONFIG_NAME
from transformers.utils import logging

from .architectures import ARCHITECTURES, find_architecture
from .errors import CorruptCheckpointError, HubError, SourceNotFoundError, one_line

logger = logging.get_logger(__name__)

# The HTTP client huggingface_hub makes its requests with: httpx2 from its 2.x releases, httpx in 1.x
# (the same API under two names).
httpx = importlib.import_module("httpx2" if int(huggingface_hub.__version__.split(".")[0]) >= 2 else "httpx")

HUB_TIMEOUT_VARIABLE = "LSG_HUB_TIMEOUT"  # seconds a Hub request of lsg-convert may wait for an answer (60)


def limit_hub_waits() -> None:
    """Give every request this process makes to the Hub a deadline: `HUB_TIMEOUT_VARIABLE` seconds (60 by
    default) to connect and between the bytes of an answer; sending an upload keeps no deadline.
    huggingface_hub's own client waits forever on a server that accepts a connection and never answers
    (a push would hang). Process-wide, so `lsg-convert` calls it, not the library's functions."""
    seconds = float(os.environ.get(HUB_TIMEOUT_VARIABLE) or 60)

    def client_with_deadlines() -> httpx.Client:
        client = default_client_factory()  # huggingface_hub's client, its request hooks included
        client.timeout = httpx.Timeout(seconds, write=None)
        return client

    set_client_factory(client_with_deadlines)

# What huggingface_hub raises when the Hub cannot be reached or answers with an error: its own
# HfHubHTTPError and the errors of its HTTP client (both httpx.HTTPError), OfflineModeIsEnabled (a
# ConnectionError), and the standard library's connection errors and timeouts.
HUB_ERRORS = (httpx.HTTPError, ConnectionError, TimeoutError)
# A model's name as a card's title gives it: a Hub name, or a Hub id (owner/name).
MODEL_NAME = re.compile(r"[\w.-]+(/[\w.-]+)?")
# The titles sentence-transformers gives the card of a model it knows no name for: its class's name.
UNNAMED_MODEL_TITLES = ("SentenceTransformer", "CrossEncoder", "SparseEncoder", "MultiVectorEncoder")


@contextmanager
def hub_errors(action: str, advice: str) -> Iterator[None]:
    """Turn a Hub failure inside the block into a one-line HubError (exit code 7).

    Args:
        action: what was tried, completing "Cannot ..." (e.g. "push to 'me/model'").
        advice: what to do, ending the message (e.g. "check the network and token=").
    """
    try:
        yield
    except HUB_ERRORS as error:
        response = getattr(error, "response", None)
        if isinstance(error, OfflineModeIsEnabled):
            reason = "HF_HUB_OFFLINE=1 is set"
        elif response is not None:
            reason = f"the Hub answered HTTP {response.status_code} ({one_line(error, 200)})"
        else:
            reason = f"the Hub at {constants.ENDPOINT} is unreachable ({type(error).__name__}: {one_line(error, 200)})"
        raise HubError(f"Cannot {action}: {reason}; {advice}.") from error


def local_source(source: str | os.PathLike) -> Path | None:
    """The folder or file `source` names on disk, None when nothing is there (then it may be a Hub id)."""
    path = Path(source).expanduser()
    return path if path.exists() else None


def is_hub_id(source: str) -> bool:
    """Whether `source` is spelt like a Hub model id ("name" or "owner/name"), not like a path."""
    if source.startswith((".", "/", "~")) or os.sep in source.replace("/", ""):
        return False
    try:
        validate_repo_id(source)
    except HFValidationError:
        return False
    return True


def source_name(source: str) -> str:
    """How a card or a recorded command names a source: a local folder by its name alone (never its
    path), a Hub id as it is."""
    folder = local_source(source)
    return folder.resolve().name if folder else source


def source_model_name(source: str) -> str:
    """How a card and a default folder name the model `source` holds: a Hub id as it is; a local folder
    by the name its model card declares (its ``model_name``, else its title when that is one word, as
    ``# all-MiniLM-L6-v2`` in a sentence-transformers card), else by the folder's name (`source_name`).

    config.json's ``_name_or_path`` is not used: it names the checkpoint the weights were loaded from
    before they were saved (all-MiniLM-L6-v2's names its base, nreimers/MiniLM-L6-H384-uncased)."""
    folder = local_source(source)
    declared = _declared_model_name(folder / "README.md") if folder is not None else None
    return declared or source_name(source)


def _declared_model_name(readme: Path) -> str | None:
    """The model name a model card declares: its ``model_name`` metadata, else a one-word title."""
    if not readme.is_file():
        return None
    try:
        card = ModelCard.load(readme, ignore_metadata_errors=True)
    except (OSError, ValueError):
        return None
    title = next((line[2:].strip() for line in card.text.splitlines() if line.startswith("# ")), None)
    for name in (getattr(card.data, "model_name", None), title):
        if isinstance(name, str) and MODEL_NAME.fullmatch(name) and name not in UNNAMED_MODEL_TITLES:
            return name
    return None


@functools.lru_cache(maxsize=16)
def hub_model_info(repo_id: str, token: str | bool | None = None) -> ModelInfo:
    """The Hub's record of model `repo_id` (a valid Hub id, see `is_hub_id`), in one request: no
    retries, HF_HUB_ETAG_TIMEOUT seconds at most (10 by default; the Hub's metadata timeout).

    A record found is kept for the process (a failure is not): a conversion's choice of files and
    its card's license read the same record, so `lsg-convert` asks the Hub once.

    Raises:
        SourceNotFoundError: the Hub has no model `repo_id` (or a private one the token cannot see).
        HubError: the Hub is unreachable or refuses the request.
    """
    cached = isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    advice = "set HF_HUB_OFFLINE=1 to convert the copy in the Hugging Face cache" if cached else "give a folder that exists"
    with hub_errors(f"look up {repo_id!r} on the Hub (no folder of that name here)", advice):
        try:
            return HfApi(token=token).model_info(repo_id, timeout=constants.HF_HUB_ETAG_TIMEOUT)
        except HfHubHTTPError as error:
            if isinstance(error, RepositoryNotFoundError) or error.response.status_code == 404:
                raise SourceNotFoundError(
                    f"No folder {repo_id!r} here, and no model {repo_id!r} on the Hub: check the name, "
                    "or pass token= for a private model."
                ) from error
            raise


def source_license(source: str, token: str | bool | None = None) -> str | None:
    """The license the source's model card declares, None when unknown.

    A local source: its README.md, read from disk. A Hub id: the Hub's record of it (one request), or
    its README.md in the Hugging Face cache when HF_HUB_OFFLINE=1 is set.
    """
    folder = local_source(source)
    if folder is not None:
        readme = folder / "README.md"
    elif not is_hub_id(source):
        return None
    elif is_offline_mode():
        cached = try_to_load_from_cache(source, "README.md")
        readme = Path(cached) if isinstance(cached, str) else None
    else:
        try:
            card_data = hub_model_info(source, token).card_data
        except (HubError, SourceNotFoundError) as error:
            logger.warning(f"No license is recorded in the model card: {one_line(error)}")
            return None
        return card_data.license if card_data else None
    if readme is None or not readme.is_file():
        return None
    try:
        return ModelCard.load(readme, ignore_metadata_errors=True).data.license
    except (OSError, ValueError):
        return None


def look_up_source(source: str, token: str | bool | None) -> ModelInfo | None:
    """The Hub's record of `source` (one quick request: `hub_model_info`) when it is a Hub id to
    download; None for a source on disk, with HF_HUB_OFFLINE=1 set, or for a name that is no Hub id
    (`load_source_config` refuses it)."""
    if local_source(source) is not None or is_offline_mode() or not is_hub_id(source):
        return None
    return hub_model_info(source, token)


def hub_file_names(record: ModelInfo) -> set[str]:
    """The paths of the files a Hub model's record lists."""
    return {sibling.rfilename for sibling in record.siblings or ()}


def download_hub_files(record: ModelInfo, names: Iterable[str], token: str | bool | None) -> None:
    """Download the files `names` of the Hub model `record` describes, at its commit, into the Hugging
    Face cache. Each file's metadata is asked once first (HF_HUB_ETAG_TIMEOUT seconds, no retries), so
    that a Hub that fails or refuses a download is reported in seconds, not after huggingface_hub's
    retries.

    Raises:
        HubError: a request fails or is refused.
    """
    for name in sorted(names):
        with hub_errors(f"download {name} of {record.id!r}", "check the network and token=, and try again"):
            url = hf_hub_url(record.id, name, revision=record.sha)
            get_hf_file_metadata(url, token=token, timeout=constants.HF_HUB_ETAG_TIMEOUT)
            hf_hub_download(record.id, name, revision=record.sha, token=token)


def load_source_config(source: str, token: str | bool | None, record: ModelInfo | None = None) -> Any:
    """The source's config. A source that exists on disk is read from disk and nothing else; any other
    is a Hub id, whose config.json is downloaded first when `record` (its `look_up_source`) is given,
    then read through the Hugging Face cache (only the cache with HF_HUB_OFFLINE=1)."""
    folder = local_source(source)
    if folder is not None:
        return _load_local_config(source, folder)
    if not is_hub_id(source):
        raise SourceNotFoundError(f"No folder at {source!r}: give an existing model folder or a Hub model id.")
    offline = is_offline_mode()
    if record is not None:
        download_hub_files(record, {CONFIG_NAME} & hub_file_names(record), token)
    try:
        with hub_errors(f"download the configuration of {source!r}", "check the network and try again"):
            return AutoConfig.from_pretrained(source, token=token)
    except (OSError, ValueError) as error:
        if offline:
            raise SourceNotFoundError(
                f"No folder {source!r} here, and no copy of it in the Hugging Face cache (HF_HUB_OFFLINE=1 is "
                "set, so the Hub is not asked): give an existing model folder, or unset HF_HUB_OFFLINE to download it."
            ) from error
        raise SourceNotFoundError(
            f"The Hub's {source!r} holds no model configuration ({one_line(error, 200)}): give a model's Hub id or folder."
        ) from error


def _load_local_config(source: str, folder: Path) -> Any:
    """The config of the model saved in `folder`; SourceNotFoundError when the folder holds no model,
    CorruptCheckpointError when its config.json cannot be read or names architectures but no model_type."""
    config_file = folder / "config.json"
    if not folder.is_dir():
        raise SourceNotFoundError(f"{source} is a file: give the folder the model was saved to.")
    if not config_file.is_file():
        raise SourceNotFoundError(
            f"{source} holds no model (no config.json): give the folder a model was saved to, or a Hub model id."
        )
    try:
        values = json.loads(config_file.read_text(encoding="utf-8"))
        values = values if isinstance(values, dict) else {}
        model_type = values.get("model_type")
        if not model_type or not isinstance(model_type, str):
            if values.get("architectures"):  # a model's config, but for that key
                advice = _model_type_advice(values["architectures"])
                raise CorruptCheckpointError(f'{source}/config.json has no "model_type"; {advice}.')
            raise SourceNotFoundError(
                f"{source} holds no model: its config.json describes none (it was not written by "
                "save_pretrained); give the folder a model was saved to."
            )
        find_architecture(model_type)  # an unsupported model is refused as such, not as unreadable
        return AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as error:
        raise CorruptCheckpointError(
            f"Cannot read {source}/config.json ({one_line(error, 200)}): fix or restore the file."
        ) from error


def _model_type_advice(architectures: Any) -> str:
    """What to add to a config.json that names `architectures` but no model_type: the model type of the
    first of them that a supported architecture's (or LSG) head is called."""
    named = json.dumps(architectures)
    for name in architectures if isinstance(architectures, list) else ():
        for arch in ARCHITECTURES.values():
            if name in arch.heads or name in arch.heads.values():
                model_type = arch.model_type if name in arch.heads else arch.lsg_model_type
                return f'its architectures {named} suggest "{model_type}": add "model_type": "{model_type}"'
    return (
        f'its architectures {named} name no model lsg_converter converts: add the "model_type" of the model '
        f"(supported: {', '.join(sorted(ARCHITECTURES))})"
    )
