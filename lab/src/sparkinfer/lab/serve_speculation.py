"""Speculation over HTTP: `sparkinfer-bench serve` against the server with `--speculative auto`
and with `--speculative off`, on one random-weight checkpoint at Qwen3.8-27B width.

1. Writes a checkpoint folder (`random_checkpoint.py`: config.json, safetensors shards, the MTP
   head's `mtp.*` tensors; Qwen's vocabulary) at the 27B's width with `--num-layers` layers
   (3:1 linear/full pattern; 18 GB at 16), weights drawn on the GPU; `--checkpoint DIR` keeps
   it there and a later run reuses it.
2. For each round, for auto then off: starts `sparkinfer-api` on it as a child process, waits
   for /health, runs `python3 -m sparkinfer.bench serve` over the concurrency levels, stops the
   server. auto must say that the checkpoint's MTP head drafts (its start-up line), else the
   run stops.
3. Prints one table, each mode's output tok/s averaged over the rounds, their ratio, mean TPOT
   and failed requests, and the verdict: PASS when every level runs at least `--min-ratio` (0.98)
   of off's speed with auto and no request fails (exit 0), else FAIL (exit 1).

Random weights never agree with their MTP head, so every draft is rejected: auto must lose
nothing to drafts that do not pay. Server logs and the bench's JSON stay in the work folder.
SPARKINFER_* variables of this shell reach every server alike (the flags set here win).

GPU (6 to 9 minutes at the defaults: a second round only where it ends within --max-minutes):
``python3 -m sparkinfer.lab.serve_speculation``
CPU check of the whole pipeline (tiny width, 4 layers, a few short requests):
``python3 -m sparkinfer.lab.serve_speculation --smoke``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch
from sparkinfer.bench.engine import full_size_config
from sparkinfer.bench.report import Table, log
from sparkinfer.lab.random_checkpoint import (
    checkpoint_bytes,
    tiny_config,
    write_random_checkpoint,
)
from sparkinfer.model.config import ModelConfig, load_model_config

MODES = ("auto", "off")
MTP_LINE = "speculative auto: the checkpoint's MTP head drafts"
SERVER_COMMAND = ("-c", "from sparkinfer.api.cli import main; main()")
STOP_WAIT_S = 60  # SIGTERM, then SIGKILL after this long
_SPECULATION_LINE = re.compile(r"speculative [a-z_]+: .*")
_STARTED = time.monotonic()


@dataclass(frozen=True)
class Workload:
    """What each server runs and the bench sends."""

    device: str  # the server's --device
    concurrency: tuple[int, ...]
    input_len: int
    output_len: int
    num_prompts: int | None  # per level; None: the bench's default (4 x concurrency, >= 8)
    warmup: int
    max_model_len: int
    deterministic: bool
    start_timeout_s: float


@dataclass(frozen=True)
class LevelResult:
    """One concurrency level of one bench run."""

    concurrency: int
    output_tok_s: float
    tpot_mean_ms: float
    num_failed: int


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tail(path: Path, lines: int = 30) -> str:
    text = path.read_text(errors="replace") if path.is_file() else ""
    return "\n".join(text.splitlines()[-lines:])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server (it drains), SIGKILL it if it is still there after STOP_WAIT_S."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait_healthy(
    url: str, proc: subprocess.Popen[bytes], timeout_s: float, log_path: Path
) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(
                f"the server exited with {proc.returncode} before it was ready; its log "
                f"({log_path}) ends:\n{_tail(log_path)}"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the server was not ready after {timeout_s:.0f} s: raise --start-timeout-s; "
                f"its log ({log_path}) ends:\n{_tail(log_path)}"
            )
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)


@contextlib.contextmanager
def running_server(checkpoint: Path, mode: str, work: Workload, log_path: Path) -> Iterator[str]:
    """`sparkinfer-api` on `checkpoint` with `--speculative mode`, ready; yields its base URL and
    stops it when the block ends, however it ends."""
    port = _free_port()
    command = [sys.executable, *SERVER_COMMAND, "--model", str(checkpoint), "--port", str(port)]
    command += ["--speculative", mode, "--device", work.device]
    command += ["--max-model-len", str(work.max_model_len)]
    command += ["--deterministic" if work.deterministic else "--no-deterministic"]
    url = f"http://127.0.0.1:{port}"
    with log_path.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        start = time.monotonic()
        _wait_healthy(url, proc, work.start_timeout_s, log_path)
        ready_s = time.monotonic() - start
        log(f"server ({mode}) ready in {ready_s:.0f} s: {speculation_line(log_path)}")
        yield url
    finally:
        _stop(proc)
        log(f"server ({mode}) stopped")


def speculation_line(log_path: Path) -> str:
    """The server's start-up line saying which drafter runs, from `speculative` on (empty when
    absent)."""
    text = log_path.read_text(errors="replace") if log_path.is_file() else ""
    found = _SPECULATION_LINE.search(text)
    return found[0] if found else ""


def run_bench(url: str, work: Workload, out_dir: Path, seed: int) -> list[LevelResult]:
    """`python3 -m sparkinfer.bench serve` against `url`; its per-level results from serve.json."""
    command = [sys.executable, "-m", "sparkinfer.bench", "serve", "--base-url", url]
    command += ["--concurrency", ",".join(map(str, work.concurrency))]
    command += ["--input-len", str(work.input_len), "--output-len", str(work.output_len)]
    command += ["--warmup", str(work.warmup), "--seed", str(seed), "--out", str(out_dir)]
    if work.num_prompts is not None:
        command += ["--num-prompts", str(work.num_prompts)]
    with (out_dir.parent / f"{out_dir.name}.stdout").open("wb") as out:
        done = subprocess.run(command, stdout=out, check=False)
    if done.returncode not in (0, 1):  # 1: a request failed, still a result
        raise RuntimeError(f"the bench exited with {done.returncode}: its progress is above")
    data = json.loads((out_dir / "serve.json").read_text())
    return [
        LevelResult(
            level["concurrency"],
            level["output_tok_s"],
            level["tpot_ms"]["mean"],
            level["num_failed"],
        )
        for level in data["raw"]["levels"]
    ]


def _by_level(runs: list[list[LevelResult]]) -> dict[int, list[LevelResult]]:
    """Concurrency -> that level's result in each run, in level order."""
    out: dict[int, list[LevelResult]] = {}
    for run in runs:
        for result in run:
            out.setdefault(result.concurrency, []).append(result)
    return out


