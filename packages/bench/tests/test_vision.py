import json

import torch
from sparkinfer.bench.__main__ import main


def test_vision_tiny_on_cpu_end_to_end(tmp_path, capsys):
    argv = ["vision", "--device", "cpu", "--tiny", "--warmup", "0", "--iters", "1"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "command: sparkinfer-bench vision --device cpu --tiny" in out
    assert "git: " in out and "gpu: " in out and "tower: tiny vision tower" in out
    assert "vision: preprocessing (CPU) and tower latency per item" in out
    assert "vision tower vs roofline and transformers" in out
    for grid in ("1x16x16", "2x4x4", "1x32x32"):
        assert grid in out
    assert "gate grids and token counts as expected: PASS" in out
    data = json.loads((tmp_path / "vision.json").read_text())
    rows = data["raw"]["rows"]
    assert [r["num_patches"] for r in rows] == [256, 32, 1024]
    assert [r["num_tokens"] for r in rows] == [64, 8, 256]
    assert all(r["num_output_rows"] == r["num_tokens"] for r in rows)
    assert all(r["prep"]["median_ms"] > 0 and r["tower"]["median_ms"] > 0 for r in rows)
    assert all(r["gflop"] > 0 and r["roofline_ms"] > 0 for r in rows)
    assert data["raw"]["peaks"]["matmul_flop_s"] > 0
    assert [len(t["rows"]) for t in data["tables"]] == [3, 3, 3]
    assert "vision tower: one attention launch per block vs the per-segment loop" in out
    assert all(r["loop"]["max_abs_diff"] == 0.0 for r in rows)  # the CPU runs the loop both ways
    for name in ("vision-latency.png", "vision-throughput.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    peer = data["raw"]["peer"]
    if "skipped" not in peer:  # transformers imports: same weights give the same embeddings
        assert all(r["peer"]["max_abs_diff"] < 1e-4 for r in rows)


def test_vision_without_cuda_exits_2(tmp_path, capsys):
    if torch.cuda.is_available():
        return
    assert main(["vision", "--out", str(tmp_path)]) == 2
    assert "--device cpu --tiny" in capsys.readouterr().err
