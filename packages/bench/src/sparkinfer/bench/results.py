"""The results page, docs/benchmarks.md, rendered from the JSON records in docs/records/.

Each record file is one workload: its title, what it measures, and its runs (date, revision, GPU,
command, an optional note under docs/notes/ and the rows measured). The page shows each
workload's rows of its latest date, each case once at its newest run; the earlier ones stay in
the record file, which it names.
A row gives a case, its figure (value and unit, optional detail), its ratio to the roofline
measured in the same run and the peer measured in the same run (null where there is none). A new
workload is a new file; its `order` places its table. The page also lists the dated notes under
docs/notes/.

    uv run python -m sparkinfer.bench.results           # rewrite docs/benchmarks.md
    uv run python -m sparkinfer.bench.results --check   # exit 1 if the page is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parents[5] / "docs"

INTRO = """\
# Benchmarks

<!-- Generated from docs/records/*.json by `uv run python -m sparkinfer.bench.results`:
edit the records, then regenerate; a test fails when this page and the records differ. -->

Every figure quoted for SparkInfer comes from `sparkinfer-bench` (packages/bench) or, for kernels
and profiles, `sparkinfer-lab` (lab/), run after the tests pass, and is recorded here with the
command, GPU and revision that produced it. A figure is quoted beside its roofline measured in
the same run (decode: the bytes a step must read over the measured copy rate; prefill: the FLOPs
over the measured matmul rate or the bytes over the copy rate, whichever is slower) and beside
a peer measured in the same run where there is one. Investigations (what was tried, kept or
backed out, and why) are dated notes under [notes/](notes/), listed at the end.

Goals for the offline engine on one H200 (27B shapes, bf16): single-stream decode at a 4K
context at least 76 tok/s, aggregate decode at 32 streams at least 1,600 tok/s, prefill at least
13,000 tok/s at 4K and 5,300 tok/s at 262,144 tokens.
"""

OUTRO = """\
The run log these figures were first recorded in, with every report in full, is
`git show acb49dc:docs/benchmarks.md`.
"""


@dataclass(frozen=True)
class Workload:
    """One record file: a table of the page."""

    order: int
    title: str
    about: str
    runs: list[dict]
    source: str  # the record file's name


def load(records: Path) -> list[Workload]:
    """Every record under `records`, in page order."""
    workloads = []
    for path in sorted(records.glob("*.json")):
        data = json.loads(path.read_text())
        workloads.append(
            Workload(data["order"], data["workload"], data["about"], data["runs"], path.name)
        )
    return sorted(workloads, key=lambda w: (w.order, w.title))


def _number(value: float) -> str:
    if value >= 1000:
        return f"{value:,.2f}"
    return f"{value:g}"


def _row(row: dict, run: dict) -> str:
    figure = f"{_number(row['value'])} {row['unit']}"
    if row.get("detail"):
        figure += f" ({row['detail']})"
    roofline = "-" if row.get("roofline") is None else f"{row['roofline']:.2f}"
    peer = row.get("peer") or "-"
    revision = f"{run['revision']} ({run['date']})"
    cells = [row["case"], figure, roofline, peer, run["gpu"], revision, f"`{run['command']}`"]
    return "| " + " | ".join(cells) + " |"


def _table(workload: Workload) -> list[str]:
    lines = [f"## {workload.title}", "", workload.about, ""]
    lines += [
        "| case | figure | of roofline | peer, same run | GPU | revision | command |",
        "|---|---|---|---|---|---|---|",
    ]
    latest = max(run["date"] for run in workload.runs)
    shown = [run for run in workload.runs if run["date"] == latest]
    newest = {row["case"]: (row, run) for run in shown for row in run["rows"]}
    lines += [_row(row, run) for row, run in newest.values()]
    # One paragraph under the table: where the earlier runs are, and the notes.
    after: list[str] = []
    earlier = len(workload.runs) - len(shown)
    if earlier:
        link = f"records/{workload.source}"
        after.append(f"Earlier runs ({earlier}): [{link}]({link}).")
    notes = sorted({run["note"] for run in workload.runs if run.get("note")})
    if notes:
        after.append("Notes: " + ", ".join(f"[{Path(n).stem}]({n})" for n in notes) + ".")
    if after:
        lines += ["", " ".join(after)]
    return [*lines, ""]


def _note_title(path: Path) -> str:
    first = path.read_text().split("\n", 1)[0]
    return first.removeprefix("# ").strip()


def _notes(notes: Path) -> list[str]:
    lines = ["## Notes", ""]
    for path in sorted(notes.glob("*.md"), reverse=True):
        lines.append(f"- {path.name[:10]}: [{_note_title(path)}](notes/{path.name})")
    return [*lines, ""]


def render(docs: Path = DOCS) -> str:
    """The page for the records under docs/records and the notes under docs/notes."""
    lines = [INTRO]
    for workload in load(docs / "records"):
        lines += _table(workload)
    lines += _notes(docs / "notes")
    return "\n".join(lines) + "\n" + OUTRO


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render docs/benchmarks.md from docs/records.")
    parser.add_argument("--docs", type=Path, default=DOCS, help="the docs folder")
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = parser.parse_args(argv)
    page, target = render(args.docs), args.docs / "benchmarks.md"
    if args.check:
        if not target.is_file() or target.read_text() != page:
            print(f"{target} differs from its records: regenerate it", file=sys.stderr)
            return 1
        return 0
    target.write_text(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
