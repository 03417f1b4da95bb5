"""Batch invariance on CUDA: a request's greedy tokens and their logprobs are bit-identical alone
and among others of other lengths, with its prompt cut differently by the step budget."""

import pytest
import torch
from scheduler_testing import build_tiny_model, run_together
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.engine import Engine
from sparkinfer.scheduler.request import SamplingParams

PARAMS = SamplingParams(temperature=0.0, max_tokens=24, logprobs=0)
TARGET = [(11 * j + 5) % 250 for j in range(150)]
OTHERS = [[(7 * i + 3 * j) % 250 for j in range(20 + 37 * i)] for i in range(7)]


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
        (alone,) = run_together(engine, [TARGET], PARAMS)
        together = run_together(engine, [*OTHERS[:3], TARGET, *OTHERS[3:]], PARAMS)[3]
        late = run_together(engine, [*OTHERS, TARGET], PARAMS)[-1]
    finally:
        engine.shutdown()
    assert len(alone) == PARAMS.max_tokens
    assert together == alone
    assert late == alone
