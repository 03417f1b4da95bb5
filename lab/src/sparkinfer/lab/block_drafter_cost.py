"""What one block proposal of the DFlash drafter costs at Qwen3.8-27B shapes, part by part.

The bench's target (random bf16 weights, `--num-layers` of the 27B's 64) and its random 5-layer
drafter at the published 27B drafter's shape (`spec_drafters.random_block_drafter`, a block of
`--num-drafts` + 1 rows) on the GPU; each of `--rows` sequences has `--context` tokens of random
tapped context written into the drafter's cache. Then, per row count, under the engine's
deterministic decode numerics (`batch_invariant("decode")`; `--no-deterministic`: the measured
dispatch instead):

- per part (CUDA events around the module calls of eager proposals at one keys bucket): the
  embedding, each layer's attention (projections, K/V writes, the paged attention) and MLP,
  the LM head's logits, the draft picks, and what lies between them (norms, rope, copies);
- whole proposals, eager: at one keys bucket each call (`key_bucket`), and with num_keys
  growing by one each call (every call a new shape); the host's wall time per call beside the
  device's; then the same with the keys gathered and masked (`use_paged_attention` off: the
  attention before the paged one);
- the gathered proposals with the attention held to each SDPA backend (cuDNN, efficient,
  math), to tell which one the default picks and what a new shape costs it;
- the graphed proposal (`graphs.block_drafter`: captured once, replayed), paged (one graph for
  every context) and gathered (one per keys bucket);
- a decode step's context write (`observe`: the K/V of rows x (drafts + 1) accepted positions),
  eager and graphed (`graphs.drafter_context`).

Run on a GPU machine, from the repository root (about a minute):

    PYTHONPATH=$(ls -d packages/*/src lab/src | paste -sd:) \\
        python3 -m sparkinfer.lab.block_drafter_cost
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from sparkinfer.bench.engine import full_size_config, random_model, require_cuda
from sparkinfer.bench.report import Table, log
from sparkinfer.bench.spec_drafters import random_block_drafter
from sparkinfer.kernels.linear import batch_invariant
from sparkinfer.model.drafters.cache import allocate_drafter_cache
from sparkinfer.model.drafters.dflash import BlockDrafter
from sparkinfer.model.drafters.layers import DraftLayer
from sparkinfer.scheduler.graphs.block_drafter import BlockDrafterGraphs
from sparkinfer.scheduler.graphs.drafter_context import DrafterContextGraphs
from sparkinfer.scheduler.speculative.block_drafter import key_bucket, scratch_pages

PAGE = 64  # the bench's KV block size on the GPU
BETWEEN = "between the parts (norms, rope, copies)"
GROWING_ROOM = 256  # positions past context + block the calls with a new shape each reach


class Setup:
    """The drafter's cache with `rows` contexts written, each sequence's pages in its table."""

    def __init__(self, drafter: BlockDrafter, rows: int, context: int, device: torch.device):
        self.drafter, self.rows, self.context = drafter, rows, context
        block = drafter.config.block_size
        self.num_keys = key_bucket(context + block, PAGE)
        self.width = self.num_keys // PAGE
        self.scratch = scratch_pages(block, PAGE)
        growing_width = -(-(context + block + GROWING_ROOM) // PAGE)  # the growing-shape calls
        self.width = max(self.width, growing_width)
        num_blocks = rows * self.width + rows * self.scratch + 1  # the last: the dump page
        self.dump_row = (num_blocks - 1) * PAGE
        self.cache = allocate_drafter_cache(
            drafter.cache_spec(), num_blocks=num_blocks, block_size=PAGE, device=device
        )
        self.tables = torch.arange(rows * self.width, device=device).view(rows, self.width)
        gen = torch.Generator(device=device).manual_seed(0)
        width = drafter.config.num_taps * drafter.config.hidden_size
        positions = torch.arange(context, device=device)
        for r in range(rows):
            tapped = torch.randn(context, width, device=device, generator=gen, dtype=drafter.dtype)
            drafter.write_context(
                tapped, positions, self.cache, block_tables=self.tables,
                seq_ids=torch.full((context,), r, device=device),
            )  # fmt: skip
        self.anchors = torch.randint(0, 1000, (rows,), device=device, generator=gen)
        self.anchors %= drafter.config.vocab_size
        self.starts = torch.full((rows,), context, dtype=torch.int64, device=device)

    def propose(self, num_keys: int | None = None) -> torch.Tensor:
        n = self.num_keys if num_keys is None else num_keys
        tables = self.tables[:, : -(-n // PAGE)]
        draft = self.drafter.propose(
            self.anchors, self.starts, self.cache, block_tables=tables, num_keys=n
        )
        return self.drafter.draft_tokens(draft, self.anchors).tokens

    def graphs(self, stream: torch.cuda.Stream) -> BlockDrafterGraphs:
        first = self.rows * self.width
        pad = [[first + r * self.scratch] * (self.num_keys // PAGE) for r in range(self.rows)]
        return BlockDrafterGraphs(
            self.drafter, self.cache, row_sizes=(self.rows,), max_keys=self.num_keys,
            pad_tables=torch.tensor(pad, dtype=torch.int64), stream=stream,
        )  # fmt: skip


@contextlib.contextmanager
def part_events(drafter: BlockDrafter, spans: dict[str, list[tuple[Any, Any]]]) -> Iterator[None]:
    """CUDA events around each part's module calls, appended to spans[part]."""
    modules: list[tuple[str, torch.nn.Module]] = [
        ("embedding", drafter.shared.embed_tokens),
        ("logits (LM head, fp32)", drafter.shared.lm_head),
    ]
    for i, layer in enumerate(drafter.layers):
        assert isinstance(layer, DraftLayer)
        modules += [(f"layer {i} attention", layer.self_attn), (f"layer {i} MLP", layer.mlp)]
    handles = []
    for name, module in modules:

        def pre(_m: Any, _a: Any, name: str = name) -> None:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            spans.setdefault(name, []).append((start, None))

        def post(_m: Any, _a: Any, _o: Any, name: str = name) -> None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            spans[name][-1] = (spans[name][-1][0], end)

        handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(device ms, host ms) of one call: events around it, wall time to its enqueue's end."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    fn()
    host = (time.perf_counter() - t0) * 1e3
    end.record()
    end.synchronize()
    return start.elapsed_time(end), host


