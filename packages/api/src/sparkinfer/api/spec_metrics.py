"""Speculative decoding's Prometheus counters, fed from the engine's cumulative totals (vLLM's
spec_decode counters: drafts, draft tokens, accepted tokens, accepted tokens per position)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter
from sparkinfer.scheduler.speculative.policy import SpecCounters


class SpecDecodeMetrics:
    """Counters that follow `SchedulerStats.spec`, advanced by what grew since the last read."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.drafts = Counter(
            "sparkinfer_spec_decode_num_drafts",
            "Verifies of a request's drafts (speculative decoding)",
            registry=r,
        )
        self.draft_tokens = Counter(
            "sparkinfer_spec_decode_num_draft_tokens", "Draft tokens verified", registry=r
        )
        self.accepted_tokens = Counter(
            "sparkinfer_spec_decode_num_accepted_tokens", "Draft tokens accepted", registry=r
        )
        self.accepted_per_position = Counter(
            "sparkinfer_spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted at each draft position (0: the first draft)",
            ["position"],
            registry=r,
        )
        self._last = SpecCounters()

    def update(self, totals: SpecCounters) -> None:
        last = self._last
        self.drafts.inc(max(0, totals.num_drafts - last.num_drafts))
        self.draft_tokens.inc(max(0, totals.num_draft_tokens - last.num_draft_tokens))
        self.accepted_tokens.inc(max(0, totals.num_accepted_tokens - last.num_accepted_tokens))
        for pos, count in enumerate(totals.accepted_per_position):
            seen = last.accepted_per_position[pos] if pos < len(last.accepted_per_position) else 0
            self.accepted_per_position.labels(position=str(pos)).inc(max(0, count - seen))
        self._last = totals
