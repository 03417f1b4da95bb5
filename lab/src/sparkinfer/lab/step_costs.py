"""The `step-costs` mode: what each kind of small kernel costs inside the 27B decode step.

The decode step of the full-size model (random bf16 weights, caches of zeros at the given
context) is captured as one CUDA graph, with dependent launch as the engine runs it, and timed by
its replays. Then again with one kind of small kernel replaced by a stand-in that launches
nothing and returns a tensor of the right shape (the outputs are wrong: only the time counts),
and with every kind replaced at once, which leaves the projections, the LM head and the
embedding. The difference to the whole step is that kind's cost in place: its own time plus
what it adds to or hides from its neighbours, which kernel times from a profile cannot show
(under dependent launch each kernel starts while the one before it still runs). Variants are
interleaved over repetitions and each keeps its best replay median.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from sparkinfer.bench.engine import NUM_REAL_TOKENS, full_size_config, random_model, require_cuda
from sparkinfer.bench.provenance import RunInfo
from sparkinfer.bench.report import Report, Table, log
from sparkinfer.bench.timing import time_cpu
from sparkinfer.lab.stack import cached_batch, stack_caches

WHOLE_STEP = "whole step"
EVERY_KIND = "every kind above"


def _no_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, residual=None):
    return x, (x if residual is None else residual)


def _no_attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, **_):
    return q


def _no_qk_norm_rotary(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **_):
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)


def _no_conv_update(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor, **_):
    return x


def _no_recurrent_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_, **__):
    return torch.empty(v.shape, dtype=v.dtype, device=v.device)


# Each kind of small kernel of the decode step and the KernelOps fields its stand-ins replace.
STAND_INS: dict[str, dict[str, Callable[..., Any]]] = {
    "RMSNorm (residual add)": {"rms_norm": _no_rms_norm},
    "attention decode": {"paged_attention_decode": _no_attention_decode},
    "q/k norm + rotary + KV write": {"qk_norm_rotary": _no_qk_norm_rotary},
    "causal conv update": {"causal_conv1d_update": _no_conv_update},
    "GDN recurrent decode (gated norm inside or after)": {
        "fused_recurrent_gated_delta_rule": _no_recurrent_decode
    },
}


@dataclass(frozen=True)
class CostRow:
    batch: int
    variant: str
    step_ms: float
    cost_ms: float  # the whole step's time less this variant's
    share: float  # cost_ms over the whole step's time


def variants() -> dict[str, dict[str, Callable[..., Any]]]:
    """The whole step, each kind's stand-ins alone, then all of them together."""
    every = {field: fn for fields in STAND_INS.values() for field, fn in fields.items()}
    return {WHOLE_STEP: {}} | STAND_INS | {EVERY_KIND: every}


def measure(
    model,
    caches,
    *,
    batches: tuple[int, ...],
    context: int,
    reps: int,
    time_ms: Callable[[Callable[[], None]], float],
    device: torch.device,
) -> list[CostRow]:
    """Each variant's step time at each batch size (best of `reps`, variants interleaved)."""
    ops = model.ops
    rows: list[CostRow] = []
    try:
        for num_seqs in batches:
            batch = cached_batch(1, context, num_seqs, caches, device)
            ids = torch.randint(0, NUM_REAL_TOKENS, (num_seqs,), device=device)

            @torch.inference_mode()
            def step(ids=ids, batch=batch) -> None:
                hidden = model(ids, batch)
                model.compute_logits(hidden[batch.logits_indices])

            best: dict[str, float] = {}
            for rep in range(reps):
                for name, fields in variants().items():
                    log(f"step-costs: {num_seqs} sequences, {name} ({rep + 1}/{reps})")
                    model.use_ops(dataclasses.replace(ops, **fields))
                    best[name] = min(best.get(name, math.inf), time_ms(step))
            whole = best[WHOLE_STEP]
            rows += [
                CostRow(num_seqs, name, ms, whole - ms, (whole - ms) / whole)
                for name, ms in best.items()
            ]
    finally:
        model.use_ops(ops)
    return rows


def _graph_timer(warmup: int, iters: int) -> Callable[[Callable[[], None]], float]:
    """Median ms of a CUDA graph's replays of the step (captured once per call)."""
    from sparkinfer.lab.kernels._graph_timing import time_graph

    return lambda step: time_graph([step], warmup=warmup, iters=iters).median_ms


def _wall_clock_timer(warmup: int, iters: int) -> Callable[[Callable[[], None]], float]:
    """Median ms of eager steps by the host's clock (the CPU smoke run)."""
    return lambda step: time_cpu(step, warmup=warmup, iters=iters).median_ms


def run(args: argparse.Namespace, info: RunInfo) -> Report:
    from sparkinfer.kernels.tuning import KernelTuning, kernel_tuning

    device = require_cuda()
    cfg = full_size_config(args.num_layers)
    model = random_model(cfg, device, "step-costs")
    max_seqs = max(args.decode_batches)
    caches = stack_caches(model, max_seqs, args.context + 1, device)
    timer = _graph_timer if device.type == "cuda" else _wall_clock_timer
    time_ms = timer(args.warmup, args.iters)
    with kernel_tuning(KernelTuning(use_dependent_launch=args.dependent_launch)):
        rows = measure(
            model, caches, batches=args.decode_batches, context=args.context, reps=args.reps,
            time_ms=time_ms, device=device,
        )  # fmt: skip
    launch = "dependent launch on" if args.dependent_launch else "dependent launch off"
    return Report(
        "step-costs",
        info,
        {
            "model": f"Qwen3.8-27B text shapes, {cfg.text.num_hidden_layers} layers, bf16, random "
            f"weights; decode step at {args.context} context as one CUDA graph, {launch}",
        },
        [_table(rows, args.context)],
        raw={"rows": [asdict(r) for r in rows]},
    )


def _table(rows: list[CostRow], context: int) -> Table:
    return Table(
        f"decode step at {context} context: each kind of small kernel's cost in place",
        ["sequences", "replaced by stand-ins", "step ms", "cost ms", "share of the step"],
        [[r.batch, r.variant, r.step_ms, r.cost_ms, r.share] for r in rows],
        [
            "cost: the whole step's time less the step's with that kind's kernels replaced by "
            "stand-ins that launch nothing (wrong outputs, same shapes); best of the repetitions",
        ],
    )
