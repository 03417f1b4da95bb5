import json

from sparkinfer.bench.__main__ import main


def test_serve_runs_end_to_end(fake_server, tmp_path, capsys):
    server = fake_server(token_delay_s=0.001)
    argv = [
        "serve",
        "--base-url",
        server.url,
        "--concurrency",
        "1,2",
        "--input-len",
        "32",
        "--output-len",
        "8",
        "--num-prompts",
        "4",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "throughput per concurrency level" in out and "TTFT p99" in out
    assert "git: " in out and "gpu: " in out and "command: sparkinfer-bench serve" in out
    assert (tmp_path / "serve-throughput.png").stat().st_size > 0
    assert (tmp_path / "serve-latency.png").stat().st_size > 0
    raw = json.loads((tmp_path / "serve.json").read_text())
    levels = raw["raw"]["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 2]
    assert all(lv["num_ok"] == 4 and lv["num_failed"] == 0 for lv in levels)
    assert all(lv["output_tokens"] == 4 * 8 for lv in levels)  # ignore_eos honoured: 8 each
    # 32 requested tokens, calibrated against the server's count (whitespace words here)
    assert all(abs(lv["input_tokens"] / 4 - 32) <= 2 for lv in levels)
    generation = [b for b in server.bodies if b["max_tokens"] == 8]
    assert len({b["prompt"] for b in generation}) == len(generation)  # every prompt distinct
    assert all(b["min_tokens"] == 8 and b["ignore_eos"] for b in generation)


def test_serve_tolerates_a_server_that_refuses_fixed_lengths(fake_server, tmp_path, capsys):
    server = fake_server(is_strict=True)
    argv = [
        "serve",
        "--base-url",
        server.url,
        "--concurrency",
        "2",
        "--input-len",
        "16",
        "--output-len",
        "8",
        "--num-prompts",
        "4",
        "--endpoint",
        "chat",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "refused by the server" in out
    raw = json.loads((tmp_path / "serve.json").read_text())
    assert raw["raw"]["levels"][0]["num_ok"] == 4


def test_serve_gate_fails_on_failed_requests(fake_server, tmp_path, capsys):
    server = fake_server(fail_every=3)
    argv = [
        "serve",
        "--base-url",
        server.url,
        "--concurrency",
        "2",
        "--input-len",
        "8",
        "--output-len",
        "2",
        "--num-prompts",
        "6",
        "--warmup",
        "0",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 1
    assert "injected failure" in capsys.readouterr().out


def test_serve_reads_a_jsonl_dataset(fake_server, tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text(
        '"plain prompt"\n{"prompt": "another"}\n'
        '{"messages": [{"role": "user", "content": "hi there"}]}\n'
    )
    server = fake_server()
    argv = [
        "serve",
        "--base-url",
        server.url,
        "--concurrency",
        "1",
        "--output-len",
        "2",
        "--num-prompts",
        "3",
        "--warmup",
        "0",
        "--dataset",
        str(data),
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    prompts = [b["prompt"] for b in server.bodies]
    assert len(set(prompts)) == 3 and any(p.endswith("hi there") for p in prompts)


def test_unreachable_server_exits_2(tmp_path, capsys):
    argv = [
        "serve",
        "--base-url",
        "http://127.0.0.1:9",
        "--concurrency",
        "1",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 2
    assert "cannot reach" in capsys.readouterr().err


def test_diagnose_concurrency_reports_every_stream(fake_server, tmp_path, capsys):
    server = fake_server(token_delay_s=0.001)
    argv = [
        "diagnose-concurrency",
        "--base-url",
        server.url,
        "--streams",
        "2,3",
        "--input-len",
        "16",
        "--output-len",
        "6",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "per stream" in out and "stall" in out
    streams = json.loads((tmp_path / "diagnose-concurrency.json").read_text())["raw"]["streams"]
    assert len(streams) == 5 and all(s["tokens"] == 6 and s["error"] is None for s in streams)
    assert (tmp_path / "diagnose-concurrency.png").exists()
