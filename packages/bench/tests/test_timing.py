"""Timing helpers on the CPU (wall clock where no CUDA device is present)."""

from __future__ import annotations

from sparkinfer.bench.timing import time_cuda, time_cuda_interleaved


def test_interleaved_calls_alternate_and_time_each_function():
    calls: list[str] = []
    timings = time_cuda_interleaved(
        [lambda: calls.append("a"), lambda: calls.append("b")], warmup=1, iters=3
    )
    assert calls == ["a", "b"] * 4  # one warm-up round, then three timed ones
    assert [t.num_iters for t in timings] == [3, 3]
    assert all(t.median_ms >= 0 and t.p90_ms >= t.median_ms for t in timings)


def test_time_cuda_is_one_function_interleaved_alone():
    calls: list[int] = []
    timing = time_cuda(lambda: calls.append(1), warmup=2, iters=5)
    assert len(calls) == 7 and timing.num_iters == 5


def test_back_to_back_times_each_interval_of_calls_per_call():
    import torch
    from sparkinfer.bench.timing import time_back_to_back

    calls: list[int] = []
    timing = time_back_to_back(torch.device("cpu"), lambda: calls.append(1), warmup=2, iters=3,
                               calls=4)  # fmt: skip
    assert len(calls) == 2 + 3 * 4 and timing.num_iters == 3
    assert 0 <= timing.median_ms <= timing.p90_ms


def test_time_at_power_cap_times_each_call_on_the_cpu():
    import torch
    from sparkinfer.bench.timing import time_at_power_cap

    calls: list[int] = []
    timing = time_at_power_cap(torch.device("cpu"), lambda: calls.append(1), iters=5)
    assert len(calls) == 5 and timing.num_iters == 5
    assert 0 <= timing.median_ms <= timing.p90_ms
