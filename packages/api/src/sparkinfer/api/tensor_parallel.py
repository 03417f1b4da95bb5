"""`--tensor-parallel-size` above 1: start the ranks before the server, and stop the server when
one of them dies (docs/scaling.md).

The ranks load the checkpoint's slices themselves; this process is rank 0 and gets its own shard
back, which stands where the whole model would (text only: no vision tower, no MTP head).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import torch
from sparkinfer.api.server_config import ServerConfig
from sparkinfer.api.settings import SettingsError, env_name
from sparkinfer.model import embedded
from sparkinfer.model.config import ModelConfig
from sparkinfer.model.errors import ConfigError
from sparkinfer.model.parallel.plan import ShardPlan
from sparkinfer.scheduler.distributed.launch import (
    CheckpointShards,
    ModelSource,
    TensorParallelRanks,
)

logger = logging.getLogger("sparkinfer.api")

_RANK_EXIT_GRACE_S = 3.0  # for the requests failed by a dead rank to send their error


def _refuse(setting: str, why: str) -> SettingsError:
    return SettingsError(
        f"--tensor-parallel-size ({env_name('tensor_parallel_size')}) above 1 {why}: unset "
        f"--{setting.replace('_', '-')} ({env_name(setting)}) or serve with one rank"
    )


def check_config(config: ServerConfig, device: torch.device) -> None:
    """Raise SettingsError for what tensor parallel cannot serve, before anything loads."""
    size = config.engine.tensor_parallel_size
    if size == 1:
        return
    if config.model.model == embedded.RANDOM_MODEL_ID:
        raise _refuse("model", "serves checkpoints, not the built-in random model")
    # "auto" decodes plainly under tensor parallel
    if config.engine.speculative in ("ngram", "mtp"):
        raise _refuse("speculative", "does not run speculative decoding yet")
    if config.model.quantization != "none":
        raise _refuse("quantization", "serves bf16 checkpoints only for now")
    if device.type == "cuda":
        if device.index not in (None, 0):
            raise _refuse("device", "puts rank r on cuda:r, starting at cuda:0")
        if torch.cuda.device_count() < size:
            raise SettingsError(
                f"--tensor-parallel-size is {size}; this machine has "
                f"{torch.cuda.device_count()} GPU(s): lower it to at most that"
            )


def stop_server(message: str) -> None:
    """What a dead rank does to the server: log why, let the failed requests answer, exit 1."""
    logger.critical("%s", message)
    threading.Timer(_RANK_EXIT_GRACE_S, os._exit, args=(1,)).start()


def start_ranks(
    server: ServerConfig,
    checkpoint: Path,
    config: ModelConfig,
    *,
    device: torch.device,
    dtype: torch.dtype,
    num_real_tokens: int,
) -> TensorParallelRanks:
    """Spawn and join the other ranks; each (this one too) loads its slices of `checkpoint`."""
    check_config(server, device)
    engine = server.engine
    size = engine.tensor_parallel_size
    if config.quantization is not None:
        raise SettingsError(
            f"{checkpoint} is an FP8 checkpoint; --tensor-parallel-size above 1 serves bf16 "
            "checkpoints only for now: serve its bf16 release, or with one rank"
        )
    try:
        ShardPlan(config.text, 0, size)
    except ConfigError as exc:
        raise SettingsError(
            f"--tensor-parallel-size {size} cannot split {checkpoint}: {exc}"
        ) from None
    dtype_name = str(dtype).removeprefix("torch.")
    loader = CheckpointShards(str(checkpoint), dtype_name, num_real_tokens)
    logger.info("starting %d tensor-parallel ranks on %s", size, device.type)
    return TensorParallelRanks.start(
        ModelSource(loader, device.type),
        size=size,
        deterministic=engine.deterministic,
        tuning=engine.kernel_tuning,
        on_rank_exit=stop_server,
    )
