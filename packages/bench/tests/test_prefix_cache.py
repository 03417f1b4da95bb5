import json

from sparkinfer.bench.__main__ import main
from sparkinfer.bench.evals.prefix_cache import PrefixRow, speedup


def test_prefix_cache_reports_no_speedup_honestly(fake_server, tmp_path, capsys):
    server = fake_server(token_delay_s=0.002)
    argv = [
        "prefix-cache",
        "--base-url",
        server.url,
        "--prefix-tokens",
        "200",
        "--requests",
        "3",
        "--max-tokens",
        "4",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "no prefix-cache speedup" in out
    rows = json.loads((tmp_path / "prefix-cache.json").read_text())["raw"]["rows"]
    assert [r["label"] for r in rows] == ["cold", "warm", "warm", "control (cold)"]
    prompts = [b["messages"][0]["content"] for b in server.bodies if b["max_tokens"] == 4][1:]
    shared = prompts[0].split("Question")[0]
    assert all(p.startswith(shared) for p in prompts[:3]) and not prompts[3].startswith(shared)
    assert (tmp_path / "prefix-cache.png").exists()


def test_speedup_is_mean_cold_over_mean_warm():
    def row(label, wall):
        return PrefixRow(label, wall, None, None, None, None)

    rows = [row("cold", 6.0), row("warm", 0.5), row("warm", 0.3), row("control (cold)", 6.0)]
    assert speedup(rows) == 6.0 / 0.4
    assert speedup([row("cold", 1.0)]) is None
