"""`sparkinfer-bench`: serving, prefill, eval, offline-engine, vision and kernel benchmarks.

Exit status: 0 when every gate passes, 1 when a gate fails, 2 on a usage, server or device error.
Tables go to stdout, progress to stderr, PNGs and `<mode>.json` to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from sparkinfer.bench import corpus, device_modes, image_chat, prefill, provenance, serving
from sparkinfer.bench.cli_args import check_counts, int_list, output_flags
from sparkinfer.bench.client import OpenAIClient, ServerTarget
from sparkinfer.bench.errors import BenchError, UsageError
from sparkinfer.bench.evals import determinism, prefix_cache, workloads
from sparkinfer.bench.report import Report, emit

HTTP_MODES = (
    "serve",
    "diagnose-concurrency",
    "prefill",
    "workloads",
    "determinism",
    "prefix-cache",
    "image-chat",
)


def _http_flags(p: argparse.ArgumentParser, endpoint: str) -> None:
    p.add_argument("--base-url", default="http://127.0.0.1:8080", help="server root or .../v1")
    p.add_argument("--model", help="model name (default: the first one /v1/models lists)")
    p.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY'")
    p.add_argument("--endpoint", choices=("chat", "completions"), default=endpoint)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument(
        "--seed", type=int, help="prompt seed (default: the clock, so no re-run hits a cache)"
    )


def build_parser() -> argparse.ArgumentParser:
    """One subcommand per mode, each with the common output flags."""
    parser = argparse.ArgumentParser(prog="sparkinfer-bench", description=__doc__)
    sub = parser.add_subparsers(dest="mode", required=True)
    _add_load_modes(sub)
    _add_eval_modes(sub)
    device_modes.add_parsers(sub)
    for p in sub.choices.values():
        output_flags(p)
    return parser


def _add_load_modes(sub: argparse._SubParsersAction) -> None:
    """The HTTP speed modes: serve, diagnose-concurrency, prefill."""
    p = sub.add_parser("serve", help="concurrency sweep against an OpenAI-compatible server")
    _http_flags(p, "completions")
    p.add_argument("--concurrency", type=int_list, default=(1, 2, 4, 8, 16, 32, 64))
    p.add_argument("--input-len", type=int, default=1024, help="prompt tokens (random words)")
    p.add_argument("--output-len", type=int, default=128, help="new tokens per request")
    p.add_argument(
        "--num-prompts", type=int, help="requests per level (default 4 x concurrency, >= 8)"
    )
    p.add_argument("--dataset", type=Path, help="JSONL prompts instead of random words")
    p.add_argument("--warmup", type=int, default=1, help="untimed requests before the sweep")
    p = sub.add_parser(
        "diagnose-concurrency", help="one-shot N-stream report: rates, stalls, errors"
    )
    _http_flags(p, "completions")
    p.add_argument("--streams", type=int_list, default=(6, 8, 10, 12))
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--stall-factor", type=float, default=5.0, help="stall: gap > this x median ITL")
    p = sub.add_parser("prefill", help="TTFT and prefill tok/s vs prompt length (max_tokens 1)")
    _http_flags(p, "completions")
    p.add_argument("--lengths", type=int_list, default=prefill.DEFAULT_LENGTHS)
    p.add_argument("--iters", type=int, default=3)


def _add_eval_modes(sub: argparse._SubParsersAction) -> None:
    """The HTTP behaviour modes: workloads, determinism, prefix-cache."""
    p = sub.add_parser("workloads", help="chat/code/math/json/repetition decode speed")
    _http_flags(p, "chat")
    p.add_argument("--workloads", help="comma-separated subset (default: all)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--baseline", type=Path, help="a workloads.json from a peer to compare against")
    p = sub.add_parser("determinism", help="long-context cross-run determinism gate")
    _http_flags(p, "chat")
    p.add_argument("--depths", type=int_list, default=determinism.DEFAULT_DEPTHS)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--require-correct", action="store_true", help="also gate on the right answer")
    p.add_argument(
        "--concurrency",
        type=int_list,
        help="check batch invariance instead, at each of these batch sizes: "
        f"{determinism.NUM_PROBES} probes alone, then among the batch sent at once, then the "
        "batch again (--depths and --runs unused)",
    )
    p.add_argument(
        "--reference",
        metavar="CHECKPOINT",
        help="also compare with the offline fp32 CPU path on this small checkpoint ('embedded': "
        "the server's built-in model); the server is then asked through /v1/completions",
    )
    p = sub.add_parser("prefix-cache", help="cold vs warm wall clock with a shared long prefix")
    _http_flags(p, "chat")
    p.add_argument("--prefix-tokens", type=int, default=32768)
    p.add_argument("--requests", type=int, default=3, help="requests sharing the prefix")
    p.add_argument("--max-tokens", type=int, default=16)
    p = sub.add_parser("image-chat", help="image question TTFT: cold, second turn, text-only twin")
    _http_flags(p, "chat")
    p.add_argument("--image-size", type=int, default=448, help="square image side in pixels")
    p.add_argument("--rounds", type=int, default=3, help="rounds, each with a fresh image")
    p.add_argument("--max-tokens", type=int, default=16)


async def _with_client(
    args: argparse.Namespace, run: Callable[[OpenAIClient], Coroutine[Any, Any, Report]]
) -> Report:
    target = ServerTarget(args.base_url, args.model, args.api_key, args.endpoint, args.timeout)
    levels = getattr(args, "concurrency", None) or getattr(args, "streams", None) or (1,)
    async with OpenAIClient(target, max_connections=max(64, max(levels))) as client:
        return await run(client)


def _http_context(args: argparse.Namespace, client: OpenAIClient) -> dict[str, Any]:
    fixed = {True: "yes", False: "refused by the server", None: "not used"}
    return {
        "server": args.base_url,
        "model": client.model,
        "endpoint": args.endpoint,
        "seed": args.seed,
        "fixed output length (min_tokens/ignore_eos)": fixed[client.is_fixed_len_accepted],
    }


async def _serve(args: argparse.Namespace, info: provenance.RunInfo) -> Report:
    dataset = corpus.load_dataset(args.dataset) if args.dataset else None

    async def run(client: OpenAIClient) -> Report:
        cfg = serving.ServeConfig(
            args.concurrency,
            args.input_len,
            args.output_len,
            args.num_prompts,
            dataset,
            args.seed,
            args.warmup,
        )
        levels = await serving.sweep(client, cfg)
        ctx = _http_context(args, client) | {
            "input/output len": f"{args.input_len}/{args.output_len}"
        }
        return Report(
            "serve",
            info,
            ctx,
            serving.serve_tables(levels),
            serving.serve_plots(levels),
            {"levels": [s.as_dict() for s, _ in levels]},
            [serving.serve_gate(levels)],
        )

    return await _with_client(args, run)


async def _diagnose(args: argparse.Namespace, info: provenance.RunInfo) -> Report:
    async def run(client: OpenAIClient) -> Report:
        reports = await serving.diagnose(
            client,
            args.streams,
            input_len=args.input_len,
            output_len=args.output_len,
            stall_factor=args.stall_factor,
            seed=args.seed,
        )
        tables = serving.diagnose_tables(reports, args.stall_factor)
        errors = sum(r.error is not None for r in reports)
        levels = tables[0].rows
        plot = serving.Plot(
            "diagnose-concurrency.png",
            "Per-stream decode rate",
            "streams",
            "tok/s",
            [r[0] for r in levels],
            {"sum": [r[3] for r in levels], "min stream": [r[4] for r in levels]},
        )
        gate = serving.Gate("no errors under load", errors == 0, f"{errors} stream(s) failed")
        return Report(
            "diagnose-concurrency",
            info,
            _http_context(args, client),
            tables,
            [plot],
            {"streams": [r.__dict__ for r in reports]},
            [gate],
        )

    return await _with_client(args, run)


async def _prefill(args: argparse.Namespace, info: provenance.RunInfo) -> Report:
    async def run(client: OpenAIClient) -> Report:
        rows = await prefill.measure(client, args.lengths, num_iters=args.iters, seed=args.seed)
        return Report(
            "prefill",
            info,
            _http_context(args, client),
            [prefill.table(rows)],
            prefill.plots(rows),
            {"rows": [r.__dict__ for r in rows]},
        )

    return await _with_client(args, run)


async def _workloads(args: argparse.Namespace, info: provenance.RunInfo) -> Report:
    names = tuple(args.workloads.split(",")) if args.workloads else None
    baseline = workloads.load_baseline(args.baseline) if args.baseline else None

    async def run(client: OpenAIClient) -> Report:
        rows = await workloads.run_workloads(client, names, num_runs=args.runs, seed=args.seed)
        return Report(
            "workloads",
            info,
            _http_context(args, client),
            [workloads.table(rows, baseline)],
            [workloads.plot(rows, baseline)],
            {"workloads": [r.as_dict() for r in rows]},
        )

    return await _with_client(args, run)


async def _determinism(args: argparse.Namespace, info: provenance.RunInfo) -> Report:
    if args.concurrency:
        return await _batch_invariance(args, info)

    async def run(client: OpenAIClient) -> Report:
        results = await determinism.run_depths(
            client, args.depths, num_runs=args.runs, max_tokens=args.max_tokens, seed=args.seed
        )
        if args.reference is not None:
            from sparkinfer.bench.evals import reference

            reference.fill(results, args.reference, max_tokens=args.max_tokens)
        raw = {"depths": [{k: v for k, v in r.__dict__.items() if k != "prompt"} for r in results]}
        return Report(
            "determinism",
            info,
            _http_context(args, client),
            [determinism.table(results, num_runs=args.runs)],
            [determinism.plot(results, args.runs)],
            raw,
            determinism.gates(results, is_correct_required=args.require_correct),
        )

    return await _with_client(args, run)


async def _batch_invariance(args: argparse.Namespace, info: provenance.RunInfo) -> Report:
    async def run(client: OpenAIClient) -> Report:
        results = [
            await determinism.run_concurrency(client, n, max_tokens=args.max_tokens, seed=args.seed)
            for n in args.concurrency
        ]
        raw = {"concurrency": [r.__dict__ for r in results]}
        return Report(
            "determinism",
            info,
            _http_context(args, client),
            [determinism.concurrency_table(results)],
            [],
            raw,
            determinism.concurrency_gates(results),
        )

    return await _with_client(args, run)


async def _prefix_cache(args: argparse.Namespace, info: provenance.RunInfo) -> Report:
    async def run(client: OpenAIClient) -> Report:
        rows = await prefix_cache.run_prefix_cache(
            client,
            prefix_tokens=args.prefix_tokens,
            num_requests=args.requests,
            max_tokens=args.max_tokens,
            seed=args.seed,
        )
        raw = {"rows": [r.as_dict() for r in rows], "speedup": prefix_cache.speedup(rows)}
        return Report(
            "prefix-cache",
            info,
            _http_context(args, client),
            [prefix_cache.table(rows)],
            [prefix_cache.plot(rows)],
            raw,
        )

    return await _with_client(args, run)


async def _image_chat(args: argparse.Namespace, info: provenance.RunInfo) -> Report:
    if args.endpoint != "chat":
        raise UsageError("image-chat sends images in chat messages: use --endpoint chat")
    image_chat.check_args(args.image_size, args.rounds)

    async def run(client: OpenAIClient) -> Report:
        rows = await image_chat.run_image_chat(
            client,
            image_size=args.image_size,
            num_rounds=args.rounds,
            max_tokens=args.max_tokens,
            seed=args.seed,
        )
        raw = {"rounds": [r.as_dict() for r in rows], "median_ttft_ms": image_chat.medians(rows)}
        return Report(
            "image-chat",
            info,
            _http_context(args, client) | {"image": f"{args.image_size}x{args.image_size} PNG"},
            [image_chat.table(rows, args.image_size)],
            [image_chat.plot(rows)],
            raw,
            [image_chat.gate(rows)],
        )

    return await _with_client(args, run)


_HTTP_RUNNERS = {
    "serve": _serve,
    "diagnose-concurrency": _diagnose,
    "prefill": _prefill,
    "workloads": _workloads,
    "determinism": _determinism,
    "prefix-cache": _prefix_cache,
    "image-chat": _image_chat,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    info = provenance.collect(argv, git_rev=args.git_rev)
    try:
        check_counts(args)
        if args.mode in HTTP_MODES:
            if args.seed is None:
                args.seed = int(time.time()) % 1_000_000
            if getattr(args, "reference", None):
                args.endpoint = "completions"  # both sides tokenize the same raw text
            report = asyncio.run(_HTTP_RUNNERS[args.mode](args, info))
        else:
            report = device_modes.run(args, info)
        emit(report, args.out, record=args.record)
    except BenchError as e:
        print(f"sparkinfer-bench {args.mode}: {e}", file=sys.stderr)
        return 2
    if not report.is_passed:
        failed = ", ".join(g.name for g in report.gates if not g.is_passed)
        print(f"sparkinfer-bench {args.mode}: gate failed: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
