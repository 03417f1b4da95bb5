"""Sweeps of the Gated-DeltaNet kernels' launch choices, for a person choosing the defaults
(they print rather than return rows): `--tune` times candidate `ChunkLaunch` configs of the
prefill beside fla, `--tune-decode` the recurrent decode's V tiles and warps at large batches and
the warps of its whole-head program (the gated norm inside) at small ones, `--breakdown` the
prefill's device time kernel by kernel beside fla's. Run:
``python -m sparkinfer.lab.kernels.gated_delta_rule_tune --tune | --tune-decode | --breakdown``.
"""

from __future__ import annotations

import argparse
from functools import partial
from typing import Any

import torch
from sparkinfer.kernels.gated_delta_rule import chunk_gated_delta_rule, gdn_gating
from sparkinfer.lab.kernels._graph_timing import time_graph
from sparkinfer.lab.kernels.gated_delta_rule import (
    COPY_TB_S,
    HEAD_DIM,
    NUM_V_HEADS,
    PREFILL_LENGTHS,
    _decode_layers,
    _decode_op,
    _fla,
    _graph_ms,
    _inputs,
    _prefill_calls,
)


def prefill_breakdown(lengths: tuple[int, ...] = PREFILL_LENGTHS, reps: int = 5) -> None:
    """Print the device time of each kernel of one chunked prefill, ours and fla's, from
    torch.profiler over `reps` eager calls after a warm-up: where the two differ stage by stage
    (the eager call's host time, which dominates at 4K, is left out)."""
    from sparkinfer.lab.profile import kernel_times, summarise

    for num_tokens in lengths:
        calls = _prefill_calls(num_tokens, "cuda")
        for impl in ("fast", "fla"):
            if impl not in calls:
                continue
            for _ in range(3):
                calls[impl]()
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(reps):
                    calls[impl]()
                torch.cuda.synchronize()
            totals = summarise(kernel_times(prof))
            for k in totals:
                print(f"T={num_tokens} {impl}: {k.total_us / reps:9.1f} us  {k.name[:90]}",
                      flush=True)  # fmt: skip
            all_us = sum(k.total_us for k in totals) / reps
            print(f"T={num_tokens} {impl}: {all_us:9.1f} us  all kernels", flush=True)
        del calls
        torch.cuda.empty_cache()


# (V tile, warps) of the recurrent decode's programs that hold part of a head.
DECODE_TUNE_TILES = tuple(
    (bv, w) for bv in (16, 32, 64, 128) for w in (1, 2, 4, 8) if bv * HEAD_DIM // (32 * w) <= 128
)
DECODE_TUNE_BATCHES = (16, 24, 32, 64)
# Warps of the whole-head program that holds the gated norm, at 1 .. NORM_TUNE_BATCHES[-1].
NORM_TUNE_WARPS = (2, 4, 8, 16)
NORM_TUNE_BATCHES = (1, 2, 4, 8)


def tune_decode(device: str = "cuda", batches: tuple[int, ...] = DECODE_TUNE_BATCHES) -> None:
    """Print the recurrent decode's time per layer (and its share of the copy rate on the state
    read + write) for each candidate V tile and warp count, as the model runs it above
    NORM_IN_KERNEL_MAX_SEQS sequences (gated norm as a second launch), and for each warp count
    of the whole-head program with the norm inside at fewer sequences; over 48 layers' states in
    one CUDA graph with dependent launch on and the early state read the model uses; the
    largest difference from the default's output."""
    _tune_norm_warps(device)
    _tune_large_tiles(device, batches)


def _tune_norm_warps(device: str) -> None:
    """The whole-head program with the norm inside, by warps, against V tiles with the norm
    launched after (NORM_IN_KERNEL_MAX_SEQS 0), at the small batches."""
    most = NORM_TUNE_BATCHES[-1]
    variants: list[dict[str, Any]] = [
        {"NORM_IN_KERNEL_MAX_SEQS": most, "NORM_NUM_WARPS": (w,) * most} for w in NORM_TUNE_WARPS
    ]
    variants += [
        {"NORM_IN_KERNEL_MAX_SEQS": 0, "EARLY_STATE_V_TILE": bv, "NUM_WARPS": w}
        for bv, w in DECODE_TUNE_TILES
        if bv <= 64
    ]
    _sweep_decode(device, NORM_TUNE_BATCHES, variants)


def _tune_large_tiles(device: str, batches: tuple[int, ...]) -> None:
    variants: list[dict[str, Any]] = [
        {"EARLY_STATE_V_TILE": bv, "NUM_WARPS": w} for bv, w in DECODE_TUNE_TILES
    ]
    _sweep_decode(device, batches, variants)


