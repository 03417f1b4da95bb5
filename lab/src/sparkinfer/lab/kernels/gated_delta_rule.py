"""Gated-DeltaNet kernel benchmark: chunked prefill and recurrent decode at 27B shapes.

Times the Triton op beside its plain-torch reference and FLA (``fla.ops.gated_delta_rule``, when
installed), as median/p90 over fixed iterations. Prefill is compared with a FLOP/IO roofline, decode
with the copy bandwidth on its state read + write. Run alone:
``python -m sparkinfer.lab.kernels.gated_delta_rule [--quick]``; launch sweeps:
`gated_delta_rule_tune`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from sparkinfer.bench.timing import time_cuda
from sparkinfer.kernels.gated_delta_rule import (
    chunk_gated_delta_rule,
    chunk_gated_delta_rule_ref,
    fused_recurrent_gated_delta_rule,
    fused_recurrent_gated_delta_rule_ref,
    gdn_gating,
)
from sparkinfer.lab.kernels._cli import run_alone, standalone_parser
from sparkinfer.lab.kernels._graph_timing import COPY_PEER, same_bytes_copies, time_graph

NUM_HEADS, NUM_V_HEADS, HEAD_DIM = 16, 48, 128  # Qwen3.8-27B linear attention
COPY_TB_S = 4.24  # H200 device-to-device copy bandwidth
BF16_TFLOPS = 989.0  # H200 dense bf16 tensor-core peak
HBM_TB_S = 4.8
PREFILL_LENGTHS = (4096, 16384, 65536)
DECODE_BATCHES = (1, 32, 64)
NORM_DECODE_BATCHES = (1, 4, 8, 32)
NUM_GDN_LAYERS = 48  # linear-attention layers of the 27B model: one state each per step
MAX_REF_PREFILL = 4096  # the per-timestep reference is too slow beyond this

Row = dict[str, Any]


def _fla() -> Any | None:
    try:
        import fla.ops.gated_delta_rule as fla_gdn  # pyright: ignore[reportMissingImports]
    except ImportError:
        return None
    return fla_gdn


def _inputs(num_tokens: int, device: str) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return torch.randn(*shape, device=device, generator=gen, dtype=dtype)

    x = {name: randn(num_tokens, NUM_HEADS, HEAD_DIM) for name in ("q", "k")}
    x["v"] = randn(num_tokens, NUM_V_HEADS, HEAD_DIM)
    x["a"], x["b"] = randn(num_tokens, NUM_V_HEADS), randn(num_tokens, NUM_V_HEADS)
    x["A_log"] = torch.rand(NUM_V_HEADS, device=device, generator=gen) * 2.0
    x["dt_bias"] = randn(NUM_V_HEADS, dtype=torch.float32)
    return x


def _ms(fn: Callable[[], object], warmup: int, iters: int) -> tuple[float, float]:
    t = time_cuda(fn, warmup=warmup, iters=iters)
    return t.median_ms, t.p90_ms


def _graph_ms(fn: Callable[[], object], warmup: int, iters: int) -> tuple[float, float]:
    """Median/p90 of CUDA-graph replays of fn (`time_graph`): device time without Python launch
    overhead, as the runner's captured decode step sees it."""
    t = time_graph([fn], warmup=warmup, iters=iters)
    return t.median_ms, t.p90_ms


def _prefill_roofline_ms(num_tokens: int) -> float:
    """max(FLOP time at the bf16 peak, q/k/v/o traffic at HBM peak) for the chunk algorithm."""
    bt, d = 64, HEAD_DIM
    flops_per_chunk = 2 * bt * bt * d * 5 + 2 * bt * d * d * 3  # kk^T, w, u, qk^T, Av; wh, k^Tv, qh
    flops = flops_per_chunk * (num_tokens / bt) * NUM_V_HEADS
    io_bytes = num_tokens * (2 * NUM_HEADS + 2 * NUM_V_HEADS) * d * 2
    return max(flops / (BF16_TFLOPS * 1e9), io_bytes / (HBM_TB_S * 1e9))


def _rows(
    op: str,
    shape: str,
    times: dict[str, tuple[float, float]],
    roof_ms: float,
    device_ms: dict[str, float] | None = None,
):
    """One row per implementation; vs_fast = its time / the fast op's time. `device_ms`: the
    CUDA-graph replay time of some implementations (their kernels without the host's launch
    time), with device_vs_fast beside it."""
    fast_ms = times["fast"][0]
    rows = []
    for impl, t in times.items():
        row = {
            "op": op, "impl": impl, "shape": shape, "dtype": "bfloat16",
            "median_ms": t[0], "p90_ms": t[1], "roofline_ms": roof_ms,
            "of_roofline": roof_ms / t[0], "vs_fast": t[0] / fast_ms,
        }  # fmt: skip
        if device_ms is not None:
            dev = device_ms.get(impl)
            row["device_ms"] = dev
            row["device_vs_fast"] = None if dev is None else dev / device_ms["fast"]
        rows.append(row)
    return rows


