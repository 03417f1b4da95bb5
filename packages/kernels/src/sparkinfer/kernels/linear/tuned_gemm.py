"""`TunedGemms`: for a prompt's GEMMs, the fastest of cuBLAS's own candidates, timed on this GPU.

torch's `F.linear` runs the first algorithm cuBLAS's heuristic ranks. At the 27B model's prompt
shapes another of its first eight ran up to 1.09x as fast at 4,096 rows and 1.16x at 8,192
(docs/benchmarks.md). `tune` times the candidates once per weight shape and row bucket (powers of
two from `min_rows`) and keeps a candidate only when its output equals `F.linear`'s bit for bit:
the choice changes speed, never numbers, so greedy output stays the same from run to run
whichever candidate a run's timing picks.

A call with M rows takes the choice of the smallest bucket >= M; fewer rows than `min_rows`,
shapes or buckets not tuned, CPU tensors and batch-invariant phases go to `linear`.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from sparkinfer.kernels.activation import silu_and_mul
from sparkinfer.kernels.linear.cublaslt import WORKSPACE_BYTES, LtAlgo, LtMatmul
from sparkinfer.kernels.linear.dispatch import linear, linear_swiglu
from sparkinfer.kernels.linear.invariant import current_phase

logger = logging.getLogger(__name__)

NUM_CANDIDATES = 8
# The heuristic plans for operands aligned to 256 bytes (its default); views that start elsewhere
# (a slice of rows) go to `linear`.
ALIGNMENT = 256
MAX_PLANS = 4096  # descriptors kept for distinct (rows, N, K); a prompt step makes a handful


@dataclass(frozen=True)
class Tuning:
    """What `tune` measured for one shape: F.linear's time and the chosen candidate's."""

    rows: int
    n: int
    k: int
    linear_ms: float
    best_ms: float
    algo: LtAlgo | None  # None: F.linear was fastest (or no candidate matched its bits)


class TunedGemms:
    """The measured choice per (row bucket, N, K, dtype) and the workspace its launches share."""

    def __init__(self, device: torch.device, *, min_rows: int = 1024) -> None:
        if min_rows < 1:
            raise ValueError(f"min_rows is {min_rows}; it must be >= 1")
        self.device = device
        self.min_rows = min_rows
        self._choices: dict[tuple[int, int, int, torch.dtype], LtAlgo] = {}
        self._buckets: list[int] = []
        self._plans: dict[tuple[int, int, int, torch.dtype], LtMatmul] = {}
        self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)

    def row_buckets(self, max_rows: int) -> list[int]:
        """Powers of two from min_rows below max_rows, then max_rows itself."""
        buckets, rows = [], self.min_rows
        while rows < max_rows:
            buckets.append(rows)
            rows *= 2
        return [*buckets, max_rows] if max_rows >= self.min_rows else []

    def tune(
        self, shapes: Iterable[tuple[int, int]], *, max_rows: int, dtype: torch.dtype,
        iters: int = 10,
    ) -> list[Tuning]:  # fmt: skip
        """Time F.linear and the heuristic's candidates for each weight shape (N, K) at each row
        bucket up to max_rows; keep the fastest candidate that matches F.linear bit for bit."""
        results = []
        shapes = sorted(set(shapes))
        for rows in self.row_buckets(max_rows):
            for n, k in shapes:
                results.append(self._tune_one(rows, n, k, dtype, iters))
                logger.info(
                    "tuned GEMM %d x %d x %d: F.linear %.3f ms, best %.3f ms",
                    rows, n, k, results[-1].linear_ms, results[-1].best_ms,
                )  # fmt: skip
            self._buckets = sorted({*self._buckets, rows})
        return results

    def _tune_one(self, rows: int, n: int, k: int, dtype: torch.dtype, iters: int) -> Tuning:
        x = torch.randn(rows, k, device=self.device, dtype=dtype)
        w = torch.randn(n, k, device=self.device, dtype=dtype) * 0.02
        out = torch.empty(rows, n, device=self.device, dtype=dtype)
        expected = F.linear(x, w)
        linear_ms = _time(lambda: F.linear(x, w), iters)
        plan = LtMatmul(rows, n, k, dtype)
        best: tuple[float, LtAlgo | None] = (linear_ms, None)
        for algo in plan.algos(NUM_CANDIDATES):
            if dict(algo.config).get("splitk", 1) > 1 or algo.workspace_bytes > WORKSPACE_BYTES:
                continue  # split-K sums in another order: other bits
            plan(x, w, out, algo, self._workspace)
            if not torch.equal(out, expected):
                continue
            ms = _time(lambda a=algo: plan(x, w, out, a, self._workspace), iters)
            best = min(best, (ms, algo), key=lambda b: b[0])
        if best[1] is not None:
            self._choices[(rows, n, k, dtype)] = best[1]
        return Tuning(rows, n, k, linear_ms, best[0], best[1])

    def choice(self, rows: int, n: int, k: int, dtype: torch.dtype) -> LtAlgo | None:
        """The tuned candidate for a call of `rows` rows, or None where `linear` runs it."""
        if rows < self.min_rows:
            return None
        bucket = next((b for b in self._buckets if b >= rows), None)
        return None if bucket is None else self._choices.get((bucket, n, k, dtype))

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """`linear`'s result, by the tuned candidate where one was chosen for the shape."""
        algo = self._algo_for(x, weight)
        if algo is None:
            return linear(x, weight)
        (m, k), n = x.shape, weight.shape[0]
        key = (m, n, k, x.dtype)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= MAX_PLANS:
                self._plans.clear()
            plan = self._plans[key] = LtMatmul(m, n, k, x.dtype)
        return plan(x, weight, x.new_empty(m, n), algo, self._workspace)

    def linear_swiglu(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """`linear_swiglu`'s result: the tuned GEMM then `silu_and_mul` for many rows."""
        if self._algo_for(x, weight) is None:
            return linear_swiglu(x, weight)
        return silu_and_mul(self.linear(x, weight))

    def _algo_for(self, x: torch.Tensor, weight: torch.Tensor) -> LtAlgo | None:
        is_plain = (
            x.is_cuda and x.dim() == 2 and weight.dim() == 2 and x.dtype == weight.dtype
            and x.is_contiguous() and weight.is_contiguous() and current_phase() is None
            and x.data_ptr() % ALIGNMENT == 0 and weight.data_ptr() % ALIGNMENT == 0
        )  # fmt: skip
        if not is_plain:
            return None
        return self.choice(x.shape[0], weight.shape[0], weight.shape[1], x.dtype)


def _time(call, iters: int) -> float:
    """Median ms of one call, each of `iters` timed calls queued behind the one before."""
    for _ in range(2):
        call()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    events[0].record()
    for end in events[1:]:
        call()
        end.record()
    torch.cuda.synchronize()
    times = sorted(a.elapsed_time(b) for a, b in itertools.pairwise(events))
    return times[len(times) // 2]
