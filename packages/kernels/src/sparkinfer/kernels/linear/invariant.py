"""Batch-invariant linear layers on the GPU: one kernel and one tile per (phase, N, K).

cuBLAS, and the measured dispatch table, choose a kernel by row count, so a row's bits change with
the batch it shares. Inside `batch_invariant(phase)` every CUDA `linear` instead runs a kernel
whose configuration depends only on the phase and the weight's shape:

- "decode": the skinny GEMM with BM fixed at 64 rows and BN / SPLIT_K picked from (N, K) so the
  grid fills the GPU (the split-K slices are summed in a fixed order).
- "prefill": the tiled GEMM with one fixed tile, no split-K.

A request's rows always run in the same phase (prompt rows in prefill forwards, generated rows in
decode forwards), so its logits do not depend on what else is scheduled with it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from functools import lru_cache
from typing import Literal

import torch
import triton
from sparkinfer.kernels.linear.skinny_gemm import SkinnyGemmConfig, skinny_gemm
from sparkinfer.kernels.linear.tiled_gemm import TiledGemmConfig, tiled_gemm

Phase = Literal["decode", "prefill"]

DECODE_BM = 64
PREFILL_CONFIG = TiledGemmConfig()
_TARGET_PROGRAMS = 256  # about two waves over the H200's 132 multiprocessors
_MIN_K_PER_SPLIT = 1024
_BK = 128

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
def decode_config(n: int, k: int) -> SkinnyGemmConfig:
    """The one skinny-GEMM config every decode batch uses for an [N, K] weight."""
    bn = 64 if triton.cdiv(n, 64) >= _TARGET_PROGRAMS * 3 // 4 else 32
    col_tiles = triton.cdiv(n, bn)
    max_split = max(1, k // _MIN_K_PER_SPLIT)
    split_k = min(max_split, triton.cdiv(_TARGET_PROGRAMS, col_tiles))
    return SkinnyGemmConfig(BM=DECODE_BM, BN=bn, BK=_BK, SPLIT_K=split_k, num_stages=4)


def invariant_linear(x: torch.Tensor, weight: torch.Tensor, phase: Phase) -> torch.Tensor:
    """y = x @ weight.T whose rows do not depend on M: the kernel of `phase` for this shape."""
    if phase == "decode":
        return skinny_gemm(x, weight, decode_config(weight.shape[0], weight.shape[1]))
    return tiled_gemm(x, weight, PREFILL_CONFIG)
