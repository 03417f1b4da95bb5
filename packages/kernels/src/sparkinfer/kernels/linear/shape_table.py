"""The measured shape table: (M bucket, N, K, dtype) -> the skinny-GEMM tile that beat cuBLAS.

`shape_table.json` (committed data, written by `sparkinfer.bench.kernels.linear --tune`) holds,
per shape, the winner and its tile config on the GPU it names; None marks a cuBLAS win.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from types import MappingProxyType

import torch
from sparkinfer.kernels.linear.skinny_gemm import SkinnyGemmConfig

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


TABLE = _load_table()


def m_bucket(m: int) -> int | None:
    """Smallest bucket holding m rows, or None when m is beyond the skinny range."""
    return next((b for b in M_BUCKETS if m <= b), None)


# A weight up to this fraction wider or narrower than a measured one (same K) uses its entry:
# fusing a few extra rows into a projection (e.g. GDN's 96 gate rows) must not lose its tile.
NEAR_N = 0.01


@functools.cache  # the table is fixed, and eager steps ask once per linear call
def _entry(bucket: int, n: int, k: int, name: str) -> tuple[bool, SkinnyGemmConfig | None]:
    """(found, entry) for the measured shape nearest in N, within NEAR_N, at the same K."""
    if (bucket, n, k, name) in TABLE:
        return True, TABLE[(bucket, n, k, name)]
    near = [key for key in TABLE if key[0] == bucket and key[2] == k and key[3] == name]
    near = [key for key in near if abs(key[1] - n) <= NEAR_N * key[1]]
    if not near:
        return False, None
    return True, TABLE[min(near, key=lambda key: abs(key[1] - n))]


def decode_entry(n: int, k: int, dtype: torch.dtype) -> SkinnyGemmConfig | None:
    """The skinny tile measured best for one row of an [N, K] weight, None where cuBLAS won."""
    return _entry(1, n, k, str(dtype).removeprefix("torch."))[1]


def lookup(m: int, n: int, k: int, dtype: torch.dtype) -> SkinnyGemmConfig | None:
    """The Triton config the table chose for this shape, or None to use cuBLAS."""
    bucket = m_bucket(m)
    if bucket is None:
        return None
    name = str(dtype).removeprefix("torch.")
    # Buckets the table lacks fall back to the next measured bucket up.
    for b in M_BUCKETS[M_BUCKETS.index(bucket) :]:
        found, config = _entry(b, n, k, name)
        if found:
            return config
    return None
