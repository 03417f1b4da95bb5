"""The `spec` mode's stand-in drafters: acceptance set by the bench, not by the drafts' quality.

`OracleDrafter` drafts the AR run's continuation, right on the first j drafts of each verify. A
`PricedDrafter` runs the real drafter (its full cost paid: the MTP head catches up and drafts as
when serving) and then makes its drafts right or wrong by a per-position acceptance schedule, so
the engine's speed at a published acceptance (Qwen3.8-27B's MTP head: about 0.92, 0.84, 0.65)
can be measured on random weights. The schedule gives, per position j, the share of verifies
that accept draft j (as the report's "accepted at 1..k" column counts it), so it never rises.
"""

from __future__ import annotations

import contextlib
import itertools
import random
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from sparkinfer.scheduler.observer import StepObserver, StepSpan


def _right_or_wrong(known: Sequence[int], num_right: int) -> list[int]:
    """The known continuation, each token from position num_right on made wrong (lowest bit
    flipped: never the target's greedy token)."""
    return [t if j < num_right else t ^ 1 for j, t in enumerate(known)]


def _continuation(seq: Any, continuations: dict[tuple[int, ...], list[int]], k: int) -> list[int]:
    req = seq.req
    known = continuations.get(tuple(req.token_ids[: req.num_prompt_tokens]), [])
    done = req.num_output_tokens
    return list(known[done : done + k])


class OracleDrafter:
    """Drafts the AR run's continuation of each prompt: right on the first `num_right` of each
    verify's drafts, each one after wrong."""

    needs_hidden = False

    def __init__(self, continuations: dict[tuple[int, ...], list[int]], num_right: int) -> None:
        self.continuations = continuations
        self.num_right = num_right

    def propose(self, seqs: Sequence[Any], num_drafts: Sequence[int]) -> list[list[int]]:
        return [
            _right_or_wrong(_continuation(seq, self.continuations, k), self.num_right)
            for seq, k in zip(seqs, num_drafts, strict=True)
        ]

    def must_read(self, batch: Any, *, is_overlapped: bool) -> bool:
        return False

    def observe(self, step: object) -> None:
        pass


def check_schedule(schedule: Sequence[float]) -> None:
    """Raise ValueError unless every share is in [0, 1] and none rises after the one before."""
    if not schedule or any(not 0.0 <= p <= 1.0 for p in schedule):
        raise ValueError(f"--priced-acceptance is {list(schedule)}; give shares in [0, 1]")
    if any(b > a for a, b in itertools.pairwise(schedule)):
        raise ValueError(
            f"--priced-acceptance is {list(schedule)}; a later position's share cannot exceed "
            "an earlier one's (draft j is accepted only after draft j - 1)"
        )


class PricedDrafter:
    """Wraps a real drafter: its proposals are made (and paid for), then each verify's first n
    drafts are made right and the rest wrong, n drawn so that draft j is right with probability
    schedule[j - 1]. Seeded by the request's prompt and output position, so runs repeat.

    `observer`: a step observer given the real drafter's calls (the engine's own spans would
    bracket this wrapper's host work too), on the current stream of `device`."""

    def __init__(
        self,
        inner: Any,
        continuations: dict[tuple[int, ...], list[int]],
        schedule: Sequence[float],
        *,
        seed: int,
        observer: StepObserver | None = None,
        device: torch.device | None = None,
    ) -> None:
        check_schedule(schedule)
        self.inner = inner
        self.observer = observer
        self.device = device
        self.needs_hidden: bool = inner.needs_hidden
        self.needs_taps: bool = getattr(inner, "needs_taps", False)
        self.continuations = continuations
        self.schedule = tuple(schedule)
        self.seed = seed

    def propose(self, seqs: Sequence[Any], num_drafts: Sequence[int]) -> list[list[int]]:
        with self._span("draft_propose"):
            proposed = self.inner.propose(seqs, num_drafts)  # the real drafter's full cost
        return self._priced(seqs, [len(d) for d in proposed])

    def propose_drafts(self, seqs: Sequence[Any], num_drafts: Sequence[int]) -> Any:
        """`propose` as `Drafts` on the host; where the real drafter leaves its own on the
        device (`propose_drafts`: its counts known at once) they stay unread, so the engine
        waits for them no more than for the real drafter's."""
        from sparkinfer.scheduler.speculative.drafter import Drafts

        on_device = getattr(self.inner, "propose_drafts", None)
        if on_device is None:
            return Drafts.on_host(self.propose(seqs, num_drafts))
        with self._span("draft_propose"):
            counts = on_device(seqs, num_drafts).counts  # the real drafter's full cost
        return Drafts.on_host(self._priced(seqs, counts))

    def _priced(self, seqs: Sequence[Any], counts: Sequence[int]) -> list[list[int]]:
        """counts[i] drafts for seqs[i], right up to its drawn number, wrong after."""
        out: list[list[int]] = []
        for seq, n in zip(seqs, counts, strict=True):
            known = _continuation(seq, self.continuations, n)
            out.append(_right_or_wrong(known, self._num_right(seq)))
        return out

    def _num_right(self, seq: Any) -> int:
        req = seq.req
        key = (self.seed, *req.token_ids[: min(16, req.num_prompt_tokens)], req.num_output_tokens)
        u = random.Random(hash(key)).random()  # ints hash the same in every process
        return sum(1 for p in self.schedule if u < p)

    def must_read(self, batch: Any, *, is_overlapped: bool) -> bool:
        return self.inner.must_read(batch, is_overlapped=is_overlapped)

    def observe(self, step: Any) -> None:
        with self._span("draft_observe"):
            self.inner.observe(step)

    def _span(self, kind: StepSpan) -> AbstractContextManager[object]:
        if self.observer is None:
            return contextlib.nullcontext()
        import torch

        is_cuda = self.device is not None and self.device.type == "cuda"
        return self.observer.span(kind, torch.cuda.current_stream(self.device) if is_cuda else None)


