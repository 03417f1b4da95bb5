"""What a drafter is: the `Drafter` interface, and the target's step it learns from
(`TargetStep`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from sparkinfer.scheduler.batch import ScheduledBatch, ScheduledSeq


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
    per row. `must_read` says whether the drafter has to see a step's results before the next
    step runs (the step is then read at once, not overlapped with the next; `is_overlapped`:
    whether steps overlap at all). `observe` gets each step's accepted target rows when
    `needs_hidden` (MTP reads the final hidden states; the block drafter of `--draft-model`
    reads a few layers' hidden states instead and proposes its whole block in one forward of
    its own from them, `block_drafter`).
    """

    needs_hidden: bool
    needs_taps: bool  # with needs_hidden: the rows are the target's tap layers' states

    def propose(
        self, seqs: Sequence[ScheduledSeq], num_drafts: Sequence[int]
    ) -> list[list[int]]: ...

    def must_read(self, batch: ScheduledBatch, *, is_overlapped: bool) -> bool: ...

    def observe(self, step: TargetStep) -> None: ...
