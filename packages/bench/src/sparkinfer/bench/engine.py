"""Offline engine benchmark at full Qwen3.8-27B shapes with random bf16 weights on one GPU.

Decode (one stream and 1..64 concurrent) and prefill through the scheduler's Engine, beside the
roofline from the copy bandwidth and matmul rate measured in the same run, and transformers' model
on the same shapes where memory allows.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import math
import time
from collections.abc import Iterator
from dataclasses import asdict, replace
from typing import TYPE_CHECKING

import numpy as np
import torch
from sparkinfer.bench import join_load, offline_report, prefix_reuse, roofline
from sparkinfer.bench.engine_config import offline_config
from sparkinfer.bench.errors import DeviceError
from sparkinfer.bench.offline_report import DecodeRow, PrefillRow
from sparkinfer.bench.provenance import RunInfo
from sparkinfer.bench.report import Report, log
from sparkinfer.bench.tracker import OutputTracker
from sparkinfer.model.config import FULL_ATTENTION, LINEAR_ATTENTION, ModelConfig, TextConfig
from sparkinfer.scheduler.config import SchedulerConfig

if TYPE_CHECKING:
    from sparkinfer.model.decoder import Qwen3_8ForCausalLM
    from sparkinfer.scheduler.engine import Engine
    from sparkinfer.scheduler.observer import StepObserver

NUM_REAL_TOKENS = 248_077  # ids above are vocabulary padding (docs/model.md §11)
WARMUP_PROMPT, _WARMUP_TOKENS = 512, 8  # two such requests compile and warm every path first
# Prefix reuse: each request's own question after the shared prefix, the requests, the snapshots
PREFIX_SUFFIX, PREFIX_REQUESTS, PREFIX_SNAPSHOTS = 32, 3, 4


def full_size_config(num_layers: int | None = None) -> ModelConfig:
    """Qwen3.8-27B's text config (model.md §1); `num_layers` keeps the 3:1 layer pattern."""
    n = num_layers or 64
    text = TextConfig(
        vocab_size=248_320,
        hidden_size=5120,
        intermediate_size=17_408,
        num_hidden_layers=n,
        layer_types=tuple(FULL_ATTENTION if i % 4 == 3 else LINEAR_ATTENTION for i in range(n)),
        num_attention_heads=24,
        num_key_value_heads=4,
        head_dim=256,
        linear_num_key_heads=16,
        linear_num_value_heads=48,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        max_position_embeddings=262_144,
        eos_token_ids=(248_044,),
    )
    return ModelConfig(model_type="qwen3_5", architecture="Qwen3_5ForCausalLM", text=text)


def require_cuda(mode: str = "offline") -> torch.device:
    if not torch.cuda.is_available():
        raise DeviceError(
            f"{mode} needs a CUDA device and torch.cuda.is_available() is False: run it on a GPU "
            "machine (the HTTP modes work anywhere)"
        )
    return torch.device("cuda", torch.cuda.current_device())


@torch.no_grad()
def fill_random(model: torch.nn.Module, seed: int) -> None:
    """Random weights with sane statistics: N(0, 0.02) matrices, unit gains, HF-style A_log."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("A_log"):
            p.copy_(torch.empty_like(p, dtype=torch.float32).uniform_(1, 16, generator=gen).log())
        elif name.endswith("dt_bias") or name.endswith("linear_attn.norm.weight"):
            p.fill_(1.0)
        elif "norm" in name:
            p.zero_()  # (1 + w) norms
        else:
            p.normal_(0.0, 0.02, generator=gen)


def random_model(cfg: ModelConfig, device: torch.device, mode: str) -> Qwen3_8ForCausalLM:
    """The model of `cfg` in bf16 on `device` with `fill_random` weights (seed 0), logged as
    `mode`'s step."""
    from sparkinfer.model.decoder import Qwen3_8ForCausalLM

    log(f"{mode}: building the model ({cfg.text.num_hidden_layers} layers, bf16, random weights)")
    model = Qwen3_8ForCausalLM(
        cfg, device=device, dtype=torch.bfloat16, num_real_tokens=NUM_REAL_TOKENS
    )
    fill_random(model, seed=0)
    return model


