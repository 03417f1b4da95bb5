"""The auto-against-off serving comparison: its verdict, and the whole pipeline on the CPU."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from sparkinfer.lab import serve_speculation
from sparkinfer.lab.random_checkpoint import tiny_config
from sparkinfer.lab.serve_speculation import LevelResult, comparison, speculation_line


def _run(rates: dict[int, float], failed: int = 0) -> list[LevelResult]:
    return [LevelResult(c, rate, 10.0, failed) for c, rate in rates.items()]


def test_the_verdict_averages_rounds_and_holds_every_level_to_the_ratio() -> None:
    off = [_run({1: 100.0, 8: 400.0}), _run({1: 100.0, 8: 400.0})]
    auto = [_run({1: 99.0, 8: 400.0}), _run({1: 98.0, 8: 380.0})]  # 8: 390 / 400 = 0.975
    table, is_passed = comparison({"auto": auto, "off": off}, 0.98)
    assert [row[:4] for row in table.rows] == [[1, 98.5, 100.0, 0.985], [8, 390.0, 400.0, 0.975]]
    assert not is_passed
    assert comparison({"auto": auto, "off": off}, 0.97)[1]


def test_a_failed_request_fails_the_verdict() -> None:
    runs = {"auto": [_run({1: 200.0}, failed=1)], "off": [_run({1: 100.0})]}
    assert not comparison(runs, 0.98)[1]


def test_the_start_up_line_is_read_from_the_server_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(
        "INFO loading\n2026-01-01 INFO sparkinfer.scheduler: speculative auto: the checkpoint's "
        "MTP head drafts up to 3 tokens a request and step\nINFO ready\n"
    )
    line = speculation_line(log)
    assert line.startswith(serve_speculation.MTP_LINE) and line.endswith("step")
    assert speculation_line(tmp_path / "missing.log") == ""


def test_a_kept_checkpoint_is_reused_only_for_the_model_it_holds(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint"
    args = serve_speculation._parse(["--smoke", "--checkpoint", str(folder)])
    cpu = torch.device("cpu")
    assert serve_speculation._checkpoint(args, tiny_config(), cpu, tmp_path) == folder
    written = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    assert serve_speculation._checkpoint(args, tiny_config(), cpu, tmp_path) == folder
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == written  # not rewritten
    wider = replace(tiny_config(), text=replace(tiny_config().text, hidden_size=128))
    with pytest.raises(SystemExit, match="another model"):
        serve_speculation._checkpoint(args, wider, cpu, tmp_path)


@pytest.mark.slow
def test_the_smoke_mode_runs_end_to_end_and_auto_drafts_with_the_mtp_head(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = serve_speculation._parse(["--smoke", "--work-dir", str(tmp_path), "--min-ratio", "0"])
    assert serve_speculation.run(args)  # raises when auto does not pick the MTP head
    out = capsys.readouterr().out
    assert "PASS" in out and "auto/off" in out
    assert not (tmp_path / "checkpoint").exists()  # the temporary checkpoint is removed
    assert (tmp_path / "bench-auto-1" / "serve.json").is_file()
