"""Tensor parallel on two GPUs against one, in the same run, at Qwen3.8-27B shapes with random
bf16 weights (docs/scaling.md).

Rows: decode at batch 1 and 32 streams, a 4K and a 128K prompt's time to first token, each for
TP=1 with CUDA graphs and TP=2 (eager: the ranks do not replay graphs yet), and decode for TP=1
eager, the fair match for TP=2 today; then the
NCCL all-reduce of one decode step's activations (eager and inside a CUDA graph) beside the
bus bandwidth of a large all-reduce. Each row runs in its own try, so one failure prints and the
rest go on. Run it with NVLink multicast off (NCCL_NVLS_ENABLE=0, see docs/scaling.md):

    python3 -m sparkinfer.bench.tensor_parallel [--num-layers 64]
"""

from __future__ import annotations

import argparse
import gc
import queue
import socket
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from sparkinfer.bench.engine import (
    NUM_REAL_TOKENS,
    fill_random,
    full_size_config,
    random_model,
    random_prompts,
    run_requests,
)
from sparkinfer.bench.engine_config import offline_config
from sparkinfer.model.parallel.group import TensorParallelGroup
from sparkinfer.model.parallel.sharded_model import build_sharded_model
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.distributed.launch import ModelSource, start_tensor_parallel_engine
from sparkinfer.scheduler.engine import Engine

LONG_PROMPT = 128 * 1024
DECODE_TOKENS = 64
HIDDEN = 5120
ALL_REDUCE_ROWS = (1, 32, 4096)  # decode at batch 1 and 32, a 4K prompt chunk
BUS_BYTES = 256 << 20  # the all-reduce whose bus bandwidth stands for the link's
NVLINK_GB_S = 450.0  # H200 NVLink 4: 18 links x 25 GB/s per direction


@dataclass(frozen=True)
class RandomShards:
    """Each rank's shard of the random 27B-shaped model (`fill_random`, seeded by rank)."""

    num_layers: int

    def __call__(self, tp: TensorParallelGroup, device: torch.device):
        model = build_sharded_model(
            full_size_config(self.num_layers),
            tp,
            device=device,
            dtype=torch.bfloat16,
            num_real_tokens=NUM_REAL_TOKENS,
        )
        fill_random(model, seed=tp.rank)
        return model


def _config(*, is_eager: bool) -> SchedulerConfig:
    config = offline_config(None, max_num_seqs=32, max_model_len=LONG_PROMPT + 2 * DECODE_TOKENS)
    return replace(
        config, max_num_batched_tokens=8192, enforce_eager=is_eager, prefix_cache_snapshots=0
    )


@dataclass(frozen=True)
class Rows:
    """Prints the table's rows; none starts after `deadline` (time.monotonic), so the run ends
    inside its budget, the rows after it marked skipped."""

    deadline: float

    def row(self, name: str, measure: Callable[[], str]) -> None:
        if time.monotonic() > self.deadline:
            print(f"| {name} | skipped: past --budget-s |", flush=True)
            return
        try:
            print(f"| {name} | {measure()} |", flush=True)
        except Exception as exc:
            traceback.print_exc()
            print(f"| {name} | error: {type(exc).__name__}: {exc} |", flush=True)


def _decode_tok_s(engine: Engine, batch: int) -> str:
    tracker = run_requests(engine, random_prompts(batch, 128, seed=batch), DECODE_TOKENS, "dec")
    firsts = [ev[0][0] for ev in tracker.events.values()]
    lasts = [ev[-1][0] for ev in tracker.events.values()]
    tokens = sum(n for ev in tracker.events.values() for _, n in ev[1:])
    return f"{tokens / (max(lasts) - max(firsts)):.1f} tok/s aggregate"


def _ttft_s(engine: Engine, prompt_len: int) -> str:
    tracker = run_requests(engine, random_prompts(1, prompt_len, seed=prompt_len), 1, "ttft")
    (events,) = tracker.events.values()
    return f"{events[0][0] - tracker.submitted_s:.3f} s to first token"


def _engine_rows(rows: Rows, tag: str, engine: Engine, *, with_prompts: bool = True) -> None:
    run_requests(engine, random_prompts(2, 512, seed=7), 8, "warmup")
    rows.row(f"{tag} decode batch 1", lambda: _decode_tok_s(engine, 1))
    rows.row(f"{tag} decode 32 streams", lambda: _decode_tok_s(engine, 32))
    if with_prompts:  # long prompts run eagerly either way: one row per model split is enough
        rows.row(f"{tag} 4K prompt", lambda: _ttft_s(engine, 4096))
        rows.row(f"{tag} 128K prompt", lambda: _ttft_s(engine, LONG_PROMPT))


def _single_gpu_rows(rows: Rows, num_layers: int) -> None:
    device = torch.device("cuda", 0)
    model = random_model(full_size_config(num_layers), device, "tp1")
    for tag, is_eager in (("TP=1 graphs", False), ("TP=1 eager", True)):
        engine = Engine.from_model(model, _config(is_eager=is_eager), device=device)
        try:
            _engine_rows(rows, tag, engine, with_prompts=not is_eager)
        finally:
            engine.shutdown()
    del model, engine
    gc.collect()
    torch.cuda.empty_cache()


