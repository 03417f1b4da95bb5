"""The measured shape table: (M bucket, N, K, dtype) -> the skinny-GEMM tile that beat cuBLAS,
and for one row the GEMV tile where the GEMV beat both.

`shape_table.json` (committed data, written by `sparkinfer.lab.kernels.linear --tune`) holds,
per shape, the winner ("impl": triton, cublas or gemv) and its tile config on the GPU it names.
"config" is the skinny tile measured best (kept in gemv and cublas entries re-timed by
`--tune-gemv`: the batch-invariant decode mode runs the one-row tile), "gemv" the GEMV tile of a
one-row gemv entry.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from types import MappingProxyType
from typing import TypeVar

import torch
from sparkinfer.kernels.linear.gemv import GemvConfig
from sparkinfer.kernels.linear.skinny_gemm import SkinnyGemmConfig

M_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
TABLE_FILE = "shape_table.json"

TableKey = tuple[int, int, int, str]
Tile = TypeVar("Tile")  # a table's value: skinny tile (or None) or GEMV tile


def _load_entries(path: str | None = None) -> list[dict]:
    """The entries of the table file at `path`, or of the committed table (absent: none)."""
    if path is not None:
        with open(path) as f:
            return json.load(f)["entries"]
    committed = resources.files("sparkinfer.kernels.linear") / TABLE_FILE
    return json.loads(committed.read_text())["entries"] if committed.is_file() else []


def _load_table(
    entries: list[dict], *, winners_only: bool = True
) -> MappingProxyType[TableKey, SkinnyGemmConfig | None]:
    """(M bucket, N, K, dtype name) -> skinny tile, or None where cuBLAS beat it; with
    winners_only False, the measured skinny tile wherever the entry keeps one."""
    table: dict[TableKey, SkinnyGemmConfig | None] = {}
    for e in entries:
        has_tile = "config" in e and (not winners_only or e["impl"] in ("triton", "gemv"))
        table[(e["m"], e["n"], e["k"], e["dtype"])] = (
            SkinnyGemmConfig(**e["config"]) if has_tile else None
        )
    return MappingProxyType(table)


def _load_gemv_table(entries: list[dict]) -> MappingProxyType[TableKey, GemvConfig]:
    """(1, N, K, dtype name) -> GEMV tile, for the one-row shapes the GEMV won."""
    return MappingProxyType({
        (e["m"], e["n"], e["k"], e["dtype"]): GemvConfig(**e["gemv"])
        for e in entries if e["impl"] == "gemv" and e["m"] == 1
    })  # fmt: skip


_ENTRIES = _load_entries()
TABLE = _load_table(_ENTRIES)
SKINNY_TILES = _load_table(_ENTRIES, winners_only=False)
GEMV_TABLE = _load_gemv_table(_ENTRIES)


def m_bucket(m: int) -> int | None:
    """Smallest bucket holding m rows, or None when m is beyond the skinny range."""
    return next((b for b in M_BUCKETS if m <= b), None)


# A weight up to this fraction wider or narrower than a measured one (same K) uses its entry:
# fusing a few extra rows into a projection (e.g. GDN's 96 gate rows) must not lose its tile.
NEAR_N = 0.01


def _nearest(
    table: MappingProxyType[TableKey, Tile], bucket: int, n: int, k: int, name: str
) -> tuple[bool, Tile | None]:
    """(found, entry) for the measured shape nearest in N, within NEAR_N, at the same K."""
    if (bucket, n, k, name) in table:
        return True, table[(bucket, n, k, name)]
    near = [key for key in table if key[0] == bucket and key[2] == k and key[3] == name]
    near = [key for key in near if abs(key[1] - n) <= NEAR_N * key[1]]
    if not near:
        return False, None
    return True, table[min(near, key=lambda key: abs(key[1] - n))]


@functools.cache  # the table is fixed, and eager steps ask once per linear call
def _entry(bucket: int, n: int, k: int, name: str) -> tuple[bool, SkinnyGemmConfig | None]:
    return _nearest(TABLE, bucket, n, k, name)


@functools.cache
def decode_entry(n: int, k: int, dtype: torch.dtype) -> SkinnyGemmConfig | None:
    """The skinny tile measured best for one row of an [N, K] weight, None where none is kept
    (cuBLAS won before the skinny tile was timed)."""
    return _nearest(SKINNY_TILES, 1, n, k, str(dtype).removeprefix("torch."))[1]


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


@functools.cache
def gemv_lookup(n: int, k: int, dtype: torch.dtype) -> GemvConfig | None:
    """The GEMV tile for one row of an [N, K] weight where the GEMV won, else None."""
    return _nearest(GEMV_TABLE, 1, n, k, str(dtype).removeprefix("torch."))[1]


def use_table(path: str | None) -> None:
    """Make the table file at `path` (None: the committed `shape_table.json`) the dispatcher's for
    later calls, so a benchmark can run the engine with several tables in one process. CUDA graphs
    captured before keep the kernels they captured."""
    global TABLE, SKINNY_TILES, GEMV_TABLE
    entries = _load_entries(path)
    TABLE = _load_table(entries)
    SKINNY_TILES = _load_table(entries, winners_only=False)
    GEMV_TABLE = _load_gemv_table(entries)
    for cached in (_entry, decode_entry, gemv_lookup):
        cached.cache_clear()
