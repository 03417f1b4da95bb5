"""One GPU run that prices batch-invariant numerics and checks them, printing one table.

1. The kernels' GPU bit-equality tests of the batch-invariant paths (pytest, `-m gpu`), then
   the kernel-by-kernel costs (`batch_invariance_kernels.py`).
2. One random-weight model at Qwen3.8-27B widths (fewer layers: the per-layer kernels are the
   same, so the ratio moves only by the embedding and LM head's share), then one engine with the
   default numerics and one with `deterministic`, each measuring decode at each concurrency and
   a prompt's TTFT.
3. In each engine: a few probe prompts alone, then among a batch sent at once, then that batch
   again; greedy token ids must match (the engine-level twin of `sparkinfer-bench determinism
   --concurrency`).

Run from the repository root with the packages' sources on PYTHONPATH:
`python3 packages/bench/scripts/batch_invariance_check.py`. Every row catches its own error and
prints it, so one failure never hides the others.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
GPU_TESTS = [
    "packages/kernels/tests/test_linear.py::test_decode_tiles_give_a_row_the_same_bits",
    "packages/kernels/tests/test_linear.py::test_invariant_linear_real_shapes_on_gpu",
    "packages/kernels/tests/test_linear.py::test_linear_swiglu_equals_linear_then_silu_and_mul_on_gpu",
    "packages/kernels/tests/test_paged_attention.py::test_decode_rows_keep_their_bits_at_every_graph_batch_size_on_gpu",
    "packages/kernels/tests/test_paged_attention.py::test_decode_real_shapes_on_gpu",
    "packages/kernels/tests/test_paged_attention.py::test_prefill_few_rows_over_long_contexts_on_gpu",
]
NUM_PROBES = 4


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--num-layers", type=int, default=16)
    p.add_argument("--concurrency", default="1,8,32,64")
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=4096)
    p.add_argument("--prefill-iters", type=int, default=3)
    p.add_argument("--probe-batch", type=int, default=64)
    p.add_argument("--probe-tokens", type=int, default=48)
    p.add_argument("--skip-tests", action="store_true")
    p.add_argument("--skip-kernels", action="store_true", help="no kernel-by-kernel table")
    return p.parse_args()


def run_gpu_tests() -> str:
    """pytest on the GPU tests; the summary line (or the error)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
           "--import-mode=importlib", *GPU_TESTS]  # fmt: skip
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        return "timed out after 240 s"
    tail = (done.stdout + done.stderr).strip().splitlines()
    if done.returncode:
        print("\n".join(tail[-40:]), flush=True)
    return tail[-1] if tail else f"exit {done.returncode}"


def run_kernel_table() -> None:
    """The kernel-by-kernel costs (`batch_invariance_kernels.py`), printed as they come."""
    script = Path(__file__).with_name("batch_invariance_kernels.py")
    try:
        subprocess.run([sys.executable, str(script)], cwd=ROOT, timeout=180, check=False)
    except subprocess.TimeoutExpired:
        print("kernel table: timed out after 180 s", flush=True)


def generate(engine, prompts: list[list[int]], max_tokens: int, tag: str) -> list[list[int]]:
    """Greedy token ids of `prompts`, all submitted at once."""
    from sparkinfer.scheduler.request import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    ids: list[list[int]] = [[] for _ in prompts]
    left = [len(prompts)]
    done = threading.Event()
    lock = threading.Lock()

    def callback(i: int):
        def on_output(out) -> None:
            with lock:
                ids[i].extend(out.new_token_ids or ())
                if out.is_finished:
                    left[0] -= 1
                    if left[0] == 0:
                        done.set()

        return on_output

    for i, prompt in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", prompt, params, on_output=callback(i))
    if not done.wait(600):
        raise RuntimeError(f"{tag}: requests did not finish in 600 s")
    return ids


def invariance(engine, batch: int, max_tokens: int) -> str:
    """'k/4 probes, j/N batch': probes alone vs among `batch` at once, and the batch resent."""
    from sparkinfer.bench.engine import random_prompts

    # lengths differ, so rows cross tiles, chunk budgets and split plans
    prompts = [random_prompts(1, 200 + 37 * i, seed=100 + i)[0] for i in range(batch)]
    probes = min(NUM_PROBES, batch)
    alone = [
        generate(engine, [p], max_tokens, f"alone{i}")[0] for i, p in enumerate(prompts[:probes])
    ]
    first = generate(engine, prompts, max_tokens, "first")
    second = generate(engine, prompts, max_tokens, "second")
    same_probes = sum(a == b for a, b in zip(alone, first, strict=False))
    same_batch = sum(a == b for a, b in zip(first, second, strict=True))
    return f"{same_probes}/{probes} probes, {same_batch}/{batch} batch"


