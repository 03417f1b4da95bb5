"""The `tables` mode: argument parsing and the summary (the engine runs need CUDA)."""

import math

import pytest
import torch
from sparkinfer.bench.errors import UsageError
from sparkinfer.lab.__main__ import main
from sparkinfer.lab.tables import COMMITTED, TableRun, parse_table, summary_tables


def test_parse_table_names_a_file_or_the_committed_table():
    assert parse_table("swap=/tmp/t.json") == ("swap", "/tmp/t.json")
    assert parse_table(COMMITTED) == (COMMITTED, None)
    for bad in ("just-a-path.json", "=x.json", "name="):
        with pytest.raises(UsageError, match="NAME=PATH"):
            parse_table(bad)


def test_summary_takes_each_tables_median_against_the_first():
    runs = [
        TableRun("base", 0, 1, 70.0, 70.0, 0),
        TableRun("new", 0, 1, 71.0, 71.0, 0),
        TableRun("base", 1, 1, 72.0, 72.0, 0),
        TableRun("new", 1, 1, 73.0, 73.0, 0),
        TableRun("base", 0, 32, 1500.0, 1560.0, 0),
        TableRun("new", 0, 32, 1515.0, 1575.0, 0),
    ]
    summary, each = summary_tables(runs)
    assert summary.columns[-1] == "vs base"
    assert summary.rows[0] == [1, "base", 71.0, 1.0]
    assert summary.rows[1][:3] == [1, "new", 72.0]
    assert math.isclose(summary.rows[1][3], 72.0 / 71.0)
    assert summary.rows[3][:2] == [32, "new"] and math.isclose(summary.rows[3][3], 1.01)
    assert len(each.rows) == len(runs) and each.rows[1][:3] == ["new", 1, 1]


def test_tables_without_cuda_says_so(tmp_path, capsys):
    if torch.cuda.is_available():
        return
    assert main(["tables", "--table", COMMITTED, "--out", str(tmp_path)]) == 2
    assert "CUDA" in capsys.readouterr().err


def test_tables_needs_a_table(capsys):
    with pytest.raises(SystemExit):
        main(["tables"])
    assert "--table" in capsys.readouterr().err


def test_tables_mode_runs_end_to_end_on_the_cpu(monkeypatch, tmp_path):
    """The whole mode with the scheduler tests' tiny model (Triton interpreted): two tables,
    interleaved, each through its own engine; the dispatcher's table outside them stays the
    committed one."""
    import json
    import sys
    from pathlib import Path

    from sparkinfer.bench import engine, roofline
    from sparkinfer.kernels.linear import shape_table
    from sparkinfer.model.config import parse_model_config

    sys.path.insert(0, str(Path(__file__).parents[2] / "packages" / "scheduler" / "tests"))
    from scheduler_testing import TINY_CONFIG

    monkeypatch.setattr(engine, "require_cuda", lambda: torch.device("cpu"))
    monkeypatch.setattr(engine, "full_size_config", lambda n=None: parse_model_config(TINY_CONFIG))
    monkeypatch.setattr(engine, "NUM_REAL_TOKENS", 250)
    monkeypatch.setattr(roofline, "measure_peaks", lambda d: roofline.Peaks(1e12, 1e12))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 0)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    other = tmp_path / "empty.json"
    other.write_text(json.dumps({"entries": []}))
    argv = ["tables", "--table", COMMITTED, "--table", f"empty={other}", "--concurrency", "1,2"]
    argv += ["--context", "16", "--new-tokens", "3", "--reps", "1", "--out", str(tmp_path)]
    assert main(argv) == 0
    runs = json.loads((tmp_path / "tables.json").read_text())["raw"]["runs"]
    assert [(r["table"], r["batch"]) for r in runs] == [
        (COMMITTED, 1),
        (COMMITTED, 2),
        ("empty", 1),
        ("empty", 2),
    ]
    assert all(r["errors"] == 0 and r["aggregate_tok_s"] > 0 for r in runs)
    assert shape_table.current_table() is shape_table.COMMITTED  # no table was swapped in