def quantize(model: Qwen3_8ForCausalLM, quantization: str, mode: str) -> int | None:
    """`--quantization` on a model built in memory: "fp8" turns its decoder projections into
    block-FP8 layers in place (`quantize_model_fp8`: the layers, blocks and values of FP8 on
    load) and returns the matmul weights' bytes as stored; "none" leaves it, None."""
    if quantization == "none":
        return None
    from sparkinfer.model.weights import quantize_model_fp8

    log(f"{mode}: quantizing the projections to FP8 (128x128 blocks)")
    quantize_model_fp8(model)
    if model.lm_head.weight.is_cuda:
        torch.cuda.empty_cache()  # the bf16 weights just freed
    return matmul_weight_bytes(model)


def weights_label(quantization: str) -> str:
    """The report's words for the weights' storage."""
    return "bf16" if quantization == "none" else "FP8 projections (128x128 blocks), bf16 rest"


def matmul_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights every decode step streams: the decoder's linear layers as stored
    (e4m3, scales and bf16 tails for FP8 layers) and the LM head."""
    from sparkinfer.model.layers.linear import Linear

    layers = model.get_submodule("model.layers")
    total = sum(
        p.numel() * p.element_size()
        for m in layers.modules()
        if isinstance(m, Linear)
        for p in m.parameters()
    )
    head = model.get_submodule("lm_head").weight
    assert isinstance(head, torch.Tensor)
    return total + head.numel() * head.element_size()


@contextlib.contextmanager
def started_engine(
    model: Qwen3_8ForCausalLM,
    sched: SchedulerConfig,
    device: torch.device,
    *,
    observer: StepObserver | None = None,
) -> Iterator[Engine]:
    """The engine on `model` (caches sized, graphs captured; `observer`: its step observer,
    what a profiler times through); shut down and its caches freed when the block ends,
    however it ends."""
    from sparkinfer.scheduler.engine import Engine

    engine = Engine.from_model(model, sched, device=device, observer=observer)
    try:
        yield engine
    finally:
        engine.shutdown()  # the loop frees the runner's graphs and caches as it ends


def run_requests(engine, prompts: list[list[int]], max_tokens: int, tag: str) -> OutputTracker:
    from sparkinfer.scheduler.request import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    tracker = OutputTracker(num_left=len(prompts))
    for i, prompt in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", prompt, params, on_output=tracker.callback(f"{tag}-{i}"))
    if not tracker.done.wait(3600):
        raise DeviceError(f"{tag}: requests did not finish within an hour")
    return tracker


def random_prompts(num: int, length: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randint(0, NUM_REAL_TOKENS, (length,), generator=gen).tolist() for _ in range(num)
    ]


def measure_decode(
    engine,
    cfg: TextConfig,
    peaks: roofline.Peaks,
    *,
    batch: int,
    context: int,
    new_tokens: int,
    seed: int,
    weight_bytes: int | None = None,
) -> DecodeRow:
    torch.cuda.reset_peak_memory_stats()
    t = run_requests(engine, random_prompts(batch, context, seed), new_tokens, f"decode{batch}")
    all_in = max(ev[0][0] for ev in t.events.values())
    end = max(ev[-1][0] for ev in t.events.values())
    after = sum(n for ev in t.events.values() for ts, n in ev if ts > all_in)
    streams = [
        (sum(n for _, n in ev) - ev[0][1]) / (ev[-1][0] - ev[0][0])
        for ev in t.events.values()
        if ev[-1][0] > ev[0][0]
    ]
    total = sum(n for ev in t.events.values() for _, n in ev)
    first_end = min(ev[-1][0] for ev in t.events.values())
    steady = sum(n for ev in t.events.values() for ts, n in ev if all_in < ts <= first_end)
    return DecodeRow(
        batch,
        context,
        float(np.median(streams)) if streams else math.nan,
        after / (end - all_in) if end > all_in else math.nan,
        total / (end - t.submitted_s),
        roofline.decode_roofline_tok_s(
            cfg, peaks, batch=batch, context=context + new_tokens // 2, weight_bytes=weight_bytes
        ),
        torch.cuda.max_memory_allocated() / 2**30,
        len(t.errors),
        cfg.num_hidden_layers == 64,
        steady / (first_end - all_in) if first_end > all_in else math.nan,
    )


def measure_prefill(
    engine,
    cfg: TextConfig,
    peaks: roofline.Peaks,
    *,
    prompt_len: int,
    iters: int,
    seed: int,
    idle_s: float = 0.0,
) -> PrefillRow:
    """TTFT of `iters` one-token requests of `prompt_len` tokens, each after `idle_s` seconds."""
    torch.cuda.reset_peak_memory_stats()
    ttfts = []
    for i in range(iters):
        time.sleep(idle_s)
        t = run_requests(
            engine, random_prompts(1, prompt_len, seed + i), 1, f"prefill{prompt_len}-{i}"
        )
        ttfts.append(next(iter(t.events.values()))[0][0] - t.submitted_s)
    median = float(np.median(ttfts))
    return PrefillRow(
        prompt_len,
        median * 1e3,
        float(np.percentile(ttfts, 90)) * 1e3,
        prompt_len / median,
        roofline.prefill_roofline_tok_s(cfg, peaks, prompt_len=prompt_len),
        torch.cuda.max_memory_allocated() / 2**30,
        cfg.num_hidden_layers == 64,
    )


def run(args: argparse.Namespace, info: RunInfo) -> Report:
    """The `offline` mode: peaks, engine decode and prefill, then the transformers peer."""
    device = require_cuda()
    cfg = full_size_config(args.num_layers)
    log("offline: measuring copy bandwidth and matmul rate")
    peaks = roofline.measure_peaks(device)
    model = random_model(cfg, device, "offline")
    weight_bytes = quantize(model, args.quantization, "offline")
    weights_gib = torch.cuda.memory_allocated() / 2**30
    sched = _scheduler_config(args)
    log("offline: starting the engine (caches, CUDA graphs)")
    with started_engine(model, sched, device) as engine:
        decode, prefill = _measure(engine, cfg.text, peaks, args, weight_bytes)
        join = [_measure_join(engine, args)] if args.join_under_load else []
    reuse = _measure_prefix_reuse(model, device, args) if args.prefix_reuse else []
    del engine, model
    gc.collect()
    torch.cuda.empty_cache()
    peer = [] if args.skip_hf else _hf_rows(cfg.text, args)
    raw = {
        "peaks": asdict(peaks),
        "decode": [asdict(r) for r in decode],
        "prefill": [asdict(r) for r in prefill],
        "peer": [asdict(p) for p in peer],
        "prefix_reuse": [asdict(r) for r in reuse],
        "join_under_load": [asdict(r) for r in join],
    }
    tables = offline_report.tables(peaks, decode, prefill, peer)
    gates = offline_report.gates(decode, prefill, args.gate_goals)
    context = _context(cfg.text, weights_gib, sched, args.quantization)
    if join:
        tables.append(join_load.table(join))
    if reuse:
        tables.append(prefix_reuse.table(reuse, PREFIX_SNAPSHOTS))
        gates.append(prefix_reuse.gate(reuse))
        context["prefix reuse scheduler"] = str(_prefix_scheduler_config(args))
    return Report(
        "offline",
        info,
        context,
        tables,
        offline_report.plots(decode, prefill),
        raw,
        gates,
    )


def _measure_join(engine, args: argparse.Namespace) -> join_load.JoinRow:
    """A prompt of `args.join_under_load` tokens joining one stream fewer than the widest
    concurrency, so the step that takes it holds max_num_seqs sequences."""
    streams = max(max(args.concurrency) - 1, 1)
    log(f"offline: a {args.join_under_load}-token prompt joining {streams} decoding streams")
    return join_load.measure_join(
        engine,
        streams=streams,
        context=args.context,
        prompt_len=args.join_under_load,
        new_tokens=max(args.new_tokens, 64),
        vocab=NUM_REAL_TOKENS,
        seed=21,
    )


def _measure_prefix_reuse(
    model: Qwen3_8ForCausalLM, device: torch.device, args: argparse.Namespace
) -> list[prefix_reuse.PrefixReuseRow]:
    """Sequential requests sharing an `args.prefix_reuse`-token prefix, in an engine of its own
    with the prefix cache on (the other rows run with it off, the default)."""
    prompt_len = args.prefix_reuse + PREFIX_SUFFIX
    sched = _prefix_scheduler_config(args)
    log(f"offline: prefix reuse, {PREFIX_REQUESTS} requests sharing {args.prefix_reuse} tokens")
    with started_engine(model, sched, device) as engine:
        # A prompt of the same length but another prefix first, so no request pays for warm-up.
        run_requests(engine, random_prompts(1, prompt_len, seed=11), 1, "prefix-warmup")
        return prefix_reuse.measure_prefix_reuse(
            engine,
            prefix_len=args.prefix_reuse,
            suffix_len=PREFIX_SUFFIX,
            num_requests=PREFIX_REQUESTS,
            vocab=NUM_REAL_TOKENS,
            seed=12,
        )


def _scheduler_config(args: argparse.Namespace) -> SchedulerConfig:
    """Room for the widest decode batch and the longest prompt or decoded context."""
    return offline_config(
        args,
        max_num_seqs=max(args.concurrency),
        max_model_len=max(
            max(args.prefill_lengths) + 1,
            args.context + args.new_tokens,
            WARMUP_PROMPT + _WARMUP_TOKENS,
        ),
    )


def _prefix_scheduler_config(args: argparse.Namespace) -> SchedulerConfig:
    """The prefix-reuse engine's: one sequence, room for the shared prefix and a question, the
    prefix cache on."""
    return replace(
        _scheduler_config(args),
        max_num_seqs=1,
        max_model_len=max(args.prefix_reuse + PREFIX_SUFFIX + 1, WARMUP_PROMPT + _WARMUP_TOKENS),
        prefix_cache_snapshots=max(PREFIX_SNAPSHOTS, args.prefix_cache_snapshots),
    )


def _measure(
    engine,
    cfg: TextConfig,
    peaks: roofline.Peaks,
    args: argparse.Namespace,
    weight_bytes: int | None = None,
) -> tuple[list[DecodeRow], list[PrefillRow]]:
    """A warm-up, then decode at each concurrency and prefill at each prompt length
    (weight_bytes: the stored matmul weights' bytes for the decode roofline; None: bf16)."""
    run_requests(engine, random_prompts(2, WARMUP_PROMPT, 1), _WARMUP_TOKENS, "warmup")
    decode = []
    for b in args.concurrency:
        log(f"offline: decode, {b} stream(s) at {args.context} context")
        decode.append(
            measure_decode(
                engine,
                cfg,
                peaks,
                batch=b,
                context=args.context,
                new_tokens=args.new_tokens,
                seed=b,
                weight_bytes=weight_bytes,
            )
        )
    prefill = []
    for n in args.prefill_lengths:
        log(f"offline: prefill {n} tokens x {args.iters}")
        row = measure_prefill(
            engine, cfg, peaks, prompt_len=n, iters=args.iters, seed=n, idle_s=args.prefill_idle_s
        )
        prefill.append(row)
    return decode, prefill


def _context(
    t: TextConfig, weights_gib: float, sched: SchedulerConfig, quantization: str = "none"
) -> dict[str, str]:
    """The report header's model and scheduler lines."""
    weights = weights_label(quantization)
    return {
        "model": f"Qwen3.8-27B text shapes, {t.num_hidden_layers} layers "
        f"({len(t.full_attention_layers)} full attention), hidden {t.hidden_size}, "
        f"vocab {t.vocab_size}, {weights}, random weights ({weights_gib:.1f} GiB)",
        "scheduler": str(sched),
    }


def _hf_rows(cfg: TextConfig, args: argparse.Namespace) -> list:
    from sparkinfer.bench import hf_peer

    return hf_peer.measure(
        cfg,
        context=args.context,
        new_tokens=args.new_tokens,
        prefill_lengths=tuple(n for n in args.prefill_lengths if n <= 32768),
    )
