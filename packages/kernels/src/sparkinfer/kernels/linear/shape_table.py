"""The measured shape table: (M bucket, N, K, dtype) -> the skinny-GEMM tile that beat cuBLAS,
and for one row the GEMV tile where the GEMV beat both.

`shape_table.json` (committed data, written by `sparkinfer.lab.kernels.linear --tune`) holds,
per shape, the winner ("impl": triton, cublas or gemv) and its tile config on the GPU it names.
"config" is the skinny tile measured best (kept in gemv and cublas entries re-timed by
`--tune-gemv`: the batch-invariant decode mode runs the one-row tile), "gemv" the GEMV tile of a
one-row gemv entry.

A `ShapeTable` is one table file, frozen. The dispatcher reads the table of the current
`tuning.KernelTuning` (`current_table`): the committed one unless a caller passes another (a
benchmark comparing tables in the engine), so no table is ever swapped under a running process.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

import torch
from sparkinfer.kernels.linear.gemv import GemvConfig
from sparkinfer.kernels.linear.skinny_gemm import SkinnyGemmConfig
from sparkinfer.kernels.tuning import current_tuning

M_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
TABLE_FILE = "shape_table.json"
# A weight up to this fraction wider or narrower than a measured one (same K) uses its entry:
# fusing a few extra rows into a projection (e.g. GDN's 96 gate rows) must not lose its tile.
NEAR_N = 0.01

TableKey = tuple[int, int, int, str]
Tile = TypeVar("Tile")  # a table's value: skinny tile (or None) or GEMV tile


def _load_entries(path: str | Path | None = None) -> list[dict[str, Any]]:
    """The entries of the table file at `path`, or of the committed table (absent: none)."""
    if path is not None:
        return json.loads(Path(path).read_text())["entries"]
    committed = resources.files("sparkinfer.kernels.linear") / TABLE_FILE
    return json.loads(committed.read_text())["entries"] if committed.is_file() else []


def _load_table(
    entries: list[dict[str, Any]], *, winners_only: bool = True
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


def _load_gemv_table(entries: list[dict[str, Any]]) -> MappingProxyType[TableKey, GemvConfig]:
    """(1, N, K, dtype name) -> GEMV tile, for the one-row shapes the GEMV won."""
    return MappingProxyType({
        (e["m"], e["n"], e["k"], e["dtype"]): GemvConfig(**e["gemv"])
        for e in entries if e["impl"] == "gemv" and e["m"] == 1
    })  # fmt: skip


def m_bucket(m: int) -> int | None:
    """Smallest bucket holding m rows, or None when m is beyond the skinny range."""
    return next((b for b in M_BUCKETS if m <= b), None)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _nearest(
    table: Mapping[TableKey, Tile], bucket: int, n: int, k: int, name: str
) -> tuple[bool, Tile | None]:
    """(found, entry) for the measured shape nearest in N, within NEAR_N, at the same K."""
    if (bucket, n, k, name) in table:
        return True, table[(bucket, n, k, name)]
    near = [key for key in table if key[0] == bucket and key[2] == k and key[3] == name]
    near = [key for key in near if abs(key[1] - n) <= NEAR_N * key[1]]
    if not near:
        return False, None
    return True, table[min(near, key=lambda key: abs(key[1] - n))]


@dataclass(frozen=True, eq=False)
class ShapeTable:
    """One table file's tiles. skinny: the winners (None where cuBLAS won); skinny_tiles: every
    kept skinny tile (the batch-invariant decode tiles); gemv: the one-row GEMV winners.

    Lookups are memoised per table: the table never changes, and eager steps ask once per
    linear call.
    """

    skinny: Mapping[TableKey, SkinnyGemmConfig | None]
    skinny_tiles: Mapping[TableKey, SkinnyGemmConfig | None]
    gemv: Mapping[TableKey, GemvConfig]
    source: str = "committed"
    _memo: dict[tuple[object, ...], Any] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def load(cls, path: str | Path | None = None) -> ShapeTable:
        """The table file at `path` (None: the committed `shape_table.json`)."""
        entries = _load_entries(path)
        return cls(
            skinny=_load_table(entries),
            skinny_tiles=_load_table(entries, winners_only=False),
            gemv=_load_gemv_table(entries),
            source="committed" if path is None else str(path),
        )

    def __repr__(self) -> str:
        return f"ShapeTable({self.source!r}, {len(self.skinny)} entries)"

    def lookup(self, m: int, n: int, k: int, dtype: torch.dtype) -> SkinnyGemmConfig | None:
        """The Triton config the table chose for this shape, or None to use cuBLAS."""
        key = ("lookup", m_bucket(m), n, k, dtype)
        if key not in self._memo:
            self._memo[key] = self._lookup(m, n, k, _dtype_name(dtype))
        return self._memo[key]

    def _lookup(self, m: int, n: int, k: int, name: str) -> SkinnyGemmConfig | None:
        bucket = m_bucket(m)
        if bucket is None:
            return None
        # Buckets the table lacks fall back to the next measured bucket up.
        for b in M_BUCKETS[M_BUCKETS.index(bucket) :]:
            found, config = _nearest(self.skinny, b, n, k, name)
            if found:
                return config
        return None

    def decode_entry(self, n: int, k: int, dtype: torch.dtype) -> SkinnyGemmConfig | None:
        """The skinny tile measured best for one row of an [N, K] weight, None where none is kept
        (cuBLAS won before the skinny tile was timed)."""
        key = ("decode", n, k, dtype)
        if key not in self._memo:
            self._memo[key] = _nearest(self.skinny_tiles, 1, n, k, _dtype_name(dtype))[1]
        return self._memo[key]

    def gemv_lookup(self, n: int, k: int, dtype: torch.dtype) -> GemvConfig | None:
        """The GEMV tile for one row of an [N, K] weight where the GEMV won, else None."""
        key = ("gemv", n, k, dtype)
        if key not in self._memo:
            self._memo[key] = _nearest(self.gemv, 1, n, k, _dtype_name(dtype))[1]
        return self._memo[key]


COMMITTED = ShapeTable.load()
# The committed table's maps, for tests and tools that read it directly.
TABLE, SKINNY_TILES, GEMV_TABLE = COMMITTED.skinny, COMMITTED.skinny_tiles, COMMITTED.gemv


def current_table() -> ShapeTable:
    """The table of the current `KernelTuning` (the committed one unless it names another)."""
    table = current_tuning().shape_table
    return COMMITTED if table is None else table


def lookup(m: int, n: int, k: int, dtype: torch.dtype) -> SkinnyGemmConfig | None:
    """`ShapeTable.lookup` on the current table."""
    return current_table().lookup(m, n, k, dtype)


def decode_entry(n: int, k: int, dtype: torch.dtype) -> SkinnyGemmConfig | None:
    """`ShapeTable.decode_entry` on the current table."""
    return current_table().decode_entry(n, k, dtype)


def gemv_lookup(n: int, k: int, dtype: torch.dtype) -> GemvConfig | None:
    """`ShapeTable.gemv_lookup` on the current table."""
    return current_table().gemv_lookup(n, k, dtype)
