"""The FP8 benchmark's printed table (`fp8_linear`): one line per projection and row count, a
summary per row count over the five projections with the fastest route per row bucket (as an
`FP8_ROUTES` literal), and the norm before the in-projections with and without its e4m3 output.

A route's time at a projection whose input comes from a norm (`normed`) is its `+normq` variant
where it has one (the swap-AB GEMM, cuBLAS and the batch-invariant route read the norm's e4m3 x
there, as the model runs). The summary also sums the deterministic mode's kernels: the FP8
batch-invariant route (`invariant`), the one it replaced (`invariant_before`) and bf16's
(`bf16_invariant`), so one run gives the route's before and after and its ratio to bf16.
"""

from __future__ import annotations

from typing import Any

import torch
from sparkinfer.kernels.fp8_linear import quantize_activation_fp8
from sparkinfer.kernels.rms_norm import rms_norm, rms_norm_quantize_fp8
from sparkinfer.lab.kernels._graph_timing import rotation_copies, time_graph

Row = dict[str, Any]
ROUTES = ("gemv", "decode", "swap_ab", "prompt", "cublas")  # the kernels `routes.py` names
_CELL_IMPLS = ("gemv", "gemv_bits", "decode", "swap_ab", "swap_ab+normq", "swap_ab+normq+pdl",
               "prompt", "cublas", "cublas+normq", "invariant", "invariant+normq",
               "invariant_before", "bf16", "bf16_invariant")  # fmt: skip
INVARIANT_IMPLS = ("invariant", "invariant_before", "bf16_invariant")  # deterministic mode
DECODE_ROWS = 64  # up to here a cell gives its fraction of the copy rate, beyond its TFLOP/s


def route_ms(row: Row, kernel: str, is_normed: bool) -> float | None:
    """The time of route `kernel` at this table row (its +normq variant after a norm)."""
    name = f"{kernel}+normq" if is_normed and f"{kernel}+normq" in row else kernel
    cell = row.get(name)
    return cell.get("ms") if isinstance(cell, dict) and cell.get("ok", True) else None


def _fastest(row: Row, is_normed: bool) -> tuple[str, float] | None:
    timed = [(k, ms) for k in ROUTES if (ms := route_ms(row, k, is_normed)) is not None]
    return min(timed, key=lambda p: p[1]) if timed else None


def summary(table: list[Row], normed: frozenset[str], copy: float) -> list[Row]:
    """Per row count: each route's total over the projections, bf16's, the route picked now, and
    the fastest route with its fraction of the copy rate and its speed-up over bf16."""
    out: list[Row] = []
    for m in dict.fromkeys(r["M"] for r in table):
        rows = [r for r in table if r["M"] == m]
        totals: Row = {"M": m}
        for kernel in ROUTES:
            times = [route_ms(r, kernel, r["op"] in normed) for r in rows]
            totals[kernel] = None if None in times else sum(t for t in times if t is not None)
        totals["bf16"] = sum(r["bf16"]["ms"] for r in rows)
        for name in INVARIANT_IMPLS:
            times = [route_ms(r, name, r["op"] in normed) for r in rows]
            totals[name] = None if None in times else sum(t for t in times if t is not None)
        inv, before, bf16_inv = (totals[k] for k in INVARIANT_IMPLS)
        totals["invariant_vs_before"] = before / inv if inv and before else None
        totals["invariant_vs_bf16_invariant"] = bf16_inv / inv if inv and bf16_inv else None
        picked = [route_ms(r, r["picked"], r["op"] in normed) for r in rows]
        totals["picked"] = None if None in picked else sum(t for t in picked if t is not None)
        timed = {k: totals[k] for k in ROUTES if totals[k] is not None}
        best = min(timed, key=lambda k: timed[k]) if timed else None
        fp8_bytes = sum(
            r["N"] * r["K"] * (1 + 4 / 128**2) + 2 * m * (r["N"] + r["K"]) for r in rows
        )
        mixed = [_fastest(r, r["op"] in normed) for r in rows]
        totals |= {
            "best_route": best,
            "best_ms": timed.get(best) if best else None,
            "best_of_copy": fp8_bytes / (timed[best] / 1e3) / copy if best else None,
            "best_vs_bf16": totals["bf16"] / timed[best] if best else None,
            "picked_vs_bf16": totals["bf16"] / totals["picked"] if totals["picked"] else None,
            "per_shape_best_ms": None if None in mixed else sum(p[1] for p in mixed if p),
        }
        out.append(totals)
    return out


def routes_literal(totals: list[Row]) -> str:
    """The fastest route per row bucket as an `FP8_ROUTES` tuple (a bucket ends at the largest
    row count its route won; the last route takes every larger batch)."""
    wins = [(t["M"], t["best_route"]) for t in sorted(totals, key=lambda t: t["M"])]
    wins = [(m, k) for m, k in wins if k is not None]
    buckets: list[tuple[str, int]] = []
    for m, kernel in wins:
        if buckets and buckets[-1][0] == kernel:
            buckets[-1] = (kernel, m)
        else:
            buckets.append((kernel, m))
    parts = [f'Fp8Route("{k}", max_rows={m})' for k, m in buckets[:-1]]
    parts += [f'Fp8Route("{buckets[-1][0]}")'] if buckets else []
    return "FP8_ROUTES = (" + ", ".join(parts) + ")"


