"""Batch-invariant CPU numerics: fixed-shape matmuls and fixed-chunk transcendental functions.

Measured with torch 2.15 (MKL, AVX-512), fp32:
- BLAS picks a different kernel by row count (gemv for one row, other tilings as rows grow):
  row 0 of `x[:m] @ w.T` differs between m = 1 and 2, and again from m = 11-16 on. In zero-padded
  blocks of a fixed row count it is bitwise equal for every m and every row position.
- Element-wise sigmoid / silu / softplus give different bits in the vectorised loop and in its
  scalar tail, so an element's value depends on the tensor's length (about half of the rows of a
  [300, 24] tensor differ from the same row alone). Applied to fixed 4096-element chunks, every
  element takes the vector path and the results no longer depend on the batch.
Reductions along the last dim and softmax were row-invariant already. bf16 matmuls showed no drift.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

BLOCK_ROWS = 16
CHUNK_ELEMENTS = 4096  # a multiple of every vector width, below the parallel grain size

_MATMULS = frozenset({torch.matmul, torch.mm, torch.Tensor.matmul, torch.Tensor.__matmul__})
_ELEMENTWISE = frozenset(
    {
        torch.exp, torch.Tensor.exp, torch.sigmoid, torch.Tensor.sigmoid, torch.tanh,
        torch.Tensor.tanh, torch.log, torch.Tensor.log, torch.cos, torch.Tensor.cos, torch.sin,
        torch.Tensor.sin, F.silu, F.softplus, F.gelu,
    }
)  # fmt: skip


def _row_blocked(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """fn over x [M, K] in blocks of BLOCK_ROWS rows, the last one zero-padded."""
    num_rows = x.shape[0]
    if num_rows == 0:
        return fn(x)
    pad = -num_rows % BLOCK_ROWS
    if pad:
        x = torch.cat([x, x.new_zeros(pad, x.shape[1])])
    out = torch.cat([fn(x[i : i + BLOCK_ROWS]) for i in range(0, x.shape[0], BLOCK_ROWS)])
    return out[:num_rows]


def _chunked(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Element-wise fn over x in zero-padded chunks of CHUNK_ELEMENTS."""
    flat = x.reshape(-1)
    num = flat.numel()
    pad = -num % CHUNK_ELEMENTS
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    chunks = [fn(flat[i : i + CHUNK_ELEMENTS]) for i in range(0, flat.numel(), CHUNK_ELEMENTS)]
    return torch.cat(chunks)[:num].view(x.shape)


class BatchInvariantMode(TorchFunctionMode):
    """Inside this mode, CPU matmuls and transcendental functions give each row the same bits
    whatever else shares the batch."""

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or x.is_cuda or not x.is_floating_point():
            return func(*args, **kwargs)
        if func in _ELEMENTWISE and x.numel() > 0:
            rest = args[1:]
            return _chunked(lambda xc: func(xc, *rest, **kwargs), x)
        if x.dim() == 2:
            if func is F.linear:
                rest = args[1:]
                return _row_blocked(lambda xb: func(xb, *rest, **kwargs), x)
            if func in _MATMULS and isinstance(args[1], torch.Tensor) and args[1].dim() == 2:
                other = args[1]
                return _row_blocked(lambda xb: func(xb, other), x)
        return func(*args, **kwargs)