def measure(setup: Setup, iters: int) -> list[list[Any]]:
    """The table's rows for one row count."""
    rows: list[list[Any]] = []
    tag = f"{setup.rows} x {setup.context}"
    for _ in range(3):
        setup.propose()  # warm-up: kernels built, the attention's plan made
    spans: dict[str, list[tuple[Any, Any]]] = {}
    whole: list[float] = []
    picks: list[float] = []
    with part_events(setup.drafter, spans):
        for _ in range(iters):
            a, b, c = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            a.record()
            draft = setup.drafter.propose(
                setup.anchors, setup.starts, setup.cache,
                block_tables=setup.tables[:, : setup.num_keys // PAGE], num_keys=setup.num_keys,
            )  # fmt: skip
            b.record()
            setup.drafter.draft_tokens(draft, setup.anchors)
            c.record()
            c.synchronize()
            whole.append(a.elapsed_time(c))
            picks.append(b.elapsed_time(c))
    total = statistics.median(whole)
    parts = {
        name: statistics.median(s.elapsed_time(e) for s, e in ev) for name, ev in spans.items()
    }
    parts["draft tokens (picks)"] = statistics.median(picks)
    for name, ms in parts.items():
        rows.append([tag, name, ms, ms / total])
    rows.append([tag, BETWEEN, total - sum(parts.values()), 1 - sum(parts.values()) / total])
    bucket = [timed(setup.propose) for _ in range(iters)]
    first = setup.context + setup.drafter.config.block_size
    growing = [timed(lambda i=i: setup.propose(first + i)) for i in range(iters)]
    for name, samples in (
        (f"whole, eager, one keys bucket ({setup.num_keys})", bucket),
        (f"whole, eager, num_keys {first}, {first + 1}, ... (a new shape each call)", growing),
    ):
        device_ms = statistics.median(d for d, _ in samples)
        rows.append([tag, name, device_ms, device_ms / total])
        rows.append(
            [tag, "  of which host time to enqueue", statistics.median(h for _, h in samples), None]
        )
    with gathered(setup.drafter):
        setup.propose()  # warm-up
        bucket = [timed(setup.propose) for _ in range(iters)]
        device_ms = statistics.median(d for d, _ in bucket)
        name = f"whole, eager, keys gathered + masked SDPA, one keys bucket ({setup.num_keys})"
        rows.append([tag, name, device_ms, device_ms / total])
        host_ms = statistics.median(h for _, h in bucket)
        rows.append([tag, "  of which host time to enqueue", host_ms, None])
        rows += _per_backend(setup, tag, total, first, iters)
    for is_gathered in (False, True):
        with gathered(setup.drafter, is_gathered):
            graphed = _graphed(setup, iters)
        how = "keys gathered + masked SDPA" if is_gathered else "paged attention"
        name = f"whole, graphed, {how} (replay, staging copies included)"
        rows.append([tag, name, graphed, graphed / total])
    rows += _context_writes(setup, tag, iters)
    return rows


@contextlib.contextmanager
def gathered(drafter: BlockDrafter, is_gathered: bool = True) -> Iterator[None]:
    """The drafter's proposals gather and mask their keys (the attention before the paged one)."""
    drafter.use_paged_attention = not is_gathered
    try:
        yield
    finally:
        drafter.use_paged_attention = True


def _graphed(setup: Setup, iters: int) -> float:
    """Median device ms of a graphed proposal (captured first, then replayed)."""
    stream = torch.cuda.Stream()
    graphs = setup.graphs(stream)
    anchors, starts = setup.anchors.tolist(), setup.starts.tolist()
    tables = setup.tables[:, : setup.num_keys // PAGE].tolist()
    with torch.cuda.stream(stream):
        graphs.run(anchors, starts, tables, setup.num_keys)  # the capture
        replays = [
            timed(lambda: graphs.run(anchors, starts, tables, setup.num_keys)) for _ in range(iters)
        ]
    return statistics.median(d for d, _ in replays)


def _context_writes(setup: Setup, tag: str, iters: int) -> list[list[Any]]:
    """A decode step's context write of every row's drafts + 1 accepted positions (past its
    context), eager and graphed: device ms (host ms beside the eager one)."""
    drafter = setup.drafter
    n = drafter.config.block_size  # accepted drafts + the verify's own token, at most
    positions = [setup.context + j for _ in range(setup.rows) for j in range(n)]
    pages = setup.tables.cpu().numpy()
    at = np.asarray(positions)
    seq = np.repeat(np.arange(setup.rows), n)
    cache_rows = pages[seq, at // PAGE] * PAGE + at % PAGE
    device = setup.anchors.device
    width = drafter.config.num_taps * drafter.config.hidden_size
    gen = torch.Generator(device=device).manual_seed(1)
    tapped = torch.randn(len(positions), width, device=device, generator=gen, dtype=drafter.dtype)
    dev_positions = torch.tensor(positions, device=device)
    dev_rows = torch.from_numpy(cache_rows).to(device)

    def eager() -> None:
        drafter.write_context_rows(tapped, dev_positions, setup.cache, rows=dev_rows)

    eager()  # warm-up
    samples = [timed(eager) for _ in range(iters)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graphs = DrafterContextGraphs(
            drafter, setup.cache, max_rows=len(positions), dump_row=setup.dump_row, stream=stream
        )
        replays = [timed(lambda: graphs.run(tapped, positions, cache_rows)) for _ in range(iters)]
    what = f"context write of {setup.rows} x {n} accepted positions"
    return [
        [tag, f"{what}, eager", statistics.median(d for d, _ in samples), None],
        [tag, "  of which host time to enqueue", statistics.median(h for _, h in samples), None],
        [tag, f"{what}, graphed (replay, copies included)",
         statistics.median(d for d, _ in replays), None],
    ]  # fmt: skip


def _per_backend(setup: Setup, tag: str, total: float, first: int, iters: int) -> list[list[Any]]:
    """Whole eager proposals with the gathered attention held to one SDPA backend each (the
    default picks one per shape): at the keys bucket, and with a new num_keys each call from
    first on; a backend that cannot run these inputs (GQA, a boolean mask) says so."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows: list[list[Any]] = []
    offset = iters  # num_keys not used by the calls before
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH):
        name = f"whole, eager, gathered, SDPA held to {backend.name}"
        try:
            with sdpa_kernel([backend]):
                setup.propose()
                bucket = statistics.median(timed(setup.propose)[0] for _ in range(iters))
                start = first + offset
                new = [timed(lambda n=start + i: setup.propose(n)) for i in range(iters)]
        except RuntimeError as exc:
            rows.append([tag, f"{name}: cannot run ({str(exc).splitlines()[0][:50]})", None, None])
            continue
        offset += iters
        growing = statistics.median(d for d, _ in new)
        rows.append([tag, f"{name}, one keys bucket", bucket, bucket / total])
        rows.append([tag, f"{name}, a new shape each call", growing, growing / total])
    return rows


def with_window(drafter: BlockDrafter, window: int) -> None:
    """A window on every layer of the drafter but the last (as the published Qwen3.6 one)."""
    n = drafter.config.num_hidden_layers
    windows = (window,) * (n - 1) + (None,)
    drafter.config = dataclasses.replace(drafter.config, sliding_windows=windows)
    for layer, w in zip(drafter.layers, windows, strict=True):
        assert isinstance(layer, DraftLayer)
        layer.self_attn.window = w


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rows", type=int, nargs="+", default=[1, 8], help="sequences per proposal"
    )
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--num-drafts", type=int, default=7, help="the block is one more row")
    parser.add_argument(
        "--num-layers", type=int, default=64, help="target layers (the taps' spread)"
    )
    parser.add_argument("--iters", type=int, default=20, help=f"at most {GROWING_ROOM // 4}")
    parser.add_argument(
        "--no-deterministic", action="store_true", help="the measured linear dispatch"
    )
    parser.add_argument(
        "--sliding-window", type=int, default=0,
        help="a window on every layer but the last (z-lab's Qwen3.6-27B DFlash: 2048); 0: none",
    )  # fmt: skip
    args = parser.parse_args()
    if not 1 <= args.iters <= GROWING_ROOM // 4:
        parser.error(f"--iters is {args.iters}; give 1 to {GROWING_ROOM // 4}")
    device = require_cuda("block_drafter_cost")
    model = random_model(full_size_config(args.num_layers), device, "block_drafter_cost")
    drafter = random_block_drafter(model, num_drafts=args.num_drafts)
    if args.sliding_window:
        with_window(drafter, args.sliding_window)
    numerics = contextlib.nullcontext() if args.no_deterministic else batch_invariant("decode")
    rows: list[list[Any]] = []
    with torch.inference_mode(), numerics:
        for n in args.rows:
            log(f"block_drafter_cost: {n} rows, writing {n} x {args.context} context")
            rows += measure(Setup(drafter, n, args.context, device), args.iters)
            torch.cuda.empty_cache()
    mode = "measured dispatch" if args.no_deterministic else "deterministic decode numerics"
    if args.sliding_window:
        mode += f", window {args.sliding_window} on layers 0-3"
    print(Table(
        f"one DFlash block proposal (block {args.num_drafts + 1}, 5 layers, 27B shapes, {mode})",
        ["rows x context", "part", "ms", "share"],
        rows,
        [
            "part: median of the CUDA-event spans around that module's calls over the eager "
            "proposals; share: of those proposals' median device time (the whole rows: theirs "
            "over it)",
            "whole: device time from before the call to its last kernel (host time: the call's "
            "wall time to return, its kernels enqueued)",
        ],
    ).render())  # fmt: skip


if __name__ == "__main__":
    main()
