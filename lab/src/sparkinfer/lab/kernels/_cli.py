"""Running one kernel benchmark alone: ``python -m sparkinfer.lab.kernels.<op> [--quick]``."""

from __future__ import annotations

import argparse

import torch
from sparkinfer.lab.kernels import KernelBench, KernelBenchArgs, rows_table


def standalone_parser(doc: str | None, *, warmup: int, iters: int) -> argparse.ArgumentParser:
    """`--quick`, `--warmup` and `--iters` with the module's defaults; add its own flags to it."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--quick", action="store_true", help="small shapes only")
    parser.add_argument("--warmup", type=int, default=warmup)
    parser.add_argument("--iters", type=int, default=iters)
    return parser


def run_alone(run: KernelBench, cli: argparse.Namespace, doc: str | None) -> None:
    """Run `run` on the GPU with the parsed flags and print its rows as one table."""
    args = KernelBenchArgs(torch.device("cuda"), cli.warmup, cli.iters, cli.quick)
    title = (doc or "").strip().splitlines()[0] if doc else "kernel benchmark"
    print(rows_table(title, run(args)).render())
