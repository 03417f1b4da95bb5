"""Usage over several prompts and choices (each prompt once); timings of the slowest choice."""

from __future__ import annotations

from sparkinfer.api.generation import ChoiceResult
from sparkinfer.api.usage import make_timings, make_usage
from sparkinfer.scheduler.request import RequestMetrics


def _result(prompt: int, output: int, cached: int, ttft: float, gen: float) -> ChoiceResult:
    metrics = RequestMetrics(ttft_ms=ttft, generation_ms=gen, decode_tps=output / gen)
    return ChoiceResult(prompt, output, cached, metrics)


def test_prompts_count_once_and_the_slowest_choice_reports() -> None:
    results = [  # two prompts (5 and 7 tokens), two choices each
        _result(5, 3, 4, ttft=10.0, gen=20.0),
        _result(5, 4, 0, ttft=12.0, gen=40.0),  # finishes last (52 ms)
        _result(7, 2, 7, ttft=30.0, gen=10.0),
        _result(7, 1, 6, ttft=35.0, gen=5.0),
    ]
    usage = make_usage(results, [5, 7])
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (12, 10, 22)
    assert usage.prompt_tokens_details.cached_tokens == 0 + 6
    timings = make_timings(results)
    assert timings is not None
    assert (timings.ttft_ms, timings.generation_ms, timings.decode_tps) == (12.0, 40.0, 0.1)


def test_no_results_no_telemetry() -> None:
    usage = make_usage([], [3])
    assert (usage.prompt_tokens, usage.completion_tokens, make_timings([])) == (3, 0, None)
