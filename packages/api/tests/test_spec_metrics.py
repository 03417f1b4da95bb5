"""Speculative decoding's counters follow the engine's totals."""

from prometheus_client import CollectorRegistry, generate_latest
from sparkinfer.api.spec_metrics import SpecDecodeMetrics
from sparkinfer.scheduler.speculative.policy import SpecCounters


def test_counters_advance_by_what_the_totals_grew():
    registry = CollectorRegistry()
    metrics = SpecDecodeMetrics(registry)
    metrics.update(SpecCounters(2, 6, 3, [2, 1, 0]))
    metrics.update(SpecCounters(5, 15, 9, [5, 3, 1]))
    text = generate_latest(registry).decode()
    assert "sparkinfer_spec_decode_num_drafts_total 5.0" in text
    assert "sparkinfer_spec_decode_num_draft_tokens_total 15.0" in text
    assert "sparkinfer_spec_decode_num_accepted_tokens_total 9.0" in text
    assert 'sparkinfer_spec_decode_num_accepted_tokens_per_pos_total{position="1"} 3.0' in text
