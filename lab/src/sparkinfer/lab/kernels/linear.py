"""Decode-shaped linear benchmark: the dispatcher (Triton skinny GEMM, one-row GEMV or cuBLAS) vs
cuBLAS (torch.matmul) at 27B shapes.

Rows report bandwidth as a fraction of this run's copy bandwidth (weights dominate the bytes).
`--tune` sweeps skinny-GEMM tiles per shape, keeps the faster of the best tile and cuBLAS, and
writes the dispatcher's table (`sparkinfer/kernels/linear/shape_table.json`); `--tune-gemv
TABLE` then sweeps GEMV tiles for that table's one-row entries at the model's shapes and makes
the GEMV the entry's kernel where it beats both. Run alone:
``python -m sparkinfer.lab.kernels.linear [--quick] [--tune OUT.json [--tune-gemv TABLE]]``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from sparkinfer.bench.timing import Timing
from sparkinfer.kernels.activation import silu_and_mul
from sparkinfer.kernels.linear import (
    GemvConfig,
    SkinnyGemmConfig,
    gemv,
    linear,
    linear_ref,
    skinny_gemm,
)
from sparkinfer.kernels.rms_norm import rms_norm
from sparkinfer.lab.kernels import KernelBenchArgs
from sparkinfer.lab.kernels._cli import run_alone, standalone_parser
from sparkinfer.lab.kernels._graph_timing import (
    COPY_PEER,
    bandwidth_row,
    copy_bandwidth,
    rotation_copies,
    same_bytes_copies,
    time_graph,
)

HIDDEN, INTERMEDIATE, Q_WIDTH, VOCAB = 5120, 17408, 6144, 248320
# (N, K) of every decode matmul of Qwen3.8-27B, fused where the model fuses them.
SHAPES = (
    (10240, HIDDEN),  # GDN in_proj_qkv
    (6144, HIDDEN),  # GDN in_proj_z
    (16384, HIDDEN),  # GDN in_proj_qkv + in_proj_z
    (16480, HIDDEN),  # GDN in_proj: qkv + z + b + a
    (12288, HIDDEN),  # attention q_proj (query and gate)
    (14336, HIDDEN),  # q_proj + k_proj + v_proj
    (1024, HIDDEN),  # k_proj, v_proj
    (2 * INTERMEDIATE, HIDDEN),  # gate_proj + up_proj
    (HIDDEN, INTERMEDIATE),  # down_proj
    (HIDDEN, Q_WIDTH),  # o_proj, GDN out_proj
    (VOCAB, HIDDEN),  # lm_head
)
BENCH_SHAPES = ((16480, HIDDEN), (14336, HIDDEN), (2 * INTERMEDIATE, HIDDEN),
                (HIDDEN, INTERMEDIATE), (HIDDEN, Q_WIDTH))  # fmt: skip
# The table's entries the model runs at decode (GDN's in_proj is its 16384-row entry, within 1%).
MODEL_SHAPES = frozenset(BENCH_SHAPES) | {(16384, HIDDEN), (VOCAB, HIDDEN)}
BATCHES = (1, 8, 32)
TMA_ROWS = (8, 16, 32)  # row buckets `--retune-tma` times by default: the goals' decode batches
TUNE_BATCHES = (1, 8, 16, 32, 64)

Row = dict[str, Any]
Timer = Callable[[Callable[..., Any], Any], float]  # (kernel, operands) -> median us


def _operands(m: int, n: int, k: int, device: torch.device) -> list[tuple[torch.Tensor, ...]]:
    copies = rotation_copies(2 * n * k)
    return [
        (torch.randn(m, k, device=device, dtype=torch.bfloat16),
         torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02)
        for _ in range(copies)
    ]  # fmt: skip


def _producer(x0: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """The small kernel the model runs before a projection of x0's width, as x -> its output: the
    SwiGLU that makes down_proj's input, else an RMSNorm of x."""
    if x0.shape[1] == INTERMEDIATE:
        gate_up = torch.randn(x0.shape[0], 2 * INTERMEDIATE, device=x0.device, dtype=x0.dtype)
        return lambda x: silu_and_mul(gate_up)
    norm_w = torch.zeros(x0.shape[1], device=x0.device, dtype=x0.dtype)
    return lambda x: rms_norm(x, norm_w, 1e-6)[0]


