"""A decode step against a verify step and a draft step at Qwen3.8-27B's shapes: one table.

Random bf16 weights and a random MTP head, as the `spec` bench builds them (`--num-layers`
keeps the 3:1 layer pattern), caches of zeros at `--context` (speed does not depend on their
values). Each step's device work is timed as the engine runs it, from CUDA graphs replayed back to
back, under the engine's kernel tuning (`--deterministic`: its batch-invariant decode numerics):

- decode step: the target over one row per sequence, the lm_head over those rows, their argmax;
- verify step: the target over k + 1 rows per sequence laid out as a verify (`VerifyLayout`: the
  Gated-DeltaNet verify kernels and their stash, each row a decode row of attention), the lm_head
  and argmax over every row, and `commit_verify` keeping every row (all drafts accepted); then
  its pieces alone;
- draft step: the engine's MTP head graph (`graphs.head`: the catch-up over k + 1 rows per
  sequence, then k drafts), drafting over the whole vocabulary and over the default draft
  vocabulary (`speculative_draft_vocab`); then one draft's logits alone.

"x decode" is a row's time over the decode step's at the same batch; "per draft" divides a draft
row by k. Host work (staging, the sampler's bookkeeping, acceptance) is not in these times.
Run: ``python3 -m sparkinfer.lab.spec_step_costs --batches 1,8 --context 4096 --deterministic``
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator

import torch
from sparkinfer.bench import speculative as spec_bench
from sparkinfer.bench.engine import NUM_REAL_TOKENS
from sparkinfer.bench.timing import time_back_to_back
from sparkinfer.kernels.linear import batch_invariant
from sparkinfer.kernels.tuning import kernel_tuning
from sparkinfer.lab.kernels._graph_timing import time_graph
from sparkinfer.model.cache_spec import ModelCaches, allocate_caches
from sparkinfer.model.forward_batch import ForwardBatch, VerifyLayout
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.speculative.mtp_drafter import MTPDrafter

BLOCK_SIZE = 64


@contextlib.contextmanager
def _numerics(cfg: SchedulerConfig) -> Iterator[None]:
    """The runner's decode numerics (`Runner.numerics(is_decode=True)` on CUDA)."""
    with kernel_tuning(cfg.kernel_tuning):
        if not cfg.deterministic:
            yield
            return
        with batch_invariant("decode"):
            yield


def _tables(batch: int, blocks_per_seq: int) -> list[list[int]]:
    return [list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)) for i in range(batch)]


def _decode_batch(
    batch: int, context: int, caches: ModelCaches, tables: list[list[int]], device: torch.device
) -> ForwardBatch:
    return ForwardBatch.build(
        [1] * batch, [context] * batch, tables, list(range(batch)),
        caches=caches, block_size=BLOCK_SIZE, device=device,
    )  # fmt: skip


def _verify_batch(
    batch: int,
    context: int,
    k: int,
    caches: ModelCaches,
    tables: list[list[int]],
    device: torch.device,
) -> ForwardBatch:
    """k + 1 rows per sequence, position-major (row j * batch + i: sequence i's position j), each
    a decode row of its own, as `speculative.verify.verify_batch` lays them out."""
    rows = [(i, j) for j in range(k + 1) for i in range(batch)]
    out = ForwardBatch.build(
        [1] * len(rows),
        [context + j for _, j in rows],
        [tables[i] for i, _ in rows],
        [i for i, _ in rows],
        caches=caches,
        block_size=BLOCK_SIZE,
        device=device,
    )
    seq_rows = torch.arange(len(rows), device=device).reshape(k + 1, batch).T.contiguous()
    out.verify = VerifyLayout(seq_rows, torch.arange(batch, device=device))
    return out


def _head_graph_ms(
    model,
    caches: ModelCaches,
    *,
    batch: int,
    context: int,
    k: int,
    draft_vocab: int,
    tables: list[list[int]],
    device: torch.device,
    cfg: SchedulerConfig,
) -> float:
    """One replay of the engine's MTP head graph for `batch` sequences, k + 1 pending rows each."""
    drafter = MTPDrafter(
        model, model.mtp, caches, block_size=BLOCK_SIZE, device=device, draft_vocab=draft_vocab
    )
    stream = torch.cuda.Stream(device)
    with _numerics(cfg):
        drafter.capture_graphs(
            batch_sizes=[batch], num_drafts=k, max_blocks_per_seq=len(tables[0]), stream=stream
        )
        graphs = drafter.graphs
        assert graphs is not None
        start = context - (k + 1)  # the pending rows end right before the next input
        rows = [(k + 1, [start + 1 + r for r in range(k + 1)], start)] * batch
        hidden = torch.randn(batch * (k + 1), model.config.text.hidden_size, device=device)
        next_ids = torch.randint(0, NUM_REAL_TOKENS, (batch * (k + 1),), device=device)
        with torch.inference_mode():
            graphs.run(batch, rows, tables, [k] * batch, hidden.to(model.dtype), next_ids)
        torch.cuda.synchronize(device)
        graph = graphs.buckets.captured[batch].graph
        with torch.cuda.stream(stream):
            ms = time_back_to_back(device, graph.replay, warmup=3, iters=10, calls=10).median_ms
    drafter.graphs = None
    return ms


