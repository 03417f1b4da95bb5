"""The `tables` mode: the offline engine's decode with each of several linear shape tables.

The kernel tune times each projection alone, where cuBLAS's launch gap and the dependent launch
of the Triton kernels around it do not show; this mode settles a table change in the engine
itself. One model (full-size Qwen3.8-27B text shapes, random bf16 weights) is built once; for
every repetition, each table in turn is named in the engine's config (`shape_table`), an engine
is started on it (its CUDA graphs captured with that table's kernels) and decodes at each
concurrency as the `offline` mode does. Repetitions interleave the tables, so a drift of the
GPU's clocks reaches them all.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
from sparkinfer.bench import engine as offline
from sparkinfer.bench import roofline
from sparkinfer.bench.errors import UsageError
from sparkinfer.bench.provenance import RunInfo
from sparkinfer.bench.report import Report, Table, log

COMMITTED = "committed"  # the name of the package's own shape_table.json in --table


@dataclass(frozen=True)
class TableRun:
    table: str
    rep: int
    batch: int
    aggregate_tok_s: float  # the offline mode's figure: one stream's rate at batch 1
    steady_tok_s: float  # every stream decoding
    errors: int


def parse_table(text: str) -> tuple[str, str | None]:
    """'NAME=PATH' -> (name, path); 'committed' -> the package's table (path None)."""
    if text == COMMITTED:
        return COMMITTED, None
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise UsageError(
            f"--table {text!r}: give NAME=PATH to a shape table JSON, or {COMMITTED!r}"
        )
    return name, path


def run(args: argparse.Namespace, info: RunInfo) -> Report:
    device = offline.require_cuda()
    from sparkinfer.bench.engine_config import offline_config
    from sparkinfer.kernels.linear.shape_table import ShapeTable

    tables = [parse_table(t) for t in args.table]
    if len({name for name, _ in tables}) != len(tables):
        raise UsageError("--table names must differ")
    cfg = offline.full_size_config(args.num_layers)
    peaks = roofline.measure_peaks(device)
    model = offline.random_model(cfg, device, "tables")
    sched = offline_config(
        args,
        max_num_seqs=max(args.concurrency),
        max_model_len=max(args.context + args.new_tokens, offline.WARMUP_PROMPT + 16) + 1,
    )
    loaded = {name: ShapeTable.load(path) for name, path in tables}
    runs: list[TableRun] = []
    for rep in range(args.reps):
        for name, _ in tables:
            log(f"tables: repetition {rep + 1} of {args.reps}, table {name}")
            with_table = dataclasses.replace(sched, shape_table=loaded[name])
            with offline.started_engine(model, with_table, device) as engine:
                offline.run_requests(
                    engine, offline.random_prompts(2, offline.WARMUP_PROMPT, 1), 16, "warmup"
                )
                for b in args.concurrency:
                    r = offline.measure_decode(
                        engine, cfg.text, peaks, batch=b, context=args.context,
                        new_tokens=args.new_tokens, seed=b,
                    )  # fmt: skip
                    value = r.stream_tok_s if b == 1 else r.aggregate_tok_s
                    runs.append(TableRun(name, rep, b, value, r.steady_tok_s, r.errors))
    del model
    gc.collect()
    torch.cuda.empty_cache()
    context = {
        "model": f"Qwen3.8-27B text shapes, {cfg.text.num_hidden_layers} layers, bf16, random "
        f"weights; decode at {args.context} context, {args.new_tokens} new tokens per stream",
        "tables": ", ".join(f"{name}={path or 'shape_table.json'}" for name, path in tables),
        "scheduler": str(sched),
    }
    return Report("tables", info, context, summary_tables(runs), raw={
        "runs": [asdict(r) for r in runs],
    })  # fmt: skip


def summary_tables(runs: list[TableRun]) -> list[Table]:
    """Every run, then per concurrency the median of each table against the first table's."""
    each = Table(
        "runs (aggregate tok/s: one stream's rate at batch 1)",
        ["table", "repetition", "batch", "aggregate tok/s", "all-decoding tok/s", "errors"],
        [[r.table, r.rep + 1, r.batch, r.aggregate_tok_s, r.steady_tok_s, r.errors] for r in runs],
    )
    names = list(dict.fromkeys(r.table for r in runs))
    batches = sorted({r.batch for r in runs})
    rows = []
    for b in batches:
        medians = {
            name: float(
                np.median([r.aggregate_tok_s for r in runs if r.table == name and r.batch == b])
            )
            for name in names
        }
        first = medians[names[0]]
        for name in names:
            ratio = medians[name] / first if first > 0 else math.nan
            rows.append([b, name, medians[name], ratio])
    summary = Table(
        "median per table",
        ["batch", "table", "aggregate tok/s", f"vs {names[0]}" if names else "vs first"],
        rows,
        ["repetitions interleave the tables; each starts its own engine on the same model"],
    )
    return [summary, each]
