"""Flags and argument checks shared by the CLIs' modes (sparkinfer-bench, sparkinfer-lab)."""

from __future__ import annotations

import argparse
from pathlib import Path

from sparkinfer.bench.errors import UsageError


def int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers"
        ) from e
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more integers >= 1")
    return values


def float_list(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of numbers"
        ) from e
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more numbers")
    return values


def quantization_flag(p: argparse.ArgumentParser, note: str = "") -> None:
    """--quantization of the modes that build the model in this process (offline, spec)."""
    p.add_argument(
        "--quantization",
        choices=("none", "fp8"),
        default="none",
        help="fp8: the decoder projections in block FP8 (128x128 blocks, Qwen's FP8 layout), "
        "quantized from the random weights (or a bf16 --model on load)" + note,
    )


def output_flags(p: argparse.ArgumentParser) -> None:
    """--out, --record and --git-rev, which every mode takes."""
    p.add_argument("--out", type=Path, default=Path("."), help="folder for PNGs and the JSON")
    p.add_argument(
        "--record",
        type=Path,
        help="append the report as markdown to this file (a run log; the results page is "
        "generated from docs/records)",
    )
    p.add_argument("--git-rev", help="revision to record when running from a copy without .git")


def check_counts(args: argparse.Namespace) -> None:
    """Raise UsageError for a count flag below 1 (--warmup: below 0)."""
    for name in (
        "input_len",
        "output_len",
        "num_prompts",
        "iters",
        "runs",
        "max_tokens",
        "prefix_tokens",
        "requests",
        "prompt_len",
        "context",
        "new_tokens",
        "reps",
        "warmup",
        "timeout",
    ):
        value = getattr(args, name, None)
        if value is not None and value < (0 if name == "warmup" else 1):
            raise UsageError(f"--{name.replace('_', '-')} is {value}; it must be >= 1")
