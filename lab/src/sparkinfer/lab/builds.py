"""Triton kernel builds: how many the engine makes at start and how many the first requests wait
on, over a sweep of step shapes (prompt lengths, several prompts at once, chunked prompts).

A build of the attention prefill kernel takes seconds, so a request that meets an unbuilt
variant waits that long. `--cold` points Triton's build cache at an empty folder, so
every build compiles as in a fresh container; without it, builds cached on disk by an earlier
process load in milliseconds but still count.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import asdict, dataclass

import torch
from sparkinfer.bench import engine as offline
from sparkinfer.bench.engine_config import offline_config
from sparkinfer.bench.provenance import RunInfo
from sparkinfer.bench.report import Gate, Report, Table, log

# Each step: the prompt lengths of requests sent together (chunked past the token budget).
SWEEP: tuple[tuple[int, ...], ...] = (
    (4096,), (1000,), (3000,), (17,), (1,), (2048, 2048), (16000,), (100, 100, 100),
    (4096,) * 4, (600,), (6000,), (8192,), (8000,), (700,) * 5, (33,) * 7, (12000,),
)  # fmt: skip


@dataclass(frozen=True)
class BuildRow:
    phase: str
    wall_s: float
    num_builds: int
    build_s: float
    kernels: str


class BuildLog:
    """Every Triton build from `start()` on, with its time, through Triton's JIT hooks."""

    def __init__(self) -> None:
        self.builds: list[tuple[str, float, float | None]] = []  # (kernel, start, end)

    def start(self) -> None:
        from triton import knobs

        def before(**kwargs) -> bool:
            self.builds.append((kwargs["fn"].name, time.perf_counter(), None))
            return False  # build it: only logged

        def after(**kwargs) -> None:
            name, began, _ = self.builds[-1]
            self.builds[-1] = (name, began, time.perf_counter())

        knobs.runtime.jit_cache_hook = before
        knobs.runtime.jit_post_compile_hook = after

    def take(self, phase: str, wall_s: float) -> BuildRow:
        """The builds since the last take, as one row."""
        builds, self.builds = self.builds, []
        seconds = sum((end or began) - began for _, began, end in builds)
        names = sorted({name for name, _, _ in builds})
        kernels = ", ".join(names) if len(names) <= 5 else f"{len(names)} kernels"
        return BuildRow(phase, wall_s, len(builds), seconds, kernels)


def run(args: argparse.Namespace, info: RunInfo) -> Report:
    device = offline.require_cuda("builds")
    if args.cold:
        from triton import knobs

        knobs.cache.dir = tempfile.mkdtemp(prefix="sparkinfer-builds-")
    cfg = offline.full_size_config(args.num_layers)
    model = offline.random_model(cfg, device, "builds")
    sched = offline_config(
        args,
        max_num_seqs=max(len(step) for step in SWEEP),
        max_model_len=max(max(step) for step in SWEEP) + 8,
    )
    builds = BuildLog()
    builds.start()
    rows = []
    began = time.perf_counter()
    with offline.started_engine(model, sched, device) as engine:
        rows.append(builds.take("engine start", time.perf_counter() - began))
        for i, step in enumerate(SWEEP):
            log(f"builds: step {i + 1} of {len(SWEEP)}, prompts of {step[0]} tokens x {len(step)}")
            began = time.perf_counter()
            prompts = offline.random_prompts(len(step), step[0], seed=i)
            offline.run_requests(engine, prompts, 4, f"builds{i}")
            torch.cuda.synchronize()
            rows.append(builds.take(f"{step[0]} tokens x {len(step)}", time.perf_counter() - began))
    after_start = rows[1:]
    waited = sum(r.build_s for r in after_start)
    table = Table(
        "Triton builds (4 new tokens a request)",
        ["phase", "wall s", "builds", "build s", "kernels built"],
        [[r.phase, r.wall_s, r.num_builds, r.build_s, r.kernels] for r in rows],
        notes=["build s: time inside Triton's builds (compiles, or loads from its disk cache)"],
    )
    gate = Gate(
        "no request waits on a kernel build",
        all(r.num_builds == 0 for r in after_start),
        f"{sum(r.num_builds for r in after_start)} build(s) after start, {waited:.1f} s",
    )
    context = {
        "model": f"Qwen3.8-27B text shapes, {cfg.text.num_hidden_layers} layers, bf16, random "
        "weights (builds do not depend on the depth)",
        "build cache": "empty at start (--cold)" if args.cold else "Triton's default, as found",
        "scheduler": repr(sched),
    }
    return Report("builds", info, context, [table], raw={"rows": [asdict(r) for r in rows]},
                  gates=[gate])  # fmt: skip
