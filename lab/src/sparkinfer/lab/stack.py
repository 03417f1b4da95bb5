"""The `stack` mode: one forward of the full-size Qwen3.8-27B layer stack, torch path vs Triton.

The same model (random bf16 weights on the GPU) runs each step twice: with the plain-torch
reference ops of `sparkinfer.kernels` (the CPU path, run on the GPU; cuBLAS linears) and with the
Triton kernels the engine uses (`--skip-torch`: the Triton kernels only). Steps are timed
eagerly, with no engine and no CUDA graphs, so the difference is the kernels': a prefill of one
prompt and decode steps of 1 and 32 sequences at a 4K context (the caches hold zeros; speed does
not depend on their values).
"""

from __future__ import annotations

import argparse
import functools
import gc
from dataclasses import asdict, dataclass

import torch
from sparkinfer.bench import roofline
from sparkinfer.bench.engine import NUM_REAL_TOKENS, full_size_config, random_model, require_cuda
from sparkinfer.bench.provenance import RunInfo
from sparkinfer.bench.report import Report, Table, log
from sparkinfer.bench.timing import time_cuda_interleaved
from sparkinfer.model.cache_spec import allocate_caches
from sparkinfer.model.forward_batch import ForwardBatch
from sparkinfer.model.layers import REFERENCE_OPS, triton_ops

BLOCK_SIZE = 64


@dataclass(frozen=True)
class StepRow:
    step: str
    ops: str
    median_ms: float
    p90_ms: float
    tokens_per_s: float


def cached_batch(new: int, context: int, num_seqs: int, caches, device) -> ForwardBatch:
    """`num_seqs` sequences, each with `new` tokens after `context` cached ones."""
    blocks = -(-(context + new) // BLOCK_SIZE)
    tables = [list(range(i * blocks, (i + 1) * blocks)) for i in range(num_seqs)]
    return ForwardBatch.build(
        [new] * num_seqs, [context] * num_seqs, tables, list(range(num_seqs)),
        caches=caches, block_size=BLOCK_SIZE, device=device,
    )  # fmt: skip


def stack_caches(model, max_seqs: int, max_tokens: int, device):
    """Caches for `max_seqs` sequences of up to `max_tokens` tokens each, new tokens included."""
    return allocate_caches(
        model.cache_spec(), num_blocks=max_seqs * -(-max_tokens // BLOCK_SIZE),
        block_size=BLOCK_SIZE, num_slots=max_seqs, device=device,
    )  # fmt: skip


def run(args: argparse.Namespace, info: RunInfo) -> Report:
    device = require_cuda()
    cfg = full_size_config(args.num_layers)
    model = random_model(cfg, device, "stack")
    max_seqs = max(args.decode_batches)
    caches = stack_caches(model, max_seqs, max(args.context, args.prompt_len) + 1, device)
    steps = [(f"prefill {args.prompt_len} tokens", args.prompt_len, 0, 1)]
    steps += [(f"decode {b} x {args.context} context", 1, args.context, b)
              for b in args.decode_batches]  # fmt: skip
    rows = _measure(model, caches, steps, args, device)
    del model, caches
    gc.collect()
    torch.cuda.empty_cache()
    peaks = roofline.measure_peaks(device)
    return Report(
        "stack",
        info,
        {
            "model": f"Qwen3.8-27B text shapes, {cfg.text.num_hidden_layers} layers, bf16, random "
            "weights; eager forwards (no engine, no CUDA graphs)",
            "peaks": f"copy {peaks.copy_bytes_s / 1e9:,.0f} GB/s, bf16 matmul "
            f"{peaks.matmul_flop_s / 1e12:,.0f} TFLOP/s (this run)",
        },
        [_table(rows)],
        raw={"rows": [asdict(r) for r in rows]},
    )


def _measure(model, caches, steps, args: argparse.Namespace, device) -> list[StepRow]:
    """Each step with the torch references (unless skipped), then with the Triton kernels.

    Steps run as the engine runs them, the last layer's projection and MLP on the sampled rows
    only; with the Triton kernels a prefill also runs with every row through the last layer,
    the two interleaved.
    """
    rows: list[StepRow] = []
    kernels = [("triton", triton_ops())]
    if not args.skip_torch:
        kernels.insert(0, ("torch reference", REFERENCE_OPS))
    for ops_name, ops in kernels:
        model.use_ops(ops)
        for name, new, context, num_seqs in steps:
            log(f"stack: {ops_name}: {name}")
            batch = cached_batch(new, context, num_seqs, caches, device)
            ids = torch.randint(0, NUM_REAL_TOKENS, (new * num_seqs,), device=device)
            variants = {name: True}
            if new > 1 and ops_name == "triton":
                variants[f"{name}, every row through the last layer"] = False
            fns = [
                functools.partial(_step, model, ids, batch, rows_only)
                for rows_only in variants.values()
            ]
            timings = time_cuda_interleaved(fns, warmup=args.warmup, iters=args.iters)
            for label, t in zip(variants, timings, strict=True):
                tok_s = new * num_seqs / (t.median_ms / 1e3)
                rows.append(StepRow(label, ops_name, t.median_ms, t.p90_ms, tok_s))
    return rows


@torch.inference_mode()
def _step(model, ids: torch.Tensor, batch: ForwardBatch, logits_rows_only: bool) -> None:
    hidden = model(ids, batch, logits_rows_only=logits_rows_only)
    model.compute_logits(hidden if logits_rows_only else hidden[batch.logits_indices])


def _table(rows: list[StepRow]) -> Table:
    torch_ms = {r.step: r.median_ms for r in rows if r.ops == "torch reference"}
    return Table(
        "27B layer stack: one forward step, torch reference ops vs Triton kernels",
        ["step", "ops", "median ms", "p90 ms", "tok/s", "speedup vs torch"],
        [
            [r.step, r.ops, r.median_ms, r.p90_ms, r.tokens_per_s, _speedup(torch_ms, r)]
            for r in rows
        ],
        [
            "eager: launch gaps are in both columns; the engine replays decode as CUDA graphs",
            "steps run the last layer's output projection and MLP on the sampled rows only, as "
            "the engine does; `every row through the last layer` is the same prefill without "
            "that, its calls alternating with the plain row's",
        ],
    )


def _speedup(torch_ms: dict[str, float], row: StepRow) -> float | str:
    return torch_ms[row.step] / row.median_ms if row.step in torch_ms else "-"
