"""The `profile` mode: where the GPU time of an engine step goes, kernel by kernel.

The offline engine (full-size Qwen3.8-27B shapes, random bf16 weights, CUDA-graph decode) runs
decode batches and a prefill exactly as the `offline` mode does; torch.profiler records every
kernel the GPU ran inside a window of steady decode steps (every stream already decoding) and over
one whole prefill. Kernels are summed per step and grouped by the op they implement, beside the
step's wall time, so the gap between GPU work and the step is visible too.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import re
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from sparkinfer.bench import engine as offline
from sparkinfer.bench.errors import DeviceError
from sparkinfer.bench.provenance import RunInfo
from sparkinfer.bench.report import Report, Table, log
from sparkinfer.bench.tracker import OutputTracker
from sparkinfer.lab.idle_gaps import Idle, idle

if TYPE_CHECKING:
    from sparkinfer.scheduler.config import SchedulerConfig
    from sparkinfer.scheduler.observer import StepSpan

# First match wins; the patterns are the kernel names of sparkinfer.kernels and of cuBLAS/torch.
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("attention prefill", r"_prefill_(tma_)?kernel|sdpa|fmha|flash_fprop|flash_fwd"),
    ("linear (Triton skinny GEMM)", r"_skinny_gemm"),
    ("linear (Triton tiled GEMM)", r"_tiled_gemm"),
    ("linear (cuBLAS)", r"gemm|xmma|cutlass|nvjet|sm90_|sm80_|cublas"),
    ("GDN chunk prefill", r"_chunk_(prepare|wu|solve|state|output)"),
    ("GDN recurrent decode", r"_fused_recurrent"),
    ("GDN gating", r"_gdn_gating"),
    ("causal conv1d", r"conv1d|_conv_state"),
    ("attention decode", r"_decode_(split|merge)"),
    ("KV cache write", r"_write_kv_cache"),
    ("q/k norm + rotary + KV write", r"_qk_norm_rotary"),
    ("RMSNorm (plain, gated)", r"rms_norm"),
    ("rotary", r"_apply_rotary"),
    ("SwiGLU", r"_silu_and_mul"),
    ("sampling", r"argmax|topk|sort|softmax|multinomial|exponential|cumsum|scatter|gather"),
    ("torch copies, fills, elementwise", r"copy|fill|memcpy|memset|elementwise|CatArray|index"),
)


def category(kernel: str) -> str:
    """The op a kernel name belongs to (see CATEGORIES); 'other' when none matches."""
    for name, pattern in CATEGORIES:
        if re.search(pattern, kernel, flags=re.IGNORECASE):
            return name
    return "other"


@dataclass(frozen=True)
class KernelTotal:
    name: str
    calls: int
    total_us: float


@dataclass(frozen=True)
class Window:
    """Kernels recorded over `steps` engine steps that took `wall_ms` together."""

    scenario: str
    steps: int
    wall_ms: float
    kernels: tuple[KernelTotal, ...]
    replay_ms: float | None = None  # median CUDA-graph replay, inputs staged (decode windows)
    idle: Idle | None = None  # the GPU's idle time between the window's first and last kernel

    @property
    def gpu_ms_per_step(self) -> float:
        return sum(k.total_us for k in self.kernels) / 1e3 / self.steps

    @property
    def wall_ms_per_step(self) -> float:
        return self.wall_ms / self.steps

    @property
    def kernels_per_step(self) -> float:
        return sum(k.calls for k in self.kernels) / self.steps


def summarise(kernels: list[tuple[str, float]]) -> tuple[KernelTotal, ...]:
    """(name, duration us) per launch -> totals per name, largest first."""
    calls: dict[str, int] = defaultdict(int)
    total: dict[str, float] = defaultdict(float)
    for name, us in kernels:
        calls[name] += 1
        total[name] += us
    rows = [KernelTotal(n, calls[n], total[n]) for n in calls]
    return tuple(sorted(rows, key=lambda r: -r.total_us))


def kernel_events(prof: torch.profiler.profile) -> list[tuple[str, float, float]]:
    """(name, start us, device time us) of every kernel the profiler recorded."""
    from torch.autograd import DeviceType  # pyright: ignore[reportPrivateImportUsage]

    return [
        (evt.name, evt.time_range.start, evt.time_range.elapsed_us())
        for evt in prof.events() or ()
        if evt.device_type == DeviceType.CUDA
    ]


def kernel_times(prof: torch.profiler.profile) -> list[tuple[str, float]]:
    """(name, device time us) of every kernel the profiler recorded."""
    return [(name, us) for name, _, us in kernel_events(prof)]


def _tokens(tracker: OutputTracker) -> dict[str, list[float]]:
    with tracker.lock:
        return {rid: [ts for ts, _ in ev] for rid, ev in tracker.events.items()}


def _wait(predicate, timeout_s: float, what: str, tracker: OutputTracker) -> None:
    """Poll until predicate holds; a failed request or the timeout raises with the reason."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        with tracker.lock:
            errors = list(tracker.errors)
        if errors:
            raise DeviceError(f"profile: waiting for {what}, requests failed: {errors[:3]}")
        if time.monotonic() > deadline:
            raise DeviceError(f"profile: {what} did not happen within {timeout_s:.0f} s")
        time.sleep(0.001)


