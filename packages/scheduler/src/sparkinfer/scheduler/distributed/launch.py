"""Start a tensor-parallel engine: this process is rank 0, one spawned process per other rank.

Each rank joins one torch.distributed group (NCCL on GPUs, rank r on cuda:r; gloo on the CPU)
plus a gloo group for the step headers, loads only its own slices of the checkpoint, and rank 0
builds the engine over a `TensorParallelRunner`. A watchdog thread waits on the other ranks'
processes: one that exits while the engine serves fails every later step with a message naming
it, and calls `on_rank_exit` (the server passes one that shuts it down), so nothing waits on a
collective that can never complete.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import multiprocessing.connection
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.process import BaseProcess
from typing import Protocol

import torch
import torch.distributed as dist
from sparkinfer.model.decoder import Qwen3_8ForCausalLM
from sparkinfer.model.parallel.group import TensorParallelGroup
from sparkinfer.model.parallel.sharded_model import load_sharded_model
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.distributed.channel import StepChannel
from sparkinfer.scheduler.distributed.mirror import MirroredModel, TensorParallelRunner
from sparkinfer.scheduler.distributed.worker import RankWorker, exit_with_parent
from sparkinfer.scheduler.engine import Engine

logger = logging.getLogger(__name__)

_JOIN_S = 10.0  # how long a stopping rank may take before it is terminated


class ShardLoader(Protocol):
    """Builds rank `tp.rank`'s model on `device`; picklable, since each spawned rank calls it."""

    def __call__(self, tp: TensorParallelGroup, device: torch.device) -> Qwen3_8ForCausalLM: ...


@dataclass(frozen=True)
class CheckpointShards:
    """The serving loader: each rank reads its slices of a checkpoint folder."""

    checkpoint: str
    dtype: str  # a torch dtype's name: "bfloat16", "float32"
    num_real_tokens: int | None = None

    def __call__(self, tp: TensorParallelGroup, device: torch.device) -> Qwen3_8ForCausalLM:
        return load_sharded_model(
            self.checkpoint,
            tp,
            device=device,
            dtype=getattr(torch, self.dtype),
            num_real_tokens=self.num_real_tokens,
        )


@dataclass(frozen=True)
class ModelSource:
    """What every rank runs: its loader, the device type, and how long a collective may take."""

    loader: ShardLoader
    device_type: str  # "cuda" or "cpu"
    timeout_s: float = 120.0  # start-up rendezvous, and any one collective


def _device(source: ModelSource, rank: int) -> torch.device:
    return torch.device("cuda", rank) if source.device_type == "cuda" else torch.device("cpu")


def _join_group(source: ModelSource, rank: int, size: int, port: int) -> StepChannel:
    device = _device(source, rank)
    is_cuda = device.type == "cuda"
    if is_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if is_cuda else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=size,
        timeout=timedelta(seconds=source.timeout_s),
        device_id=device if is_cuda else None,
    )
    if not is_cuda:
        return StepChannel(device=device)  # gloo carries both the headers and the tensors
    control = dist.new_group(backend="gloo")
    assert isinstance(control, dist.ProcessGroup), "every rank is a member of the group"
    return StepChannel(device=device, control_group=control)


def _load(source: ModelSource, rank: int, size: int) -> Qwen3_8ForCausalLM:
    return source.loader(TensorParallelGroup(rank, size), _device(source, rank))


def worker_main(rank: int, size: int, port: int, source: ModelSource, deterministic: bool) -> None:
    """The entry point of a spawned rank."""
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank {rank} %(message)s")
    exit_with_parent()
    channel = _join_group(source, rank, size, port)
    model = _load(source, rank, size)
    RankWorker(model, channel, device=channel.device, deterministic=deterministic).serve()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RankWatchdog:
    """Waits on the other ranks' processes; the first to exit before `stop` is reported."""

    def __init__(self, procs: list[BaseProcess], on_exit: Callable[[str], None]) -> None:
        self.procs = procs
        self._on_exit = on_exit
        self._is_stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="sparkinfer-tp-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        sentinels = {p.sentinel: rank for rank, p in enumerate(self.procs, start=1)}
        ready = multiprocessing.connection.wait(list(sentinels))
        if self._is_stopping.is_set():
            return
        rank = sentinels[ready[0]]  # pyright: ignore[reportArgumentType]
        code = self.procs[rank - 1].exitcode
        self._on_exit(
            f"tensor-parallel rank {rank} (pid {self.procs[rank - 1].pid}) exited with code "
            f"{code}: the model is incomplete without it, so the server stops; check that "
            "rank's log above, then restart the server"
        )

    def stop(self) -> None:
        """Wait for the ranks to leave (they were told to stop), terminating any that hang."""
        self._is_stopping.set()
        for p in self.procs:
            p.join(_JOIN_S)
            if p.is_alive():
                p.terminate()
                p.join(_JOIN_S)


def start_tensor_parallel_engine(
    source: ModelSource,
    config: SchedulerConfig,
    *,
    size: int,
    on_rank_exit: Callable[[str], None] | None = None,
) -> Engine:
    """Spawn ranks 1..size-1, join them as rank 0, and start the engine over all of them.

    Shutting the engine down stops the other ranks. `on_rank_exit(message)` runs (on the
    watchdog's thread) when a rank exits while serving; the engine's later steps fail with that
    message either way. CUDA graphs and speculative decoding are off under tensor parallel.
    """
    if size < 2:
        raise ValueError(f"size is {size}; tensor parallel needs at least 2 ranks")
    if config.is_speculative:
        raise ValueError(
            "speculative decoding does not run under tensor parallel yet: set speculative off "
            "or tensor_parallel_size 1"
        )
    config = dataclasses.replace(config, enforce_eager=True)
    port = _free_port()
    spawn = multiprocessing.get_context("spawn")
    procs: list[BaseProcess] = [
        spawn.Process(
            target=worker_main,
            args=(rank, size, port, source, config.deterministic),
            name=f"sparkinfer-tp-rank-{rank}",
            daemon=True,
        )
        for rank in range(1, size)
    ]
    for p in procs:
        p.start()
    try:
        return _start_rank_0(source, config, procs, port, on_rank_exit)
    except BaseException:
        for p in procs:  # a rank 0 that cannot start leaves no rank behind
            p.terminate()
            p.join(_JOIN_S)
        if dist.is_initialized():
            dist.destroy_process_group()
        raise


def _start_rank_0(
    source: ModelSource,
    config: SchedulerConfig,
    procs: list[BaseProcess],
    port: int,
    on_rank_exit: Callable[[str], None] | None,
) -> Engine:
    size = len(procs) + 1
    channel = _join_group(source, 0, size, port)
    runner_box: list[TensorParallelRunner] = []

    def rank_exited(message: str) -> None:
        logger.error("%s", message)
        for runner in runner_box:
            runner.fail(message)
        if on_rank_exit is not None:
            on_rank_exit(message)

    watchdog = RankWatchdog(procs, rank_exited)

    def close() -> None:
        watchdog.stop()
        dist.destroy_process_group()

    model = MirroredModel(_load(source, 0, size), channel)
    runner = TensorParallelRunner(model, config, device=channel.device, on_close=close)
    runner_box.append(runner)
    return Engine(runner, config)
