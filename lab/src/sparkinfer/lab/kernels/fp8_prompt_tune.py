"""FP8 prompt-GEMM tile sweep: the batch-invariant prefill kernel's candidate tiles at the 27B
projections and prompt row counts, beside the bf16 batch-invariant prefill GEMM (what the FP8
one must beat in deterministic mode) and cuBLAS's block-scaled FP8 GEMM.

Each candidate `Fp8PromptConfig` is timed per projection (x quantized by the norm before an
in-projection, as the model runs; the separate quantizer before down_proj) and summed over the
five; the line gives TFLOP/s of the sum and the ratio to the bf16 invariant GEMM. A candidate that
fails to build (shared memory) or misses the prompt reference is listed with its error.
`invariant.INVARIANT_PROMPT_CONFIG` takes the fastest. Run (a minute or two on an H200):
``python3 -m sparkinfer.lab.kernels.fp8_prompt_tune [--rows 512,4096]``
"""

from __future__ import annotations

import time

import torch
from sparkinfer.kernels.fp8_linear import (
    Fp8Activation,
    Fp8PromptConfig,
    fp8_gemm_cublas,
    fp8_gemm_prompt,
    fp8_linear_prompt_ref,
    quantize_activation_fp8,
    quantize_weight_fp8,
)
from sparkinfer.kernels.linear.invariant import invariant_linear
from sparkinfer.lab.kernels._cli import standalone_parser
from sparkinfer.lab.kernels._graph_timing import time_graph
from sparkinfer.lab.kernels.fp8_linear import SHAPES

CANDIDATES = (
    Fp8PromptConfig(),  # the tile before descriptor loads
    Fp8PromptConfig(FOLD_SCALES=True),
    Fp8PromptConfig(TMA=True),
    Fp8PromptConfig(TMA=True, FOLD_SCALES=True),
    Fp8PromptConfig(num_stages=4, TMA=True),
    Fp8PromptConfig(num_stages=4, TMA=True, FOLD_SCALES=True),
    Fp8PromptConfig(num_warps=4, num_stages=4, TMA=True, FOLD_SCALES=True),
    Fp8PromptConfig(GROUP_M=16, num_stages=4, TMA=True, FOLD_SCALES=True),
    Fp8PromptConfig(BM=256, TMA=True, FOLD_SCALES=True),
    Fp8PromptConfig(BM=64, BN=128, num_warps=4, num_stages=5, TMA=True, FOLD_SCALES=True),
    Fp8PromptConfig(BN=256, TMA=True),
    Fp8PromptConfig(BN=256, num_stages=4, TMA=True),
    Fp8PromptConfig(num_stages=4, TMA=True, FOLD_SCALES=True, PERSISTENT=True),
    Fp8PromptConfig(num_stages=3, TMA=True, FOLD_SCALES=True, PERSISTENT=True),
    Fp8PromptConfig(
        num_stages=4, TMA=True, FOLD_SCALES=True, PERSISTENT=True, WARP_SPECIALIZE=True
    ),
)
REL_TOL = 1e-2


def _name(cfg: Fp8PromptConfig) -> str:
    tma = " TMA" if cfg.TMA else ""
    fold = " fold" if cfg.FOLD_SCALES else ""
    loop = (" persistent" if cfg.PERSISTENT else "") + (" ws" if cfg.WARP_SPECIALIZE else "")
    return f"{cfg.BM}x{cfg.BN} g{cfg.GROUP_M} w{cfg.num_warps} s{cfg.num_stages}{tma}{fold}{loop}"


def _line(m: int, name: str, calls, base: float | None, warmup: int, iters: int) -> float:
    """Print the summed time of `calls` at M rows, its TFLOP/s and its ratio to `base`."""
    flop = sum(2 * m * n * k for _, n, k in SHAPES)
    ms = sum(time_graph([c], warmup=warmup, iters=iters).median_ms for c in calls)
    ratio = f"  {base / ms:.2f}x bf16-invariant" if base else ""
    print(f"M={m:5d} {name:38s} {ms:8.4f} ms {flop / ms / 1e9:7.0f} TFLOP/s{ratio}", flush=True)
    return ms


def _prompt_calls(cfg: Fp8PromptConfig, ops, qs) -> list:
    return [
        lambda x=x, w=w, s=s, q=q: fp8_gemm_prompt(x, w, s, cfg, x_fp8=q)
        for (x, (_, w, s)), q in zip(ops, qs, strict=True)
    ]


def sweep(rows: tuple[int, ...], warmup: int, iters: int) -> None:
    """Print one line per candidate and row count (and the bf16 and cuBLAS baselines)."""
    device = torch.device("cuda")
    operands = []
    for _, n, k in SHAPES:
        w16 = torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
        operands.append((w16, *quantize_weight_fp8(w16)))
    for m in rows:
        xs = [torch.randn(m, k, device=device, dtype=torch.bfloat16) for _, _, k in SHAPES]
        qs = [Fp8Activation(*quantize_activation_fp8(x)) for x in xs]
        refs = [fp8_linear_prompt_ref(x, w, s) for x, (_, w, s) in zip(xs, operands, strict=True)]
        ops = list(zip(xs, operands, strict=True))
        bf16_calls = [lambda x=x, w=w: invariant_linear(x, w, "prefill") for x, (w, _, _) in ops]
        bf16 = _line(m, "bf16 invariant (tiled_gemm)", bf16_calls, None, warmup, iters)
        cublas_calls = [
            lambda x=x, w=w, s=s, q=q: fp8_gemm_cublas(x, w, s, x_fp8=q)
            for (x, (_, w, s)), q in zip(ops, qs, strict=True)
        ]
        _line(m, "cublas fp8 (+normq)", cublas_calls, bf16, warmup, iters)
        for cfg in CANDIDATES:
            try:
                errs = []
                for (x, (_, w, s)), q, ref in zip(ops, qs, refs, strict=True):
                    y = fp8_gemm_prompt(x, w, s, cfg, x_fp8=q).float()
                    errs.append(((y - ref.float()).norm() / ref.float().norm()).item())
                if max(errs) > REL_TOL:
                    print(f"M={m:5d} {_name(cfg):38s} rel_err {max(errs):.3g} over tolerance")
                    continue
                _line(m, _name(cfg), _prompt_calls(cfg, ops, qs), bf16, warmup, iters)
            except Exception as e:  # a tile that does not fit: say so, go on
                print(f"M={m:5d} {_name(cfg):38s} error {type(e).__name__}: {str(e)[:90]}")


def main() -> None:
    parser = standalone_parser(__doc__, warmup=3, iters=10)
    parser.add_argument("--rows", default="4096", help="comma-separated M")
    cli = parser.parse_args()
    start = time.perf_counter()
    sweep(tuple(int(r) for r in cli.rows.split(",")), cli.warmup, cli.iters)
    print(f"fp8_prompt_tune: {time.perf_counter() - start:.0f} s on {torch.cuda.get_device_name()}")


if __name__ == "__main__":
    main()
