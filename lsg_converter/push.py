"""Push a converted model to the Hugging Face Hub: the whole folder (weights, config, remote code,
tokenizer, model card) in one commit, refused before any work when it cannot happen."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from huggingface_hub import CommitOperationAdd, HfApi, ModelCard, get_token, is_offline_mode
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging

from .card import model_card
from .errors import HubError
from .saving import save_converted
from .sources import hub_errors, source_license

logger = logging.get_logger(__name__)


def check_can_push(repo_id: str, token: str | bool | None = None) -> None:
    """Refuse, before any work, a push that cannot happen: HF_HUB_OFFLINE=1 is set, or no token is found.

    Raises:
        HubError: with what to do.
    """
    if is_offline_mode():
        raise HubError(f"Cannot push to {repo_id!r}: HF_HUB_OFFLINE=1 is set; unset it to push.")
    if token is False or (not isinstance(token, str) and get_token() is None):
        raise HubError(
            f"Cannot push to {repo_id!r}: no Hugging Face token found; pass token=, set HF_TOKEN, "
            "or log in with `hf auth login`."
        )


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
        HubError: the Hub is unreachable or refuses the token or the repository; HF_HUB_OFFLINE=1 is
            set or no token is found (refused before anything is saved).
    """
    check_can_push(repo_id, token)
    with tempfile.TemporaryDirectory(prefix="lsg-push-") as staging:
        if folder is None:
            folder = save_converted(model, tokenizer, Path(staging) / "model")
        folder = Path(folder)
        if not (folder / "README.md").is_file():
            card = card or model_card(
                model,
                repo_id,
                license=source_license(model.config._name_or_path, token),
                has_tokenizer=tokenizer is not None,
            )
            card.save(folder / "README.md")
        operations = [
            CommitOperationAdd(path_in_repo=path.relative_to(folder).as_posix(), path_or_fileobj=str(path))
            for path in sorted(folder.rglob("*"))
            if path.is_file()
        ]
        api = HfApi(token=token)
        with hub_errors(f"push to {repo_id!r}", "check the network, the repository name and token="):
            api.create_repo(repo_id, private=private, exist_ok=True)
            commit = api.create_commit(
                repo_id,
                operations,
                commit_message=commit_message or f"Upload {type(model).__name__} converted with lsg_converter",
            )
    logger.info(f"Pushed {len(operations)} files to {repo_id}.")
    return commit.commit_url
