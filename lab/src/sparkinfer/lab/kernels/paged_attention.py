"""Paged attention benchmark at Qwen3.8-27B shapes (24 query heads, 4 KV heads, D=256, bf16).

Prefill: one causal sequence through the paged cache, against torch SDPA on contiguous K/V (the
ratio `vs_sdpa` > 1 means faster than SDPA). Decode: a batch of equal contexts, as a fraction of
this run's copy bandwidth over the K/V bytes, beside SDPA on contiguous K/V and a copy moving
the same bytes (up to 1 GiB). Every row is replayed from CUDA graphs: device time alone, as the
engine's steps run them. Run alone: ``python -m sparkinfer.lab.kernels.paged_attention
[--quick]``; tile sweeps and split costs: `paged_attention_tune`.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import torch
import torch.nn.functional as F
from sparkinfer.bench.timing import time_cuda
from sparkinfer.kernels.paged_attention import (
    paged_attention_decode,
    paged_attention_decode_ref,
    paged_attention_prefill,
)
from sparkinfer.kernels.paged_attention.decode import DecodeConfig, launch_decode
from sparkinfer.kernels.paged_attention.prefill import (
    PrefillConfig,
    default_prefill_config,
    launch_prefill,
)
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

H, HKV, D, BLOCK_SIZE = 24, 4, 256, 64
SCALE = D**-0.5
PREFILL_LENGTHS = (4096, 8192, 16384, 32768)
# A prefix-cache hit: a short question (new tokens) after a long cached context.
CACHED_PREFILLS = ((16, 32000), (54, 32000), (128, 32000))
# The defaults before few-row steps took 64-row tiles and up to 16 splits: timed beside them.
EARLIER_FEW_ROW_CONFIG = PrefillConfig(BM=128, BN=64, num_warps=8, num_stages=2, use_tma=True,
                                       kv_splits=8)  # fmt: skip
# Other choices for a few rows over a long context, beside the default: one query head a 64-row
# tile (the default up to PACKED_MAX_ROWS rows before it packed a KV head's query heads), and
# packed tiles in 16 splits (the packed default before it took 32, and the other packing choice
# where the default keeps one head a tile).
ONE_HEAD_FEW_ROW_CONFIG = PrefillConfig(BM=64, BN=64, num_warps=4, num_stages=2, use_tma=True,
                                        kv_splits=16, heads_fastest=True)  # fmt: skip
PACKED_FEW_ROW_CONFIG = PrefillConfig(BM=128, BN=64, num_warps=8, num_stages=2, use_tma=True,
                                      kv_splits=16, heads_fastest=True, pack_gqa=True)  # fmt: skip
DECODE_BATCHES = (1, 8, 32)
DECODE_CONTEXTS = (4096, 32768, 131072)
MAX_SDPA_BYTES = 40 * 2**30
# A graph-replayed copy moving a decode row's K/V bytes, beside it up to this size: what the
# size alone allows (a copy of a few MiB runs far below the copy rate of large buffers).
MAX_COPY_PEER_BYTES = 2**30

Row = dict[str, Any]


def _prefill_inputs(num_tokens: int, device: torch.device) -> dict[str, torch.Tensor]:
    """One sequence of num_tokens new tokens whose K/V sit in shuffled cache blocks."""
    num_blocks = -(-num_tokens // BLOCK_SIZE)
    kv = torch.randn(2, num_tokens, HKV, D, device=device, dtype=torch.bfloat16)
    perm = torch.randperm(num_blocks, device=device)
    k_cache = torch.zeros(num_blocks, BLOCK_SIZE, HKV, D, device=device, dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    padded = num_blocks * BLOCK_SIZE
    k_cache[perm] = F.pad(kv[0], (0, 0, 0, 0, 0, padded - num_tokens)).view_as(k_cache)
    v_cache[perm] = F.pad(kv[1], (0, 0, 0, 0, 0, padded - num_tokens)).view_as(v_cache)
    qg = torch.randn(num_tokens, H, 2 * D, device=device, dtype=torch.bfloat16)
    return {
        "q": qg[..., :D], "gate": qg[..., D:], "k": kv[0], "v": kv[1],
        "k_cache": k_cache, "v_cache": v_cache,
        "cu_seqlens": torch.tensor([0, num_tokens], device=device, dtype=torch.int32),
        "cached_lens": torch.zeros(1, device=device, dtype=torch.int32),
        "block_tables": perm.to(torch.int32)[None],
    }  # fmt: skip


def _prefill_call(x: dict[str, torch.Tensor], config: PrefillConfig | None = None):
    if config is None:
        return lambda: paged_attention_prefill(
            x["q"], x["k_cache"], x["v_cache"], cu_seqlens=x["cu_seqlens"],
            cached_lens=x["cached_lens"], block_tables=x["block_tables"], scale=SCALE,
            gate=x["gate"],
        )  # fmt: skip
    return lambda: launch_prefill(
        x["q"], x["k_cache"], x["v_cache"], x["cu_seqlens"], x["cached_lens"],
        x["block_tables"], SCALE, x["gate"], config,
    )  # fmt: skip


def _sdpa_heads(x: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """q [1, H, T_new, D] and K, V [1, H, T, D] contiguous, each KV head repeated for its group."""
    q = x["q"].transpose(0, 1).contiguous()[None]
    k = x["k"].transpose(0, 1).repeat_interleave(H // HKV, 0).contiguous()[None]
    v = x["v"].transpose(0, 1).repeat_interleave(H // HKV, 0).contiguous()[None]
    return q, k, v


def _sdpa_prefill(x: dict[str, torch.Tensor]):
    q, k, v = _sdpa_heads(x)
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=SCALE)


def bench_prefill(device, lengths, warmup: int, iters: int) -> list[Row]:
    """One causal sequence: our default, the same kernel with the grid's other order (head-first
    or tile-first, `PrefillConfig.heads_fastest`) and SDPA, each replayed from a CUDA graph:
    device time alone, as a prefill step's kernels run behind the host."""
    rows = []
    for num_tokens in lengths:
        x = _prefill_inputs(num_tokens, device)
        flops = 2.0 * num_tokens * num_tokens * D * H  # causal: half of 4 T^2 D H
        expected = _sdpa_prefill(x)()[0].transpose(0, 1).float() * torch.sigmoid(x["gate"].float())
        err = (_prefill_call(x)().float() - expected).abs().max().item()
        del expected
        default = default_prefill_config(x["q"], HKV)
        other_order = "tiles" if default.heads_fastest else "heads"
        swapped = dataclasses.replace(default, heads_fastest=not default.heads_fastest)
        calls = {"fast": _prefill_call(x), f"fast, {other_order} first": _prefill_call(x, swapped),
                 "torch_sdpa": _sdpa_prefill(x)}  # fmt: skip
        times = {impl: time_graph([fn], warmup=warmup, iters=iters) for impl, fn in calls.items()}
        for impl, t in times.items():
            rows.append({
                "op": "attention_prefill", "impl": impl,
                "shape": f"T={num_tokens} H={H} HKV={HKV} D={D} causal", "dtype": "bf16",
                "median_ms": t.median_ms, "p90_ms": t.p90_ms,
                "TFLOP/s": flops / t.median_ms / 1e9,
                "vs_sdpa": times["torch_sdpa"].median_ms / t.median_ms,
                "max_abs_err": err if impl == "fast" else None,
            })  # fmt: skip
        del x
        torch.cuda.empty_cache()
    return rows