def bench_prefill(lengths: tuple[int, ...], warmup: int, iters: int, device: str) -> list[Row]:
    """Single-sequence chunked prefill, initial state in and final state out: each call as a
    caller launches it (median_ms, host time included) and replayed from a CUDA graph
    (device_ms: the kernels alone, as in the model's prefill, where the host runs ahead)."""
    rows = []
    for num_tokens in lengths:
        calls = _prefill_calls(num_tokens, device)
        peers = {impl: fn for impl, fn in calls.items() if impl != "ref"}  # ours and fla
        times = {impl: _ms(fn, warmup, iters) for impl, fn in peers.items()}
        device_ms = {impl: _graph_ms(fn, warmup, iters)[0] for impl, fn in peers.items()}
        if num_tokens <= MAX_REF_PREFILL:
            times["ref"] = _ms(calls["ref"], 0, 1)
        shape = f"T={num_tokens} H={NUM_HEADS} HV={NUM_V_HEADS} K=V={HEAD_DIM}"
        rows += _rows("chunk prefill", shape, times, _prefill_roofline_ms(num_tokens), device_ms)
    return rows


def _prefill_calls(num_tokens: int, device: str) -> dict[str, Callable[[], object]]:
    """The prefill of one sequence by our op ("fast"), fla's (when installed) and the reference,
    on the same inputs and initial state."""
    x = _inputs(num_tokens, device)
    g, beta = gdn_gating(x["a"], x["b"], x["A_log"], x["dt_bias"])
    state = torch.zeros(1, NUM_V_HEADS, HEAD_DIM, HEAD_DIM, device=device)
    kw = {
        "cu_seqlens": torch.tensor([0, num_tokens], dtype=torch.int32, device=device),
        "state_slots": torch.zeros(1, dtype=torch.int64, device=device),
        "has_initial_state": torch.ones(1, dtype=torch.bool, device=device),
    }
    args = (x["q"], x["k"], x["v"], g, beta, state)
    calls: dict[str, Callable[[], object]] = {"fast": partial(chunk_gated_delta_rule, *args, **kw)}
    fla_gdn = _fla()
    if fla_gdn is not None:
        fla_args = (x["q"][None], x["k"][None], x["v"][None], g[None], beta[None])
        fla_kw = {"initial_state": state, "output_final_state": True}
        fla_kw |= {"use_qk_l2norm_in_kernel": True}
        calls["fla"] = partial(fla_gdn.chunk_gated_delta_rule, *fla_args, **fla_kw)
    calls["ref"] = partial(chunk_gated_delta_rule_ref, *args, **kw)
    return calls


def bench_decode(batches: tuple[int, ...], warmup: int, iters: int, device: str) -> list[Row]:
    """One decode token for B sequences; the roofline is the fp32 state read + written once.

    "fast" and "fla" are timed as CUDA-graph replays (the decode step is captured in serving);
    "fast eager" includes the Python launch overhead.
    """
    fla_gdn = _fla()
    rows = []
    for batch in batches:
        x = _inputs(batch, device)
        state = torch.zeros(batch, NUM_V_HEADS, HEAD_DIM, HEAD_DIM, device=device)
        slots = torch.arange(batch, device=device)
        args = (x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], state)
        fast = partial(fused_recurrent_gated_delta_rule, *args, state_slots=slots)
        times = {"fast": _graph_ms(fast, warmup, iters), "fast eager": _ms(fast, warmup, iters)}
        if fla_gdn is not None:
            g, beta = gdn_gating(x["a"], x["b"], x["A_log"], x["dt_bias"])
            fla_args = (x["q"][:, None], x["k"][:, None], x["v"][:, None])
            fla_kw = {"g": g[:, None], "beta": beta[:, None], "initial_state": state}
            fla_kw |= {"output_final_state": True, "use_qk_l2norm_in_kernel": True}
            fn = partial(fla_gdn.fused_recurrent_gated_delta_rule, *fla_args, **fla_kw)
            times["fla"] = _graph_ms(fn, warmup, iters)
        ref = partial(fused_recurrent_gated_delta_rule_ref, *args, state_slots=slots)
        times["ref"] = _ms(ref, 1, 3)
        state_bytes = 2 * state.numel() * state.element_size()
        shape = f"B={batch} HV={NUM_V_HEADS} K=V={HEAD_DIM}"
        rows += _rows("recurrent decode", shape, times, state_bytes / (COPY_TB_S * 1e9))
    return rows


