"""The scaffold every graph family shares (decode, verify, MTP head, prefill): its bucket sizes,
one captured graph per bucket, the event that guards its pinned host staging, and the replay.

A family supplies only its rows (it fills its staging buffers and copies them into its static
device buffers on the graph stream) and its forward (what a bucket's graph runs). The staging
buffers are filled by the host while the device may still copy out of them: `wait_for_staging`
comes before a refill and `replay` records the guard behind the copies (else a copy still
queued behind a failed step would read the next step's rows and replay them twice).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from sparkinfer.scheduler.graphs.capture import Captured, capture_buckets


class GraphBuckets:
    """Owns one family's captured graphs and its staging guard (runner- or drafter-internal)."""

    def __init__(self, sizes: Sequence[int], stream: torch.cuda.Stream, *, what: str) -> None:
        self.sizes = tuple(sorted(sizes))
        self.stream = stream
        self.what = what  # names a bucket in messages ("decode graph for batch size")
        self.captured: dict[int, Captured] = {}
        self._staging_read = torch.cuda.Event()

    @property
    def largest(self) -> int:
        return self.sizes[-1]

    def bucket_for(self, size: int) -> int | None:
        """The smallest captured size holding `size` (None: run eagerly)."""
        return next((b for b in self.sizes if b >= size), None)

    def capture(
        self,
        forward: Callable[[int], torch.Tensor],
        *,
        prepare: Callable[[int], object] = lambda size: None,
        sizes: Sequence[int] | None = None,
        pool: object | None = None,
    ) -> None:
        """Capture `forward(size)` for every size (`capture.capture_buckets`), or only for
        `sizes`, added to those captured before (into `pool`, shared with them)."""
        self.captured |= capture_buckets(
            self.sizes if sizes is None else sizes,
            self.stream,
            forward,
            what=self.what,
            prepare=prepare,
            pool=pool,
        )

    def wait_for_staging(self) -> None:
        """Wait until the last copies out of the staging buffers are done (unrecorded: at once)."""
        self._staging_read.synchronize()

    def mark_staging_read(self) -> None:
        """Record the guard behind the copies just queued on the graph stream."""
        self._staging_read.record(self.stream)

    def replay(self, bucket: int) -> torch.Tensor:
        """Record the staging guard and replay the bucket's graph (call on the graph stream,
        after the copies) -> its output, valid until it replays again."""
        self.mark_staging_read()
        captured = self.captured[bucket]
        captured.graph.replay()
        return captured.output
