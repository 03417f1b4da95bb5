"""The `spec` mode: the same prompts decoded without and with speculation in one process.

For each drafter (prompt lookup, the MTP head, a block drafter, or an oracle) and draft count it
prints the plain (AR) and speculative decode rates, the speedup, the mean accepted length (tokens a
verify emits: accepted drafts + 1) and whether every output equals the AR run's. The oracle drafts
the target's own greedy continuation, recorded in the AR run, right on the first j of k drafts and
wrong after: it prices the engine's gain at a given acceptance, whatever the drafter. With
`--priced-acceptance` each real drafter also runs priced (`spec_drafters.PricedDrafter`): it drafts
at its full cost, and its drafts are then made right by the given per-position schedule (seeded,
`--seed`); those rows are labelled "priced", not real acceptance.

The block drafter (`dflash`, `spec_drafters.random_block_drafter`) has the published 27B DFlash
drafter's dimensions (5 layers, docs/model.md §17; `--draft-layers` changes the depth) with random
weights, and a block of k + 1 rows for k drafts: its rows price the drafter's real cost (its
"block ms": one drafter forward proposing every drafting request's block), its random drafts
are rarely accepted, so pair it with `--priced-acceptance` for a speed at a given acceptance.
With `--draft-model DIR|embedded` the `dflash` rows draft with that trained drafter instead (its
block cut to k + 1 rows for k drafts), so their acceptance is real; `--prompt held-out` decodes
openings of the held-out standard-library files (`evals.code_corpus`, which no training of the
embedded model or its drafter read).

The `code` mode is `spec` with the embedded model and its own drafter on held-out code as
defaults (the server image's `bench code`): AR and the drafter on the same prompts, their tok/s,
speedup, mean accepted length and whether the outputs are identical.

Models: a checkpoint (`--model`, with its mtp.* tensors for the MTP drafter and its tokenizer
for the shipped code prompt), Qwen3.8-27B's shapes with random bf16 weights and a random MTP
head (the default, CUDA), or a tiny random model on the CPU (`--tiny`, a smoke run). With
`--quantization fp8` the decoder projections run in block FP8, made the way the offline mode
makes them (`engine.quantize`; a bf16 `--model` quantized on load); the MTP head stays bf16.
On the random 27B model the MTP head's drafts are never accepted: with the adaptive policy (the
default) a gate checks that its rows run at least `NEVER_RIGHT_MIN_SPEEDUP` of AR's rate, since
speculation is on by default and must never make decoding slower.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from sparkinfer.bench.cli_args import float_list, int_list, quantization_flag
from sparkinfer.bench.errors import UsageError
from sparkinfer.bench.provenance import RunInfo
from sparkinfer.bench.report import Gate, Report, Table, log
from sparkinfer.bench.spec_drafters import (
    OracleDrafter,
    PricedDrafter,
    check_schedule,
    random_block_drafter,
    trained_block_drafter,
)

if TYPE_CHECKING:
    import torch
    from sparkinfer.model.decoder import Qwen3_8ForCausalLM
    from sparkinfer.scheduler.config import SchedulerConfig
    from sparkinfer.scheduler.observer import StepObserver, StepSpan

DRAFTERS = ("ngram", "mtp", "oracle")  # the default set
CODE_MODEL = "embedded"  # the `code` mode's --model: the embedded checkpoint
KNOWN_DRAFTERS = (*DRAFTERS, "dflash")
_WARMUP_TOKENS = 8
# The random MTP head's rows against AR: speculation, on by default, must not slow decoding.
NEVER_RIGHT_MIN_SPEEDUP = 0.98


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "spec", help="AR vs speculative decoding in one process: tok/s, speedup, accepted length"
    )
    _add_arguments(p)
    p = sub.add_parser(
        "code",
        help="AR vs the embedded model's own block drafter on held-out code (spec's defaults "
        "changed: --model the embedded checkpoint, --drafters dflash --draft-model embedded "
        "--prompt held-out --num-speculative-tokens 15 --deterministic)",
    )
    _add_arguments(p)
    p.set_defaults(
        model=CODE_MODEL, drafters=("dflash",), draft_model="embedded", prompt="held-out",
        num_speculative_tokens=(15,), context=512, new_tokens=256, deterministic=True,
    )  # fmt: skip


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="checkpoint folder or hub id (default: 27B shapes, random)")
    p.add_argument("--tiny", action="store_true", help="tiny random model on the CPU (smoke run)")
    p.add_argument("--num-layers", type=int, help="fewer than 64 layers at 27B shapes")
    p.add_argument(
        "--drafters",
        type=lambda s: tuple(s.split(",")),
        default=DRAFTERS,
        help="comma-separated: ngram, mtp, oracle, dflash (a block drafter, random weights)",
    )
    p.add_argument(
        "--draft-layers", type=int, default=5, help="the dflash drafter's layers (published: 5)"
    )
    p.add_argument(
        "--draft-model",
        help="a trained block drafter (folder, hub id, or embedded: the embedded model's own) "
        "for the dflash rows, its block cut to k + 1 rows; without it they run a random one",
    )
    p.add_argument("--cpu", action="store_true", help="run on the CPU (fp32), e.g. a --model")
    p.add_argument("--num-speculative-tokens", type=int_list, default=(3,))
    p.add_argument(
        "--oracle-accept",
        type=int_list,
        default=(3, 2, 0),
        help="the oracle's right drafts j of each verify (capped at k)",
    )
    p.add_argument(
        "--priced-acceptance",
        type=float_list,
        help="also run each real drafter (ngram, mtp, dflash) priced: its drafts made right by "
        "this per-position share of verifies accepting draft j (e.g. 0.92,0.84,0.65); rows "
        "labelled priced",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the priced acceptance draws")
    p.add_argument("--concurrency", type=int_list, default=(1,))
    p.add_argument("--context", type=int, default=4096, help="prompt tokens")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument(
        "--prompt", choices=("code", "held-out", "random", "repeat"), default="code",
        help="the shipped code file or openings of held-out standard-library files (both need a "
        "tokenizer: --model), random tokens, or a random 64-token block repeated",
    )  # fmt: skip
    p.add_argument("--no-adaptive", dest="adaptive", action="store_false",
                   help="draft every step (price verifies at a fixed acceptance)")  # fmt: skip
    quantization_flag(p, "; the MTP head stays bf16, as in Qwen's FP8 releases")
    p.add_argument("--deterministic", action="store_true", help="batch-invariant numerics")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs in the engine")


@dataclass(frozen=True)
class SpecRow:
    drafter: str
    num_drafts: int
    oracle_accept: int | None
    batch: int
    context: int
    ar_tok_s: float
    spec_tok_s: float
    mean_accepted_len: float  # tokens emitted per verify of a request with drafts
    accepted_per_position: tuple[float, ...]  # share of verifies accepting draft j
    draft_ms: float | None  # the drafter's own time per draft token (MTP, dflash)
    is_identical: bool
    priced: tuple[float, ...] | None = None  # the acceptance schedule its drafts were made to
    block_ms: float | None = None  # dflash: one propose call (every drafting request's block)

    @property
    def label(self) -> str:
        return f"{self.drafter} priced" if self.priced is not None else self.drafter

    @property
    def speedup(self) -> float:
        return self.spec_tok_s / self.ar_tok_s


def run(args: argparse.Namespace, info: RunInfo) -> Report:
    import torch
    from sparkinfer.bench.engine import weights_label

    if args.mode == "code" and args.tiny:
        raise UsageError(
            "code runs the embedded model and its drafter: --cpu runs them on the CPU "
            "(spec --tiny is the tiny random model's smoke run)"
        )
    device = torch.device("cpu") if args.tiny or args.cpu else _require_cuda()
    if args.priced_acceptance is not None:
        check_schedule(args.priced_acceptance)
    model, tokenizer = spec_model(args, device)
    base = base_config(args)
    rows: list[SpecRow] = []
    for batch in args.concurrency:
        prompts = spec_prompts(args, batch, tokenizer)
        ar_s, ar_tokens = _decode(model, base, device, prompts, args.new_tokens)
        ar = _tok_s(ar_tokens, ar_s, batch)
        log(f"spec: batch {batch}: AR {ar:.1f} tok/s")
        continuations = {tuple(p): t for p, t in zip(prompts, ar_tokens, strict=True)}
        for k in args.num_speculative_tokens:
            variants = _variants(args.drafters, args.oracle_accept, k, args.priced_acceptance)
            for drafter, accept, priced in variants:
                rows.append(
                    _measure(model, base, device, prompts, args, continuations,
                             drafter=drafter, k=k, accept=accept, priced=priced, ar=ar,
                             ar_tokens=ar_tokens)
                )  # fmt: skip
                log(f"spec: {rows[-1]}")
    gates = []
    if args.deterministic:
        same = all(r.is_identical for r in rows)
        gates.append(Gate("identical outputs", same, "every speculative output equals AR's"))
    never_right = [r for r in rows if r.drafter == "mtp" and r.priced is None]
    if never_right and args.adaptive and not (args.model or args.tiny or args.cpu):
        worst = min(never_right, key=lambda r: r.speedup)
        gates.append(
            Gate(
                "a never-right head costs at most 2%",
                worst.speedup >= NEVER_RIGHT_MIN_SPEEDUP,
                f"the random MTP head (no draft accepted) under the adaptive policy: worst "
                f"{worst.speedup:.3f}x AR at {worst.batch} streams (at least "
                f"{NEVER_RIGHT_MIN_SPEEDUP}x)",
            )
        )
    context = {
        "model": args.model or ("tiny random" if args.tiny else "Qwen3.8-27B shapes, random"),
        "weights": "fp32" if args.cpu else weights_label(args.quantization),
        "prompt": args.prompt,
        "new tokens": str(args.new_tokens),
        "scheduler": str(base),
    }
    raw = {"rows": [asdict(r) | {"speedup": r.speedup} for r in rows]}
    return Report("spec", info, context, [_table(rows)], raw=raw, gates=gates)


def _variants(
    drafters: Sequence[str],
    accepts: Sequence[int],
    k: int,
    priced: Sequence[float] | None,
) -> list[tuple[str, int | None, tuple[float, ...] | None]]:
    """(drafter, the oracle's right drafts, the priced schedule) of each row to measure."""
    out: list[tuple[str, int | None, tuple[float, ...] | None]] = []
    for name in drafters:
        if name not in KNOWN_DRAFTERS:
            raise ValueError(f"--drafters has {name!r}; choose from {', '.join(KNOWN_DRAFTERS)}")
        if name == "oracle":
            out += [(name, j, None) for j in dict.fromkeys(min(a, k) for a in accepts)]
            continue
        out.append((name, None, None))
        if priced is not None:
            out.append((name, None, tuple(priced[:k])))
    return out


def _measure(
    model: Qwen3_8ForCausalLM,
    base: SchedulerConfig,
    device: torch.device,
    prompts: list[list[int]],
    args: argparse.Namespace,
    continuations: dict[tuple[int, ...], list[int]],
    *,
    drafter: str,
    k: int,
    accept: int | None,
    priced: tuple[float, ...] | None,
    ar: float,
    ar_tokens: list[list[int]],
) -> SpecRow:
    method = {"mtp": "mtp", "dflash": "draft_model"}.get(drafter, "ngram")
    cfg = replace(
        base,
        speculative=method,  # pyright: ignore[reportArgumentType]
        num_speculative_tokens=k,
    )
    oracle = OracleDrafter(continuations, accept or 0) if drafter == "oracle" else None
    block = None
    if drafter == "dflash" and args.draft_model:
        block = trained_block_drafter(model, args.draft_model, num_drafts=k)
    elif drafter == "dflash":
        block = random_block_drafter(model, num_drafts=k, num_layers=args.draft_layers)

    def pricing(inner: Any, timer: StepObserver) -> Any:
        assert priced is not None
        return PricedDrafter(
            inner, continuations, priced, seed=args.seed, observer=timer, device=device
        )

    timer: list[float] = []
    blocks: list[float] = []
    seconds, tokens, stats = _decode(
        model, cfg, device, prompts, args.new_tokens, drafter=oracle, timer=timer,
        with_stats=True, wrap=pricing if priced is not None else None, block_drafter=block,
        block_timer=blocks,
    )  # fmt: skip
    spec = stats.spec
    verifies = max(1, spec.num_drafts)
    return SpecRow(
        drafter,
        k,
        accept,
        len(prompts),
        len(prompts[0]),
        ar,
        _tok_s(tokens, seconds, len(prompts)),
        1 + spec.num_accepted_tokens / verifies,
        tuple(n / verifies for n in spec.accepted_per_position),
        1e3 * sum(timer) / spec.num_draft_tokens if timer and spec.num_draft_tokens else None,
        tokens == ar_tokens,
        priced,
        1e3 * sum(blocks) / len(blocks) if blocks else None,
    )


def _decode(
    model: Qwen3_8ForCausalLM,
    cfg: SchedulerConfig,
    device: torch.device,
    prompts: list[list[int]],
    new_tokens: int,
    *,
    drafter: object | None = None,
    timer: list[float] | None = None,
    with_stats: bool = False,
    wrap: Callable[[Any, StepObserver], Any] | None = None,
    block_drafter: Any = None,
    block_timer: list[float] | None = None,
) -> Any:
    """Warm the engine up, then decode every prompt at once -> (seconds from the last first
    token to the last token, each prompt's tokens[, the engine's stats]). The MTP or block
    drafter's calls are timed into `timer` through the engine's step observer; `wrap`: wraps
    the engine's drafter, given the observer to time the real drafter's calls by (the
    engine's would bracket the wrapper too); `block_drafter`: the engine's --draft-model
    drafter, its propose calls timed into `block_timer`."""
    from sparkinfer.scheduler.engine import Engine
    from sparkinfer.scheduler.request import SamplingParams

    calls, blocks = _CallTimer(), _CallTimer()
    observer = _DrafterTimer(
        calls if timer is not None and cfg.speculative in ("mtp", "draft_model") else None,
        blocks if block_timer is not None and cfg.speculative == "draft_model" else None,
    )
    engine = Engine.from_model(
        model, cfg, device=device, drafter=block_drafter,
        observer=observer if wrap is None else None,
    )  # fmt: skip
    try:
        runner = engine.runner
        if drafter is not None:
            runner.speculative.drafter = drafter  # type: ignore[attr-defined]
        if wrap is not None:
            runner.speculative.drafter = wrap(runner.speculative.drafter, observer)  # type: ignore[attr-defined]
        warm = SamplingParams(temperature=0.0, max_tokens=_WARMUP_TOKENS, ignore_eos=True)
        engine.generate(prompts[0][:64], warm)
        calls.clear()
        blocks.clear()
        before = engine.stats().spec
        params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
        firsts: list[float] = []
        results: list[list[int]] = []
        import threading

        done = threading.Semaphore(0)
        for i, prompt in enumerate(prompts):
            results.append([])

            def on_output(out, res=results[i]) -> None:
                if out.new_token_ids and not res:
                    firsts.append(time.perf_counter())
                res.extend(out.new_token_ids)
                if out.is_finished:
                    done.release()

            engine.add_request(f"spec-{i}", prompt, params, on_output=on_output)
        for _ in prompts:
            done.acquire()
        seconds = time.perf_counter() - max(firsts)
        stats = engine.stats()
        stats = replace(stats, spec=_minus(stats.spec, before))
        for out, timed in ((timer, calls), (block_timer, blocks)):
            if out is not None:
                out.extend(timed.seconds())
    finally:
        engine.shutdown()
    return (seconds, results, stats) if with_stats else (seconds, results)


class _DrafterTimer:
    """The engine's step observer in the spec mode: each drafter call (propose and observe)
    timed into `calls`, each propose into `blocks`, where given."""

    def __init__(self, calls: _CallTimer | None, blocks: _CallTimer | None) -> None:
        self.calls = calls
        self.blocks = blocks

    def span(
        self, kind: StepSpan, stream: torch.cuda.Stream | None
    ) -> AbstractContextManager[object]:
        timers = [self.calls] if kind in ("draft_propose", "draft_observe") else []
        timers += [self.blocks] if kind == "draft_propose" else []
        spans = contextlib.ExitStack()
        for timer in timers:
            if timer is not None:
                spans.enter_context(timer.timed(stream))
        return spans


class _CallTimer:
    """Times a drafter's calls without waiting for the device: a call made while a step is in
    flight (MTP's observe of an overlapped plain step) must not wait for that step, else the
    timer takes the overlap away and bills the step's forward to the drafter. On CUDA each call
    is bracketed by two events on the runner's stream (the drafter's span on the device, host
    gaps between its launches included); on the CPU (no stream), by the wall clock."""

    def __init__(self) -> None:
        self._spans: list[tuple[Any, Any]] = []
        self._seconds: list[float] = []

    @contextlib.contextmanager
    def timed(self, stream: torch.cuda.Stream | None) -> Iterator[None]:
        if stream is None:
            start = time.perf_counter()
            yield
            self._seconds.append(time.perf_counter() - start)
            return
        import torch

        begin, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        begin.record(stream)
        yield
        end.record(stream)
        self._spans.append((begin, end))

    def clear(self) -> None:
        self._spans.clear()
        self._seconds.clear()

    def seconds(self) -> list[float]:
        """Each call's time (waits for the last call's events)."""
        if self._spans:
            self._spans[-1][1].synchronize()
        return self._seconds + [b.elapsed_time(e) / 1e3 for b, e in self._spans]


def _minus(after: Any, before: Any) -> Any:
    pairs = zip(after.accepted_per_position, before.accepted_per_position, strict=True)
    per_pos = [a - b for a, b in pairs]
    return replace(
        after,
        num_drafts=after.num_drafts - before.num_drafts,
        num_draft_tokens=after.num_draft_tokens - before.num_draft_tokens,
        num_accepted_tokens=after.num_accepted_tokens - before.num_accepted_tokens,
        accepted_per_position=per_pos,
    )


def _tok_s(tokens: list[list[int]], seconds: float, batch: int) -> float:
    """Decode rate after every request has its first token (all of them decoding)."""
    return (sum(len(t) for t in tokens) - batch) / seconds if seconds > 0 else float("nan")


def _table(rows: list[SpecRow]) -> Table:
    return Table(
        "spec: the same prompts without (AR) and with speculation (greedy)",
        ["drafter", "k", "right", "batch", "context", "AR tok/s", "spec tok/s", "speedup",
         "accepted len", "accepted at 1..k", "draft ms", "block ms", "identical"],
        [
            [r.label, r.num_drafts, _right(r),
             r.batch, r.context, r.ar_tok_s, r.spec_tok_s, r.speedup, r.mean_accepted_len,
             " ".join(f"{x:.2f}" for x in r.accepted_per_position),
             "-" if r.draft_ms is None else r.draft_ms,
             "-" if r.block_ms is None else r.block_ms, "yes" if r.is_identical else "NO"]
            for r in rows
        ],
        notes=[
            "accepted len: tokens a verify emits (accepted drafts + 1); right: the oracle's "
            "correct drafts of k, or a priced row's schedule (the share of verifies whose draft "
            "j is made right: priced, not the drafter's real acceptance); draft ms: the MTP or "
            "block drafter's time per draft token (its cache writes included; its calls' span "
            "on the device, never a wait for the step in flight); block ms: one "
            "block drafter forward proposing every drafting request's block"
        ],
    )  # fmt: skip


def _right(row: SpecRow) -> str | int:
    if row.priced is not None:
        return ",".join(f"{p:g}" for p in row.priced)
    return "-" if row.oracle_accept is None else row.oracle_accept


def _require_cuda() -> torch.device:
    from sparkinfer.bench.engine import require_cuda

    return require_cuda("spec")


def base_config(args: argparse.Namespace) -> SchedulerConfig:
    """The engine config of the AR run; each speculative row replaces its drafter fields."""
    from sparkinfer.bench.engine_config import offline_config

    max_len = args.context + args.new_tokens + 64
    base = offline_config(args, max_num_seqs=max(max(args.concurrency), 1), max_model_len=max_len)
    return replace(
        base,
        max_num_batched_tokens=max(2048, max(args.concurrency) * 32),
        speculative="off",  # the AR run; each speculative row sets its drafter
        speculative_adaptive=args.adaptive,
        block_size=16 if args.tiny or args.cpu else 64,
        cpu_cache_bytes=1 << 28,
    )


def spec_model(args: argparse.Namespace, device: torch.device) -> tuple[Qwen3_8ForCausalLM, Any]:
    """The model (with an MTP head when the mtp drafter runs) and its tokenizer (or None)."""
    import torch
    from sparkinfer.bench.engine import fill_random, full_size_config, quantize, random_model
    from sparkinfer.model.decoder import Qwen3_8ForCausalLM
    from sparkinfer.model.mtp import MTPHead

    use_mtp = "mtp" in args.drafters
    if args.model:
        from sparkinfer.model.embedded import embedded_checkpoint_dir
        from sparkinfer.model.hub import fetch_checkpoint
        from sparkinfer.model.tokenizer import Tokenizer
        from sparkinfer.model.weights import load_model

        name = embedded_checkpoint_dir() if args.model == CODE_MODEL else args.model
        path = fetch_checkpoint(name)  # a hub id: its weights too, not only the configs
        tokenizer = Tokenizer.from_checkpoint(path)
        model = load_model(
            path, device=device, dtype=torch.float32 if args.cpu else torch.bfloat16,
            use_mtp=use_mtp,
            num_real_tokens=tokenizer.vocab_size,
            quantization=None if args.quantization == "none" else args.quantization,
        )  # fmt: skip
        return model, tokenizer
    if args.tiny:
        cfg, dtype = _tiny_config(), torch.float32
        model = Qwen3_8ForCausalLM(cfg, device=device, dtype=dtype)
        fill_random(model, seed=0)
    else:
        cfg, dtype = full_size_config(args.num_layers), torch.bfloat16
        model = random_model(cfg, device, "spec")
    quantize(model, args.quantization, "spec")
    if use_mtp:
        head = MTPHead(cfg.text, ops=model.ops, device=device, dtype=dtype)
        fill_random(head, seed=1)
        model.mtp = head
    return model, None


def _tiny_config() -> Any:
    from sparkinfer.bench.engine import full_size_config
    from sparkinfer.model.config import FULL_ATTENTION, LINEAR_ATTENTION

    text = replace(
        full_size_config(4).text,
        vocab_size=512, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, max_position_embeddings=4096,
        layer_types=(LINEAR_ATTENTION,) * 3 + (FULL_ATTENTION,), eos_token_ids=(),
    )  # fmt: skip
    return replace(full_size_config(4), text=text)


def spec_prompts(args: argparse.Namespace, batch: int, tokenizer: Any) -> list[list[int]]:
    """`batch` prompts of `args.context` tokens, each one different from its first token."""
    vocab = tokenizer.vocab_size if tokenizer is not None else 500 if args.tiny else 248_000
    rng = random.Random(0)
    if args.prompt == "held-out":
        return _held_out_code(tokenizer, batch, args.context)
    out: list[list[int]] = []
    for i in range(batch):
        if args.prompt == "code" and tokenizer is not None:
            from sparkinfer.bench.corpus import read_data

            ids = tokenizer.encode(f"# file {i}\n" + read_data("code.txt"))
            body = (ids * (1 + args.context // max(1, len(ids))))[: args.context]
        elif args.prompt in ("repeat", "code"):  # code without a tokenizer: a repeated block
            block = [rng.randrange(vocab) for _ in range(64)]
            body = (block * (1 + args.context // 64))[: args.context]
        else:
            body = [rng.randrange(vocab) for _ in range(args.context)]
        out.append([rng.randrange(vocab), *body[1:]])
    return out


def _held_out_code(tokenizer: Any, batch: int, context: int) -> list[list[int]]:
    """The first `context` tokens of `batch` held-out standard-library files (the longest
    first, cycling when there are fewer)."""
    from sparkinfer.bench.evals.code_corpus import read_source, split_files, stdlib_root

    if tokenizer is None:
        raise UsageError("--prompt held-out needs a tokenizer: give --model")
    root = stdlib_root()
    texts = sorted(
        (t for f in split_files(root)[1] if (t := read_source(root / f))), key=len, reverse=True
    )
    if not texts:
        raise UsageError(f"no held-out source files under {root}: use another --prompt")
    out = []
    for i in range(batch):
        ids = tokenizer.encode(texts[i % len(texts)])
        out.append((ids * (1 + context // max(1, len(ids))))[:context])
    return out