# Decode steps that may run while torch.profiler starts (seconds on some hosts, ~15 ms a step).
PROFILER_START_STEPS = 1024


def decode_room(batch: int, context: int, window: int) -> int:
    """New tokens each decode request may take: streams admitted first decode while later
    prompts prefill and while the profiler starts, and the window must end before any stream
    does (the streams are aborted once it has)."""
    return 4 + 2 * window + batch * (context // 1024 + 2) + PROFILER_START_STEPS


class ReplayTimer:
    """The engine's step observer (`sparkinfer.scheduler.observer`): CUDA events around each
    decode-graph run (staging and replay) while a `recording` block runs; nothing otherwise."""

    def __init__(self) -> None:
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] | None = None

    @contextlib.contextmanager
    def recording(self) -> Iterator[list[tuple[torch.cuda.Event, torch.cuda.Event]]]:
        """The (start, end) events of the replays the engine runs while the block runs."""
        self._events = events = []
        try:
            yield events
        finally:
            self._events = None

    def span(
        self, kind: StepSpan, stream: torch.cuda.Stream | None
    ) -> contextlib.AbstractContextManager[object]:
        events = self._events  # read once: the block may end on another thread
        if events is None or kind != "decode_replay" or stream is None:
            return contextlib.nullcontext()
        return self._timed(events, stream)

    @staticmethod
    @contextlib.contextmanager
    def _timed(
        events: list[tuple[torch.cuda.Event, torch.cuda.Event]], stream: torch.cuda.Stream
    ) -> Iterator[None]:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        yield
        end.record(stream)
        events.append((start, end))


def profile_decode(
    engine, replays: ReplayTimer, *, batch: int, context: int, window: int
) -> Window:
    """Kernels of `window` decode steps once all `batch` streams decode at `context`; the
    median graph replay timed by `replays`, the engine's observer."""
    from sparkinfer.scheduler.request import SamplingParams

    warm = 4
    params = SamplingParams(
        temperature=0.0, max_tokens=decode_room(batch, context, window), ignore_eos=True
    )
    tracker = OutputTracker(num_left=batch)
    ids = [f"p{batch}-{i}" for i in range(batch)]
    for rid, prompt in zip(ids, offline.random_prompts(batch, context, seed=batch), strict=True):
        engine.add_request(rid, prompt, params, on_output=tracker.callback(rid))

    def all_decoding() -> bool:
        ev = _tokens(tracker)
        return len(ev) == batch and min(len(v) for v in ev.values()) >= warm

    _wait(all_decoding, 600, f"{batch} streams decoding", tracker)
    with (
        replays.recording() as events,
        torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof,
    ):
        # Counted once tracing runs: starting the profiler takes longer than many steps.
        t0 = time.perf_counter()
        counts = {rid: len(ts) for rid, ts in _tokens(tracker).items()}
        last = min(counts, key=counts.__getitem__)  # the stream admitted last counts the steps

        def window_done() -> bool:
            if tracker.done.is_set() and not tracker.errors:  # _wait reports failed requests
                raise DeviceError(
                    f"profile: the decode streams ended before {window} steps were traced; "
                    "raise PROFILER_START_STEPS"
                )
            return len(_tokens(tracker)[last]) >= counts[last] + window

        _wait(window_done, 600, f"{window} decode steps", tracker)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
    for rid in ids:
        engine.abort(rid)
    _wait(tracker.done.is_set, 600, "the decode requests ending", tracker)
    if tracker.errors:
        raise DeviceError(f"profile: decode requests failed: {tracker.errors[:3]}")
    steps = sum(1 for ts in _tokens(tracker)[last] if t0 <= ts <= t1) or window
    # Steps the engine ran after the window's synchronize recorded events too: wait for them.
    torch.cuda.synchronize()
    replay_ms = [start.elapsed_time(end) for start, end in events]
    return Window(
        f"decode {batch} x {context}",
        steps,
        (t1 - t0) * 1e3,
        summarise(kernel_times(prof)),
        float(np.median(replay_ms)) if replay_ms else None,
    )


def profile_prefill(engine, *, prompt_len: int) -> Window:
    """Kernels of one whole prefill of `prompt_len` tokens (one step per prompt chunk)."""
    from sparkinfer.scheduler.request import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    tracker = OutputTracker(num_left=1)
    prompt = offline.random_prompts(1, prompt_len, seed=prompt_len)[0]
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        engine.add_request("prefill", prompt, params, on_output=tracker.callback("prefill"))
        _wait(tracker.done.is_set, 3600, "the prefill", tracker)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
    if tracker.errors:
        raise DeviceError(f"profile: the prefill failed: {tracker.errors}")
    events = kernel_events(prof)
    kernels = summarise([(name, us) for name, _, us in events])
    return Window(f"prefill {prompt_len}", 1, (t1 - t0) * 1e3, kernels, idle=idle(events, top=8))


