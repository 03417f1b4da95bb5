"""FP8 GEMM benchmark: every FP8 route at the 27B projections and the row counts the routes
cover, each checked against its reference and timed beside cuBLAS's block-scaled FP8 GEMM
(`F.scaled_mm`, 1x128 activation and 128x128 weight blocks) and the bf16 dispatcher.

Implementations per shape and row count M (`IMPLS`): our one-row GEMV (the tile `fp8_linear.tiles`
names, and the same tile converting the weight by bit moves, a candidate), the decode GEMM, the
swap-AB GEMM (x quantized in the launch, as the tile says), the swap-AB GEMM and cuBLAS reading x
as the norm before an in-projection quantized it (`+normq`: `rms_norm_quantize_fp8`, its cost in
the norm, timed apart), the latter swap-AB GEMM launched as a programmatic dependent that
first asks L2 for its first two weight steps (`+pdl`, a candidate: `Fp8SwapAbConfig.DEPENDENT`,
`PREFETCH`), the prompt GEMM, cuBLAS quantizing x per call, the batch-invariant kernel
of the phase (deterministic mode: decode to 64 rows, prefill beyond; `invariant`, and
`invariant+normq` reading the norm's e4m3 x), the batch-invariant kernels it replaced
(`invariant_before`: the decode GEMM in 16-row tiles, the prompt GEMM's pointer tile), bf16 and
bf16's batch-invariant kernel (`bf16_invariant`). The one table (`_fp8_linear_table`) gives each
in ms beside its fraction of this run's copy rate (`of_copy`: the FP8 roofline, e4m3 weight plus
scales plus x and y; bf16 over its own bytes) or, past 64 rows, its TFLOP/s; the fastest route; the
route `fp8_kernel_for` picks now; and FP8 over bf16. A summary sums the five projections per M
and names the fastest route per row bucket, as an `FP8_ROUTES` literal; a last line lists the
row counts cuBLAS takes unpadded. rel_err is
||y - ref|| / ||ref|| against the dequantizing reference (bf16 activations) or the prompt
reference (activations quantized per token and group); a row above REL_TOL is flagged.
Run (meant to finish in under 4 minutes on an H200, most of it Triton compiling; `--json PATH`
also writes every figure):
``python3 -m sparkinfer.lab.kernels.fp8_linear [--rows 1,8,32,64,4096] [--json out.json]``,
or through ``sparkinfer-lab kernels --only fp8_linear``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.nn.functional as F
from sparkinfer.kernels.fp8_linear import (
    CUBLAS_ROW_MULTIPLE,
    Fp8Activation,
    Fp8DecodeConfig,
    Fp8PromptConfig,
    fp8_gemm_cublas,
    fp8_gemm_decode,
    fp8_gemm_prompt,
    fp8_gemm_swap_ab,
    fp8_gemv,
    fp8_kernel_for,
    fp8_linear,
    fp8_linear_prompt_ref,
    fp8_linear_ref,
    quantize_activation_fp8,
    quantize_weight_fp8,
)
from sparkinfer.kernels.fp8_linear.dispatch import PROMPT_CONFIG
from sparkinfer.kernels.fp8_linear.routes import DECODE_MAX_ROWS
from sparkinfer.kernels.fp8_linear.tiles import decode_tile, gemv_tile, swap_ab_tile
from sparkinfer.kernels.linear import batch_invariant, invariant_linear, linear
from sparkinfer.kernels.rms_norm import rms_norm_quantize_fp8
from sparkinfer.kernels.rms_norm.fused import MAX_COLUMNS as NORM_MAX_COLUMNS
from sparkinfer.lab.kernels import KernelBenchArgs
from sparkinfer.lab.kernels._cli import standalone_parser
from sparkinfer.lab.kernels._fp8_linear_table import norm_rows, render, summary
from sparkinfer.lab.kernels._graph_timing import copy_bandwidth, rotation_copies, time_graph

# (name, N, K) of the 27B projections: GDN in_proj_qkv+z, attention qkv, gate_up, down, o/out.
SHAPES = (
    ("gdn_in_proj", 16384, 5120),
    ("attn_qkv", 14336, 5120),
    ("gate_up", 34816, 5120),
    ("down", 5120, 17408),
    ("out_proj", 5120, 6144),
)
NORMED = frozenset({"gdn_in_proj", "attn_qkv", "gate_up"})  # a norm before: x comes quantized
ROWS = (1, 8, 32, 64, 4096)
QUICK_ROWS = (1, 32)
PROBE_ROWS = (1, 2, 3, 4, 5, 8, 12, 16, 17, 24, 33)  # cuBLAS's acceptance, unpadded
REL_TOL = 1e-2

Row = dict[str, Any]
Phase = Literal["decode", "prefill"]
Gemm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Fp8Activation], torch.Tensor]
Ref = Callable[..., torch.Tensor]


@dataclasses.dataclass(frozen=True)
class Impl:
    """One implementation timed: its name, the route kernel it stands for ("" for none), the
    call and its reference."""

    name: str
    kernel: str
    fn: Gemm
    ref: Ref


def _phase(m: int) -> Phase:
    """The deterministic mode's phase the table times at M rows."""
    return "decode" if m <= DECODE_MAX_ROWS else "prefill"