def norm_rows(
    device: torch.device, rows: tuple[int, ...], hidden: int, copy: float, args
) -> list[Row]:
    """The norm before an in-projection at each row count: alone, with its e4m3 output fused
    (`rms_norm_quantize_fp8`), and followed by the separate quantizer."""
    out: list[Row] = []
    w = torch.randn(hidden, device=device, dtype=torch.bfloat16) * 0.1

    def unfused(x: torch.Tensor, r: torch.Tensor) -> object:
        return quantize_activation_fp8(rms_norm(x, w, 1e-6, residual=r)[0], 4)

    variants = {
        "rms_norm": lambda x, r: rms_norm(x, w, 1e-6, residual=r),
        "fused norm+quantize": lambda x, r: rms_norm_quantize_fp8(x, w, 1e-6, residual=r),
        "norm, then quantize": unfused,
    }
    for m in rows:
        count = rotation_copies(4 * m * hidden, max_copies=8)
        xs = [torch.randn(m, hidden, device=device, dtype=torch.bfloat16) for _ in range(count)]
        rs = [torch.randn_like(x) for x in xs]
        row: Row = {"M": m}
        for name, fn in variants.items():
            calls = [lambda x=x, r=r, fn=fn: fn(x, r) for x, r in zip(xs, rs, strict=True)]
            row[name] = time_graph(calls, warmup=args.warmup, iters=args.iters).median_ms
        row["norm_bytes_of_copy"] = 6 * m * hidden / (row["rms_norm"] / 1e3) / copy
        out.append(row)
    return out


def _cell(m: int, cell: Any) -> str:
    if not isinstance(cell, dict):
        return "-"
    if "error" in cell:
        return "error"
    frac = f"{cell['of_copy']:.2f}" if m <= DECODE_ROWS else f"{cell['TFLOP/s']:.0f}T"
    bad = "" if cell.get("ok", True) else "!"
    return f"{cell['ms']:.4f} {frac}{bad}"


def _line(cells: list[str], widths: list[int]) -> str:
    return " | ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))


def _grid(header: list[str], body: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    return [_line(header, widths), "-+-".join("-" * w for w in widths)] + [
        _line(r, widths) for r in body
    ]


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}"


def _frac(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def render(
    table: list[Row], totals: list[Row], norms: list[Row], normed: frozenset[str], copy: float
) -> str:
    """The three tables as text."""
    out = [f"FP8 linear at the 27B projections; copy rate {copy / 1e9:,.0f} GB/s. Cells: ms and "
           f"fraction of the copy rate (T: TFLOP/s past {DECODE_ROWS} rows); ! rel_err over "
           "tolerance; +normq: x quantized by the norm before (in-projections)"]  # fmt: skip
    header = ["op", "M", *_CELL_IMPLS, "fastest", "picked", "fp8/bf16"]
    body = []
    for r in table:
        fastest = _fastest(r, r["op"] in normed)
        speedup = r["bf16"]["ms"] / fastest[1] if fastest else None
        cells = [_cell(r["M"], r.get(name)) for name in _CELL_IMPLS]
        body.append([r["op"], str(r["M"]), *cells, fastest[0] if fastest else "-", r["picked"],
                     _x(speedup)])  # fmt: skip
    out += _grid(header, body)
    out += ["", "Per row count, the five projections summed (ms; a route after a norm: +normq):"]
    header = ["M", *ROUTES, "bf16", "picked", "picked/bf16", "fastest", "of_copy", "fast/bf16",
              "per-shape best"]  # fmt: skip
    body = [[str(t["M"]), *[_ms(t[k]) for k in ROUTES], _ms(t["bf16"]), _ms(t["picked"]),
             _x(t["picked_vs_bf16"]), str(t["best_route"]), _frac(t["best_of_copy"]),
             _x(t["best_vs_bf16"]), _ms(t["per_shape_best_ms"])] for t in totals]  # fmt: skip
    out += _grid(header, body)
    out += ["", "Fastest route per row bucket: " + routes_literal(totals), ""]
    out += ["Deterministic mode, the five projections summed (ms; FP8 invariant route after a "
            "norm: +normq):"]  # fmt: skip
    header = ["M", "invariant", "invariant_before", "speed-up", "bf16_invariant",
              "invariant/bf16_invariant"]  # fmt: skip
    body = [[str(t["M"]), *[_ms(t[k]) for k in INVARIANT_IMPLS[:2]], _x(t["invariant_vs_before"]),
             _ms(t["bf16_invariant"]), _x(t["invariant_vs_bf16_invariant"])]
            for t in totals]  # fmt: skip
    out += _grid(header, body)
    out += [""]
    out += ["The norm before an in-projection (ms; hidden 5120, with the residual add):"]
    names = ["rms_norm", "fused norm+quantize", "norm, then quantize"]
    out += _grid(["M", *names], [[str(n["M"]), *[_ms(n[k]) for k in names]] for n in norms])
    return "\n".join(out)
