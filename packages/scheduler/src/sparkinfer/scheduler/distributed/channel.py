"""Rank 0's messages to the other ranks: a small header, then at most one tensor.

The header (what to run, sizes and host lists) goes over a gloo group, since it is a Python
object; the tensor goes over the model's group (NCCL on GPUs), so device data never visits the
host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Message:
    """One instruction: `op` names it, `meta` holds its host-side values.

    tensor_shape / tensor_dtype: the tensor that follows the header, or None when none does.
    """

    op: str
    meta: dict[str, Any]
    tensor_shape: tuple[int, ...] | None = None
    tensor_dtype: torch.dtype | None = None


class StepChannel:
    """Broadcasts rank 0's messages (`send`) to every other rank (`recv`)."""

    def __init__(
        self,
        *,
        device: torch.device,
        group: dist.ProcessGroup | None = None,
        control_group: dist.ProcessGroup | None = None,
    ) -> None:
        self.device = device
        self.group = group
        self.control_group = control_group

    def send(self, op: str, meta: dict[str, Any], tensor: torch.Tensor | None = None) -> None:
        shape = None if tensor is None else tuple(tensor.shape)
        dtype = None if tensor is None else tensor.dtype
        dist.broadcast_object_list(
            [Message(op, meta, shape, dtype)], src=0, group=self.control_group
        )
        if tensor is not None:
            dist.broadcast(tensor.contiguous(), src=0, group=self.group)

    def recv(self) -> tuple[Message, torch.Tensor | None]:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0, group=self.control_group)
        message: Message = box[0]
        if message.tensor_shape is None:
            return message, None
        assert message.tensor_dtype is not None, "a tensor's header carries its dtype"
        tensor = torch.empty(message.tensor_shape, dtype=message.tensor_dtype, device=self.device)
        dist.broadcast(tensor, src=0, group=self.group)
        return message, tensor
