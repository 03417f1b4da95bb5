"""The ranks a model is split across: a torch.distributed process group and this rank's place."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TensorParallelGroup:
    """This rank's index and the group's size, with the collectives the sharded layers use.

    `group` is None for the default process group. The collectives are plain torch.distributed
    calls on tensors the forward already holds, so a CUDA graph captured around a forward records
    them (NCCL supports capture).
    """

    rank: int
    size: int
    group: dist.ProcessGroup | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank is {self.rank}; it must be in [0, size={self.size})")

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place; returns it."""
        dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """[..., n] on each rank -> [..., size * n], rank r's columns at r * n."""
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)
