import json

from sparkinfer.bench.__main__ import main
from sparkinfer.bench.evals import determinism


def _argv(url, tmp_path, *extra):
    return [
        "determinism",
        "--base-url",
        url,
        "--depths",
        "64,128",
        "--max-tokens",
        "4",
        "--out",
        str(tmp_path),
        *extra,
    ]


def test_deterministic_server_passes(fake_server, tmp_path, capsys):
    server = fake_server()
    assert main(_argv(server.url, tmp_path)) == 0
    out = capsys.readouterr().out
    assert "gate cross-run determinism: PASS" in out
    depths = json.loads((tmp_path / "determinism.json").read_text())["raw"]["depths"]
    assert [len(d["outputs"]) for d in depths] == [3, 3]
    # prompt length follows the depth as the server counts tokens (whitespace words here)
    assert depths[0]["prompt_tokens"] < depths[1]["prompt_tokens"]
    assert abs(depths[1]["prompt_tokens"] - 128 - 50) < 30  # intro + question ~ 50 words
    bodies = [b for b in server.bodies if b["max_tokens"] == 4]
    assert all(b["temperature"] == 0 and "ignore_eos" not in b for b in bodies)
    assert (tmp_path / "determinism.png").exists()


def test_nondeterministic_server_fails_the_gate(fake_server, tmp_path, capsys):
    server = fake_server(is_deterministic=False)
    assert main(_argv(server.url, tmp_path)) == 1
    captured = capsys.readouterr()
    assert "gate cross-run determinism: FAIL" in captured.out
    assert "gate failed" in captured.err


def test_require_correct_gates_on_the_answer(fake_server, tmp_path):
    server = fake_server()
    assert main(_argv(server.url, tmp_path, "--require-correct", "--runs", "2")) == 1


def test_depth_result_verdicts():
    same = determinism.DepthResult(depth=1, prompt="p", outputs=["278", "278", "278"])
    assert same.is_deterministic and same.num_correct == 3
    differ = determinism.DepthResult(depth=1, prompt="p", outputs=["278", "277", "278"])
    assert not differ.is_deterministic
    failed = determinism.DepthResult(depth=1, prompt="p", outputs=["1", "1"], errors=["HTTP 500"])
    assert not failed.is_deterministic
    assert determinism.build_prompt(100, 4.5).endswith(determinism.QUESTION)


def test_concurrency_mode_passes_a_batch_invariant_server(fake_server, tmp_path, capsys):
    server = fake_server()
    argv = ["determinism", "--base-url", server.url, "--concurrency", "2,6", "--max-tokens", "4"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "gate batch invariance: PASS" in out
    raw = json.loads((tmp_path / "determinism.json").read_text())["raw"]["concurrency"]
    assert [(len(r["alone"]), len(r["first"]), len(r["second"])) for r in raw] == [
        (2, 2, 2),
        (4, 6, 6),
    ]
    assert "4/4" in out and "6/6" in out


def test_concurrency_mode_fails_a_server_whose_outputs_vary(fake_server, tmp_path, capsys):
    server = fake_server(is_deterministic=False)
    argv = ["determinism", "--base-url", server.url, "--concurrency", "3", "--max-tokens", "4"]
    assert main([*argv, "--out", str(tmp_path)]) == 1
    assert "gate batch invariance: FAIL" in capsys.readouterr().out


def test_concurrency_result_counts_identical_outputs():
    r = determinism.ConcurrencyResult(
        concurrency=3, alone=["a", "b"], first=["a", "x", "c"], second=["a", "x", "d"]
    )
    assert (r.num_probes_identical, r.num_batch_identical, r.is_invariant) == (1, 2, False)
    failed = determinism.ConcurrencyResult(
        concurrency=1, alone=[None], first=[None], second=[None], errors=["HTTP 500"]
    )
    assert (failed.num_probes_identical, failed.num_batch_identical) == (0, 0)
    assert not failed.is_invariant