def bench_cached_prefill(device, shapes, warmup: int, iters: int) -> list[Row]:
    """A few new tokens after a long cached context (the prefix-cache hit): our default, the
    earlier 128-row tiles in 8 splits, one head a tile where the default packs
    (`ONE_HEAD_FEW_ROW_CONFIG`), packed tiles in 16 splits (`PACKED_FEW_ROW_CONFIG`) and SDPA
    with a lower-right causal mask on contiguous K/V; each replayed from a CUDA graph, so the
    host's work around a launch is left out."""
    from torch.nn.attention.bias import causal_lower_right

    rows = []
    for num_new, num_cached in shapes:
        total = num_new + num_cached
        full = _prefill_inputs(total, device)
        index = {"cu_seqlens": [0, num_new], "cached_lens": [num_cached]}
        x = {**full, "q": full["q"][-num_new:], "gate": full["gate"][-num_new:]}
        x |= {n: torch.tensor(v, device=device, dtype=torch.int32) for n, v in index.items()}
        q, k, v = _sdpa_heads(x)
        mask = causal_lower_right(num_new, total)

        def sdpa(q=q, k=k, v=v, mask=mask):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=SCALE)

        expected = sdpa()[0].transpose(0, 1).float() * torch.sigmoid(x["gate"].float())
        calls = {"fast": _prefill_call(x), "fast, 128-row tiles, 8 splits":
                 _prefill_call(x, EARLIER_FEW_ROW_CONFIG)}  # fmt: skip
        if default_prefill_config(x["q"], HKV).pack_gqa:
            calls["fast, one head a tile, 64-row tiles, 16 splits"] = _prefill_call(
                x, ONE_HEAD_FEW_ROW_CONFIG
            )
        calls["fast, packed heads, 128-row tiles, 16 splits"] = _prefill_call(
            x, PACKED_FEW_ROW_CONFIG
        )
        calls["torch_sdpa"] = sdpa
        errs = {impl: (calls[impl]().float() - expected).abs().max().item()
                for impl in calls if impl != "torch_sdpa"}  # fmt: skip
        times = {impl: time_graph([fn], warmup=warmup, iters=iters) for impl, fn in calls.items()}
        flops = 4.0 * num_new * (num_cached + num_new / 2) * D * H
        for impl, t in times.items():
            rows.append({
                "op": "attention_prefill", "impl": impl,
                "shape": f"T={num_new} cached={num_cached} H={H} HKV={HKV} D={D} causal",
                "dtype": "bf16", "median_ms": t.median_ms, "p90_ms": t.p90_ms,
                "TFLOP/s": flops / t.median_ms / 1e9,
                "vs_sdpa": times["torch_sdpa"].median_ms / t.median_ms,
                "max_abs_err": errs.get(impl),
            })  # fmt: skip
        del full, x, q, k, v, expected
        torch.cuda.empty_cache()
    return rows


