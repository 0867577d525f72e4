"""What a saved model is, as LSG sees it (`lsg-convert PATH --info`): its format, head, length and settings,
read from its config alone (no weights are loaded). Works for this library's models, the 2023
reference's checkpoints and plain models (which it says are not LSG yet)."""

from __future__ import annotations

from .architectures import find_architecture
from .lsg_config import is_lsg_config
from .models.lsg_model import is_reference_config
from .models.lsg_settings import LSG_KEYS, LSGSettings
from .positions import PRETRAINED_POSITIONS_KEY
from .sources import load_source_config

# Keys shown after the LSG settings where the config has them.
EXTRA_KEYS = ("global_token_position", "pass_global_tokens_to_decoder", "clamp_global_distances")


def describe(source: str, token: str | bool | None = None) -> str:
    """Lines that say what `source` (a folder or Hub id) is: a plain model that can be converted, or an
    LSG model with its format, head, the tokens it reads and its LSG settings."""
    config = load_source_config(source, token)
    values = config.to_dict()
    arch = find_architecture(config.model_type)
    head = (config.architectures or ["(no head recorded)"])[0]
    reads = arch.layout.max_input_length(config)
    if not is_lsg_config(config):
        return (
            f"{source}: a {config.model_type} model ({head}) reading {reads:,} tokens, not LSG yet: "
            f"lsg-convert {source} --max-len 4096 converts it."
        )
    if is_reference_config(values):
        made_by = "the 2023 reference (lsg-converter 0.1.x; re-convert it to run it on transformers 5)"
    else:
        made_by = f"lsg_converter, saved with transformers {values.get('transformers_version', '(unknown)')}"
    settings = LSGSettings.of(arch.config_class()(**values))  # the 2023 format's defaults (legacy_sparse_window) too
    shown = [f"{key}={getattr(settings, key)!r}" for key in LSG_KEYS]
    shown += [f"{key}={values[key]!r}" for key in EXTRA_KEYS if key in values]
    pretrained = values.get(PRETRAINED_POSITIONS_KEY)
    lines = [
        f"{source}: an LSG {arch.model_type} model ({head}) written by {made_by}",
        f"reads up to {reads:,} tokens" + (f" (pretrained on {pretrained:,})" if pretrained else ""),
        "LSG settings: " + ", ".join(shown),
    ]
    return "\n".join(lines)

