"""Kernel benchmarks: the ops of `registry.REGISTRY`, run by `sparkinfer-lab kernels`.

Protocol for each registered module `sparkinfer/lab/kernels/<op>.py`:

- Define `run(args: KernelBenchArgs) -> list[dict[str, object]]`. Import the op inside the module;
  nothing runs at import time.
- Each row is one measurement of one implementation at one shape. Keys, in this order where present:
  "op", "impl" ("fast", "ref", or a baseline library such as "fla" or "torch"), "shape" (a string
  such as "T=4096 H=16 K=128"), "dtype", "median_ms", "p90_ms", then optional figures such as
  "GB/s", "TFLOP/s", "of_peak" or "max_abs_err". The table's columns are the union of the rows'
  keys in first-seen order.
- Time with `sparkinfer.bench.timing.time_cuda(fn, warmup=args.warmup, iters=args.iters)` and put
  the fast op beside its reference (docs/style.md, Benchmarks). With `args.is_quick`, use small
  shapes.
- Raise `KernelSkipped("reason")` when the op cannot run here (e.g. a baseline library is absent).
- To run alone (`python -m sparkinfer.lab.kernels.<op>`), `main()` parses flags with
  `_cli.standalone_parser` and prints through `_cli.run_alone`.
"""

from __future__ import annotations

import argparse
import importlib
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from sparkinfer.bench.errors import DeviceError, UsageError
from sparkinfer.bench.provenance import RunInfo
from sparkinfer.bench.report import Gate, Report, Table, log
from sparkinfer.lab.kernels.registry import REGISTRY

KernelBench = Callable[["KernelBenchArgs"], list[dict[str, object]]]


@dataclass(frozen=True)
class KernelBenchArgs:
    device: torch.device
    warmup: int
    iters: int
    is_quick: bool


class KernelSkipped(Exception):
    """Raised by a kernel benchmark that cannot run on this machine; the reason is reported."""


def discover() -> list[str]:
    """Names of the registered ops, sorted."""
    return sorted(REGISTRY)


def _module_of(name: str) -> str:
    return REGISTRY[name].module if name in REGISTRY else name


def load(names: list[str]) -> dict[str, KernelBench | str]:
    """Each module's `run`, or the reason it could not be loaded."""
    out: dict[str, KernelBench | str] = {}
    for name in names:
        try:
            module = importlib.import_module(f"{__name__}.{_module_of(name)}")
        except Exception as e:  # a module mid-development must not stop the others
            out[name] = f"import failed: {type(e).__name__}: {e}"
            continue
        fn: KernelBench | None = getattr(module, "run", None)
        out[name] = fn if callable(fn) else "defines no run(args) -> list[dict]"
    return out


def bench(
    benches: Mapping[str, KernelBench | str], args: KernelBenchArgs
) -> tuple[list[Table], list[str]]:
    """Run every benchmark; returns one table per op and the ops that failed."""
    tables, failed = [], []
    for name, fn in benches.items():
        if isinstance(fn, str):
            tables.append(Table(name, ["status"], [[fn]]))
            failed.append(name)
            continue
        log(f"kernels: {name}")
        try:
            rows = fn(args)
        except KernelSkipped as e:
            tables.append(Table(name, ["status"], [[f"skipped: {e}"]]))
            continue
        except Exception as e:
            log(traceback.format_exc())
            tables.append(Table(name, ["status"], [[f"failed: {type(e).__name__}: {e}"]]))
            failed.append(name)
            continue
        tables.append(rows_table(name, rows))
    return tables, failed


def rows_table(title: str, rows: list[dict[str, object]]) -> Table:
    """One table of benchmark rows; its columns are the rows' keys in first-seen order."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    return Table(title, columns, [[row.get(c) for c in columns] for row in rows])


def run(cli: argparse.Namespace, info: RunInfo) -> Report:
    """The `kernels` mode."""
    device = torch.device(cli.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(
            "kernels needs a CUDA device and torch.cuda.is_available() is False: run on a GPU "
            "machine, or pass --device cpu for a slow smoke run of the references"
        )
    names = discover()
    if cli.only:
        wanted = cli.only.split(",")
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            raise UsageError(f"--only names {unknown}; the kernel benchmarks are {names}")
        names = [n for n in names if n in wanted]
    args = KernelBenchArgs(device, cli.warmup, cli.iters, cli.quick)
    tables, failed = bench(load(names), args)
    gate = Gate("every kernel benchmark ran", not failed, f"failed: {failed or 'none'}")
    context = {"device": str(device), "warmup/iters": f"{cli.warmup}/{cli.iters}"}
    raw = {t.title: [dict(zip(t.columns, r, strict=True)) for r in t.rows] for t in tables}
    return Report("kernels", info, context, tables, [], raw, [gate])
