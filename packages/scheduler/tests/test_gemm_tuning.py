"""Start-up GEMM tuning: which engines tune, and what the model runs afterwards."""

import pytest
import torch
from sparkinfer.model.embedded import build_embedded_model
from sparkinfer.scheduler._gemm_tuning import tune_prompt_gemms
from sparkinfer.scheduler.config import SchedulerConfig


def test_cpu_models_fakes_and_opted_out_engines_are_left_alone():
    config = SchedulerConfig(max_num_batched_tokens=2048)
    model = build_embedded_model(device="cpu", dtype=torch.float32)
    ops = model.ops
    assert tune_prompt_gemms(model, config, torch.device("cpu")) is None
    assert tune_prompt_gemms(object(), config, torch.device("cuda")) is None
    assert model.ops is ops


@pytest.mark.gpu
def test_a_cuda_model_runs_its_linears_through_the_tuned_choices():
    model = build_embedded_model(device="cuda", dtype=torch.bfloat16)
    off = SchedulerConfig(max_num_batched_tokens=2048, tune_gemms=False)
    assert tune_prompt_gemms(model, off, torch.device("cuda")) is None
    deterministic = SchedulerConfig(max_num_batched_tokens=2048, deterministic=True)
    assert tune_prompt_gemms(model, deterministic, torch.device("cuda")) is None
    tuned = tune_prompt_gemms(model, SchedulerConfig(max_num_batched_tokens=2048),
                              torch.device("cuda"))  # fmt: skip
    assert tuned is not None
    assert model.ops.linear == tuned.linear and model.ops.linear_swiglu == tuned.linear_swiglu
    assert model.model.layers[0].mlp.ops is model.ops
