"""What a development tool may watch of the engine's steps: the public hook that profilers and
benchmarks time parts of a step through, instead of reaching into the runner.

An engine built with a `StepObserver` (`Engine.from_model(..., observer=...)`) calls its
`span` once around each part a `StepSpan` names, on the thread that runs the step, and runs the
part inside the context manager it returns:

- "decode_replay": one decode CUDA-graph run, its rows' staging and the replay
  (`DecodeGraphs.run`), the stream its work is queued on given;
- "draft_propose", "draft_observe": one call of the speculative drafter's `propose` or
  `observe` (`SpeculativeStep`), on the runner's stream (None on the CPU).

The span brackets the host's call, so a timer there must record on the stream (CUDA events)
and never synchronize: the step in flight (an overlapped plain step the drafter observes) must
not wait for it. Without an observer (the default, and the server) each place costs one check.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from typing import Literal, Protocol

import torch

StepSpan = Literal["decode_replay", "draft_propose", "draft_observe"]


class StepObserver(Protocol):
    """Brackets parts of the engine's steps (see the module docstring)."""

    def span(
        self, kind: StepSpan, stream: torch.cuda.Stream | None
    ) -> AbstractContextManager[object]: ...


_UNOBSERVED = contextlib.nullcontext()  # stateless: shared by every unobserved span


def observed(
    observer: StepObserver | None, kind: StepSpan, stream: torch.cuda.Stream | None
) -> AbstractContextManager[object]:
    """The observer's span of `kind`, or nothing when there is no observer."""
    return _UNOBSERVED if observer is None else observer.span(kind, stream)
