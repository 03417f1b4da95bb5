"""Batch-invariant linear layers on the GPU: one kernel and one tile per (phase, N, K).

cuBLAS, and the measured dispatch table, choose a kernel by row count, so a row's bits change with
the batch it shares. Inside `batch_invariant(phase)` every CUDA `linear` instead runs a kernel
whose configuration depends only on the phase and the weight's shape:

- "decode": the skinny GEMM in 16-row tiles whatever M is, with the columns and K slices the
  shape table measured best for one row (split-K slices are summed in a fixed order).
- "prefill": the tiled GEMM with one fixed tile per dtype, no split-K.

A request's rows always run in the same phase (prompt rows in prefill forwards, generated rows in
decode forwards), so its logits do not depend on what else is scheduled with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from contextvars import ContextVar
from functools import lru_cache
from typing import Literal

import torch
import triton
from sparkinfer.kernels.linear.shape_table import decode_entry
from sparkinfer.kernels.linear.skinny_gemm import SkinnyGemmConfig, skinny_gemm
from sparkinfer.kernels.linear.tiled_gemm import TiledGemmConfig, tiled_gemm

Phase = Literal["decode", "prefill"]

DECODE_BM = 16
# Measured on the H200 at Qwen3.8-27B's prefill shapes (M = 4096): 0.76-0.89x cuBLAS, the best of
# the tiles swept by `sparkinfer.bench.kernels.linear_invariant --sweep` on most shapes.
PREFILL_CONFIG = TiledGemmConfig()
PREFILL_CONFIG_FP32 = TiledGemmConfig(BK=32)  # the same pipeline in shared memory
_TARGET_PROGRAMS = 256  # about two waves over the H200's 132 multiprocessors

_PHASE: ContextVar[Phase | None] = ContextVar("sparkinfer_linear_phase", default=None)


@contextlib.contextmanager
def batch_invariant(phase: Phase) -> Iterator[None]:
    """CUDA `linear` calls inside run the batch-invariant kernel of `phase`."""
    if phase not in ("decode", "prefill"):
        raise ValueError(f"batch_invariant: phase is {phase!r}; expected 'decode' or 'prefill'")
    token = _PHASE.set(phase)
    try:
        yield
    finally:
        _PHASE.reset(token)


def current_phase() -> Phase | None:
    """The phase set by the innermost `batch_invariant`, or None outside one."""
    return _PHASE.get()


@lru_cache(maxsize=256)
def decode_config(n: int, k: int, dtype: torch.dtype = torch.bfloat16) -> SkinnyGemmConfig:
    """The one skinny-GEMM config every decode batch uses for an [N, K] weight.

    16-row tiles (programs of one column block over several 16-row tiles run side by side and
    share its weight tiles in L2); columns and K slices as the table measured best for one row,
    or, for shapes it lacks, the widest column block that still gives ~256 programs, no split.
    """
    measured = decode_entry(n, k, dtype)
    if measured is not None:
        return dataclasses.replace(measured, BM=DECODE_BM)
    bn = next((b for b in (64, 32) if triton.cdiv(n, b) >= _TARGET_PROGRAMS * 3 // 4), 16)
    return SkinnyGemmConfig(BM=DECODE_BM, BN=bn, BK=128, SPLIT_K=1, num_stages=4)


def invariant_linear(x: torch.Tensor, weight: torch.Tensor, phase: Phase) -> torch.Tensor:
    """y = x @ weight.T whose rows do not depend on M: the kernel of `phase` for this shape."""
    if phase == "decode":
        return skinny_gemm(x, weight, decode_config(weight.shape[0], weight.shape[1], x.dtype))
    return tiled_gemm(
        x, weight, PREFILL_CONFIG_FP32 if x.dtype == torch.float32 else PREFILL_CONFIG
    )
