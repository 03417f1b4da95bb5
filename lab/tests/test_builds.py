"""The builds mode's log: rows from logged builds (no GPU), and its CPU refusal."""

from sparkinfer.lab import builds
from sparkinfer.lab.__main__ import main


def test_a_take_sums_the_builds_since_the_last_one():
    log = builds.BuildLog()
    log.builds = [("_a_kernel", 1.0, 2.5), ("_b_kernel", 3.0, 3.25), ("_a_kernel", 4.0, None)]
    row = log.take("engine start", 9.0)
    assert row == builds.BuildRow("engine start", 9.0, 3, 1.75, "_a_kernel, _b_kernel")
    assert log.take("next", 0.5) == builds.BuildRow("next", 0.5, 0, 0.0, "")
    log.builds = [(f"_k{i}_kernel", 0.0, 0.0) for i in range(6)]
    assert log.take("many", 1.0).kernels == "6 kernels"


def test_the_sweep_mixes_lengths_batches_and_chunked_prompts():
    assert max(max(step) for step in builds.SWEEP) > 8192  # chunked at the default budget
    assert any(len(step) > 1 for step in builds.SWEEP)
    assert any(n % 16 for step in builds.SWEEP for n in step)


def test_without_cuda_the_mode_says_where_to_run(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert main(["builds", "--out", str(tmp_path)]) == 2
    assert "builds needs a CUDA device" in capsys.readouterr().err
