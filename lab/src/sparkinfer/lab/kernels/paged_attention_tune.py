"""Paged attention's sweeps, for a person choosing its defaults (they print rather than return
rows): `--tune` times candidate tile configs; `--split-costs` shows where a decode call's time
goes (the default plan whole, each of its two passes alone, a copy of the same bytes, and
variants of the plan), at the benchmark's 27B shapes. Run:
``python -m sparkinfer.lab.kernels.paged_attention_tune --tune | --split-costs``.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable

import torch
from sparkinfer.kernels.paged_attention.decode import (
    DecodeConfig,
    default_decode_config,
    launch_decode_merge,
    launch_decode_splits,
)
from sparkinfer.lab.kernels._graph_timing import (
    COPY_PEER,
    copy_bandwidth,
    same_bytes_copies,
    time_graph,
)
from sparkinfer.lab.kernels.paged_attention import (
    HKV,
    SCALE,
    D,
    _decode_call,
    _decode_inputs,
    tune,
)

SPLIT_COST_SHAPES = ((1, 4096), (1, 32768), (1, 131072), (8, 4096), (8, 32768), (32, 4096))


def _variants(base: DecodeConfig) -> dict[str, DecodeConfig]:
    """The default plan beside half and twice its splits, three stages and eight warps."""
    out = {"default": base}
    for factor, name in ((0.5, "half the splits"), (2, "twice the splits")):
        splits = int(base.MAX_SPLITS * factor)
        if 1 <= splits <= 128:
            out[name] = dataclasses.replace(base, MAX_SPLITS=splits)
    out["3 stages"] = dataclasses.replace(base, num_stages=3)
    out["8 warps"] = dataclasses.replace(base, num_warps=8)
    return out


def split_costs(device: torch.device, rounds: int = 3) -> None:
    """Print where a decode call's time goes: the default plan whole, its split pass alone, its
    merge pass alone (on the split pass's partials), a copy of the same bytes, and variants of
    the plan; each timed in turn for `rounds` rounds (the median of the rounds' medians)."""
    copy = copy_bandwidth(device)
    for batch, context in SPLIT_COST_SHAPES:
        xs = _decode_inputs(batch, context, device)
        base = default_decode_config(xs[0]["q"], HKV)
        kv_bytes = batch * context * HKV * D * 4
        expected = _decode_call(xs[0], base)()
        calls: dict[str, list[Callable[[], object]]] = {
            f"whole, {name}": [_decode_call(x, cfg) for x in xs]
            for name, cfg in _variants(base).items()
        }
        calls["split pass alone"] = [_split_pass(x, base) for x in xs]
        calls["merge pass alone"] = [_merge_pass(x, base) for x in xs]
        calls[COPY_PEER] = same_bytes_copies(kv_bytes, len(xs), device)
        same = {name: torch.equal(_decode_call(xs[0], cfg)(), expected)
                for name, cfg in _variants(base).items()}  # fmt: skip
        times: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(rounds):
            for name, fns in calls.items():
                times[name].append(time_graph(fns, warmup=3, iters=20).median_ms)
        print(f"decode B={batch} ctx={context} (default: {base})", flush=True)
        for name, ts in times.items():
            ms = sorted(ts)[len(ts) // 2]
            bits = f", same bits {same[name[7:]]}" if name.startswith("whole, ") else ""
            print(f"  {name}: {ms * 1e3:.2f} us, {kv_bytes / (ms / 1e3) / copy:.4f} of copy"
                  f"{bits}", flush=True)  # fmt: skip
        del xs, calls
        torch.cuda.empty_cache()


def _split_pass(x: dict[str, torch.Tensor], config: DecodeConfig):
    return lambda: launch_decode_splits(x["q"], x["k_cache"], x["v_cache"], x["context_lens"],
                                        x["block_tables"], SCALE, config)  # fmt: skip


def _merge_pass(x: dict[str, torch.Tensor], config: DecodeConfig):
    parts = launch_decode_splits(x["q"], x["k_cache"], x["v_cache"], x["context_lens"],
                                 x["block_tables"], SCALE, config)  # fmt: skip
    o = torch.empty_like(x["q"])
    return lambda: launch_decode_merge(parts, x["context_lens"], x["gate"], o, config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--tune", action="store_true", help="print candidate tile timings")
    group.add_argument(
        "--split-costs", action="store_true", help="print a decode call's passes timed apart"
    )
    cli = parser.parse_args()
    if cli.split_costs:
        split_costs(torch.device("cuda"))
    else:
        tune(torch.device("cuda"))


if __name__ == "__main__":
    main()
