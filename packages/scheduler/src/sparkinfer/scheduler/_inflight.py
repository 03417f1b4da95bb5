"""A step in flight: its samples stay on the device while the host schedules the next step.

The runner overlaps steps: it queues step N's forward and sampling, then reads step N-1's
tokens (their copy to the host was queued behind N-1, so the wait ends when N-1 does, while N
runs). A step with a logits processor reads them between its forward and its sampling instead,
since the processor needs every earlier token; the forward still runs meanwhile. A decode row
of step N whose input is N-1's sample takes it from N-1's device tokens
(`merge_inflight_inputs`), so no host round trip sits between the two steps.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from sparkinfer.scheduler.batch import SampledToken, ScheduledSeq
from sparkinfer.scheduler.request import Request
from sparkinfer.scheduler.sampler import DrawnTokens


class StepInFlight:
    """The sampled rows of one step, their draws on the device and a copy to the host."""

    def __init__(self, seqs: Sequence[ScheduledSeq], drawn: DrawnTokens) -> None:
        self.seqs = tuple(seqs)
        self.token_ids = drawn.token_ids  # [n] int64: the next step's in-flight inputs
        self._row_of: dict[Request, int] = {s.req: i for i, s in enumerate(self.seqs)}
        self._host = drawn.to_host(non_blocking=True)
        self._copied: torch.cuda.Event | None = None
        if drawn.token_ids.is_cuda:
            self._copied = torch.cuda.Event()
            self._copied.record()

    def source_rows(self, seqs: Sequence[ScheduledSeq]) -> list[int | None]:
        """For each row: the row of this step whose sample is its input (None: input known)."""
        out: list[int | None] = []
        for s in seqs:
            if not s.is_input_inflight:
                out.append(None)
                continue
            row = self._row_of.get(s.req)
            if row is None:
                raise RuntimeError(
                    f"{s.req.request_id}: its input token is in flight, but not from the step "
                    "before; the scheduler and runner disagree about the steps in flight"
                )
            out.append(row)
        return out

    def outputs_of(self, seqs: Sequence[ScheduledSeq]) -> list[torch.Tensor | None]:
        """For each row: its input token [1] on the device when that is in flight, else None."""
        rows = self.source_rows(seqs)
        return [None if r is None else self.token_ids[r : r + 1] for r in rows]

    def resolve(self) -> list[tuple[ScheduledSeq, SampledToken]]:
        """Wait for the copy to the host (not for later steps) -> each row with its token."""
        if self._copied is not None:
            self._copied.synchronize()
        return list(zip(self.seqs, self._host.samples(), strict=True))


def device_source_rows(sources: Sequence[int | None]) -> list[int]:
    """`source_rows` as the device reads them: -1 where the input is known."""
    return [-1 if r is None else r for r in sources]


def merge_inflight_inputs(
    input_ids: torch.Tensor, source_rows: torch.Tensor, inflight: StepInFlight | None
) -> torch.Tensor:
    """input_ids [n] with row i replaced by the in-flight sample source_rows[i] where >= 0
    (`device_source_rows`).

    All on the device: the sample never visits the host before it is fed back.
    """
    if inflight is None:
        return input_ids
    picked = inflight.token_ids[source_rows.clamp(min=0)]
    return torch.where(source_rows >= 0, picked, input_ids)
