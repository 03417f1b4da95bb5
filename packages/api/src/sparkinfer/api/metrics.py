"""Prometheus metrics of one server: engine load, token counters, latency histograms, rejections."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from sparkinfer.api.spec_metrics import SpecDecodeMetrics
from sparkinfer.scheduler.scheduler import SchedulerStats

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class ServerMetrics:
    """All metrics of one app in its own registry (no process-global state)."""

    def __init__(self, stats: Callable[[], SchedulerStats] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._stats = stats
        self.running = Gauge(
            "sparkinfer_requests_running", "Requests in the running batch", registry=r
        )
        self.waiting = Gauge(
            "sparkinfer_requests_waiting", "Requests waiting in the queue", registry=r
        )
        self.kv_usage = Gauge(
            "sparkinfer_kv_cache_usage_ratio", "Share of KV-cache blocks in use", registry=r
        )
        self.slot_usage = Gauge(
            "sparkinfer_state_slot_usage_ratio", "Share of recurrent-state slots in use", registry=r
        )
        self.prefix_entries = Gauge(
            "sparkinfer_prefix_cache_entries",
            "Prompt prefixes held by the prefix cache (each with a state snapshot)",
            registry=r,
        )
        self.prompt_tokens = Counter(
            "sparkinfer_prompt_tokens", "Prompt tokens of finished requests", registry=r
        )
        self.cached_tokens = Counter(
            "sparkinfer_prompt_cached_tokens",
            "Prompt tokens served from the prefix cache",
            registry=r,
        )
        self.generation_tokens = Counter(
            "sparkinfer_generation_tokens", "Generated tokens", registry=r
        )
        self.requests = Counter(
            "sparkinfer_requests",
            "Finished requests by finish reason",
            ["finish_reason"],
            registry=r,
        )
        self.rejections = Counter(
            "sparkinfer_request_rejections",
            "Requests refused before queueing",
            ["code"],
            registry=r,
        )
        self.ttft = Histogram(
            "sparkinfer_time_to_first_token_seconds",
            "Time to first token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.inter_token = Histogram(
            "sparkinfer_inter_token_latency_seconds",
            "Time between streamed token batches",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.spec_decode = SpecDecodeMetrics(r)
        self.e2e = Histogram(
            "sparkinfer_e2e_request_latency_seconds",
            "Arrival to finish",
            buckets=_E2E_BUCKETS,
            registry=r,
        )

    def _refresh_engine_gauges(self) -> None:
        if self._stats is None:
            return
        stats = self._stats()
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.kv_usage.set(stats.kv_usage)
        self.slot_usage.set(stats.slot_usage)
        self.prefix_entries.set(stats.num_prefix_cache_entries)
        self.spec_decode.update(stats.spec)

    def render(self) -> bytes:
        """The Prometheus text exposition, with engine gauges read now."""
        self._refresh_engine_gauges()
        return generate_latest(self.registry)
