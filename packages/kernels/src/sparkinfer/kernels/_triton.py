"""Launch helpers shared by the Triton kernels of this package."""

from __future__ import annotations

import torch
import triton.language as tl

_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def dot_dtype(t: torch.Tensor) -> tl.dtype:
    """Operand dtype for tl.dot on t's device: its own dtype on a GPU, fp32 on the CPU.

    The Triton interpreter (CPU tests) multiplies bf16 operands of tl.dot as raw integers, so
    kernels cast operands to this dtype first; on a GPU the cast is a no-op.
    """
    if t.is_cuda:
        return _TL_DTYPES[t.dtype]
    return tl.float32
