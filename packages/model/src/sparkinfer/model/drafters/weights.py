"""A drafter checkpoint (local directory or hub id) -> a loaded `BlockDrafter` for a target.

The hub id is fetched whole like the model (`hub.fetch_checkpoint`); config.json is parsed and
checked against the target first, so a drafter for another model stops before any tensor is read.
Tensor names are the parameters' names, with two spellings accepted: DFlash2's codebooks are
stored without `.weight` (`candidate_selector.predecessor_codebook`), as z-lab publishes them.
`embed_tokens.weight` and `lm_head.weight`, which DeepSpec's DSpark exports may carry as frozen
copies of the target's, are checked for shape and not read: the drafter uses the target's own.
Anything else missing, unexpected or of the wrong shape is an error naming the tensor.
`embedded` (or its id, `embedded.EMBEDDED_DRAFTER_ID`) names the embedded model's own drafter,
shipped in this package.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors import safe_open
from sparkinfer.model import embedded
from sparkinfer.model.config import TextConfig
from sparkinfer.model.decoder import Qwen3_8ForCausalLM
from sparkinfer.model.drafters.config import DrafterConfig, check_drafter_fits, parse_drafter_config
from sparkinfer.model.drafters.dflash import BlockDrafter, SharedTargetModules
from sparkinfer.model.errors import CheckpointError, ConfigError
from sparkinfer.model.hub import fetch_checkpoint
from sparkinfer.model.weights import (
    CONFIG_PATTERNS,
    TensorRef,
    read_tensor_refs,
    resolve_checkpoint,
)
from tqdm.auto import tqdm

# stored name -> parameter name, where the published layout differs from the module's
_ALIASES = {
    "candidate_selector.predecessor_codebook": "candidate_selector.predecessor_codebook",
    "candidate_selector.successor_codebook": "candidate_selector.successor_codebook",
    "candidate_selector.predecessor_codebook.weight": "candidate_selector.predecessor_codebook",
    "candidate_selector.successor_codebook.weight": "candidate_selector.successor_codebook",
}
_TARGET_COPIES = ("embed_tokens.weight", "lm_head.weight")
_MAX_NAMES = 8

logger = logging.getLogger(__name__)


def _read_config(path: Path) -> dict[str, object]:
    file = path / "config.json"
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{file} cannot be read as JSON ({e}): fix or re-download it") from e


def _checked_config(path: Path, target: TextConfig) -> DrafterConfig:
    config = parse_drafter_config(_read_config(path))
    check_drafter_fits(config, target)
    return config


def builtin_drafter_path(path_or_id: str | Path) -> str | Path:
    """The shipped folder for `embedded` or its id; anything else unchanged."""
    if str(path_or_id) in embedded.EMBEDDED_DRAFTER_NAMES:
        return embedded.embedded_drafter_dir()
    return path_or_id


def read_drafter_config(
    path_or_id: str | Path, target: TextConfig, *, progress: bool = True
) -> DrafterConfig:
    """The config of the drafter at a directory or hub id (of a hub id only its small files are
    fetched), checked against the target's: what start-up checks before loading any weight."""
    path = resolve_checkpoint(
        builtin_drafter_path(path_or_id), allow_patterns=CONFIG_PATTERNS, progress=progress
    )
    return _checked_config(path, target)


def _match(
    drafter: BlockDrafter, refs: list[TensorRef], target: Qwen3_8ForCausalLM
) -> dict[str, TensorRef]:
    """Parameter name -> the tensor that fills it; raises CheckpointError on any mismatch."""
    params = dict(drafter.named_parameters())
    vocab_rows = (target.config.text.vocab_size, target.config.text.hidden_size)
    matched: dict[str, TensorRef] = {}
    unexpected = []
    for ref in refs:
        name = _ALIASES.get(ref.name, ref.name)
        if name in _TARGET_COPIES:
            if ref.shape != vocab_rows:
                raise CheckpointError(
                    f"the drafter's {ref.name} has shape {list(ref.shape)}; the target's is "
                    f"{list(vocab_rows)}: this drafter was trained for another model"
                )
            logger.info("drafter tensor %s not read: the target's is used", ref.name)
        elif name not in params:
            unexpected.append(ref.name)
        elif ref.shape != tuple(params[name].shape):
            raise CheckpointError(
                f"the drafter's {ref.name} has shape {list(ref.shape)}; its config.json asks "
                f"for {list(params[name].shape)}: the checkpoint does not match its config"
            )
        else:
            matched[name] = ref
    if unexpected:
        raise CheckpointError(
            f"unexpected drafter tensors {sorted(unexpected)[:_MAX_NAMES]}: they belong to no "
            f"part of a {drafter.config.architecture}; check the checkpoint"
        )
    missing = sorted(set(params) - set(matched))
    if missing:
        raise CheckpointError(
            f"the drafter checkpoint lacks {missing[:_MAX_NAMES]}: it is incomplete or not a "
            f"{drafter.config.architecture}"
        )
    return matched


@torch.no_grad()
def load_drafter(
    path_or_id: str | Path, target: Qwen3_8ForCausalLM, *, progress: bool = True
) -> BlockDrafter:
    """Load the block drafter at a directory or hub id for `target` (on its device, in its
    dtype), sharing its embedding and LM head, and set the target's tap layers to the
    drafter's `target_layer_ids`. Raises ConfigError naming the first field that does not fit
    the target, CheckpointError naming a bad tensor, CheckpointNotFound for a missing one."""
    path = fetch_checkpoint(builtin_drafter_path(path_or_id), progress=progress)
    config = _checked_config(path, target.config.text)
    device = target.lm_head.weight.device
    shared = SharedTargetModules(target.model.embed_tokens, target.lm_head)
    drafter = BlockDrafter(config, shared, ops=target.ops, device=device, dtype=target.dtype)
    matched = _match(drafter, read_tensor_refs(path), target)
    params = dict(drafter.named_parameters())
    by_file: dict[Path, list[tuple[str, TensorRef]]] = {}
    for name, ref in matched.items():
        by_file.setdefault(ref.file, []).append((name, ref))
    with tqdm(
        total=len(matched), desc="Loading drafter", unit="tensor", disable=not progress
    ) as bar:
        for file, items in by_file.items():
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for name, ref in items:
                    params[name].copy_(f.get_tensor(ref.name))
                    bar.update(1)
    target.set_tap_layers(config.target_layer_ids)
    return drafter
