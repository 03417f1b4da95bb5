"""Batch invariance on CUDA: a request's greedy tokens and their logprobs are bit-identical alone
and among others of other lengths, with its prompt cut differently by the step budget."""

import threading

import pytest
import torch
from scheduler_testing import build_tiny_model
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.engine import Engine
from sparkinfer.scheduler.request import RequestOutput, SamplingParams

PARAMS = SamplingParams(temperature=0.0, max_tokens=24, logprobs=0)
TARGET = [(11 * j + 5) % 250 for j in range(150)]
OTHERS = [[(7 * i + 3 * j) % 250 for j in range(20 + 37 * i)] for i in range(7)]


def _run_together(engine: Engine, prompts: list[list[int]]) -> list[list[tuple[int, float]]]:
    """Submit all prompts at once; each one's (token, logprob) pairs in order."""
    results: list[list[tuple[int, float]]] = [[] for _ in prompts]
    done = threading.Semaphore(0)

    def callback(i: int):
        def on_output(out: RequestOutput) -> None:
            results[i] += [
                (t, lp.logprob) for t, lp in zip(out.new_token_ids, out.logprobs, strict=True)
            ]
            if out.is_finished:
                done.release()

        return on_output

    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, PARAMS, on_output=callback(i))
    for _ in prompts:
        assert done.acquire(timeout=120), "a request did not finish"
    return results


@pytest.mark.gpu
@pytest.mark.parametrize("enforce_eager", [False, True], ids=["graphs", "eager"])
def test_greedy_logprobs_do_not_depend_on_the_batch(enforce_eager):
    model = build_tiny_model(device="cuda", dtype=torch.bfloat16)
    cfg = SchedulerConfig(
        block_size=16,
        max_model_len=512,
        max_num_seqs=8,
        max_num_batched_tokens=128,
        enforce_eager=enforce_eager,
        deterministic=True,
    )
    assert cfg.deterministic and cfg.chunk_alignment == 128
    engine = Engine.from_model(model, cfg)
    try:
        (alone,) = _run_together(engine, [TARGET])
        together = _run_together(engine, [*OTHERS[:3], TARGET, *OTHERS[3:]])[3]
        late = _run_together(engine, [*OTHERS, TARGET])[-1]
    finally:
        engine.shutdown()
    assert len(alone) == PARAMS.max_tokens
    assert together == alone
    assert late == alone