def measure_engine(model, cfg, device, peaks, args, *, deterministic: bool) -> dict[str, object]:
    """Row name -> value (tok/s, ms or text) for one engine; cfg is the model's TextConfig."""
    from sparkinfer.bench.engine import (
        WARMUP_PROMPT,
        measure_decode,
        measure_prefill,
        random_prompts,
        run_requests,
        started_engine,
    )  # fmt: skip
    from sparkinfer.bench.engine_config import offline_config

    concurrency = [int(c) for c in args.concurrency.split(",")]
    room = max(args.context + args.new_tokens, args.prompt_len + 1, 8192)
    sched = dataclasses.replace(
        offline_config(None, max_num_seqs=max(*concurrency, args.probe_batch), max_model_len=room),
        deterministic=deterministic,
    )
    out: dict[str, object] = {}
    tag = "deterministic" if deterministic else "default"
    print(f"[{tag}] starting the engine", flush=True)
    with started_engine(model, sched, device) as engine:
        run_requests(engine, random_prompts(2, WARMUP_PROMPT, 1), 8, "warmup")
        for b in concurrency:
            name = f"decode {b} stream(s), tok/s"
            try:
                row = measure_decode(engine, cfg, peaks, batch=b, context=args.context,
                                     new_tokens=args.new_tokens, seed=b)  # fmt: skip
                out[name] = row.stream_tok_s if b == 1 else row.aggregate_tok_s
            except Exception as e:  # a row's failure is printed, the others still run
                traceback.print_exc()
                out[name] = f"error: {e}"[:60]
            print(f"[{tag}] {name}: {out[name]}", flush=True)
        name = f"{args.prompt_len}-token prompt TTFT, ms"
        try:
            row = measure_prefill(engine, cfg, peaks, prompt_len=args.prompt_len,
                                  iters=args.prefill_iters, seed=7)  # fmt: skip
            out[name] = row.ttft_ms
        except Exception as e:
            traceback.print_exc()
            out[name] = f"error: {e}"[:60]
        print(f"[{tag}] {name}: {out[name]}", flush=True)
        name = f"same ids alone / among {args.probe_batch} / resent"
        try:
            out[name] = invariance(engine, args.probe_batch, args.probe_tokens)
        except Exception as e:
            traceback.print_exc()
            out[name] = f"error: {e}"[:60]
        print(f"[{tag}] {name}: {out[name]}", flush=True)
    return out


def print_table(rows: dict[str, dict[str, object]], tests: str) -> None:
    print(f"\nGPU tests: {tests}")
    default, det = rows.get("default", {}), rows.get("deterministic", {})
    names = list(dict.fromkeys([*default, *det]))
    print(f"| {'row':<44} | {'default':>26} | {'deterministic':>26} | {'cost':>7} |")
    print(f"|{'-' * 46}|{'-' * 28}|{'-' * 28}|{'-' * 9}|")
    for name in names:
        a, b = default.get(name, "-"), det.get(name, "-")
        cost = "-"
        if isinstance(a, float) and isinstance(b, float) and a > 0 and b > 0:
            cost = f"{(b / a - 1) * 100:+.1f}%" if "ms" in name else f"{(a / b - 1) * 100:+.1f}%"
        fa = f"{a:.1f}" if isinstance(a, float) else str(a)
        fb = f"{b:.1f}" if isinstance(b, float) else str(b)
        print(f"| {name:<44} | {fa:>26} | {fb:>26} | {cost:>7} |")


def main() -> int:
    args = parse_args()
    t0 = time.perf_counter()
    tests = "skipped" if args.skip_tests else run_gpu_tests()
    print(f"GPU tests: {tests} ({time.perf_counter() - t0:.0f} s)", flush=True)
    if not args.skip_kernels:
        run_kernel_table()
    rows: dict[str, dict[str, object]] = {}
    try:
        import torch
        from sparkinfer.bench import roofline
        from sparkinfer.bench.engine import full_size_config, random_model

        device = torch.device("cuda")
        peaks = roofline.measure_peaks(device)
        config = full_size_config(args.num_layers)
        model = random_model(config, device, "invariance")
        for deterministic in (False, True):
            tag = "deterministic" if deterministic else "default"
            try:
                rows[tag] = measure_engine(
                    model, config.text, device, peaks, args, deterministic=deterministic
                )
            except Exception as e:
                traceback.print_exc()
                rows[tag] = {"engine": f"error: {e}"[:60]}
            print(f"[{tag}] done at {time.perf_counter() - t0:.0f} s", flush=True)
    except Exception:
        traceback.print_exc()
    print_table(rows, tests)
    print(
        f"total {time.perf_counter() - t0:.0f} s; {args.num_layers} layers, context "
        f"{args.context}, {args.new_tokens} new tokens, scheduler defaults (prefix cache on)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
