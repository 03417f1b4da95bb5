"""What a drafter is: the `Drafter` interface, the target's step it learns from (`TargetStep`)
and a step's drafts (`Drafts`: their ids may stay on the device until the step reads them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from sparkinfer.scheduler.batch import ScheduledBatch, ScheduledSeq
from sparkinfer.scheduler.sampler import host_list


@dataclass(frozen=True)
class TargetStep:
    """What the target computed in one step, for drafters that read its hidden states.

    seqs: the step's rows' sequences; rows_per_seq[i] of the hidden rows are seqs[i]'s, in
    order, at positions start_positions[i] onwards, each row the final-normed hidden state
    ([R, hidden]) of an accepted position (for a block drafter, `needs_taps`: its tap layers'
    hidden states, [R, taps * hidden]); next_token_ids [R] int64 (on the hidden states'
    device) is the token that follows each row: in a step that overlaps the next, still in
    flight.
    """

    seqs: tuple[ScheduledSeq, ...]
    rows_per_seq: tuple[int, ...]
    start_positions: tuple[int, ...]
    hidden: torch.Tensor
    next_token_ids: torch.Tensor


class Drafter(Protocol):
    """Proposes draft tokens for decode rows with lookahead, right before their verify forward.

    `propose` gets every decode row of the step and how many drafts each may have (0: none
    wanted; it may still update its own caches for that request) and returns at most that many
    per row. A drafter may also have `propose_drafts`, the same as `Drafts` whose ids may still
    be on the device (the step then prefers it: the verify takes them on the device, and the
    host reads them only with the step's drawn tokens; MTP has it). `must_read` says whether the
    drafter has to see a step's results before the next step runs (the step is then read at
    once, not overlapped with the next; `is_overlapped`: whether steps overlap at all).
    `observe` gets each step's accepted target rows when `needs_hidden` (MTP reads the final
    hidden states; the block drafter of `--draft-model` reads a few layers' hidden states
    instead and proposes its whole block in one forward of its own from them, `block_drafter`).
    """

    needs_hidden: bool
    needs_taps: bool  # with needs_hidden: the rows are the target's tap layers' states

    def propose(
        self, seqs: Sequence[ScheduledSeq], num_drafts: Sequence[int]
    ) -> list[list[int]]: ...

    def must_read(self, batch: ScheduledBatch, *, is_overlapped: bool) -> bool: ...

    def observe(self, step: TargetStep) -> None: ...


class Drafts:
    """One step's drafts, a list per decode row: how many each row has is known on the host at
    once (`counts`); the ids are on the host, or still on the device (`ids` [R, k] int64, row
    `rows[i]` decode row i's, -1: none), copied to the host behind the work that draws them and
    read by `host` only when the step needs them (after its draws)."""

    def __init__(
        self,
        counts: Sequence[int],
        *,
        host: list[list[int]] | None = None,
        ids: torch.Tensor | None = None,
        rows: Sequence[int] = (),
    ) -> None:
        assert (host is None) != (ids is None), "drafts on the host or on the device"
        self.counts = tuple(counts)
        self.ids = ids
        self.rows = tuple(rows)
        self._host = host
        self._copy: torch.Tensor | None = None
        self._copied: torch.cuda.Event | None = None
        if ids is not None and ids.is_cuda:  # queued now, so `host` finds it done
            self._copy = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
            self._copy.copy_(ids, non_blocking=True)
            self._copied = torch.cuda.Event()
            self._copied.record()

    @classmethod
    def on_host(cls, drafts: list[list[int]]) -> Drafts:
        return cls([len(d) for d in drafts], host=drafts)

    @property
    def is_on_device(self) -> bool:
        """Whether the ids come from the device (the verify takes them there, read or not)."""
        return self.ids is not None

    def capped(self, limits: Sequence[int]) -> Drafts:
        """At most limits[i] drafts for row i."""
        if all(c <= k for c, k in zip(self.counts, limits, strict=True)):
            return self
        counts = [min(c, k) for c, k in zip(self.counts, limits, strict=True)]
        if self._host is not None:
            return Drafts.on_host([d[:k] for d, k in zip(self._host, counts, strict=True)])
        assert self.ids is not None
        return Drafts(counts, ids=self.ids, rows=self.rows)

    def host(self) -> list[list[int]]:
        """Each row's draft ids on the host (ids on the device: waits for their copy)."""
        if self._host is None:
            assert self.ids is not None
            if self._copied is not None:
                self._copied.synchronize()
            ids = self._copy if self._copy is not None else self.ids
            table: list[list[int]] = host_list(ids)
            self._host = [
                table[r][:n] if r >= 0 else [] for r, n in zip(self.rows, self.counts, strict=True)
            ]
        return self._host

    def feed_index(self, row: int, j: int) -> int:
        """Where decode row `row`'s draft j sits in `ids` flattened (-1: the ids are on the
        host, or the row has no such draft)."""
        if self.ids is None or j >= self.counts[row] or self.rows[row] < 0:
            return -1
        return self.rows[row] * self.ids.shape[1] + j

    def merge_into(self, input_ids: torch.Tensor, feed: torch.Tensor) -> torch.Tensor:
        """input_ids [n] with row r replaced by the draft at feed[r] where >= 0
        (`feed_index`), all on the device: the ids never visit the host before the verify."""
        if self.ids is None:
            return input_ids
        picked = self.ids.reshape(-1)[feed.clamp(min=0)]
        return torch.where(feed >= 0, picked, input_ids)