_PUBLISHED_TAPS = (1, 16, 31, 46, 61)  # z-lab's Qwen3.5/3.6-27B DFlash, of 64 target layers


def random_block_drafter(model: Any, *, num_drafts: int, num_layers: int = 5) -> Any:
    """A DFlash block drafter for `model` with random weights: the published 27B drafter's
    dimensions at the 27B's width (32 / 8 heads of 128, intermediate 17408; docs/model.md §17),
    scaled down for a smaller target, a block of num_drafts + 1 rows, its taps spread over the
    target's layers as the published ones are over 64. Sets the target's tap layers."""
    import torch
    from sparkinfer.model.drafters.config import check_drafter_fits, parse_drafter_config
    from sparkinfer.model.drafters.dflash import BlockDrafter, SharedTargetModules

    text = model.config.text
    hidden, depth = text.hidden_size, text.num_hidden_layers
    heads, kv_heads, head_dim = (32, 8, 128) if hidden == 5120 else (4, 2, hidden // 4)
    taps = sorted({min(depth - 1, i * depth // 64) for i in _PUBLISHED_TAPS})
    config = parse_drafter_config({
        "architectures": ["DFlashDraftModel"],
        "hidden_size": hidden,
        "intermediate_size": 17_408 if hidden == 5120 else 2 * hidden,
        "num_hidden_layers": num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": text.vocab_size,
        "rope_theta": 10_000_000,
        "block_size": num_drafts + 1,
        "dflash_config": {"mask_token_id": text.vocab_size - 1, "target_layer_ids": taps},
    })  # fmt: skip
    check_drafter_fits(config, text)
    device = model.lm_head.weight.device
    shared = SharedTargetModules(model.model.embed_tokens, model.lm_head)
    drafter = BlockDrafter(config, shared, ops=model.ops, device=device, dtype=model.dtype)
    gen = torch.Generator(device=device).manual_seed(2)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if "norm" in name:
                p.fill_(1.0)  # the drafter's norms are plain weights
            else:
                p.normal_(0.0, 0.02, generator=gen)
    model.set_tap_layers(config.target_layer_ids)
    return drafter.eval()


def trained_block_drafter(model: Any, path_or_id: str, *, num_drafts: int) -> Any:
    """The trained block drafter at a folder or hub id (`embedded`: the embedded model's own)
    loaded beside `model`, its block cut to `num_drafts` drafts (a DFlash drafter trained on
    blocks of 16 also drafts 7 from a block of 8). Sets the target's tap layers."""
    from dataclasses import replace

    from sparkinfer.bench.errors import UsageError
    from sparkinfer.model.drafters.weights import load_drafter

    drafter = load_drafter(path_or_id, model, progress=False)
    c = drafter.config
    if not 1 <= num_drafts <= c.num_drafts:
        raise UsageError(
            f"--num-speculative-tokens {num_drafts}: the drafter {path_or_id} drafts 1 to "
            f"{c.num_drafts} a step"
        )
    drafter.config = replace(c, block_size=c.block_size - c.num_drafts + num_drafts)
    return drafter.eval()