def _invariant(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, _: Fp8Activation):
    with batch_invariant(_phase(x.shape[0])):
        return fp8_linear(x, w, s)


def _invariant_normq(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, q: Fp8Activation):
    with batch_invariant(_phase(x.shape[0])):
        return fp8_linear(x, w, s, x_fp8=q)


def _invariant_before(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, _: Fp8Activation):
    """The batch-invariant kernels before the swap-AB route and the descriptor prompt tile."""
    if _phase(x.shape[0]) == "decode":
        return fp8_gemm_decode(x, w, s, Fp8DecodeConfig(BM=16))
    return fp8_gemm_prompt(x, w, s, Fp8PromptConfig())


def impls(m: int, n: int, k: int) -> list[Impl]:
    """The implementations timed at M rows of an [N, K] weight (IMPLS order)."""
    out: list[Impl] = []
    if m == 1:
        g = gemv_tile(n, k)
        bits = dataclasses.replace(g, BF16_BITS=True)
        out.append(Impl("gemv", "gemv", lambda x, w, s, q: fp8_gemv(x, w, s, g), fp8_linear_ref))
        out.append(Impl("gemv_bits", "gemv", lambda x, w, s, q: fp8_gemv(x, w, s, bits),
                        fp8_linear_ref))  # fmt: skip
    if m <= DECODE_MAX_ROWS:
        d, a = decode_tile(m, n, k), swap_ab_tile(m, n, k)
        out.append(Impl("decode", "decode", lambda x, w, s, q: fp8_gemm_decode(x, w, s, d),
                        fp8_linear_ref))  # fmt: skip
        out.append(Impl("swap_ab", "swap_ab", lambda x, w, s, q: fp8_gemm_swap_ab(x, w, s, a),
                        fp8_linear_prompt_ref))  # fmt: skip
        out.append(Impl("swap_ab+normq", "swap_ab",
                        lambda x, w, s, q: fp8_gemm_swap_ab(x, w, s, a, x_fp8=q),
                        fp8_linear_prompt_ref))  # fmt: skip
        pdl = dataclasses.replace(a, DEPENDENT=True, PREFETCH=2)
        out.append(Impl("swap_ab+normq+pdl", "",
                        lambda x, w, s, q: fp8_gemm_swap_ab(x, w, s, pdl, x_fp8=q),
                        fp8_linear_prompt_ref))  # fmt: skip
    if m >= 32:
        out.append(Impl("prompt", "prompt",
                        lambda x, w, s, q: fp8_gemm_prompt(x, w, s, PROMPT_CONFIG),
                        fp8_linear_prompt_ref))  # fmt: skip
    out.append(Impl("cublas", "cublas", lambda x, w, s, q: fp8_gemm_cublas(x, w, s),
                    fp8_linear_prompt_ref))  # fmt: skip
    out.append(Impl("cublas+normq", "cublas", lambda x, w, s, q: fp8_gemm_cublas(x, w, s, x_fp8=q),
                    fp8_linear_prompt_ref))  # fmt: skip
    out.append(Impl("invariant", "", _invariant, fp8_linear_prompt_ref))
    out.append(Impl("invariant+normq", "", _invariant_normq, fp8_linear_prompt_ref))
    before_ref = fp8_linear_ref if m <= DECODE_MAX_ROWS else fp8_linear_prompt_ref
    out.append(Impl("invariant_before", "", _invariant_before, before_ref))
    return out


