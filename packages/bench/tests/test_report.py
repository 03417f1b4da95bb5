import json
import math

from sparkinfer.bench.provenance import collect
from sparkinfer.bench.report import Gate, Plot, Report, Table, emit, fmt


def test_fmt_cells():
    assert fmt(None) == "-" and fmt(math.nan) == "-"
    assert fmt(1234.567) == "1,234.57" and fmt(0.012345) == "0.01235" and fmt(12345) == "12,345"
    assert fmt(True) == "yes"


def test_table_aligns_columns():
    text = Table("t", ["a", "long name"], [[1, 2.5], [100, None]], ["n"]).render().splitlines()
    assert text[0] == "t" and text[2].endswith("long name") and text[-1] == "note: n"
    assert len({len(line) for line in text[1:-1]}) == 1


def test_emit_writes_png_json_and_markdown(tmp_path, capsys):
    report = Report(
        "demo",
        collect(["demo", "--x"]),
        {"model": "m"},
        [Table("t", ["x", "y"], [[1, math.nan]])],
        [
            Plot("demo.png", "p", "x", "y", [1, 2], {"s": [1.0, None]}, is_log_x=True),
            Plot(
                "bars.png",
                "p",
                "x",
                "y",
                ["a", "b"],
                {"s": [1.0, 2.0], "u": [2.0, 1.0]},
                kind="bar",
            ),
        ],
        {"value": math.inf},
        [Gate("g", False, "why")],
    )
    record = tmp_path / "benchmarks.md"
    emit(report, tmp_path, record=record)
    out = capsys.readouterr().out
    assert "command: sparkinfer-bench demo --x" in out and "gate g: FAIL: why" in out
    assert (tmp_path / "demo.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "bars.png").exists()
    data = json.loads((tmp_path / "demo.json").read_text())  # strict JSON: NaN/inf become null
    assert data["raw"]["value"] is None and data["tables"][0]["rows"] == [[1, None]]
    assert data["info"]["git_rev"] and data["info"]["gpu"] == "cpu"
    md = record.read_text()
    assert "## demo" in md and "| x | y |" in md and "- model: m" in md
    assert not report.is_passed