def bench_decode_norm(batches: tuple[int, ...], warmup: int, iters: int, device: str) -> list[Row]:
    """The model's decode step of one GDN layer: recurrent decode then the gated RMSNorm.

    "fast" is the op given the norm (in-kernel up to `recurrent.NORM_IN_KERNEL_MAX_SEQS` rows, a
    second launch above); "in-kernel" forces whole heads per program at every batch; "two
    launches" runs the plain op then `gated_rms_norm`; "copy, same bytes" copies the state's
    size between distinct buffers (the traffic of a state read and written, what the size alone
    allows). Each is a CUDA-graph replay over one state per layer of the model (48), with
    dependent launch on and the states read before the wait on the kernel ahead (`early_state`),
    as in the model's decode graphs; the states are not in L2.
    """
    rows = []  # dependent launch: on, the kernels' default outside any kernel_tuning
    for batch in batches:
        times = _decode_norm_times(batch, warmup, iters, device)
        state_bytes = 2 * batch * NUM_V_HEADS * HEAD_DIM * HEAD_DIM * 4
        shape = f"B={batch} HV={NUM_V_HEADS} K=V={HEAD_DIM}, {NUM_GDN_LAYERS} layers' states"
        roof_ms = state_bytes / (COPY_TB_S * 1e9)
        rows += _rows("recurrent decode + gated norm", shape, times, roof_ms)
    return rows


def _decode_layers(batch: int, device: str) -> tuple[list[dict[str, torch.Tensor]], torch.Tensor]:
    """One set of decode inputs, fp32 state, gate and norm weight per GDN layer of the model, and
    the state slots."""
    layers = [_inputs(batch, device) for _ in range(NUM_GDN_LAYERS)]
    for x in layers:
        x["state"] = torch.zeros(batch, NUM_V_HEADS, HEAD_DIM, HEAD_DIM, device=device)
        x["z"] = torch.randn_like(x["v"])
        x["w"] = torch.ones(HEAD_DIM, device=device, dtype=x["v"].dtype)
    return layers, torch.arange(batch, device=device)


def _decode_op(
    x: dict[str, torch.Tensor], slots: torch.Tensor, norm: bool, early_state: bool = False
) -> torch.Tensor:
    names = ("q", "k", "v", "a", "b", "A_log", "dt_bias", "state")
    kw: dict[str, Any] = {"state_slots": slots, "early_state": early_state}
    if norm:
        kw |= {"norm_gate": x["z"], "norm_weight": x["w"], "norm_eps": 1e-6}
    return fused_recurrent_gated_delta_rule(*(x[n] for n in names), **kw)


def _decode_norm_times(
    batch: int, warmup: int, iters: int, device: str
) -> dict[str, tuple[float, float]]:
    from sparkinfer.kernels.gated_delta_rule import recurrent
    from sparkinfer.kernels.rms_norm import gated_rms_norm

    layers, slots = _decode_layers(batch, device)

    def two_launches(x: dict[str, torch.Tensor]) -> torch.Tensor:
        return gated_rms_norm(_decode_op(x, slots, False, True), x["z"], x["w"], 1e-6)

    def timed(fn: Callable[[dict[str, torch.Tensor]], object]) -> tuple[float, float]:
        t = time_graph([partial(fn, x) for x in layers], warmup=warmup, iters=iters)
        return t.median_ms, t.p90_ms

    fused = partial(_decode_op, slots=slots, norm=True, early_state=True)
    times = {"fast": timed(fused), "two launches": timed(two_launches)}
    state_bytes = 2 * layers[0]["state"].numel() * layers[0]["state"].element_size()
    copies = same_bytes_copies(state_bytes, NUM_GDN_LAYERS, torch.device(device))
    t = time_graph(copies, warmup=warmup, iters=iters)
    times[COPY_PEER] = (t.median_ms, t.p90_ms)
    limit = recurrent.NORM_IN_KERNEL_MAX_SEQS
    recurrent.NORM_IN_KERNEL_MAX_SEQS = batch
    try:
        times["in-kernel"] = timed(fused)
    finally:
        recurrent.NORM_IN_KERNEL_MAX_SEQS = limit
    return times


def measure(*, warmup: int = 10, iters: int = 50, quick: bool = False, device: str = "cuda"):
    """All rows: prefill at T = 4K/16K/64K (quick: 4K), decode at B = 1/32/64 and decode with the
    gated norm at B = 1/4/8/32."""
    lengths = PREFILL_LENGTHS[:1] if quick else PREFILL_LENGTHS
    prefill = bench_prefill(lengths, warmup, iters, device)
    decode = bench_decode(DECODE_BATCHES, warmup, iters, device)
    return prefill + decode + bench_decode_norm(NORM_DECODE_BATCHES, warmup, iters, device)


def run(args: Any) -> list[Row]:
    """The `sparkinfer-lab kernels` entry point (args: KernelBenchArgs)."""
    return measure(
        warmup=args.warmup, iters=args.iters, quick=args.is_quick, device=str(args.device)
    )


def main() -> None:
    run_alone(run, standalone_parser(__doc__, warmup=10, iters=50).parse_args(), __doc__)


if __name__ == "__main__":
    main()
