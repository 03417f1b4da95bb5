"""Engine gauges of /metrics read the scheduler's stats at each scrape; finished requests are
counted by reason, client aborts and stop strings apart."""

from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sparkinfer.api.metrics import ServerMetrics
from sparkinfer.scheduler.scheduler import SchedulerStats

from .conftest import RunningServer


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


def _finished(server: RunningServer) -> dict[str, float]:
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    return {
        s.labels["finish_reason"]: s.value
        for family in text_string_to_metric_families(text)
        if family.name == "sparkinfer_requests"
        for s in family.samples
        if s.name == "sparkinfer_requests_total"
    }


def _wait_for(server: RunningServer, reason: str, above: float) -> dict[str, float]:
    deadline = time.monotonic() + 20
    while (now := _finished(server)).get(reason, 0) <= above and time.monotonic() < deadline:
        time.sleep(0.1)
    return now


def test_client_aborts_and_stop_strings_are_counted_apart(server: RunningServer) -> None:
    before = _finished(server)
    body = {"prompt": "hello", "max_tokens": 500, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.v1 + "/completions", json=body, timeout=60) as resp:
        next(resp.iter_lines())  # the first chunk, then the client goes
    after = _wait_for(server, "abort", before.get("abort", 0))
    assert after.get("abort", 0) == before.get("abort", 0) + 1
    greedy = {"prompt": "hello", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    text = httpx.post(server.v1 + "/completions", json=greedy, timeout=60).json()
    stop = text["choices"][0]["text"][3:5]
    assert stop.strip(), text
    before = _wait_for(server, "length", after.get("length", 0))
    resp = httpx.post(server.v1 + "/completions", json={**greedy, "stop": [stop]}, timeout=60)
    assert resp.json()["choices"][0]["finish_reason"] == "stop"
    after = _wait_for(server, "stop", before.get("stop", 0))
    assert after.get("stop", 0) == before.get("stop", 0) + 1
    assert after.get("abort", 0) == before.get("abort", 0)
