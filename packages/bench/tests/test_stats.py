import math

import pytest
from sparkinfer.bench.client import RequestResult
from sparkinfer.bench.stats import (
    find_stalls,
    inter_token_latencies,
    level_stats,
    summarize,
    time_per_output_token,
)


def test_summarize_known_values():
    s = summarize([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0])
    assert s.count == 10 and s.mean == 5.5 and s.median == 5.5 and s.max == 10.0
    assert s.p90 == pytest.approx(9.1)  # numpy linear interpolation, as vLLM and SGLang
    assert s.p99 == pytest.approx(9.91)
    assert summarize([4.0]).p99 == 4.0


def test_summarize_empty_is_nan():
    s = summarize([])
    assert s.count == 0 and math.isnan(s.mean) and math.isnan(s.p99)


def test_summary_scaled_to_ms():
    s = summarize([0.001, 0.003]).scaled(1e3)
    assert s.mean == pytest.approx(2.0) and s.count == 2


def test_itl_tpot_and_stalls():
    assert inter_token_latencies([0.1, 0.15, 0.3, 0.31]) == pytest.approx([0.05, 0.15, 0.01])
    assert inter_token_latencies([0.2]) == []
    assert time_per_output_token(0.5, 1.5, 11) == pytest.approx(0.1)
    assert time_per_output_token(0.5, 0.5, 1) is None
    assert find_stalls([0.01, 0.02, 0.2, 0.06], factor=5, median_s=0.01) == [0.2, 0.06]


def test_level_stats_aggregates_only_successes():
    ok1 = RequestResult(
        prompt_tokens=10, output_tokens=3, ttft_s=0.1, e2e_s=0.3, chunk_times_s=[0.1, 0.2, 0.3]
    )
    ok2 = RequestResult(
        prompt_tokens=10, output_tokens=3, ttft_s=0.3, e2e_s=0.7, chunk_times_s=[0.3, 0.5, 0.7]
    )
    bad = RequestResult(error="HTTP 500: boom")
    s = level_stats([ok1, ok2, bad], duration_s=2.0, concurrency=2)
    assert (s.num_ok, s.num_failed, s.input_tokens, s.output_tokens) == (2, 1, 20, 6)
    assert s.output_tok_s == 3.0 and s.total_tok_s == 13.0 and s.request_s == 1.0
    assert s.ttft_ms.mean == pytest.approx(200.0)
    assert s.tpot_ms.mean == pytest.approx(150.0)  # (0.2/2 + 0.4/2) / 2
    assert s.itl_ms.median == pytest.approx(150.0) and s.itl_ms.count == 4
    assert s.e2e_ms.max == pytest.approx(700.0)
