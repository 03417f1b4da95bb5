"""The CLI's device modes, which run the model in this process (offline, vision): their flags
and their dispatch (each mode's module is imported only when it runs). The GPU tuning and
profiling modes live in the development-only `sparkinfer-lab`."""

from __future__ import annotations

import argparse
import importlib

from sparkinfer.bench import speculative
from sparkinfer.bench.cli_args import int_list, quantization_flag
from sparkinfer.bench.provenance import RunInfo
from sparkinfer.bench.report import Report
from sparkinfer.scheduler.config import SchedulerConfig


def dependent_launch_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-dependent-launch",
        dest="dependent_launch",
        action="store_false",
        help="launch each kernel after the one before it ends (price dependent launch; "
        "profile: each kernel's own time)",
    )


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The modes that run the model in this process: offline, vision, spec, code."""
    p = sub.add_parser("offline", help="engine decode/prefill at 27B shapes vs roofline (CUDA)")
    p.add_argument("--context", type=int, default=4096, help="context of the decode runs")
    p.add_argument("--concurrency", type=int_list, default=(1, 2, 4, 8, 16, 32, 64))
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--prefill-lengths", type=int_list, default=(4096, 262144))
    p.add_argument(
        "--num-layers", type=int, help="fewer layers than 64 (a quick look; not comparable)"
    )
    p.add_argument("--skip-hf", action="store_true", help="skip the transformers peer")
    quantization_flag(p, "; the decode roofline then counts the bytes as stored")
    p.add_argument("--iters", type=int, default=3, help="timed prefill runs per length")
    p.add_argument(
        "--prefill-idle-s",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="idle time before each timed prompt (0: back to back, the default); a prompt that "
        "follows idle time starts below the power cap's average, one that follows another at it",
    )
    p.add_argument(
        "--prefix-reuse",
        type=int,
        default=0,
        metavar="TOKENS",
        help="also time sequential requests sharing a prefix of this many tokens, with the "
        "prefix cache on (0: skip)",
    )
    p.add_argument(
        "--join-under-load",
        type=int,
        default=0,
        metavar="TOKENS",
        help="also time a prompt of this many tokens joining the widest concurrency's streams "
        "less one, and the stall it puts on them (0: skip)",
    )
    p.add_argument("--max-batched-tokens", type=int, default=8192, help="engine step token budget")
    p.add_argument(
        "--prefill-graph-tokens",
        type=int,
        default=SchedulerConfig.prefill_graph_tokens,
        help="largest prompt-chunk forward the engine replays from a CUDA graph (0: none)",
    )
    p.add_argument(
        "--prefix-cache-snapshots",
        type=int,
        default=0,
        help="the engine's prefix cache for the decode and prefill rows (0: off, the default; "
        "their prompts are distinct, so this prices its checkpoints)",
    )
    p.add_argument("--gate-goals", action="store_true", help="fail when a release goal is missed")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs in the engine")
    p.add_argument(
        "--no-overlap-steps",
        dest="overlap_steps",
        action="store_false",
        help="read each step's samples before scheduling the next (price the overlap)",
    )
    dependent_launch_flag(p)
    p.add_argument(
        "--deterministic",
        action="store_true",
        help="batch-invariant numerics (SPARKINFER_DETERMINISTIC), to price them against the "
        "default fastest kernel per shape",
    )
    p = sub.add_parser(
        "vision", help="image/video preprocessing and vision tower latency at 27B shapes (CUDA)"
    )
    p.add_argument("--device", default="cuda", help="where the tower runs (preprocessing: CPU)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--tiny", action="store_true", help="tiny tower and media (CPU smoke runs)")
    p.add_argument("--skip-hf", action="store_true", help="skip the transformers peer")

    speculative.add_parser(sub)


# Each device mode's module under sparkinfer.bench, imported only when the mode runs.
_MODULES = {"offline": "engine", "vision": "vision", "spec": "speculative", "code": "speculative"}


def run(args: argparse.Namespace, info: RunInfo) -> Report:
    """Run the device mode `args.mode` (any mode outside the HTTP ones)."""
    module = importlib.import_module(f"sparkinfer.bench.{_MODULES[args.mode]}")
    return module.run(args, info)
