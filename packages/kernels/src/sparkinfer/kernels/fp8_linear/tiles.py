"""Per-shape tiles of the FP8 decode kernels (GEMV, decode GEMM, swap-AB GEMM): the one table
`fp8_linear` reads.

Keyed on N and K ranges rather than exact shapes, so a fused projection a few rows wider keeps
its entry. Wide projections (many output rows) have programs enough and take plain tiles; the
narrow ones (the down and out projections) split K so every SM streams. The tiles are the best
of `sparkinfer.lab.kernels.fp8_linear_tune`'s sweep on an H200, which prints each shape's entry
beside its best candidates; the first matching rule wins, and the last rule of each table
matches every shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from sparkinfer.kernels.fp8_linear.decode import Fp8DecodeConfig
from sparkinfer.kernels.fp8_linear.gemv import Fp8GemvConfig
from sparkinfer.kernels.fp8_linear.swap_ab import Fp8SwapAbConfig

NARROW_N = 8192  # at most this many weight rows: too few programs without a K split
WIDE_N = 24576  # more weight rows than this: the one-row GEMV streams best in wider tiles
Tile = TypeVar("Tile", Fp8GemvConfig, Fp8DecodeConfig, Fp8SwapAbConfig)


@dataclass(frozen=True)
class TileRule(Generic[Tile]):
    """Use `tile` for weights of at most max_n rows and at least min_k columns, for batches of at
    most max_rows rows."""

    tile: Tile
    max_n: int | None = None
    min_k: int = 0
    max_rows: int | None = None

    def matches(self, m: int, n: int, k: int) -> bool:
        return (
            (self.max_n is None or n <= self.max_n)
            and k >= self.min_k
            and (self.max_rows is None or m <= self.max_rows)
        )


GEMV_TILES: tuple[TileRule[Fp8GemvConfig], ...] = (
    TileRule(Fp8GemvConfig(BN=32, BK=256, SPLIT_K=4), max_n=NARROW_N),
    TileRule(Fp8GemvConfig(BN=16, BK=256), max_n=WIDE_N),
    TileRule(Fp8GemvConfig(BN=32, BK=256)),
)
DECODE_TILES: tuple[TileRule[Fp8DecodeConfig], ...] = (
    TileRule(
        Fp8DecodeConfig(BN=32, BK=128, num_stages=5, SPLIT_K=4, BF16_BITS=True),
        max_n=NARROW_N,
        max_rows=16,
    ),
    TileRule(Fp8DecodeConfig(BN=64, BK=128, num_stages=4, SPLIT_K=4), max_n=NARROW_N),
    TileRule(Fp8DecodeConfig(BN=32, BK=128, num_stages=4, BF16_BITS=True), max_rows=16),
    TileRule(Fp8DecodeConfig(BN=64, BK=128, num_stages=4)),
)
SWAP_AB_TILES: tuple[TileRule[Fp8SwapAbConfig], ...] = (
    TileRule(Fp8SwapAbConfig(BN=64, num_stages=3, SPLIT_K=8), max_n=NARROW_N, max_rows=16),
    TileRule(Fp8SwapAbConfig(BN=64, num_stages=3, SPLIT_K=2), max_n=WIDE_N, max_rows=16),
    TileRule(Fp8SwapAbConfig(BN=64, num_stages=3), max_rows=16),
    # 32 and 64 rows: x quantized once before the launch (in registers the work grows with BM)
    TileRule(Fp8SwapAbConfig(BN=64, num_stages=3, SPLIT_K=8, PREQUANTIZE=True), max_n=NARROW_N),
    TileRule(Fp8SwapAbConfig(BN=64, num_stages=3, SPLIT_K=2, PREQUANTIZE=True), max_n=WIDE_N),
    TileRule(Fp8SwapAbConfig(BN=64, num_stages=3, PREQUANTIZE=True)),
)


def _first(rules: tuple[TileRule[Tile], ...], m: int, n: int, k: int) -> Tile:
    return next(r.tile for r in rules if r.matches(m, n, k))


def gemv_tile(n: int, k: int) -> Fp8GemvConfig:
    """The GEMV tile for a one-row product with an [N, K] weight."""
    return _first(GEMV_TILES, 1, n, k)


def decode_tile(m: int, n: int, k: int) -> Fp8DecodeConfig:
    """The decode GEMM tile for M rows against an [N, K] weight."""
    return _first(DECODE_TILES, m, n, k)


def swap_ab_tile(m: int, n: int, k: int) -> Fp8SwapAbConfig:
    """The swap-AB GEMM tile for M rows against an [N, K] weight."""
    return _first(SWAP_AB_TILES, m, n, k)