def _rows(args: argparse.Namespace) -> Iterator[tuple[int, str, float]]:
    device = torch.device("cuda", torch.cuda.current_device())
    cfg = SchedulerConfig(deterministic=args.deterministic)
    k, context, max_batch = args.num_speculative_tokens, args.context, max(args.batches)
    bench_args = argparse.Namespace(
        model=None,
        tiny=False,
        cpu=False,
        num_layers=args.num_layers,
        drafters=["mtp"],
        quantization="none",
    )
    model, _ = spec_bench.spec_model(bench_args, device)
    blocks_per_seq = -(-(context + k + 2) // BLOCK_SIZE)
    caches = allocate_caches(
        model.cache_spec(), num_blocks=max_batch * blocks_per_seq, block_size=BLOCK_SIZE,
        num_slots=max_batch, device=device, num_verify_rows=max_batch * (k + 1),
    )  # fmt: skip
    for batch in args.batches:
        yield from _batch_rows(model, caches, cfg, args, batch, blocks_per_seq, device)


def _batch_rows(
    model,
    caches: ModelCaches,
    cfg: SchedulerConfig,
    args: argparse.Namespace,
    batch: int,
    blocks_per_seq: int,
    device: torch.device,
) -> Iterator[tuple[int, str, float]]:
    """The table's rows of one batch size, its decode step first."""
    k, context = args.num_speculative_tokens, args.context
    tables = _tables(batch, blocks_per_seq)
    decode = _decode_batch(batch, context, caches, tables, device)
    verify = _verify_batch(batch, context, k, caches, tables, device)
    layout = verify.verify
    assert layout is not None
    ids = torch.randint(0, NUM_REAL_TOKENS, (batch * (k + 1),), device=device)
    kept = torch.full((batch,), k + 1, dtype=torch.int64, device=device)
    hidden = model.embed_input_ids(ids)

    def timed(*parts: Callable[[], object]) -> float:
        """One step of these parts, run in order: timed as one call (`time_graph` gives the time
        per call, so parts passed as calls of their own would come back averaged, not summed)."""

        def step() -> None:
            for part in parts:
                part()

        with _numerics(cfg), torch.inference_mode():
            return time_graph([step], warmup=2, iters=args.iters).median_ms

    def decode_forward() -> torch.Tensor:
        return model(ids[:batch], decode)

    def decode_logits() -> torch.Tensor:
        return model.compute_logits(hidden[:batch]).argmax(dim=-1)

    def verify_forward() -> torch.Tensor:
        return model(ids, verify)

    def verify_logits() -> torch.Tensor:
        return model.compute_logits(hidden).argmax(dim=-1)

    def commit() -> None:
        model.commit_verify(caches, layout, kept)

    yield batch, "decode step (forward, lm_head, argmax)", timed(decode_forward, decode_logits)
    yield batch, "  decode forward", timed(decode_forward)
    yield (
        batch,
        f"verify step, k={k} (forward, lm_head, argmax, commit)",
        timed(verify_forward, verify_logits, commit),
    )
    yield batch, f"  verify forward ({k + 1} rows a sequence)", timed(verify_forward)
    yield batch, "  lm_head and argmax over the verify rows", timed(verify_logits)
    yield batch, "  commit_verify (every row kept)", timed(commit)
    for vocab in (0, cfg.speculative_draft_vocab):
        name = "the whole vocabulary" if not vocab else f"the first {vocab:,} ids"
        ms = _head_graph_ms(
            model, caches, batch=batch, context=context, k=k, draft_vocab=vocab,
            tables=tables, device=device, cfg=cfg,
        )  # fmt: skip
        yield batch, f"draft step, k={k}: head graph over {name}", ms

        def draft_logits(n: int | None = vocab or None) -> torch.Tensor:
            return model.lm_head(hidden[:batch], n).argmax(dim=-1)

        yield batch, f"  one draft's logits and argmax over {name}", timed(draft_logits)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batches", default="1,8", help="sequences a step, comma-separated")
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--num-speculative-tokens", type=int, default=3)
    p.add_argument("--num-layers", type=int, default=None, help="default: the 27B's 64")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--deterministic", action="store_true")
    args = p.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    if not torch.cuda.is_available():
        raise SystemExit("spec_step_costs times CUDA graphs: run it on a GPU machine")
    k = args.num_speculative_tokens
    print(f"Qwen3.8-27B shapes, random bf16 weights, context {args.context}, k={k}, "
          f"deterministic {args.deterministic}")  # fmt: skip
    print(f"{'batch':>5}  {'step':62s} {'ms':>8} {'x decode':>9} {'per draft':>10}")
    decode_ms: dict[int, float] = {}
    for batch, name, ms in _rows(args):
        decode_ms.setdefault(batch, ms)  # the first row of each batch is its decode step
        per_draft = f"{ms / k:10.3f}" if name.startswith("draft step") else " " * 10
        print(f"{batch:5d}  {name:62s} {ms:8.3f} {ms / decode_ms[batch]:9.3f} {per_draft}",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