def scheduler_config(args: argparse.Namespace) -> SchedulerConfig:
    """Room for the widest decode batch at its context and for the longest prompt."""
    from sparkinfer.bench.engine_config import offline_config

    return offline_config(
        args,
        max_num_seqs=max(args.decode_batches),
        max_model_len=max(
            max(args.prefill_lengths) + 1,
            args.context
            + max(decode_room(b, args.context, args.window) for b in args.decode_batches),
            1024,
        ),
    )


def run(args: argparse.Namespace, info: RunInfo) -> Report:
    device = offline.require_cuda()
    cfg = offline.full_size_config(args.num_layers)
    model = offline.random_model(cfg, device, "profile")
    sched = scheduler_config(args)
    log("profile: starting the engine (caches, CUDA graphs)")
    windows: list[Window] = []
    replays = ReplayTimer()
    with offline.started_engine(model, sched, device, observer=replays) as engine:
        offline.run_requests(engine, offline.random_prompts(2, 512, 1), 8, "warmup")
        for b in args.decode_batches:
            log(f"profile: decode, {b} stream(s) at {args.context} context")
            window = profile_decode(
                engine, replays, batch=b, context=args.context, window=args.window
            )
            windows.append(window)
        for n in args.prefill_lengths:
            log(f"profile: prefill {n} tokens")
            windows.append(profile_prefill(engine, prompt_len=n))
    del engine, model
    gc.collect()
    torch.cuda.empty_cache()
    return Report(
        "profile",
        info,
        {
            "model": f"Qwen3.8-27B text shapes, {cfg.text.num_hidden_layers} layers, bf16, random "
            "weights; offline engine with CUDA-graph decode; kernels from torch.profiler",
            "scheduler": str(sched),
            "kernel times": "with dependent_launch a kernel starts before the one ahead of it "
            "ends and its time includes that wait, so kernel times overlap and GPU busy can pass "
            "1; run with --no-dependent-launch for each kernel's own time"
            if sched.dependent_launch
            else "each kernel's own time (dependent launch off)",
        },
        tables(windows, top=args.top),
        raw={"windows": [asdict(w) for w in windows]},
    )


def tables(windows: list[Window], *, top: int) -> list[Table]:
    """The step summary, then per scenario the op groups and the largest kernels."""
    out = [
        Table(
            "Engine steps: wall time against the GPU time of the kernels in them",
            [
                "scenario",
                "steps",
                "wall ms/step",
                "graph replay ms",
                "kernel ms/step",
                "GPU busy",
                "kernels/step",
                "kernel span ms",
                "idle in span ms",
            ],
            [
                [
                    w.scenario,
                    w.steps,
                    w.wall_ms_per_step,
                    w.replay_ms,
                    w.gpu_ms_per_step,
                    w.gpu_ms_per_step / w.wall_ms_per_step,
                    w.kernels_per_step,
                    w.idle.span_ms if w.idle else None,
                    w.idle.idle_ms if w.idle else None,
                ]
                for w in windows
            ],
            [
                "GPU busy = kernel time / wall time; below 1 the GPU waits on the host or on gaps",
                "graph replay (decode): median time of one staged replay; wall - replay is the "
                "host's time between steps, replay - kernel the gaps between the graph's kernels",
                "kernel span (prefill): first kernel's start to the last one's end; idle in span: "
                "the part of it no kernel ran (the host behind, or waiting on the GPU)",
            ],
        )
    ]
    for w in windows:
        groups: dict[str, list[KernelTotal]] = defaultdict(list)
        for k in w.kernels:
            groups[category(k.name)].append(k)
        total = sum(k.total_us for k in w.kernels) or 1.0
        by_time = sorted(groups.items(), key=lambda item: -sum(k.total_us for k in item[1]))
        rows = [
            [
                g,
                sum(k.calls for k in ks) / w.steps,
                sum(k.total_us for k in ks) / w.steps,
                sum(k.total_us for k in ks) / total,
            ]
            for g, ks in by_time
        ]
        out.append(
            Table(
                f"{w.scenario}: GPU time per step by op",
                ["op", "kernels/step", "us/step", "share"],
                rows,
            )
        )
        out.append(
            Table(
                f"{w.scenario}: the {top} largest kernels",
                ["kernel", "calls/step", "us/step", "us/call", "share"],
                [
                    [
                        k.name[:70],
                        k.calls / w.steps,
                        k.total_us / w.steps,
                        k.total_us / k.calls,
                        k.total_us / total,
                    ]
                    for k in w.kernels[:top]
                ],
            )
        )
        if w.idle and w.idle.gaps:
            out.append(
                Table(
                    f"{w.scenario}: the longest idle gaps",
                    ["gap us", "after kernel", "before kernel"],
                    [[g.us, g.after[:60], g.before[:60]] for g in w.idle.gaps],
                )
            )
    return out
