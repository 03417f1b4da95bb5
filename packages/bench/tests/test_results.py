"""The results page and its records: the page is what the records render, and every link holds."""

import json
from pathlib import Path

from sparkinfer.bench import results

DOCS = Path(__file__).resolve().parents[3] / "docs"


def test_the_page_matches_its_records():
    # Edited a record? `uv run python -m sparkinfer.bench.results` regenerates the page.
    assert (DOCS / "benchmarks.md").read_text() == results.render(DOCS)
    assert results.main(["--check"]) == 0


def test_the_page_stays_short_and_every_run_is_complete():
    assert len((DOCS / "benchmarks.md").read_text().splitlines()) < 300
    for workload in results.load(DOCS / "records"):
        for run in workload.runs:
            assert {"date", "revision", "gpu", "command", "rows"} <= run.keys(), workload.title
            assert not run.get("note") or (DOCS / run["note"]).is_file(), run["note"]
            for row in run["rows"]:
                assert {"case", "value", "unit", "roofline", "peer"} <= row.keys(), row


def test_a_new_record_file_adds_its_table_in_order(tmp_path):
    (tmp_path / "records").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "2026-12-02-a-try.md").write_text("# A try\n\nbody\n")
    run = {"date": "2026-12-02", "revision": "abc1234", "gpu": "NVIDIA H200",
           "command": "sparkinfer-bench x", "note": "notes/2026-12-02-a-try.md",
           "rows": [{"case": "c", "value": 1234.5, "unit": "tok/s", "roofline": None,
                     "peer": None}]}  # fmt: skip
    for order, name in ((2, "second"), (1, "first")):
        record = {"order": order, "workload": name, "about": "what", "runs": [run]}
        (tmp_path / "records" / f"{name}.json").write_text(json.dumps(record))
    page = results.render(tmp_path)
    assert page.index("## first") < page.index("## second")
    row = (
        "| c | 1,234.50 tok/s | - | - | NVIDIA H200 | abc1234 (2026-12-02) | `sparkinfer-bench x` |"
    )
    assert row in page
    assert "- 2026-12-02: [A try](notes/2026-12-02-a-try.md)" in page
    assert results.main(["--docs", str(tmp_path), "--check"]) == 1
    assert results.main(["--docs", str(tmp_path)]) == 0
    assert results.main(["--docs", str(tmp_path), "--check"]) == 0
