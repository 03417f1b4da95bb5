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
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.process import BaseProcess
from typing import Protocol

import torch
import torch.distributed as dist
from sparkinfer.kernels.tuning import DEFAULT_TUNING, KernelTuning
from sparkinfer.model.decoder import Qwen3_8ForCausalLM
from sparkinfer.model.parallel.group import TensorParallelGroup
from sparkinfer.model.parallel.sharded_model import load_sharded_model
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.distributed.channel import StepChannel
from sparkinfer.scheduler.distributed.mirror import MirroredModel, TensorParallelRunner
from sparkinfer.scheduler.distributed.watchdog import RankWatchdog
from sparkinfer.scheduler.distributed.worker import RankWorker, exit_with_parent
from sparkinfer.scheduler.engine import Engine

logger = logging.getLogger(__name__)


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


def worker_main(
    rank: int,
    size: int,
    port: int,
    source: ModelSource,
    numerics: tuple[bool, KernelTuning],
) -> None:
    """The entry point of a spawned rank."""
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank {rank} %(message)s")
    exit_with_parent()
    channel = _join_group(source, rank, size, port)
    model = _load(source, rank, size)
    deterministic, tuning = numerics
    worker = RankWorker(
        model, channel, device=channel.device, deterministic=deterministic, tuning=tuning
    )
    worker.serve()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TensorParallelRanks:
    """The ranks of one tensor-parallel model, seen from rank 0: `start` spawns and joins them
    and loads rank 0's shard (`shard`); `engine` starts the engine over them; shutting that
    engine down (or `stop`, before there is one) stops the other ranks."""

    def __init__(
        self,
        shard: Qwen3_8ForCausalLM,
        channel: StepChannel,
        watchdog: RankWatchdog,
        *,
        numerics: tuple[bool, KernelTuning],
    ) -> None:
        self.shard = shard
        self.channel = channel
        self.numerics = numerics
        self._watchdog = watchdog
        self._runner: TensorParallelRunner | None = None
        self._failure: str | None = None

    @property
    def size(self) -> int:
        return len(self._watchdog.procs) + 1

    @classmethod
    def start(
        cls,
        source: ModelSource,
        *,
        size: int,
        deterministic: bool = False,
        tuning: KernelTuning = DEFAULT_TUNING,
        on_rank_exit: Callable[[str], None] | None = None,
    ) -> TensorParallelRanks:
        """Spawn ranks 1..size-1, join them as rank 0 and load every rank's shard.

        `on_rank_exit(message)` runs (on the watchdog's thread) when a rank exits before it was
        told to stop; the engine's later steps fail with that message either way.
        `deterministic`, `tuning`: the engine config's `deterministic` and `kernel_tuning`, which
        the other ranks' forwards follow.
        """
        if size < 2:
            raise ValueError(f"size is {size}; tensor parallel needs at least 2 ranks")
        port = _free_port()
        spawn = multiprocessing.get_context("spawn")
        procs: list[BaseProcess] = [
            spawn.Process(
                target=worker_main,
                args=(rank, size, port, source, (deterministic, tuning)),
                name=f"sparkinfer-tp-rank-{rank}",
                daemon=True,
            )
            for rank in range(1, size)
        ]
        for p in procs:
            p.start()
        box: list[TensorParallelRanks] = []

        def rank_exited(message: str) -> None:
            logger.error("%s", message)
            for ranks in box:
                ranks.fail(message)
            if on_rank_exit is not None:
                on_rank_exit(message)

        watchdog = RankWatchdog(procs, rank_exited)
        try:
            channel = _join_group(source, 0, size, port)
            numerics = (deterministic, tuning)
            ranks = cls(_load(source, 0, size), channel, watchdog, numerics=numerics)
        except BaseException:
            watchdog.stop(is_told=False)  # a rank 0 that cannot start leaves no rank behind
            if dist.is_initialized():
                dist.destroy_process_group()
            raise
        box.append(ranks)
        return ranks

    def fail(self, reason: str) -> None:
        """A rank has exited: the engine's later steps raise `reason`."""
        self._failure = reason
        if self._runner is not None:
            self._runner.fail(reason)

    def engine(self, config: SchedulerConfig) -> Engine:
        """The engine over these ranks (CUDA graphs off; speculative decoding refused, "auto"
        decodes plainly)."""
        if config.is_speculative:
            self.stop()
            raise ValueError(
                "speculative decoding does not run under tensor parallel yet: set speculative "
                "off or tensor_parallel_size 1"
            )
        if (config.deterministic, config.kernel_tuning) != self.numerics:
            self.stop()
            raise ValueError(
                "the ranks were started with another deterministic or kernel tuning than the "
                "engine's config: start them from the same config"
            )
        config = config.resolve_speculative(has_mtp_head=False)
        config = dataclasses.replace(config, enforce_eager=True)
        model = MirroredModel(self.shard, self.channel)
        try:
            runner = TensorParallelRunner(
                model, config, device=self.channel.device, on_close=self._close
            )
        except BaseException:
            self.stop()
            raise
        self._runner = runner
        if self._failure is not None:
            runner.fail(self._failure)
        return Engine(runner, config)

    def stop(self) -> None:
        """Stop the other ranks and leave the group (what the engine's shutdown does)."""
        if self._failure is None:
            try:
                self.channel.send("stop", {})
            except Exception:  # a rank gone while stopping: the watchdog reports it
                logger.exception("could not tell the tensor-parallel ranks to stop")
        self._close()

    def _close(self) -> None:
        self._watchdog.stop(is_told=True)
        if dist.is_initialized():
            dist.destroy_process_group()


def start_tensor_parallel_engine(
    source: ModelSource,
    config: SchedulerConfig,
    *,
    size: int,
    on_rank_exit: Callable[[str], None] | None = None,
) -> Engine:
    """`TensorParallelRanks.start` then its `engine`: one call for tests and benchmarks."""
    ranks = TensorParallelRanks.start(
        source,
        size=size,
        deterministic=config.deterministic,
        tuning=config.kernel_tuning,
        on_rank_exit=on_rank_exit,
    )
    return ranks.engine(config)
