"""Decode under CUDA graphs must give the eager engine's greedy tokens (GPU only)."""

import pytest
import torch
from scheduler_testing import build_tiny_model
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.engine import Engine
from sparkinfer.scheduler.request import SamplingParams

pytestmark = pytest.mark.gpu

PROMPTS = [[(7 * i + j) % 250 for j in range(3 + 5 * i)] for i in range(6)]


def greedy_all(engine: Engine) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=12)
    return [engine.generate(p, params) for p in PROMPTS]


def test_graph_decode_matches_eager():
    model = build_tiny_model().to("cuda")
    cfg = SchedulerConfig(block_size=16, max_model_len=128, max_num_seqs=8)
    eager = Engine.from_model(model, SchedulerConfig(**{**cfg.__dict__, "enforce_eager": True}))
    try:
        expected = greedy_all(eager)
    finally:
        eager.shutdown()
    graphed = Engine.from_model(model, cfg)
    try:
        assert graphed.runner.graphs is not None
        assert graphed.runner.graphs.batch_sizes == (1, 2, 4, 8)
        assert greedy_all(graphed) == expected
        assert graphed.stats().num_used_kv_blocks == 0
    finally:
        graphed.shutdown()
    torch.cuda.synchronize()
