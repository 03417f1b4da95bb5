import asyncio
import threading
import time

import pytest
from scheduler_testing import FakeRunner
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.engine import Engine, EngineLimits
from sparkinfer.scheduler.errors import ContextLengthExceeded, EngineStopped, QueueFull
from sparkinfer.scheduler.request import FinishReason, RequestOutput, SamplingParams


class SlowRunner(FakeRunner):
    """Blocks every step until released, so tests can hold requests in the queue."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def run(self, batch):
        assert self.gate.wait(10)
        return super().run(batch)


def collect():
    outs: list[RequestOutput] = []
    done = threading.Event()

    def on_output(out: RequestOutput) -> None:
        outs.append(out)
        if out.is_finished:
            done.set()

    return outs, done, on_output


@pytest.fixture
def engine():
    eng = Engine(FakeRunner(), SchedulerConfig(block_size=4, max_model_len=64))
    yield eng
    eng.shutdown()


def test_limits_are_the_configs_bounds():
    """A client reads the admission bounds from `limits`, never from the scheduler."""
    config = SchedulerConfig(max_model_len=64, max_num_seqs=8, num_state_slots=3, max_queue_depth=5)
    eng = Engine(FakeRunner(), config)
    try:
        assert eng.limits == EngineLimits(max_model_len=64, max_seqs_per_step=3, max_queue_depth=5)
    finally:
        eng.shutdown()


def test_generate_and_metrics(engine):
    tokens = engine.generate([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=5))
    assert len(tokens) == 5
    outs, done, on_output = collect()
    engine.add_request("m", [1, 2], SamplingParams(max_tokens=3), on_output=on_output)
    assert done.wait(5)
    final = outs[-1]
    assert final.finish_reason is FinishReason.LENGTH and final.num_output_tokens == 3
    assert final.metrics.ttft_ms is not None and final.metrics.generation_ms is not None
    assert all(o.metrics.ttft_ms is None for o in outs[:-1])


def test_a_prompt_is_checked_once_on_the_clients_thread(engine, monkeypatch):
    # The engine thread admits it with the answer: a second pass over a long prompt would
    # delay the step that prefills it.
    threads: list[str] = []
    check = engine.scheduler.check_request

    def counted(prompt, params):
        threads.append(threading.current_thread().name)
        return check(prompt, params)

    monkeypatch.setattr(engine.scheduler, "check_request", counted)
    assert engine.generate([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=4))
    assert threads == [threading.current_thread().name]


def test_add_request_rejects_bad_input_synchronously(engine):
    with pytest.raises(ContextLengthExceeded, match="max_model_len is 64"):
        engine.add_request("x", [1] * 80, SamplingParams(), on_output=None)


def test_queue_full_carries_retry_after():
    runner = SlowRunner()
    config = SchedulerConfig(block_size=4, max_model_len=64, max_queue_depth=2, max_num_seqs=1)
    eng = Engine(runner, config)
    try:
        for i in range(3):  # one takes the seat, two wait for it
            eng.add_request(f"r{i}", [1], SamplingParams(max_tokens=2), on_output=None)
        with pytest.raises(QueueFull) as exc:
            eng.add_request("r3", [1], SamplingParams(max_tokens=2), on_output=None)
        assert exc.value.retry_after_s >= 1.0 and "max_queue_depth is 2" in str(exc.value)
    finally:
        runner.gate.set()
        eng.shutdown()


def test_queue_depth_counts_only_what_waits_for_a_seat():
    runner = SlowRunner()
    config = SchedulerConfig(block_size=4, max_model_len=64, max_queue_depth=1, max_num_seqs=4)
    eng = Engine(runner, config)
    try:
        for i in range(4):  # an idle engine has four free seats
            eng.add_request(f"r{i}", [1], SamplingParams(max_tokens=2), on_output=None)
    finally:
        runner.gate.set()
        eng.shutdown()


def test_abort_ends_a_running_request(engine):
    outs, done, collect_output = collect()

    def on_output(out):
        collect_output(out)
        if len(outs) == 1:
            engine.abort("a")  # a client that leaves after its first token

    engine.add_request("a", [1], SamplingParams(max_tokens=None), on_output=on_output)
    assert done.wait(5)
    assert len(outs) <= 3
    assert outs[-1].finish_reason is FinishReason.ABORT
    stats = engine.stats()
    assert stats.num_used_kv_blocks == 0 and stats.num_used_state_slots == 0


def test_failing_step_fails_only_its_request():
    runner = FakeRunner()
    runner.fail_when = {"bad"}
    eng = Engine(runner, SchedulerConfig(block_size=4, max_model_len=64, max_num_seqs=1))
    try:
        bad, bad_done, on_bad = collect()
        eng.add_request("bad", [1], SamplingParams(max_tokens=3), on_output=on_bad)
        assert eng.generate([2], SamplingParams(max_tokens=3)) != []
        assert bad_done.wait(5)
        assert bad[-1].finish_reason is FinishReason.ERROR and "boom" in bad[-1].error
    finally:
        eng.shutdown()


def test_raising_callback_aborts_its_request(engine):
    calls = []

    def on_output(out):
        calls.append(out)
        raise RuntimeError("client gone")

    engine.add_request("cb", [1], SamplingParams(max_tokens=50), on_output=on_output)
    deadline = time.monotonic() + 5
    while not (calls and calls[-1].is_finished) and time.monotonic() < deadline:
        time.sleep(0.001)
    assert calls[-1].finish_reason is FinishReason.ABORT
    assert engine.generate([1], SamplingParams(max_tokens=2))


def test_shutdown_aborts_live_requests_and_refuses_new_ones():
    runner = SlowRunner()
    eng = Engine(runner, SchedulerConfig(block_size=4, max_model_len=64))
    outs, done, on_output = collect()
    eng.add_request("a", [1], SamplingParams(max_tokens=20), on_output=on_output)
    time.sleep(0.05)
    threading.Timer(0.05, runner.gate.set).start()
    eng.shutdown()
    assert done.wait(5) and outs[-1].finish_reason is FinishReason.ABORT
    assert runner.is_closed
    with pytest.raises(EngineStopped):
        eng.add_request("b", [1], SamplingParams(), on_output=None)


def test_generate_cut_short_by_shutdown_raises():
    # It returned the tokens so far as if the request had run to the end.
    runner = SlowRunner()
    eng = Engine(runner, SchedulerConfig(block_size=4, max_model_len=64))
    errors: list[BaseException] = []

    def client() -> None:
        try:
            eng.generate([1], SamplingParams(max_tokens=20), timeout=5)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=client)
    thread.start()
    time.sleep(0.05)
    threading.Timer(0.05, runner.gate.set).start()
    eng.shutdown()
    thread.join(5)
    assert len(errors) == 1 and isinstance(errors[0], EngineStopped), errors
    assert "aborted after" in str(errors[0])


class LoopKiller(BaseException):
    """Not an Exception: the loop does not survive it."""


class DyingRunner(FakeRunner):
    def run(self, batch):
        raise LoopKiller


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_is_alive_until_shutdown_or_a_dead_loop(engine):
    assert engine.is_alive()
    engine.shutdown()
    assert not engine.is_alive()
    dying = Engine(DyingRunner(), SchedulerConfig(block_size=4, max_model_len=64))
    outs, done, on_output = collect()
    dying.add_request("a", [1], SamplingParams(max_tokens=2), on_output=on_output)
    assert done.wait(5) and outs[-1].finish_reason is FinishReason.ERROR
    assert not dying.is_alive()
    dying.shutdown()


def test_concurrent_clients(engine):
    results: dict[int, list[int]] = {}

    def client(i: int) -> None:
        results[i] = engine.generate([i + 1], SamplingParams(temperature=0.0, max_tokens=4))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(results) == list(range(16)) and all(len(v) == 4 for v in results.values())


def test_callback_raising_a_base_exception_leaves_the_loop_running(engine):
    # asyncio.CancelledError is a BaseException: it went past the callback guard and killed the
    # loop, ending every other live request with an error.
    calls = []

    def on_output(out):
        calls.append(out)
        raise asyncio.CancelledError

    engine.add_request("cb", [1], SamplingParams(max_tokens=50), on_output=on_output)
    assert engine.generate([1], SamplingParams(max_tokens=2), timeout=5)
    assert engine.is_alive()
    deadline = time.monotonic() + 5
    while not (calls and calls[-1].is_finished) and time.monotonic() < deadline:
        time.sleep(0.001)
    assert calls[-1].finish_reason is FinishReason.ABORT
