"""Causal conv1d + SiLU benchmark at 27B shapes (C = 10240, W = 4, bf16).

Times the Triton op beside its plain-torch reference; the roofline is HBM copy bandwidth on the
bytes that must move (prefill: x in, y out; decode: window read + write, x in, y out). Run alone:
``python -m sparkinfer.lab.kernels.causal_conv1d [--quick]``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from sparkinfer.bench.timing import time_cuda
from sparkinfer.kernels.causal_conv1d import (
    causal_conv1d,
    causal_conv1d_ref,
    causal_conv1d_update,
    causal_conv1d_update_ref,
)
from sparkinfer.lab.kernels._cli import run_alone, standalone_parser

CHANNELS, WIDTH = 10240, 4
COPY_TB_S = 4.24
PREFILL_LENGTHS = (4096, 16384, 65536)
DECODE_BATCHES = (1, 32, 64)

Row = dict[str, Any]


def _rows(op: str, shape: str, fast, ref, *, num_bytes: int) -> list[Row]:
    roof_ms = num_bytes / (COPY_TB_S * 1e9)
    return [
        {
            "op": op, "impl": impl, "shape": shape, "dtype": "bfloat16",
            "median_ms": t.median_ms, "p90_ms": t.p90_ms, "roofline_ms": roof_ms,
            "of_roofline": roof_ms / t.median_ms, "vs_fast": t.median_ms / fast.median_ms,
        }
        for impl, t in (("fast", fast), ("ref", ref))
    ]  # fmt: skip


def measure(*, warmup: int = 10, iters: int = 50, quick: bool = False, device: str = "cuda"):
    """Prefill at T = 4K/16K/64K (quick: 4K), one sequence; decode at B = 1/32/64."""
    gen = torch.Generator(device=device).manual_seed(0)
    weight = torch.randn(CHANNELS, WIDTH, device=device, generator=gen, dtype=torch.bfloat16)
    rows = []
    for num_tokens in PREFILL_LENGTHS[:1] if quick else PREFILL_LENGTHS:
        x = torch.randn(num_tokens, CHANNELS, device=device, generator=gen, dtype=torch.bfloat16)
        state = torch.zeros(1, WIDTH - 1, CHANNELS, device=device, dtype=torch.bfloat16)
        kw = {
            "cu_seqlens": torch.tensor([0, num_tokens], dtype=torch.int32, device=device),
            "state_slots": torch.zeros(1, dtype=torch.int64, device=device),
            "has_initial_state": torch.ones(1, dtype=torch.bool, device=device),
        }
        fast = time_cuda(partial(causal_conv1d, x, weight, state, **kw), warmup=warmup, iters=iters)
        ref = time_cuda(partial(causal_conv1d_ref, x, weight, state, **kw), warmup=1, iters=3)
        shape = f"T={num_tokens} C={CHANNELS}"
        rows += _rows("prefill", shape, fast, ref, num_bytes=2 * x.numel() * 2)
    for batch in DECODE_BATCHES:
        x = torch.randn(batch, CHANNELS, device=device, generator=gen, dtype=torch.bfloat16)
        state = torch.zeros(batch, WIDTH - 1, CHANNELS, device=device, dtype=torch.bfloat16)
        slots = torch.arange(batch, device=device)
        fast = time_cuda(
            partial(causal_conv1d_update, x, weight, state, state_slots=slots),
            warmup=warmup, iters=iters,
        )  # fmt: skip
        ref = time_cuda(
            partial(causal_conv1d_update_ref, x, weight, state, state_slots=slots),
            warmup=1,
            iters=3,
        )
        num_bytes = 2 * state.numel() * 2 + 2 * x.numel() * 2
        rows += _rows("decode update", f"B={batch} C={CHANNELS}", fast, ref, num_bytes=num_bytes)
    return rows


def run(args: Any) -> list[Row]:
    """The `sparkinfer-lab kernels` entry point (args: KernelBenchArgs)."""
    return measure(
        warmup=args.warmup, iters=args.iters, quick=args.is_quick, device=str(args.device)
    )


def main() -> None:
    run_alone(run, standalone_parser(__doc__, warmup=10, iters=50).parse_args(), __doc__)


if __name__ == "__main__":
    main()