def comparison(runs: dict[str, list[list[LevelResult]]], min_ratio: float) -> tuple[Table, bool]:
    """One row per level: each mode's mean over its runs, the ratio; and whether all pass (auto
    at least `min_ratio` of off at every level, no failed request)."""
    table = Table(
        "output tok/s and mean TPOT per concurrency level, speculative auto against off",
        ["concurrency", "tok/s auto", "tok/s off", "auto/off", "TPOT ms auto", "TPOT ms off",
         "failed auto", "failed off"],
        [],
    )  # fmt: skip
    is_passed = True
    auto, off = _by_level(runs["auto"]), _by_level(runs["off"])
    for level, pair in ((lv, (auto[lv], off[lv])) for lv in auto):
        rate = [statistics.fmean(r.output_tok_s for r in rs) for rs in pair]
        tpot = [statistics.fmean(r.tpot_mean_ms for r in rs) for rs in pair]
        failed = [sum(r.num_failed for r in rs) for rs in pair]
        ratio = rate[0] / rate[1] if rate[1] else float("nan")
        is_passed &= ratio >= min_ratio and not any(failed)
        table.rows.append([level, *rate, ratio, *tpot, *failed])
    return table, is_passed


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python3 -m sparkinfer.lab.serve_speculation",
        description=(__doc__ or "").split("\n\n")[0],
    )
    p.add_argument("--num-layers", type=int, default=16, help="decoder layers (3:1 pattern)")
    p.add_argument("--concurrency", default="1,8,32", help="levels, comma-separated")
    p.add_argument("--input-len", type=int, default=1024, help="prompt tokens")
    p.add_argument("--output-len", type=int, default=256, help="new tokens per request")
    p.add_argument(
        "--num-prompts", type=int, help="requests per level (default 4 x concurrency, >= 8)"
    )
    p.add_argument(
        "--warmup",
        type=int,
        help="untimed requests sent at once before each sweep (default: the highest level, so "
        "every batch size has run before the timing)",
    )
    p.add_argument(
        "--rounds", type=int, help="auto then off, this many times (default 2; 1 with --smoke)"
    )
    p.add_argument("--min-ratio", type=float, default=0.98, help="PASS: auto/off at least this")
    p.add_argument("--deterministic", action="store_true", help="serve with --deterministic")
    p.add_argument(
        "--checkpoint",
        type=Path,
        help="folder to write the checkpoint to and keep "
        "(reused when it has config.json); default: a temporary one, removed",
    )
    p.add_argument(
        "--work-dir", type=Path, help="folder for logs and bench JSON (default: temporary)"
    )
    p.add_argument("--start-timeout-s", type=float, default=600.0)
    p.add_argument(
        "--max-minutes",
        type=float,
        default=9.0,
        help="start a further round only "
        "where it is expected to end within this much time from the start",
    )
    p.add_argument("--seed", type=int, default=0, help="weights and prompts")
    p.add_argument("--smoke", action="store_true", help="tiny width, 4 layers, CPU, short requests")
    return p.parse_args(argv)


