"""Engine gauges of /metrics read the scheduler's stats at each scrape."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from sparkinfer.api.metrics import ServerMetrics
from sparkinfer.scheduler.scheduler import SchedulerStats


def _gauges(metrics: ServerMetrics) -> dict[str, float]:
    text = metrics.render().decode()
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        if family.type == "gauge"
        for s in family.samples
    }


def test_engine_gauges_follow_the_stats() -> None:
    stats = SchedulerStats(
        num_running=3, num_waiting=2, num_kv_blocks=100, num_used_kv_blocks=25,
        num_state_slots=8, num_used_state_slots=3, num_steps=10, num_prefill_tokens=0,
        num_generated_tokens=0, num_preemptions=0, num_finished=0, num_aborted=0, num_failed=0,
        num_prefix_cache_entries=2,
    )  # fmt: skip
    gauges = _gauges(ServerMetrics(lambda: stats))
    assert gauges["sparkinfer_requests_running"] == 3
    assert gauges["sparkinfer_requests_waiting"] == 2
    assert gauges["sparkinfer_kv_cache_usage_ratio"] == 0.25
    assert gauges["sparkinfer_state_slot_usage_ratio"] == 0.375
    assert gauges["sparkinfer_prefix_cache_entries"] == 2
