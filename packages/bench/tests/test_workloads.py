import json

from sparkinfer.bench.__main__ import main


def test_workloads_run_and_compare_with_a_baseline(fake_server, tmp_path, capsys):
    server = fake_server()
    argv = ["workloads", "--base-url", server.url, "--runs", "2", "--out", str(tmp_path)]
    assert main(argv) == 0
    rows = json.loads((tmp_path / "workloads.json").read_text())["raw"]["workloads"]
    assert [r["name"] for r in rows] == ["chat", "code", "math", "json", "repetition"]
    assert all(r["num_ok"] == 2 and r["output_tokens"] == 128 for r in rows)
    # ~4K Qwen tokens each; the fake server counts whitespace words (1K-3.6K of them)
    assert all(1000 < r["prompt_tokens"] < 4000 for r in rows)
    prompts = [m["messages"][0]["content"] for m in server.bodies]
    assert len(set(prompts)) == len(prompts)  # runs never share a prefix
    base = tmp_path / "base"
    base.mkdir()
    (base / "workloads.json").write_text((tmp_path / "workloads.json").read_text())
    argv = [
        "workloads",
        "--base-url",
        server.url,
        "--runs",
        "1",
        "--workloads",
        "code,json",
        "--baseline",
        str(base / "workloads.json"),
        "--out",
        str(tmp_path),
    ]
    capsys.readouterr()
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "baseline tok/s" in out and "%" in out
    assert (tmp_path / "workloads.png").exists()


def test_unknown_workload_is_a_usage_error(fake_server, tmp_path, capsys):
    server = fake_server()
    argv = ["workloads", "--base-url", server.url, "--workloads", "poetry", "--out", str(tmp_path)]
    assert main(argv) == 2
    assert "workload 'poetry' is unknown" in capsys.readouterr().err