IMPLS = ("gemv", "gemv_bits", "decode", "swap_ab", "swap_ab+normq", "swap_ab+normq+pdl", "prompt",
         "cublas", "cublas+normq", "invariant", "invariant+normq", "invariant_before", "bf16",
         "bf16_invariant")  # fmt: skip


def fp8_bytes(m: int, n: int, k: int) -> int:
    """The FP8 roofline's bytes: e4m3 weight, its fp32 block scales, bf16 x and y."""
    return n * k + 4 * (-(-n // 128)) * (-(-k // 128)) + 2 * m * (k + n)


def _figures(m: int, n: int, k: int, ms: float, copy: float, is_bf16: bool) -> Row:
    nbytes = 2 * n * k + 2 * m * (k + n) if is_bf16 else fp8_bytes(m, n, k)
    return {"ms": ms, "of_copy": nbytes / (ms / 1e3) / copy, "TFLOP/s": 2 * m * n * k / ms / 1e9}


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.float() - ref.float()).norm() / ref.float().norm().clamp(min=1e-30)).item()


def _normed_x(m: int, k: int, device: torch.device) -> tuple[torch.Tensor, Fp8Activation]:
    """A normed activation and its quantization, as the norm before an in-projection gives; an
    input wider than the norm kernel takes (down_proj's, which no norm precedes) is quantized
    on its own, padded to cuBLAS's row multiple as the norm pads it."""
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    if k > NORM_MAX_COLUMNS:
        q, scale = quantize_activation_fp8(x, CUBLAS_ROW_MULTIPLE)
        return x, Fp8Activation(q, scale)
    w = torch.randn(k, device=device, dtype=torch.bfloat16) * 0.1
    y, _, x_fp8 = rms_norm_quantize_fp8(x, w, 1e-6)
    return y, x_fp8


def _bench_shape_rows(op: str, m: int, n: int, k: int, w16s, weights, copy: float, args) -> Row:
    """Every implementation at one shape and row count: one row of the table."""
    x, x_fp8 = _normed_x(m, k, w16s[0].device)
    w0, s0 = weights[0]
    row: Row = {"op": op, "M": m, "N": n, "K": k, "picked": fp8_kernel_for(x, w0, s0)}
    refs: dict[Ref, torch.Tensor] = {}
    for impl in impls(m, n, k):
        try:
            if impl.ref not in refs:
                refs[impl.ref] = impl.ref(x, w0, s0)
            err = _rel_err(impl.fn(x, w0, s0, x_fp8), refs[impl.ref])
            calls = [lambda ws=ws, fn=impl.fn: fn(x, *ws, x_fp8) for ws in weights]
            t = time_graph(calls, warmup=args.warmup, iters=args.iters)
        except Exception as e:  # a refused layout, a failed build: say so, go on
            row[impl.name] = {"error": f"{type(e).__name__}: {str(e)[:80]}"}
            print(f"fp8_linear: {op} M={m} {impl.name}: {row[impl.name]['error']}", flush=True)
            continue
        fig = _figures(m, n, k, t.median_ms, copy, is_bf16=False)
        row[impl.name] = {**fig, "rel_err": err, "ok": err <= REL_TOL, "kernel": impl.kernel}
    t = time_graph([lambda w=w: linear(x, w) for w in w16s], warmup=args.warmup, iters=args.iters)
    row["bf16"] = _figures(m, n, k, t.median_ms, copy, is_bf16=True)
    phase: Phase = _phase(m)
    t = time_graph([lambda w=w: invariant_linear(x, w, phase) for w in w16s], warmup=args.warmup,
                   iters=args.iters)  # fmt: skip
    row["bf16_invariant"] = _figures(m, n, k, t.median_ms, copy, is_bf16=True)
    return row


