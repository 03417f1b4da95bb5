"""`--draft-model`: the block drafter checked against the served model at start-up, then loaded.

The check reads only config files (the model's and the drafter's), so a drafter for another
model stops start-up in one line naming the setting before gigabytes of weights load.
"""

from __future__ import annotations

import logging

from sparkinfer.api.settings import Settings, SettingsError, env_name
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


def _model_text_config(settings: Settings) -> TextConfig:
    """The served model's text config, from its config files only."""
    if settings.model in (None, embedded.EMBEDDED_MODEL_ID):
        return load_model_config(embedded.embedded_checkpoint_dir()).text
    if settings.model == embedded.RANDOM_MODEL_ID:
        return embedded.random_model_config().text
    return read_checkpoint_configs(settings.model).model.text


def check_draft_model(settings: Settings) -> DrafterConfig | None:
    """The drafter's config checked against the model's (None without --draft-model); raises
    SettingsError naming the setting and what does not fit."""
    if settings.draft_model is None:
        if settings.speculative == "draft_model":
            raise SettingsError(
                "invalid setting --speculative draft_model: it drafts with the block drafter of "
                "--draft-model DIR|HUB_ID: give one, or pick another --speculative"
            )
        return None
    if settings.speculative not in ("auto", "draft_model"):
        raise SettingsError(
            f"--draft-model drafts with --speculative auto or draft_model, not "
            f"{settings.speculative}: drop --draft-model or --speculative"
        )
    if settings.tensor_parallel_size > 1:
        raise SettingsError(
            "--draft-model runs on one GPU for now: drop it or set --tensor-parallel-size 1"
        )
    try:
        return read_drafter_config(settings.draft_model, _model_text_config(settings))
    except (ConfigError, CheckpointError) as exc:
        raise _refused(exc) from None


def load_draft_model(settings: Settings, model: Qwen3_8ForCausalLM) -> BlockDrafter | None:
    """The drafter of --draft-model loaded beside `model` (None without it); a tensor that does
    not fit raises SettingsError naming the setting and the tensor."""
    if settings.draft_model is None:
        return None
    try:
        drafter = load_drafter(settings.draft_model, model)
    except (ConfigError, CheckpointError) as exc:
        raise _refused(exc) from None
    c = drafter.config
    logger.info(
        "loaded the %s drafter %s: it drafts %d tokens a step from target layers %s",
        c.layout, settings.draft_model, c.num_drafts, list(c.target_layer_ids),
    )  # fmt: skip
    return drafter
