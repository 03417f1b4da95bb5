"""Batch-invariant CPU matmuls: every 2-D product runs in zero-padded blocks of a fixed row count.

CPU BLAS picks a different kernel (gemv for one row, other tilings as rows grow), so a row's
result depends on how many rows share the call. Measured with torch 2.15 on x86: fp32
`x[:m] @ w.T` row 0 differs between m = 1 and m = 2, and again from about m = 11-16 on; in blocks
of a fixed shape it is bitwise equal for every m and every row position. bf16 showed no drift.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

BLOCK_ROWS = 16

_MATMULS = frozenset({torch.matmul, torch.mm, torch.Tensor.matmul, torch.Tensor.__matmul__})


def _row_blocked(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """fn over x [M, K] in blocks of BLOCK_ROWS rows, the last one zero-padded."""
    num_rows = x.shape[0]
    pad = -num_rows % BLOCK_ROWS
    if pad:
        x = torch.cat([x, x.new_zeros(pad, x.shape[1])])
    out = torch.cat([fn(x[i : i + BLOCK_ROWS]) for i in range(0, x.shape[0], BLOCK_ROWS)])
    return out[:num_rows]


class RowBlockedMatmul(TorchFunctionMode):
    """Inside this mode, CPU `F.linear` and 2-D matmuls compute each row independently of M."""

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and x.dim() == 2 and not x.is_cuda:
            if func is F.linear:
                rest = args[1:]
                return _row_blocked(lambda xb: func(xb, *rest, **kwargs), x)
            if func in _MATMULS and isinstance(args[1], torch.Tensor) and args[1].dim() == 2:
                other = args[1]
                return _row_blocked(lambda xb: func(xb, other), x)
        return func(*args, **kwargs)