def _setup(args: argparse.Namespace) -> tuple[ModelConfig, Workload, torch.device]:
    if args.smoke:
        work = Workload("cpu", (1, 2), 32, 8, 2, 1, 512, args.deterministic, args.start_timeout_s)
        return tiny_config(), work, torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("serve_speculation measures a GPU server: run it on a GPU machine, or "
                         "pass --smoke to check the pipeline on the CPU")  # fmt: skip
    levels = tuple(int(c) for c in args.concurrency.split(","))
    max_len = 2 * args.input_len + args.output_len  # the bench's prompts land near input_len
    warmup = max(levels) if args.warmup is None else args.warmup
    work = Workload("cuda", levels, args.input_len, args.output_len, args.num_prompts,
                    warmup, max_len, args.deterministic, args.start_timeout_s)  # fmt: skip
    return full_size_config(args.num_layers), work, torch.device("cuda")


def _checkpoint(
    args: argparse.Namespace, config: ModelConfig, device: torch.device, work_dir: Path
) -> Path:
    folder = args.checkpoint or work_dir / "checkpoint"
    if (folder / "config.json").is_file():
        if load_model_config(folder).text != config.text:
            raise SystemExit(f"{folder} holds another model than these flags ask for: remove it "
                             "or pass another --checkpoint")  # fmt: skip
        log(f"reusing the checkpoint in {folder}")
        return folder
    need = checkpoint_bytes(config)
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < need * 1.05:
        raise SystemExit(f"{folder} has {free / 1e9:.1f} GB free; the checkpoint needs "
                         f"{need / 1e9:.1f} GB: pass --checkpoint on a larger disk")  # fmt: skip
    t = config.text
    log(f"writing a {t.num_hidden_layers}-layer checkpoint (hidden {t.hidden_size}, "
        f"{need / 1e9:.1f} GB) to {folder}")  # fmt: skip
    start = time.monotonic()
    write_random_checkpoint(folder, config, device=device, seed=args.seed, log=log)
    log(f"checkpoint written in {time.monotonic() - start:.0f} s")
    return folder


def _measure_mode(
    checkpoint: Path, mode: str, work: Workload, work_dir: Path, round_idx: int, seed: int
) -> list[LevelResult]:
    """One server with `--speculative mode`, one bench sweep against it (files tagged with the
    mode and round)."""
    tag, name = f"round {round_idx + 1}", f"{mode}-{round_idx + 1}"
    log(f"{tag}: starting the server with --speculative {mode}")
    server_log = work_dir / f"server-{name}.log"
    with running_server(checkpoint, mode, work, server_log) as url:
        if mode == "auto" and MTP_LINE not in server_log.read_text(errors="replace"):
            raise RuntimeError(
                "--speculative auto did not pick the MTP head: "
                f"{speculation_line(server_log) or 'no start-up line'}; see {server_log}"
            )
        log(f"{tag}: bench against --speculative {mode}")
        return run_bench(url, work, work_dir / f"bench-{name}", seed)


def _measure(
    args: argparse.Namespace, checkpoint: Path, work: Workload, work_dir: Path, rounds: int
) -> tuple[dict[str, list[list[LevelResult]]], int]:
    """auto then off, `rounds` times, or fewer where the next round would end past
    --max-minutes; returns the runs and the rounds run. A round is expected to take twice the
    last off phase (2.2x): off's server found the Triton builds auto's made, as later ones do."""
    runs: dict[str, list[list[LevelResult]]] = {m: [] for m in MODES}
    expected_s = 0.0
    for i in range(rounds):
        if i and time.monotonic() - _STARTED + expected_s > 60 * args.max_minutes:
            log(f"round {i + 1} would end past {args.max_minutes} minutes: stopping after {i}")
            return runs, i
        for mode in MODES:
            start = time.monotonic()
            runs[mode].append(_measure_mode(checkpoint, mode, work, work_dir, i, args.seed))
            expected_s = 2.2 * (time.monotonic() - start)
    return runs, rounds


def run(args: argparse.Namespace) -> bool:
    """The whole measurement; prints the table and verdict, returns whether it passed."""
    config, work, device = _setup(args)
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="serve-speculation-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    log(f"work folder {work_dir}")
    try:
        checkpoint = _checkpoint(args, config, device, work_dir)
        rounds = args.rounds or (1 if args.smoke else 2)
        runs, rounds = _measure(args, checkpoint, work, work_dir, rounds)
    finally:
        if args.checkpoint is None:
            shutil.rmtree(work_dir / "checkpoint", ignore_errors=True)
    table, is_passed = comparison(runs, args.min_ratio)
    t = config.text
    print(f"{t.num_hidden_layers} layers at hidden {t.hidden_size}, random weights with an MTP "
          f"head; {work.input_len}-token prompts, {work.output_len} output tokens, "
          f"{rounds} round(s) of auto then off, deterministic {work.deterministic}")  # fmt: skip
    print(table.render())
    if args.smoke:
        print("smoke: a tiny model's CPU timings of a few requests; only the pipeline is checked")
    verdict = "PASS" if is_passed else "FAIL"
    print(f"{verdict}: no level slower than {args.min_ratio}x with auto, no failed request")
    return is_passed


def _raise_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # runs the `finally` blocks that stop the server


def main(argv: Sequence[str] | None = None) -> None:
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    sys.exit(0 if run(_parse(argv)) else 1)


if __name__ == "__main__":
    main()
