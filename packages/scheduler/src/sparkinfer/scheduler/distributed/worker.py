"""A tensor-parallel rank other than 0: runs each forward rank 0 sends, on its own shard and
caches, until told to stop (or until rank 0 is gone)."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Generator
from typing import Any

import torch
from sparkinfer.kernels.linear import batch_invariant
from sparkinfer.kernels.tuning import KernelTuning, kernel_tuning
from sparkinfer.model.cache_spec import ModelCaches, allocate_caches
from sparkinfer.model.decoder import Qwen3_8ForCausalLM
from sparkinfer.scheduler._batch_invariant import BatchInvariantMode
from sparkinfer.scheduler.distributed.channel import StepChannel
from sparkinfer.scheduler.distributed.step_plan import CacheKey, decode_forward

logger = logging.getLogger(__name__)

_PARENT_POLL_S = 1.0


class RankWorker:
    """Owns a rank's caches (the geometry of rank 0's, allocated on first use) and its last
    forward output, which the logits message reuses."""

    def __init__(
        self,
        model: Qwen3_8ForCausalLM,
        channel: StepChannel,
        *,
        device: torch.device,
        deterministic: bool,
        tuning: KernelTuning,
    ) -> None:
        self.model = model
        self.channel = channel
        self.device = device
        self.deterministic = deterministic
        self.tuning = tuning
        self._caches: tuple[CacheKey, ModelCaches] | None = None
        self._hidden: torch.Tensor | None = None

    @torch.inference_mode()
    def serve(self) -> None:
        """Run rank 0's messages in order until "stop", under rank 0's kernel tuning."""
        with kernel_tuning(self.tuning):
            self._serve()

    def _serve(self) -> None:
        while True:
            message, tensor = self.channel.recv()
            if message.op == "stop":
                return
            if message.op == "forward":
                assert tensor is not None, "a forward message carries its inputs"
                self._forward(message.meta, tensor)
            elif message.op == "logits_of_forward":
                assert self._hidden is not None, "logits follow a forward"
                self.model.compute_logits(self._hidden)
            elif message.op == "logits":
                assert tensor is not None, "a logits message carries its rows"
                self.model.compute_logits(tensor)
            elif message.op == "copy_states":
                self._copy_states(message.meta)
            else:
                raise RuntimeError(f"unknown tensor-parallel message {message.op!r}: a bug")

    def _forward(self, meta: dict[str, Any], packed: torch.Tensor) -> None:
        input_ids, batch = decode_forward(meta, packed, self._caches_for(meta["cache_key"]))
        with self._numerics(is_decode=batch.is_decode):
            self._hidden = self.model(input_ids, batch, logits_rows_only=meta["logits_rows_only"])

    def _copy_states(self, meta: dict[str, Any]) -> None:
        caches = list(self._caches_for(meta["cache_key"]).linear.values())
        for src, dst in meta["copies"]:
            for c in caches:
                c.conv[dst].copy_(c.conv[src])
                c.recurrent[dst].copy_(c.recurrent[src])

    def _caches_for(self, key: CacheKey) -> ModelCaches:
        """This rank's caches of rank 0's geometry; a new geometry (the profiling scratch, then
        the serving caches) replaces the old one."""
        if self._caches is None or self._caches[0] != key:
            self._caches = None  # freed before the next is allocated
            num_blocks, block_size, num_slots = key
            caches = allocate_caches(
                self.model.cache_spec(),
                num_blocks=num_blocks,
                block_size=block_size,
                num_slots=num_slots,
                device=self.device,
            )
            self._caches = (key, caches)
        return self._caches[1]

    @contextlib.contextmanager
    def _numerics(self, *, is_decode: bool) -> Generator[None, None, None]:
        """The runner's `numerics`: rank 0 runs every forward under the same mode."""
        if not self.deterministic:
            yield
            return
        is_cuda = self.device.type == "cuda"
        cpu_matmuls = contextlib.nullcontext() if is_cuda else BatchInvariantMode()
        with batch_invariant("decode" if is_decode else "prefill"), cpu_matmuls:
            yield


def exit_with_parent() -> None:
    """End this process when the one that started it is gone (killed before it could stop us):
    a rank left behind would hold its GPU forever."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_PARENT_POLL_S)
        logger.error("rank 0 (pid %d) is gone: this tensor-parallel rank exits", parent)
        os._exit(1)

    threading.Thread(target=watch, name="sparkinfer-parent-watch", daemon=True).start()