def _two_gpu_rows(rows: Rows, num_layers: int) -> None:
    source = ModelSource(RandomShards(num_layers), "cuda", timeout_s=600.0)
    engine = start_tensor_parallel_engine(source, _config(is_eager=True), size=2)
    try:
        _engine_rows(rows, "TP=2 eager", engine)
    finally:
        engine.shutdown()


def _time_all_reduce(x: torch.Tensor, iters: int) -> float:
    """Median seconds of one all-reduce of x, by CUDA events."""
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dist.all_reduce(x)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _time_captured_step(per_step: int) -> float:
    """Median seconds of one CUDA-graph replay of a decode step's all-reduces at batch 1."""
    x = torch.ones(1, HIDDEN, dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        dist.all_reduce(x)  # NCCL's first call outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(per_step):
                dist.all_reduce(x)
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        start = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _all_reduce_rank(rank: int, port: int, num_layers: int, results) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
        device_id=torch.device("cuda", rank),
    )  # fmt: skip
    per_step = 2 * num_layers + 1  # mixer and MLP of every layer, and the embedding
    out = {}
    for rows in ALL_REDUCE_ROWS:
        x = torch.ones(rows, HIDDEN, dtype=torch.bfloat16, device="cuda")
        _time_all_reduce(x, 5)
        out[f"eager {rows}"] = _time_all_reduce(x, 50)
    big = torch.ones(BUS_BYTES // 2, dtype=torch.bfloat16, device="cuda")
    _time_all_reduce(big, 3)
    out["bus"] = _time_all_reduce(big, 10)
    if rank == 0:
        results.put(out)  # before the capture, so these rows come back whatever it does
    try:
        graph: float | str = _time_captured_step(per_step)
    except Exception as exc:
        graph = f"error: {type(exc).__name__}: {exc}"
    if rank == 0:
        results.put({"graph step": graph})
    dist.destroy_process_group()


def _all_reduce_rows(rows: Rows, num_layers: int) -> None:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_all_reduce_rank, args=(r, port, num_layers, results)) for r in range(2)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 240
    while True:  # a rank that crashed (no GPU, NCCL error) ends the wait, not the deadline
        try:
            out = results.get(timeout=1)
            break
        except queue.Empty:
            if time.monotonic() > deadline or not all(p.is_alive() for p in procs):
                raise RuntimeError(
                    "an all-reduce rank exited without results: see its log"
                ) from None
    try:
        out |= results.get(timeout=60)
    except queue.Empty:
        out["graph step"] = "error: the captured step did not finish within 60 s"
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.terminate()
    per_step = 2 * num_layers + 1
    for num_rows in ALL_REDUCE_ROWS:
        t = out[f"eager {num_rows}"]
        rows.row(
            f"all-reduce [{num_rows}, {HIDDEN}] bf16",
            lambda t=t: f"{t * 1e6:.1f} us each, {per_step * t * 1e3:.2f} ms per step",
        )
    graph = out["graph step"]
    shown = graph if isinstance(graph, str) else f"{graph * 1e3:.2f} ms per step"
    rows.row(f"all-reduce [1, {HIDDEN}] x {per_step}, one CUDA graph", lambda: shown)
    bus_gb_s = BUS_BYTES / out["bus"] / 1e9  # 2 ranks: bus bytes = 2 (n-1)/n x size = size
    share = bus_gb_s / NVLINK_GB_S
    rows.row(
        "all-reduce 256 MiB bus bandwidth", lambda: f"{bus_gb_s:.0f} GB/s, {share:.0%} of NVLink"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Tensor parallel on two GPUs against one")
    parser.add_argument("--num-layers", type=int, default=64, help="keeps the 3:1 layer pattern")
    parser.add_argument("--skip-engines", action="store_true", help="all-reduce rows only")
    parser.add_argument("--budget-s", type=float, default=270.0, help="start no row after this")
    args = parser.parse_args(argv)
    rows = Rows(deadline=time.monotonic() + args.budget_s)
    print(f"| row (Qwen3.8-27B shapes, {args.num_layers} layers, random bf16) | result |")
    print("|---|---|")
    rows.row("GPUs", lambda: f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")
    try:
        _all_reduce_rows(rows, args.num_layers)
    except Exception as exc:
        traceback.print_exc()
        print(f"| all-reduce rows | error: {type(exc).__name__}: {exc} |", flush=True)
    if args.skip_engines:
        return
    for part in (_single_gpu_rows, _two_gpu_rows):
        try:
            part(rows, args.num_layers)
        except Exception as exc:
            traceback.print_exc()
            print(f"| {part.__name__} | error: {type(exc).__name__}: {exc} |", flush=True)


if __name__ == "__main__":
    main()