def _sweep_decode(device: str, batches: tuple[int, ...], variants: list[dict[str, Any]]) -> None:
    """For each batch, time the recurrent decode with the gated norm (early state read, as the
    model runs it) with each variant's values set on the `recurrent` module, restored after; print
    each beside its share of the copy rate and its largest difference from the defaults' output."""
    from sparkinfer.kernels.gated_delta_rule import recurrent

    defaults = {name: getattr(recurrent, name) for variant in variants for name in variant}
    for batch in batches:
        layers, slots = _decode_layers(batch, device)
        states = [x["state"].clone() for x in layers]
        expected = _decode_op(layers[0], slots, True, early_state=True)
        roof_ms = 2 * batch * NUM_V_HEADS * HEAD_DIM * HEAD_DIM * 4 / (COPY_TB_S * 1e9)
        for variant in variants:
            for name, value in variant.items():
                setattr(recurrent, name, value)
            try:
                layers[0]["state"].copy_(states[0])
                out = _decode_op(layers[0], slots, True, early_state=True)
                diff = (out.float() - expected.float()).abs()
                calls = [partial(_decode_op, x, slots, True, True) for x in layers]
                t = time_graph(calls, warmup=3, iters=20)
                is_default = all(defaults[name] == value for name, value in variant.items())
                label = ", ".join(f"{name}={value}" for name, value in variant.items())
                mark = " (default)" if is_default else ""
                print(f"B={batch} {label}{mark}: {t.median_ms * 1e3:.2f} us, "
                      f"{roof_ms / t.median_ms:.3f} of copy, max diff {diff.max().item():.2e}",
                      flush=True)  # fmt: skip
            finally:
                for name, value in defaults.items():
                    setattr(recurrent, name, value)
        del layers, states
        torch.cuda.empty_cache()


# ChunkLaunch fields to vary one at a time from the default, a few combinations, and the launch
# before the one-warp solve (32-column state tile on 2 warps, 3 stages, 2-chunk output blocks).
TUNE_VARIANTS: tuple[dict[str, int], ...] = (
    {}, {"solve_width": 16}, {"solve_width": 64}, {"solve_warps": 2},
    {"state_stages": 3}, {"state_bv": 32}, {"state_warps": 8},
    {"out_chunks": 2}, {"out_chunks": 2, "out_bk": 64}, {"out_bk": 64}, {"out_bv": 64},
    {"out_warps": 8},
    {"state_bv": 32, "state_warps": 2, "state_stages": 3, "solve_warps": 2, "out_chunks": 2,
     "out_bk": 64},
)  # fmt: skip


def tune(device: str = "cuda", lengths: tuple[int, ...] = (4096, 16384, 65536)) -> None:
    """Print each candidate launch config's prefill device time (CUDA-graph replays, so the
    host's launch time does not hide the kernels at 4K), its largest difference from the
    default config's output, and fla's time on the same inputs."""
    import dataclasses

    from sparkinfer.kernels.gated_delta_rule import chunk

    default = chunk.LAUNCH
    fla_gdn = _fla()
    for num_tokens in lengths:
        x = _inputs(num_tokens, device)
        g, beta = gdn_gating(x["a"], x["b"], x["A_log"], x["dt_bias"])
        kw = {
            "cu_seqlens": torch.tensor([0, num_tokens], dtype=torch.int32, device=device),
            "state_slots": torch.zeros(1, dtype=torch.int64, device=device),
            "has_initial_state": torch.ones(1, dtype=torch.bool, device=device),
        }

        def call(state: torch.Tensor, x=x, g=g, beta=beta, kw=kw) -> torch.Tensor:
            return chunk_gated_delta_rule(x["q"], x["k"], x["v"], g, beta, state, **kw)

        zeros = torch.zeros(1, NUM_V_HEADS, HEAD_DIM, HEAD_DIM, device=device)
        expected = call(zeros.clone())
        if fla_gdn is not None:
            fla_args = (x["q"][None], x["k"][None], x["v"][None], g[None], beta[None])
            fla_kw = {"initial_state": zeros, "output_final_state": True}
            fla_kw |= {"use_qk_l2norm_in_kernel": True}
            fla_ms, _ = _graph_ms(
                partial(fla_gdn.chunk_gated_delta_rule, *fla_args, **fla_kw), 3, 10
            )
            print(f"T={num_tokens} fla: {fla_ms:.3f} ms", flush=True)
        for variant in TUNE_VARIANTS:
            try:
                chunk.LAUNCH = dataclasses.replace(default, **variant)
                err = (call(zeros.clone()).float() - expected.float()).abs().max().item()
                ms, _ = _graph_ms(partial(call, zeros.clone()), 3, 10)
                print(f"T={num_tokens} {variant or 'default'}: {ms:.3f} ms, max diff {err:.2e}",
                      flush=True)  # fmt: skip
            except Exception as e:  # a config may not fit this GPU
                print(f"T={num_tokens} {variant}: failed {type(e).__name__}: {str(e)[:120]}")
            finally:
                chunk.LAUNCH = default
        del x
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--tune", action="store_true", help="time candidate launch configs")
    group.add_argument(
        "--tune-decode", action="store_true", help="time the recurrent decode's V tiles and warps"
    )
    group.add_argument(
        "--breakdown", action="store_true", help="the prefill's device time kernel by kernel"
    )
    parser.add_argument(
        "--tune-lengths",
        type=lambda text: tuple(int(n) for n in text.split(",")),
        default=(4096, 16384, 65536),
        help="with --tune: prompt lengths, comma-separated (default 4096,16384,65536)",
    )
    cli = parser.parse_args()
    if cli.breakdown:
        prefill_breakdown()
    elif cli.tune:
        tune(lengths=cli.tune_lengths)
    else:
        tune_decode()


if __name__ == "__main__":
    main()
