"""`linear`: per shape, the faster of the Triton skinny GEMM and cuBLAS, from a measured table.

`shape_table.json` (committed data, written by `sparkinfer.bench.kernels.linear --tune`) maps
(M bucket, N, K, dtype) to the winner and its tile config on the GPU it names. Shapes absent from
the table, rows beyond the largest bucket and CPU tensors go to torch (cuBLAS on CUDA). Inside
`invariant.batch_invariant(phase)` CUDA calls take that phase's fixed kernel instead.
"""

from __future__ import annotations

import json
from importlib import resources
from types import MappingProxyType

import torch
import torch.nn.functional as F
from sparkinfer.kernels.linear.invariant import current_phase, invariant_linear
from sparkinfer.kernels.linear.skinny_gemm import SkinnyGemmConfig, skinny_gemm

M_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
TABLE_FILE = "shape_table.json"

TableKey = tuple[int, int, int, str]


def _load_table() -> MappingProxyType[TableKey, SkinnyGemmConfig | None]:
    """(M bucket, N, K, dtype name) -> Triton config, or None where cuBLAS won."""
    path = resources.files("sparkinfer.kernels.linear") / TABLE_FILE
    if not path.is_file():
        return MappingProxyType({})
    entries = json.loads(path.read_text())["entries"]
    table: dict[TableKey, SkinnyGemmConfig | None] = {}
    for e in entries:
        key = (e["m"], e["n"], e["k"], e["dtype"])
        table[key] = SkinnyGemmConfig(**e["config"]) if e["impl"] == "triton" else None
    return MappingProxyType(table)


_TABLE = _load_table()


def m_bucket(m: int) -> int | None:
    """Smallest bucket holding m rows, or None when m is beyond the skinny range."""
    return next((b for b in M_BUCKETS if m <= b), None)


def lookup(m: int, n: int, k: int, dtype: torch.dtype) -> SkinnyGemmConfig | None:
    """The Triton config the table chose for this shape, or None to use cuBLAS."""
    bucket = m_bucket(m)
    if bucket is None:
        return None
    name = str(dtype).removeprefix("torch.")
    # Buckets the table lacks fall back to the next measured bucket up.
    for b in M_BUCKETS[M_BUCKETS.index(bucket) :]:
        if (b, n, k, name) in _TABLE:
            return _TABLE[(b, n, k, name)]
    return None


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """y = x @ weight.T, by whichever of the skinny GEMM and cuBLAS measured faster for the shape.

    Args:
        x: [M, K] activations (bf16, fp16 or fp32), unit stride along K.
        weight: [N, K] weight in the checkpoint's layout, same dtype.

    Returns:
        y: [M, N] in x.dtype, accumulated in fp32.
    """
    if x.is_cuda and x.dim() == 2 and weight.dim() == 2:
        phase = current_phase()
        if phase is not None:
            return invariant_linear(x, weight, phase)
        config = lookup(x.shape[0], weight.shape[0], weight.shape[1], x.dtype)
        if config is not None:
            return skinny_gemm(x, weight, config)
    if x.dtype != weight.dtype:
        raise TypeError(f"x and weight must share a dtype, got {x.dtype} and {weight.dtype}")
    return F.linear(x, weight)
