"""The `stack` and `step-costs` modes on the CPU (Triton interpreted) with the scheduler tests'
tiny model (the full-size runs need CUDA)."""

import dataclasses
import json
import sys
from pathlib import Path

import torch
from sparkinfer.bench import engine, roofline
from sparkinfer.lab.__main__ import main

ROOT = Path(__file__).resolve().parents[2]


def test_stack_compares_torch_and_triton_steps(monkeypatch, tmp_path):
    """The `stack` mode on the CPU (Triton interpreted) with the scheduler tests' tiny model."""
    from sparkinfer.lab import stack
    from sparkinfer.model.config import parse_model_config

    sys.path.insert(0, str(ROOT / "packages" / "scheduler" / "tests"))
    from scheduler_testing import TINY_CONFIG

    monkeypatch.setattr(stack, "require_cuda", lambda: torch.device("cpu"))
    monkeypatch.setattr(stack, "full_size_config", lambda n=None: parse_model_config(TINY_CONFIG))
    monkeypatch.setattr(stack, "NUM_REAL_TOKENS", 250)
    monkeypatch.setattr(engine, "NUM_REAL_TOKENS", 250)  # random_model builds with it
    monkeypatch.setattr(roofline, "measure_peaks", lambda d: roofline.Peaks(1e12, 1e12))
    argv = ["stack", "--prompt-len", "20", "--context", "30", "--decode-batches", "2"]
    argv += ["--warmup", "0", "--iters", "1", "--out", str(tmp_path)]
    assert main(argv) == 0
    data = json.loads((tmp_path / "stack.json").read_text())
    assert [(r["ops"], r["step"]) for r in data["raw"]["rows"]] == [
        ("torch reference", "prefill 20 tokens"),
        ("torch reference", "decode 2 x 30 context"),
        ("triton", "prefill 20 tokens"),
        ("triton", "prefill 20 tokens, every row through the last layer"),
        ("triton", "decode 2 x 30 context"),
    ]


def test_step_costs_times_each_kind_stood_in_for(monkeypatch, tmp_path):
    """The `step-costs` mode on the CPU with the scheduler tests' tiny model: every variant runs
    a decode step with its stand-ins (shapes the model accepts), and the whole step comes first."""
    from sparkinfer.lab import step_costs
    from sparkinfer.model.config import parse_model_config

    sys.path.insert(0, str(ROOT / "packages" / "scheduler" / "tests"))
    from scheduler_testing import TINY_CONFIG

    monkeypatch.setattr(step_costs, "require_cuda", lambda: torch.device("cpu"))
    monkeypatch.setattr(
        step_costs, "full_size_config", lambda n=None: parse_model_config(TINY_CONFIG)
    )
    monkeypatch.setattr(step_costs, "NUM_REAL_TOKENS", 250)
    monkeypatch.setattr(engine, "NUM_REAL_TOKENS", 250)  # random_model builds with it
    argv = ["step-costs", "--context", "30", "--decode-batches", "1,3", "--reps", "1"]
    argv += ["--warmup", "0", "--iters", "1", "--out", str(tmp_path)]
    assert main(argv) == 0
    rows = json.loads((tmp_path / "step-costs.json").read_text())["raw"]["rows"]
    names = list(step_costs.variants())
    assert names[0] == step_costs.WHOLE_STEP and names[-1] == step_costs.EVERY_KIND
    assert [(r["batch"], r["variant"]) for r in rows] == [(b, n) for b in (1, 3) for n in names]
    assert all(r["step_ms"] > 0 for r in rows)
    assert all(r["cost_ms"] == 0 for r in rows if r["variant"] == step_costs.WHOLE_STEP)


def test_step_costs_stand_ins_replace_only_decode_step_ops():
    from sparkinfer.lab import step_costs
    from sparkinfer.model.layers import REFERENCE_OPS

    fields = {f for kind in step_costs.STAND_INS.values() for f in kind}
    assert fields <= {f.name for f in dataclasses.fields(REFERENCE_OPS)}
    assert step_costs.variants()[step_costs.EVERY_KIND].keys() == fields
