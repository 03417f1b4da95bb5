"""`--draft-model`: the block drafter checked against the served model at start-up, then loaded.

The check reads only config files (the model's and the drafter's), so a drafter for another
model stops start-up in one line naming the setting before gigabytes of weights load.
"""

from __future__ import annotations

import logging

from sparkinfer.api.server_config import ServerConfig
from sparkinfer.api.settings import SettingsError, env_name
from sparkinfer.model import embedded
from sparkinfer.model.config import TextConfig, load_model_config
from sparkinfer.model.decoder import Qwen3_8ForCausalLM
from sparkinfer.model.drafters.config import DrafterConfig
from sparkinfer.model.drafters.dflash import BlockDrafter
from sparkinfer.model.drafters.weights import load_drafter, read_drafter_config
from sparkinfer.model.errors import CheckpointError, ConfigError
from sparkinfer.model.weights import read_checkpoint_configs

logger = logging.getLogger(__name__)


def _refused(exc: Exception) -> SettingsError:
    return SettingsError(f"invalid setting --draft-model ({env_name('draft_model')}): {exc}")


def _model_text_config(source: str | None) -> TextConfig:
    """The served model's text config, from its config files only."""
    if source in (None, embedded.EMBEDDED_MODEL_ID):
        return load_model_config(embedded.embedded_checkpoint_dir()).text
    if source == embedded.RANDOM_MODEL_ID:
        return embedded.random_model_config().text
    return read_checkpoint_configs(source).model.text


def check_draft_model(config: ServerConfig) -> DrafterConfig | None:
    """The drafter's config checked against the model's (None without --draft-model); raises
    SettingsError naming the setting and what does not fit."""
    draft_model, speculative = config.model.draft_model, config.engine.speculative
    if draft_model is None:
        if speculative == "draft_model":
            raise SettingsError(
                "invalid setting --speculative draft_model: it drafts with the block drafter of "
                "--draft-model DIR|HUB_ID: give one, or pick another --speculative"
            )
        return None
    if speculative not in ("auto", "draft_model"):
        raise SettingsError(
            f"--draft-model drafts with --speculative auto or draft_model, not "
            f"{speculative}: drop --draft-model or --speculative"
        )
    if config.engine.tensor_parallel_size > 1:
        raise SettingsError(
            "--draft-model runs on one GPU for now: drop it or set --tensor-parallel-size 1"
        )
    try:
        return read_drafter_config(draft_model, _model_text_config(config.model.model))
    except (ConfigError, CheckpointError) as exc:
        raise _refused(exc) from None


def load_draft_model(config: ServerConfig, model: Qwen3_8ForCausalLM) -> BlockDrafter | None:
    """The drafter of --draft-model loaded beside `model` (None without it); a tensor that does
    not fit raises SettingsError naming the setting and the tensor."""
    draft_model = config.model.draft_model
    if draft_model is None:
        return None
    try:
        drafter = load_drafter(draft_model, model)
    except (ConfigError, CheckpointError) as exc:
        raise _refused(exc) from None
    c = drafter.config
    logger.info(
        "loaded the %s drafter %s: it drafts %d tokens a step from target layers %s",
        c.layout, draft_model, c.num_drafts, list(c.target_layer_ids),
    )  # fmt: skip
    return drafter
