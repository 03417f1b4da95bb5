"""`sparkinfer-lab`: GPU tuning and profiling of SparkInfer's kernels and engine steps.

Development only: nothing in the product imports it, and the server image does not install it.
What users run (serving, evals, the offline engine, vision) is `sparkinfer-bench`. Exit status:
0 when every gate passes, 1 when a gate fails, 2 on a usage or device error.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from sparkinfer.bench import provenance
from sparkinfer.bench.cli_args import check_counts, int_list, output_flags
from sparkinfer.bench.device_modes import dependent_launch_flag
from sparkinfer.bench.errors import BenchError
from sparkinfer.bench.report import emit

# Each mode's module under sparkinfer.lab, imported only when the mode runs.
MODULES = {
    "tables": "tables",
    "stack": "stack",
    "step-costs": "step_costs",
    "profile": "profile",
    "builds": "builds",
    "kernels": "kernels",
}


def build_parser() -> argparse.ArgumentParser:
    """One subcommand per mode, each with the common output flags."""
    parser = argparse.ArgumentParser(prog="sparkinfer-lab", description=__doc__)
    sub = parser.add_subparsers(dest="mode", required=True)
    _add_parsers(sub)
    for p in sub.choices.values():
        output_flags(p)
    return parser


def _add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tables", help="engine decode at 27B shapes with each of several linear shape tables (CUDA)"
    )
    p.add_argument(
        "--table",
        action="append",
        required=True,
        help="NAME=PATH of a shape table JSON, or 'committed' (the package's); repeat, the first "
        "is the baseline",
    )
    p.add_argument("--concurrency", type=int_list, default=(1, 8, 32))
    p.add_argument("--context", type=int, default=4096, help="context of the decode runs")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--reps", type=int, default=2, help="repetitions, tables interleaved")
    p.add_argument("--max-batched-tokens", type=int, default=8192, help="engine step token budget")
    p.add_argument("--num-layers", type=int, help="fewer layers than 64 (not comparable)")
    p = sub.add_parser(
        "stack", help="one 27B layer-stack forward: torch reference ops vs Triton kernels (CUDA)"
    )
    p.add_argument("--prompt-len", type=int, default=4096, help="tokens of the prefill step")
    p.add_argument("--context", type=int, default=4096, help="cached tokens of the decode steps")
    p.add_argument("--decode-batches", type=int_list, default=(1, 32))
    p.add_argument("--num-layers", type=int, help="fewer layers than 64 (not comparable)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument(
        "--skip-torch", action="store_true", help="Triton kernels only (the torch prefill is slow)"
    )
    p = sub.add_parser(
        "step-costs",
        help="the 27B decode step's CUDA graph with each kind of small kernel stood in for: "
        "each kind's cost in place (CUDA)",
    )
    p.add_argument("--context", type=int, default=4096, help="cached tokens of each sequence")
    p.add_argument("--decode-batches", type=int_list, default=(1, 8, 32))
    p.add_argument("--reps", type=int, default=3, help="repetitions, variants interleaved")
    p.add_argument("--num-layers", type=int, help="fewer layers than 64 (not comparable)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=30, help="timed replays per variant")
    dependent_launch_flag(p)
    p = sub.add_parser(
        "profile", help="engine decode/prefill steps at 27B shapes, kernel by kernel (CUDA)"
    )
    p.add_argument("--context", type=int, default=4096, help="context of the decode runs")
    p.add_argument("--decode-batches", type=int_list, default=(1, 32))
    p.add_argument("--window", type=int, default=32, help="decode steps profiled per batch")
    p.add_argument("--prefill-lengths", type=int_list, default=(4096,))
    p.add_argument("--num-layers", type=int, help="fewer layers than 64 (not comparable)")
    p.add_argument("--max-batched-tokens", type=int, default=8192, help="engine step token budget")
    p.add_argument("--top", type=int, default=12, help="largest kernels listed per scenario")
    p.add_argument("--deterministic", action="store_true", help="batch-invariant numerics")
    dependent_launch_flag(p)
    p = sub.add_parser(
        "builds", help="Triton builds at engine start and in each shape's first requests (CUDA)"
    )
    p.add_argument("--num-layers", type=int, default=4, help="model depth (builds do not vary)")
    p.add_argument("--max-batched-tokens", type=int, default=8192, help="engine step token budget")
    p.add_argument("--cold", action="store_true", help="start from an empty Triton build cache")
    p = sub.add_parser("kernels", help="run the kernel benchmarks under sparkinfer.bench.kernels")
    p.add_argument("--only", help="comma-separated module names (default: all)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--quick", action="store_true", help="small shapes only")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    info = provenance.collect(argv, git_rev=args.git_rev)
    try:
        check_counts(args)
        module = importlib.import_module(f"sparkinfer.lab.{MODULES[args.mode]}")
        report = module.run(args, info)
        emit(report, args.out, record=args.record)
    except BenchError as e:
        print(f"sparkinfer-lab {args.mode}: {e}", file=sys.stderr)
        return 2
    if not report.is_passed:
        failed = ", ".join(g.name for g in report.gates if not g.is_passed)
        print(f"sparkinfer-lab {args.mode}: gate failed: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