def _time(fn, operands, args_warmup: int, iters: int, *, after_norm: bool = False):
    """Median time of fn(x, w) over the rotated operands; with after_norm, of the small kernel
    the model runs before the projection (`_producer`) then fn on its output: dependent launch
    overlaps the Triton kernels with the kernel before them, not cuBLAS's."""
    produce = _producer(operands[0][0]) if after_norm else (lambda x: x)
    calls = [lambda x=x, w=w: fn(produce(x), w) for x, w in operands]
    return time_graph(calls, warmup=args_warmup, iters=iters)


def _marginal(fn, operands, producer: Timing, warmup: int, iters: int) -> Timing:
    """What fn adds to a step after its producer kernel: the pair's time less the producer's."""
    pair = _time(fn, operands, warmup, iters, after_norm=True)
    return Timing(pair.median_ms - producer.median_ms, pair.p90_ms - producer.median_ms, iters)


def _candidates(m: int, n: int, k: int) -> list[SkinnyGemmConfig]:
    """Tiles worth trying: enough programs to fill 132 SMs, pipelines that fit shared memory.
    The weight-first form (SWAP_AB) gets the wide tiles its 64-row dot side wants, and may run
    a few programs short of a full wave (one 128-row tile per SM at 14336-16480 rows won).
    Three and six K slices spread the 5120-row projections' 40-80 tiles more evenly over 132
    SMs than powers of two do (6144 is 3 x 2048)."""
    bm = max(16, min(64, 1 << (m - 1).bit_length()))
    x_first = itertools.product((16, 32, 64), (128, 256), (1, 2, 3, 4, 6, 8), (3, 4))
    weight_first = itertools.product((64, 128), (1, 2, 3, 4, 6), (3, 4, 5))
    grid = [(False, bn, bk, split_k, stages, 132) for bn, bk, split_k, stages in x_first]
    grid += [(True, bn, 128, split_k, stages, 100) for bn, split_k, stages in weight_first]
    out = []
    for swap_ab, bn, bk, split_k, stages, min_programs in grid:
        programs = -(-n // bn) * split_k
        smem = (bm + bn) * bk * 2 * stages
        if not min_programs <= programs <= 2048 or k // split_k < 2 * bk or smem > 160 * 1024:
            continue
        out.append(SkinnyGemmConfig(BN=bn, BK=bk, SPLIT_K=split_k, num_warps=4,
                                    num_stages=stages, SWAP_AB=swap_ab))  # fmt: skip
    return out


def tune(
    device: torch.device,
    *,
    warmup: int = 3,
    iters: int = 10,
    keys: Sequence[tuple[int, int, int]] | None = None,
    after_norm: bool = False,
) -> list[Row]:
    """Best skinny-GEMM tile per (M, N, K) against cuBLAS: the dispatcher's table entries; every
    shape at every tuned batch, or the given (M, N, K) keys. With after_norm every candidate is
    timed after the kernel the model runs before it (see `_time`) and the entry says so
    ("timed": "after_norm")."""
    entries = []
    if keys is None:
        keys = [(m, n, k) for (n, k), m in itertools.product(SHAPES, TUNE_BATCHES)]
    for m, n, k in keys:
        operands = _operands(m, n, k, device)
        cublas_ms = _time(_cublas, operands, warmup, iters, after_norm=after_norm).median_ms
        best, best_ms = None, float("inf")
        for cfg in _candidates(m, n, k):
            try:
                t = _time(lambda x, w, c=cfg: skinny_gemm(x, w, c), operands, warmup, iters,
                          after_norm=after_norm)  # fmt: skip
            except Exception as e:  # a tile that does not fit this GPU is skipped
                print(f"skip {cfg}: {type(e).__name__}", flush=True)
                continue
            ms = t.median_ms
            if ms < best_ms:
                best, best_ms = cfg, ms
        impl = "triton" if best is not None and best_ms < cublas_ms else "cublas"
        entry = {"m": m, "n": n, "k": k, "dtype": "bfloat16", "impl": impl,
                 "triton_us": round(best_ms * 1e3, 2),
                 "cublas_us": round(cublas_ms * 1e3, 2)}  # fmt: skip
        if impl == "triton":
            entry["config"] = best.__dict__
        if after_norm:
            entry["timed"] = "after_norm"
        print(json.dumps(entry), flush=True)
        entries.append(entry)
        del operands
    return entries


def _cublas(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The dispatcher's own cuBLAS call (matmul with w.t() can pick other, slower kernels)."""
    return F.linear(x, w)


def bench(device: torch.device, *, warmup: int, iters: int, is_quick: bool) -> list[Row]:
    """Each decode shape at each batch: the dispatcher's kernel and cuBLAS, and a copy moving
    the same bytes (what a kernel of that size reaches at best), as fractions of the copy rate.

    Each kernel runs twice: back to back with itself, and after the kernel the model runs before
    the projection ("after its producer": what the projection adds to that pair's time, the
    context the dispatcher's table was tuned in, where dependent launch overlaps a Triton
    kernel's weight reads with the kernel ahead)."""
    copy = copy_bandwidth(device)
    rows = []
    shapes = BENCH_SHAPES[:2] if is_quick else BENCH_SHAPES
    for (n, k), m in itertools.product(shapes, BATCHES):
        operands = _operands(m, n, k, device)
        x, w = operands[0]
        err = (linear(x, w).float() - linear_ref(x, w).float()).abs().max().item()
        nbytes = 2 * (n * k + m * k + m * n)
        impls = {"fast": linear, "cublas": _cublas}
        times = {name: _time(fn, operands, warmup, iters) for name, fn in impls.items()}
        copies = same_bytes_copies(nbytes, len(operands), device)
        times[COPY_PEER] = time_graph(copies, warmup=warmup, iters=iters)
        del copies
        produce = _producer(x)
        calls = [lambda x=x, p=produce: p(x) for x, _ in operands]
        producer = time_graph(calls, warmup=warmup, iters=iters)
        for name, fn in impls.items():
            times[f"{name}, after its producer"] = _marginal(fn, operands, producer, warmup, iters)
        for name, t in times.items():
            peer = "cublas, after its producer" if "after its producer" in name else "cublas"
            extra = {
                "vs_cublas": times[peer].median_ms / t.median_ms,
                "max_abs_err": err if name == "fast" else None,
            }
            shape = f"M={m} N={n} K={k}"
            rows.append(
                bandwidth_row("linear", name, shape, t, nbytes=nbytes, copy=copy, extra=extra)
            )
        del operands
    return rows


def run(args: KernelBenchArgs) -> list[Row]:
    """`sparkinfer-lab kernels` entry point."""
    return bench(args.device, warmup=args.warmup, iters=args.iters, is_quick=args.is_quick)


def main() -> None:
    parser = standalone_parser(__doc__, warmup=5, iters=20)
    parser.add_argument("--tune", metavar="OUT_JSON", help="sweep tiles and write the shape table")
    parser.add_argument(
        "--tune-gemv",
        metavar="TABLE_JSON",
        help="with --tune: sweep GEMV tiles for this table's one-row entries at the model's shapes",
    )
    parser.add_argument(
        "--retune-cublas",
        metavar="TABLE_JSON",
        help="with --tune: sweep only the model's shapes where this table chose cuBLAS",
    )
    parser.add_argument(
        "--retune-rows",
        metavar="TABLE_JSON",
        help="with --tune: sweep the model's shapes at every row bucket above one again",
    )
    parser.add_argument(
        "--retune-tma",
        metavar="TABLE_JSON",
        help="with --tune: time descriptor (TMA) tiles against each multi-row entry's kernel at "
        "the model's shapes, and take the faster",
    )
    parser.add_argument(
        "--after-norm",
        action="store_true",
        help="with --tune-gemv or a re-tune: time every candidate after the small kernel the model "
        "runs before the projection (RMSNorm, or SwiGLU for down_proj)",
    )
    parser.add_argument(
        "--rows",
        type=lambda s: tuple(int(v) for v in s.split(",")),
        default=TMA_ROWS,
        help="with --retune-tma: the row buckets to time, comma-separated (default "
        f"{','.join(map(str, TMA_ROWS))})",
    )
    cli = parser.parse_args()
    if not cli.tune:
        run_alone(run, cli, __doc__)
        return
    device = torch.device("cuda")
    if cli.tune_gemv is not None:
        table = _tune_gemv(cli.tune_gemv, device, after_norm=cli.after_norm)
    elif cli.retune_cublas is not None:
        table = _retune(
            cli.retune_cublas, device, lambda e: e["impl"] == "cublas", after_norm=cli.after_norm
        )
    elif cli.retune_tma is not None:
        table = _retune_tma(cli.retune_tma, device, rows=cli.rows, after_norm=cli.after_norm)
    elif cli.retune_rows is not None:
        table = _retune(cli.retune_rows, device, lambda e: e["m"] > 1, after_norm=cli.after_norm)
    else:
        table = {"device": torch.cuda.get_device_name(device), "entries": tune(device)}
    with open(cli.tune, "w") as f:
        json.dump(table, f, indent=1)


def _read_table(table_path: str) -> dict[str, Any]:
    with open(table_path) as f:
        return json.load(f)


def _retune(
    table_path: str,
    device: torch.device,
    select: Callable[[dict[str, Any]], bool],
    *,
    after_norm: bool = False,
) -> dict[str, Any]:
    """The table at `table_path` with its selected entries at the model's decode shapes tuned
    again (after a change to the Triton kernels); every other entry is kept."""
    table = _read_table(table_path)
    keys = [(e["m"], e["n"], e["k"]) for e in table["entries"]
            if select(e) and (e["n"], e["k"]) in MODEL_SHAPES]  # fmt: skip
    fresh = {(e["m"], e["n"], e["k"]): e
             for e in tune(device, keys=keys, after_norm=after_norm)}  # fmt: skip
    table["entries"] = [fresh.get((e["m"], e["n"], e["k"]), e) for e in table["entries"]]
    return table


def _tma_candidates(m: int, n: int, k: int) -> list[SkinnyGemmConfig]:
    """Weight-first descriptor tiles: 64 or 128 weight rows, 128 or 256 K columns, pipelines
    that fit the H200's shared memory, at least 80 programs."""
    bm = max(16, min(64, 1 << (m - 1).bit_length()))
    out = []
    for bn, bk, split_k, stages in itertools.product((64, 128), (128, 256), (1, 2, 3, 4, 6),
                                                     (3, 4, 6)):  # fmt: skip
        programs = -(-n // bn) * split_k
        if programs < 80 or k // split_k < 2 * bk or (bm + bn) * bk * 2 * stages > 200 * 1024:
            continue
        out.append(SkinnyGemmConfig(BN=bn, BK=bk, SPLIT_K=split_k, num_warps=4,
                                    num_stages=stages, SWAP_AB=True, TMA=True))  # fmt: skip
    return out


def _retune_tma(
    table_path: str,
    device: torch.device,
    *,
    rows: Sequence[int] = TMA_ROWS,
    after_norm: bool = False,
) -> dict[str, Any]:
    """The table at `table_path` with each entry of the `rows` buckets at the model's shapes
    timed again (its kernel and cuBLAS) against the best descriptor tile, which becomes the
    entry's kernel where it beats both in this run. Every other entry is kept."""
    return _retime_entries(table_path, device, lambda e: e["m"] in rows, _tma_challenge,
                           after_norm=after_norm)  # fmt: skip


def _tma_challenge(e: dict[str, Any], operands, timed_us: Timer) -> None:
    timed = []
    for c in _tma_candidates(e["m"], e["n"], e["k"]):
        try:
            timed.append((timed_us(lambda x, w, c=c: skinny_gemm(x, w, c), operands), c))
        except Exception as err:  # a tile that does not fit this GPU is skipped
            print(f"skip {c}: {type(err).__name__}", flush=True)
    e["tma_us"], best = min(timed, key=lambda r: r[0])
    others = [e["cublas_us"]] + ([e["triton_us"]] if "config" in e else [])
    if e["tma_us"] < min(others):
        e["impl"], e["config"], e["triton_us"] = "triton", best.__dict__, e["tma_us"]
    elif "config" not in e or e["triton_us"] >= e["cublas_us"]:
        e["impl"] = "cublas"


def _retime_entries(
    table_path: str,
    device: torch.device,
    select: Callable[[dict[str, Any]], bool],
    challenge: Callable[[dict[str, Any], Any, Timer], None],
    *,
    warmup: int = 3,
    iters: int = 10,
    after_norm: bool = False,
) -> dict[str, Any]:
    """The table at `table_path` with each selected entry at the model's shapes timed again:
    cuBLAS and the entry's skinny tile, then `challenge(entry, operands, timed_us)` times its
    candidates and sets the entry's kernel. With after_norm every kernel is timed after the one
    the model runs before it (see `_time`). Every other entry is kept."""
    table = _read_table(table_path)

    def timed_us(fn, operands) -> float:
        t = _time(fn, operands, warmup, iters, after_norm=after_norm)
        return round(t.median_ms * 1e3, 2)

    for e in table["entries"]:
        if not select(e) or (e["n"], e["k"]) not in MODEL_SHAPES:
            continue
        operands = _operands(e["m"], e["n"], e["k"], device)
        e["cublas_us"] = timed_us(_cublas, operands)
        if "config" in e:
            tile = SkinnyGemmConfig(**e["config"])
            e["triton_us"] = timed_us(lambda x, w, c=tile: skinny_gemm(x, w, c), operands)
        challenge(e, operands, timed_us)
        e.pop("chosen_by", None)  # this run's times decide now
        if after_norm:
            e["timed"] = "after_norm"
        print(json.dumps(e), flush=True)
        del operands
    return table


def _gemv_candidates() -> list[GemvConfig]:
    """GEMV tiles worth trying: 2K-8K weight elements per tile, a few pipeline depths."""
    return [
        GemvConfig(BN=bn, BK=bk, num_warps=warps, num_stages=stages)
        for bn, bk, warps, stages in itertools.product((8, 16, 32), (256, 512), (4, 8), (2, 3, 4))
        if bn * bk <= 8192
    ]


def _tune_gemv(table_path: str, device: torch.device, *, after_norm: bool = False):
    """The table at `table_path` with each one-row entry at the model's shapes timed again
    against the best GEMV tile; the GEMV becomes the entry's kernel where it beats both the
    skinny tile and cuBLAS in this run. Every other entry is kept."""
    return _retime_entries(table_path, device, lambda e: e["m"] == 1, _gemv_challenge,
                           after_norm=after_norm)  # fmt: skip


def _gemv_challenge(e: dict[str, Any], operands, timed_us: Timer) -> None:
    timed = [(timed_us(lambda x, w, c=c: gemv(x, w, c), operands), c) for c in _gemv_candidates()]
    e["gemv_us"], best = min(timed, key=lambda r: r[0])
    others = [e["cublas_us"]] + ([e["triton_us"]] if "config" in e else [])
    if e["gemv_us"] < min(others):
        e["impl"], e["gemv"] = "gemv", best.__dict__
    else:
        e["impl"] = "triton" if "config" in e and e["triton_us"] < e["cublas_us"] else "cublas"
        e.pop("gemv", None)


if __name__ == "__main__":
    main()
