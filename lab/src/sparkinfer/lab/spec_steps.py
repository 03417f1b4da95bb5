"""Where the host and device time of speculative steps goes, call by call, for a person tuning
the drafters (it prints rather than returns rows).

The `spec` bench's model and prompts (27B shapes with random weights, or a checkpoint) decode
once per drafter; the engine's step pieces (schedule, update, propose and its graphed or eager
path, the head's catch-ups, the verify and plain forwards by graphed or eager, the draws
queued and their read that waits for the device, observe) are wrapped with wall-clock timers
for the timed decode only. Each row gives calls, total and per-call milliseconds and the share
of the decode's wall time.
Run: ``python -m sparkinfer.lab.spec_steps --concurrency 1,8`` (``--model DIR`` for a
checkpoint).
"""

from __future__ import annotations

import argparse
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from sparkinfer.bench import speculative as spec_bench
from sparkinfer.model import decoder
from sparkinfer.scheduler import runner, scheduler
from sparkinfer.scheduler.graphs import verify as verify_graphs
from sparkinfer.scheduler.speculative import drafter as spec_drafter
from sparkinfer.scheduler.speculative import mtp_drafter
from sparkinfer.scheduler.speculative import step as spec_step

_TOTALS: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
_ON = threading.Event()

# (owner, method, row name); a method returning None counts under "<name> (None)" too.
_WRAPPED: tuple[tuple[Any, str, str], ...] = (
    (runner.Runner, "run", "runner step"),
    (scheduler.Scheduler, "schedule", "schedule"),
    (scheduler.Scheduler, "update", "update"),
    (spec_step.SpeculativeStep, "run", "step read at once"),
    (mtp_drafter.MTPDrafter, "propose_drafts", "propose"),
    (spec_drafter.Drafts, "host", "drafts read on the host"),
    (mtp_drafter.MTPDrafter, "_propose_graphed", "propose from the head graph"),
    (mtp_drafter.MTPDrafter, "_catch_up", "head catch-up (eager)"),
    (mtp_drafter.MTPDrafter, "_catch_up_older", "head catch-up of older rows (eager)"),
    (mtp_drafter.MTPDrafter, "observe", "observe"),
    (spec_step.SpeculativeStep, "_decode_rows", "decode rows (verify or plain)"),
    (spec_step.SpeculativeStep, "_plain_graphed", "plain decode graph"),
    (spec_step.SpeculativeStep, "_draw", "draw (queued)"),
    (spec_step.StepDraws, "read", "draws read (waits for the device)"),
    (verify_graphs.VerifyGraphs, "run", "verify graph replay"),
    (verify_graphs.VerifyGraphs, "_fill", "verify graph rows"),
    (torch.cuda.Event, "synchronize", "event wait"),
    (torch.cuda.Stream, "synchronize", "stream wait"),
    (spec_step, "verify_batch", "eager verify batch"),
    (runner.Runner, "forward_eager", "eager forward"),
    (decoder.Qwen3_8ForCausalLM, "compute_logits", "lm_head"),
)


def _wrap(owner: Any, method: str, name: str) -> Callable[[], None]:
    fn = getattr(owner, method)

    def timed(*args: Any, **kw: Any) -> Any:
        if not _ON.is_set():
            return fn(*args, **kw)
        t0 = time.perf_counter()
        out = fn(*args, **kw)
        row = _TOTALS[name]
        row[0] += 1
        row[1] += time.perf_counter() - t0
        if out is None and method.startswith("_p"):
            _TOTALS[f"{name}: none (eager)"][0] += 1
        return out

    setattr(owner, method, timed)
    return lambda: setattr(owner, method, fn)


def _decode(model: Any, cfg: Any, device: torch.device, prompts: list[list[int]], n: int) -> float:
    from sparkinfer.scheduler.engine import Engine
    from sparkinfer.scheduler.request import RequestOutput, SamplingParams

    engine = Engine.from_model(model, cfg, device=device)
    try:
        engine.generate(
            prompts[0][:64], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
        )
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        done = threading.Semaphore(0)

        def on_output(out: RequestOutput) -> None:
            if out.is_finished:
                done.release()

        _TOTALS.clear()
        _ON.set()
        t0 = time.perf_counter()
        for i, prompt in enumerate(prompts):
            engine.add_request(f"p{i}", prompt, params, on_output=on_output)
        for _ in prompts:
            done.acquire()
        seconds = time.perf_counter() - t0
        _ON.clear()
        s = engine.stats().spec
        print(f"  verifies {s.num_drafts}, draft tokens {s.num_draft_tokens}, "
              f"accepted {s.num_accepted_tokens}")  # fmt: skip
    finally:
        engine.shutdown()
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default=None)
    p.add_argument("--num-layers", type=int, default=None)
    p.add_argument("--drafters", default="off,mtp")
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--num-speculative-tokens", type=int, default=3)
    p.add_argument("--deterministic", action="store_true")
    args = p.parse_args()
    bench_args = argparse.Namespace(
        model=args.model, tiny=False, cpu=False, quantization="none",
        num_layers=args.num_layers, drafters=["mtp"],
        concurrency=[int(c) for c in args.concurrency.split(",")], context=args.context,
        new_tokens=args.new_tokens, prompt="code" if args.model else "random",
        adaptive=True, deterministic=args.deterministic, enforce_eager=False, seed=0,
    )  # fmt: skip
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: a smoke run
    model, tokenizer = spec_bench.spec_model(bench_args, device)
    base = spec_bench.base_config(bench_args)
    undo = [_wrap(*w) for w in _WRAPPED]
    try:
        for batch in bench_args.concurrency:
            prompts = spec_bench.spec_prompts(bench_args, batch, tokenizer)
            for drafter in args.drafters.split(","):
                cfg = replace(
                    base, speculative=drafter, num_speculative_tokens=args.num_speculative_tokens
                )
                print(f"{drafter} batch {batch}:")
                seconds = _decode(model, cfg, device, prompts, args.new_tokens)
                tok_s = batch * args.new_tokens / seconds
                print(f"  {seconds * 1e3:.1f} ms, {tok_s:,.1f} tok/s (prompts included)")
                for name, (calls, total) in sorted(_TOTALS.items(), key=lambda kv: -kv[1][1]):
                    per = 1e3 * total / calls if calls else 0.0
                    print(f"    {name:45s} {int(calls):6d} {1e3 * total:9.1f} ms {per:8.3f} ms/call"
                          f" {total / seconds:6.1%}")  # fmt: skip
    finally:
        for u in undo:
            u()


if __name__ == "__main__":
    main()
