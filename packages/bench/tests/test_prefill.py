import json

from sparkinfer.bench.__main__ import main


def test_prefill_measures_each_length(fake_server, tmp_path, capsys):
    server = fake_server()
    argv = [
        "prefill",
        "--base-url",
        server.url,
        "--lengths",
        "64,256",
        "--iters",
        "2",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    rows = json.loads((tmp_path / "prefill.json").read_text())["raw"]["rows"]
    assert [r["target_len"] for r in rows] == [64, 256]
    assert all(r["num_ok"] == 2 and r["prefill_tok_s"] > 0 for r in rows)
    assert abs(rows[1]["prompt_tokens"] - 256) <= 3
    assert all(b["max_tokens"] == 1 for b in server.bodies)
    assert (tmp_path / "prefill-throughput.png").exists() and (
        tmp_path / "prefill-ttft.png"
    ).exists()
    assert "prefill tok/s" in capsys.readouterr().out