def probe_cublas_rows(device: torch.device) -> Row:
    """The row counts cuBLAS's block-scaled GEMM takes without padding (the first shape)."""
    _, n, k = SHAPES[0]
    w, s = quantize_weight_fp8(torch.randn(n, k, device=device) * 0.02)
    taken, refused = [], []
    for m in PROBE_ROWS:
        x_q, x_s = quantize_activation_fp8(torch.randn(m, k, device=device, dtype=torch.bfloat16))
        try:
            F.scaled_mm(x_q, w.t(), x_s, F.ScalingType.BlockWise1x128, s.t(),
                        F.ScalingType.BlockWise128x128, output_dtype=torch.bfloat16)  # fmt: skip
            torch.cuda.synchronize()
            taken.append(m)
        except RuntimeError:
            refused.append(m)
    return {"taken": taken, "refused": refused}


def _weights(n: int, k: int, device: torch.device):
    w16 = torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
    weights = [quantize_weight_fp8(w16) for _ in range(rotation_copies(n * k))]
    return [w16.clone() for _ in range(rotation_copies(2 * n * k))], weights


def measure(device: torch.device, rows: tuple[int, ...], args) -> tuple[float, list[Row]]:
    """(copy rate in bytes/s, one row per projection and row count)."""
    copy = copy_bandwidth(device)
    start = time.perf_counter()
    table: list[Row] = []
    for op, n, k in SHAPES:
        w16s, weights = _weights(n, k, device)
        for m in rows:
            table.append(_bench_shape_rows(op, m, n, k, w16s, weights, copy, args))
            print(f"fp8_linear: {op} M={m} done ({time.perf_counter() - start:.0f} s)", flush=True)
        del w16s, weights
        torch.cuda.empty_cache()
    return copy, table


def _long_rows(table: list[Row]) -> list[Row]:
    """The table as one row per implementation (the `sparkinfer-lab kernels` protocol)."""
    out = []
    for row in table:
        base = {"op": row["op"], "impl": "", "shape": f"M={row['M']} N={row['N']} K={row['K']}"}
        for name in IMPLS:
            if name in row:
                cell = row[name]
                out.append({**base, "impl": name, "picked": cell.get("kernel") == row["picked"],
                            **{k: v for k, v in cell.items() if k != "kernel"}})  # fmt: skip
    return out


def run(args: KernelBenchArgs) -> list[Row]:
    """`sparkinfer-lab kernels` entry point."""
    _, table = measure(args.device, QUICK_ROWS if args.is_quick else ROWS, args)
    return _long_rows(table)


def main() -> None:
    parser = standalone_parser(__doc__, warmup=3, iters=15)
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma-separated M")
    parser.add_argument("--json", default=None, help="also write every figure to this path")
    cli = parser.parse_args()
    device = torch.device("cuda")
    start = time.perf_counter()
    rows = QUICK_ROWS if cli.quick else tuple(int(r) for r in cli.rows.split(","))
    copy, table = measure(device, rows, cli)
    norms = norm_rows(device, rows, SHAPES[0][2], copy, cli)
    probe = probe_cublas_rows(device)
    totals = summary(table, NORMED, copy)
    print(render(table, totals, norms, NORMED, copy))
    print(f"cuBLAS block-scaled, unpadded rows: takes {probe['taken']}, refuses {probe['refused']}")
    print(f"fp8_linear: {time.perf_counter() - start:.0f} s on {torch.cuda.get_device_name()}")
    if cli.json:
        with open(cli.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "copy_GBps": copy / 1e9,
                       "table": table, "summary": totals, "norms": norms,
                       "cublas_unpadded_rows": probe}, f, indent=1)  # fmt: skip
        print(f"fp8_linear: wrote {cli.json}")


if __name__ == "__main__":
    main()