def _decode_inputs(batch: int, context: int, device: torch.device) -> list[dict[str, torch.Tensor]]:
    """Rotating decode batches over one shared cache, each batch on distinct blocks."""
    kv_bytes = batch * context * HKV * D * 2 * 2
    copies = rotation_copies(kv_bytes)
    blocks_per_seq = -(-context // BLOCK_SIZE)
    num_blocks = copies * batch * blocks_per_seq
    k_cache = torch.randn(num_blocks, BLOCK_SIZE, HKV, D, device=device, dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(num_blocks, device=device).to(torch.int32)
    tables = tables.view(copies, batch, blocks_per_seq)
    return [{
        "q": torch.randn(batch, H, D, device=device, dtype=torch.bfloat16),
        "gate": torch.randn(batch, H, D, device=device, dtype=torch.bfloat16),
        "k_cache": k_cache, "v_cache": v_cache, "block_tables": tables[i],
        "context_lens": torch.full((batch,), context, device=device, dtype=torch.int32),
    } for i in range(copies)]  # fmt: skip


def _decode_call(x: dict[str, torch.Tensor], config: DecodeConfig | None = None):
    if config is None:
        return lambda: paged_attention_decode(
            x["q"], x["k_cache"], x["v_cache"], context_lens=x["context_lens"],
            block_tables=x["block_tables"], scale=SCALE, gate=x["gate"],
        )  # fmt: skip
    return lambda: launch_decode(x["q"], x["k_cache"], x["v_cache"], x["context_lens"],
                                 x["block_tables"], SCALE, x["gate"], config)  # fmt: skip


def _sdpa_decode(batch: int, context: int, device: torch.device):
    q = torch.randn(batch, H, 1, D, device=device, dtype=torch.bfloat16)
    k = torch.randn(batch, HKV, context, D, device=device, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    return lambda: F.scaled_dot_product_attention(q, k, v, scale=SCALE, enable_gqa=True)


def bench_decode(device, batches, contexts, *, warmup: int, iters: int) -> list[Row]:
    copy = copy_bandwidth(device)
    rows = []
    for batch, context in itertools.product(batches, contexts):
        kv_bytes = batch * context * HKV * D * 2 * 2
        xs = _decode_inputs(batch, context, device)
        err = _decode_error(xs[0]) if batch == 1 else None
        times = {"fast": time_graph([_decode_call(x) for x in xs], warmup=warmup, iters=iters)}
        del xs
        torch.cuda.empty_cache()
        if kv_bytes <= MAX_COPY_PEER_BYTES:
            copies = same_bytes_copies(kv_bytes, rotation_copies(kv_bytes), device)
            times[COPY_PEER] = time_graph(copies, warmup=warmup, iters=iters)
            del copies
            torch.cuda.empty_cache()
        if kv_bytes <= MAX_SDPA_BYTES:
            times["torch_sdpa"] = time_graph([_sdpa_decode(batch, context, device)],
                                             warmup=warmup, iters=iters)  # fmt: skip
            torch.cuda.empty_cache()
        sdpa_ms = times["torch_sdpa"].median_ms if "torch_sdpa" in times else None
        for impl, t in times.items():
            extra = {
                "vs_sdpa": sdpa_ms / t.median_ms if sdpa_ms else None,
                "max_abs_err": err if impl == "fast" else None,
            }
            shape = f"B={batch} ctx={context} H={H} HKV={HKV} D={D}"
            rows.append(bandwidth_row(
                "attention_decode", impl, shape, t, nbytes=kv_bytes, copy=copy, extra=extra
            ))  # fmt: skip
    return rows


def _decode_error(x: dict[str, torch.Tensor]) -> float:
    """Max abs difference to the plain-torch reference."""
    expected = paged_attention_decode_ref(
        x["q"], x["k_cache"], x["v_cache"], context_lens=x["context_lens"],
        block_tables=x["block_tables"], scale=SCALE, gate=x["gate"],
    )  # fmt: skip
    return (_decode_call(x)().float() - expected.float()).abs().max().item()


def tune(device: torch.device) -> None:
    """Print the time of each candidate tile config at representative shapes."""
    x = _prefill_inputs(16384, device)
    for bm, bn, warps, stages, tma, prefetch in (
        (128, 64, 8, 3, False, False), (128, 64, 8, 2, True, False), (128, 64, 8, 3, True, False),
        (128, 64, 8, 2, True, True), (128, 64, 8, 3, True, True), (128, 32, 8, 3, True, False),
        (64, 64, 4, 3, True, False),
    ):  # fmt: skip
        cfg = PrefillConfig(BM=bm, BN=bn, num_warps=warps, num_stages=stages, use_tma=tma,
                            use_qk_prefetch=prefetch)  # fmt: skip
        try:
            t = time_cuda(_prefill_call(x, cfg), warmup=2, iters=5)
            print(f"prefill T=16384 {cfg}: {t.median_ms:.3f} ms", flush=True)
        except Exception as e:  # a config may exceed shared memory
            print(f"prefill {cfg}: failed {type(e).__name__}: {str(e)[:120]}", flush=True)
    del x
    torch.cuda.empty_cache()
    for batch, context in ((1, 131072), (8, 32768), (32, 4096), (16, 4096), (8, 4096), (1, 4096)):
        xs = _decode_inputs(batch, context, device)
        # The default (64, 256, 4, 2) first; K and V tiles of 64 keys at two stages hold 128 KiB
        # of shared memory, one program per SM: narrower tiles, more warps and stages trade that.
        for bn, min_len, warps, stages in ((64, 256, 4, 2), (64, 512, 4, 2), (32, 256, 4, 3),
                                           (64, 128, 4, 2), (64, 64, 4, 2), (32, 128, 4, 3),
                                           (32, 64, 4, 2), (32, 32, 4, 2), (64, 256, 8, 2),
                                           (64, 256, 4, 3), (32, 256, 4, 2), (32, 256, 4, 4),
                                           (32, 256, 8, 4), (16, 256, 4, 4), (16, 256, 2, 4),
                                           (32, 512, 4, 4), (32, 128, 4, 4)):  # fmt: skip
            cfg = DecodeConfig(BN=bn, MIN_SPLIT_LEN=min_len, MAX_SPLITS=64, num_warps=warps,
                               num_stages=stages)  # fmt: skip
            try:
                t = time_graph([_decode_call(x, cfg) for x in xs], warmup=2, iters=10)
                gbs = batch * context * HKV * D * 4 / t.median_ms / 1e6
                print(f"decode B={batch} ctx={context} {cfg}: {t.median_ms * 1e3:.1f} us "
                      f"{gbs:.0f} GB/s", flush=True)  # fmt: skip
            except Exception as e:
                print(f"decode {cfg}: failed {type(e).__name__}: {str(e)[:120]}", flush=True)
        del xs
        torch.cuda.empty_cache()


def bench(device: torch.device, *, warmup: int, iters: int, is_quick: bool) -> list[Row]:
    lengths = (2048,) if is_quick else PREFILL_LENGTHS
    contexts = (4096,) if is_quick else DECODE_CONTEXTS
    prefill = bench_prefill(device, lengths, warmup, iters)
    prefill += bench_cached_prefill(device, CACHED_PREFILLS, warmup, iters)
    return prefill + bench_decode(device, DECODE_BATCHES, contexts, warmup=warmup, iters=iters)


def run(args: KernelBenchArgs) -> list[Row]:
    """`sparkinfer-lab kernels` entry point."""
    return bench(args.device, warmup=args.warmup, iters=args.iters, is_quick=args.is_quick)


def main() -> None:
    run_alone(run, standalone_parser(__doc__, warmup=3, iters=10).parse_args(), __doc__)


if __name__ == "__main__":
    main()
