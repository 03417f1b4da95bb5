"""The MTP drafter: the checkpoint's multi-token-prediction head (`model.mtp`) proposes drafts
from the target's final hidden states (docs/model.md §10).

After every step (`observe`) the head runs over each of the step's accepted target rows, row p
paired with the token that follows it, and writes its KV at index p of its own cache (the
target's block tables; a verify's rejected rows are overwritten when their positions are
accepted later). The last row of a request that sampled gives its first draft, d1 = argmax of
the target's lm_head over the head's output, and that output is kept. A request that drafts
k tokens at its next step (`propose`) gets d1 and k - 1 more head steps, each feeding the draft
before and the head's output before (one row per request, batched over the step's requests).

Every step of a speculating engine is read at once, and its prompt chunks and plain decode
rows run eagerly (the head needs every row's hidden state and every sampled token; verify
steps replay their graphs, which return hidden states); the drafts are greedy, so the verify's
acceptance equals rejection sampling's (`rejection_sampler`). Each draft step reads the full
lm_head ([vocab, hidden], 2.5 GB at 27B): at batch 1 that is the head's main cost.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from sparkinfer.model.cache_spec import ModelCaches
from sparkinfer.model.forward_batch import ForwardBatch, host_to_device
from sparkinfer.model.mtp import MTPHead
from sparkinfer.scheduler._causal_lm import CausalLM
from sparkinfer.scheduler.batch import ScheduledSeq
from sparkinfer.scheduler.request import Request
from sparkinfer.scheduler.sampler import host_list
from sparkinfer.scheduler.spec_decode import TargetStep


@dataclass(frozen=True)
class _Tail:
    """A request's last head row: its target position, the head's output there [hidden] and
    the draft it gives for the position after next."""

    position: int
    hidden: torch.Tensor
    first_draft: int


class MTPDrafter:
    """Owns the head's per-request tails (its KV lives in the runner's caches)."""

    needs_hidden = True

    def __init__(
        self,
        model: CausalLM,
        head: MTPHead,
        caches: ModelCaches,
        *,
        block_size: int,
        device: torch.device,
    ) -> None:
        self.model = model
        self.head = head
        self.caches = caches
        self.block_size = block_size
        self.device = device
        # Dropped with the request: a finished request leaves nothing behind.
        self._tails: weakref.WeakKeyDictionary[Request, _Tail] = weakref.WeakKeyDictionary()

    def observe(self, step: TargetStep) -> None:
        """Run the head over the step's accepted target rows; keep each request's tail."""
        if not step.seqs:
            return
        seqs = step.seqs
        batch = ForwardBatch.build(
            list(step.rows_per_seq),
            list(step.start_positions),
            [s.req.block_ids for s in seqs],
            [0] * len(seqs),  # the head keeps no recurrent state
            caches=self.caches,
            block_size=self.block_size,
            device=self.device,
            positions=self._positions(seqs, step.start_positions, step.rows_per_seq),
        )
        next_ids = host_to_device(torch.tensor(step.next_token_ids, dtype=torch.int64), self.device)
        out = self.head(self.model.embed_input_ids(next_ids), step.hidden, batch)
        last = batch.logits_indices  # each request's last row
        drafts: list[int] = host_list(self.model.compute_logits(out[last]).argmax(dim=-1))
        ends = [p + n - 1 for p, n in zip(step.start_positions, step.rows_per_seq, strict=True)]
        for i, seq in enumerate(seqs):
            self._tails[seq.req] = _Tail(ends[i], out[int(last[i])], drafts[i])

    def propose(self, seqs: Sequence[ScheduledSeq], num_drafts: Sequence[int]) -> list[list[int]]:
        """Up to num_drafts[i] drafts for each decode row whose tail ends right before it."""
        out: list[list[int]] = [[] for _ in seqs]
        going: list[int] = []  # rows that draft, and their current hidden and draft
        hidden: list[torch.Tensor] = []
        for i, (seq, k) in enumerate(zip(seqs, num_drafts, strict=True)):
            tail = self._tails.get(seq.req)
            if k == 0 or tail is None or tail.position != seq.num_cached_tokens - 1:
                continue
            out[i].append(tail.first_draft)
            if k > 1:
                going.append(i)
                hidden.append(tail.hidden)
        step = 1
        while going:
            h = torch.stack(hidden)
            prev = [out[i][-1] for i in going]
            h = self._draft_step([seqs[i] for i in going], prev, h, step)
            drafts: list[int] = host_list(self.model.compute_logits(h).argmax(dim=-1))
            for row, i in enumerate(going):
                out[i].append(drafts[row])
            step += 1
            keep = [r for r, i in enumerate(going) if len(out[i]) < num_drafts[i]]
            going = [going[r] for r in keep]
            hidden = [h[r] for r in keep]
        return out

    def _draft_step(
        self, seqs: list[ScheduledSeq], prev: list[int], hidden: torch.Tensor, step: int
    ) -> torch.Tensor:
        """One head row per request at cache index num_cached + step - 1 (the position after
        its input token, then one further each step) -> the head's outputs [B, hidden]."""
        starts = [s.num_cached_tokens + step - 1 for s in seqs]
        batch = ForwardBatch.build(
            [1] * len(seqs),
            starts,
            [s.req.block_ids for s in seqs],
            [0] * len(seqs),
            caches=self.caches,
            block_size=self.block_size,
            device=self.device,
            positions=self._positions(seqs, starts, [1] * len(seqs)),
        )
        ids = host_to_device(torch.tensor(prev, dtype=torch.int64), self.device)
        return self.head(self.model.embed_input_ids(ids), hidden, batch)

    def _positions(
        self, seqs: Sequence[ScheduledSeq], starts: Sequence[int], counts: Sequence[int]
    ) -> torch.Tensor:
        """Rotary positions of the rows: each one the position of the token it embeds (its
        cache index + 1), offset by the request's rope_delta past an image."""
        values = [
            start + 1 + r + (s.req.rope_delta if start + 1 + r >= s.req.num_prompt_tokens else 0)
            for s, start, n in zip(seqs, starts, counts, strict=True)
            for r in range(n)
        ]
        return host_to_device(torch.tensor(values, dtype=torch.int64), self.device)
