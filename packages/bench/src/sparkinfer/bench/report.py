"""Tables on stdout, PNG plots (matplotlib, Agg), a JSON of the raw figures, markdown records."""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO

import matplotlib

matplotlib.use("Agg")  # headless: no display is ever needed

import matplotlib.pyplot as plt
from sparkinfer.bench.provenance import RunInfo

_STARTED = time.monotonic()


def log(message: str) -> None:
    """Progress on stderr, so stdout holds only the report."""
    print(f"[{time.monotonic() - _STARTED:7.1f}s] {message}", file=sys.stderr, flush=True)


def fmt(value: object) -> str:
    """A table cell: floats to 4 significant digits (2 decimals from 100), missing as '-'."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) >= 100 else f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[Any]]
    notes: list[str] = field(default_factory=list)

    def _cells(self) -> list[list[str]]:
        return [[fmt(v) for v in row] for row in self.rows]

    def render(self) -> str:
        cells = self._cells()
        widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(self.columns)]
        line = "  ".join("-" * w for w in widths)
        out = [
            self.title,
            line,
            "  ".join(c.rjust(w) for c, w in zip(self.columns, widths, strict=False)),
        ]
        out.append(line)
        out += ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=False)) for r in cells]
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)

    def markdown(self) -> str:
        out = [f"**{self.title}**", "", "| " + " | ".join(self.columns) + " |"]
        out.append("|" + "---|" * len(self.columns))
        out += ["| " + " | ".join(r) + " |" for r in self._cells()]
        out += [f"\n_{n}_" for n in self.notes]
        return "\n".join(out)


@dataclass
class Plot:
    filename: str
    title: str
    xlabel: str
    ylabel: str
    x: list[Any]
    series: dict[str, list[float | None]]
    is_log_x: bool = False
    is_log_y: bool = False
    kind: Literal["line", "bar"] = "line"

    def save(self, path: Path) -> None:
        fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
        nan = float("nan")
        if self.kind == "bar":
            width = 0.8 / max(1, len(self.series))
            for i, (name, ys) in enumerate(self.series.items()):
                xs = [j + i * width for j in range(len(self.x))]
                ax.bar(xs, [nan if y is None else y for y in ys], width=width, label=name)
            ax.set_xticks(
                [j + 0.4 - width / 2 for j in range(len(self.x))], [str(v) for v in self.x]
            )
        else:
            for name, ys in self.series.items():
                ax.plot(self.x, [nan if y is None else y for y in ys], marker="o", label=name)
            if self.is_log_x:
                ax.set_xscale("log", base=2)
        if self.is_log_y:
            ax.set_yscale("log")
        ax.set(title=self.title, xlabel=self.xlabel, ylabel=self.ylabel)
        ax.grid(True, alpha=0.3)
        if len(self.series) > 1:
            ax.legend()
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)


@dataclass(frozen=True)
class Gate:
    """A pass/fail check; a failed gate makes the command exit with status 1."""

    name: str
    is_passed: bool
    detail: str


@dataclass
class Report:
    mode: str
    info: RunInfo
    context: dict[str, Any]  # model, server, shapes: printed with the provenance
    tables: list[Table]
    plots: list[Plot] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)
    gates: list[Gate] = field(default_factory=list)

    @property
    def is_passed(self) -> bool:
        return all(g.is_passed for g in self.gates)

    def header(self) -> list[str]:
        return self.info.lines() + [f"{k}: {v}" for k, v in self.context.items()]


def emit(report: Report, out_dir: Path, *, record: Path | None, out: TextIO | None = None) -> None:
    """Print the report, write its PNGs and JSON under `out_dir`, append markdown to `record`."""
    out = out or sys.stdout
    out_dir.mkdir(parents=True, exist_ok=True)
    text = ["\n".join(report.header())] + [t.render() for t in report.tables]
    text += [
        f"gate {g.name}: {'PASS' if g.is_passed else 'FAIL'}: {g.detail}" for g in report.gates
    ]
    written = []
    for plot in report.plots:
        plot.save(out_dir / plot.filename)
        written.append(str(out_dir / plot.filename))
    json_path = out_dir / f"{report.mode}.json"
    payload = {
        "mode": report.mode,
        "info": report.info.as_dict(),
        "context": report.context,
        "tables": [{"title": t.title, "columns": t.columns, "rows": t.rows} for t in report.tables],
        "gates": [g.__dict__ for g in report.gates],
        "raw": report.raw,
    }
    json_path.write_text(json.dumps(_clean(payload), indent=2, default=_json_default) + "\n")
    written.append(str(json_path))
    print("\n\n".join(text), file=out)
    print("wrote " + ", ".join(written), file=out, flush=True)
    if record is not None:
        _append_markdown(report, record)


def _append_markdown(report: Report, path: Path) -> None:
    parts = [f"\n## {report.mode} ({report.info.started_at})\n"]
    parts += [f"- {line}" for line in report.header()]
    parts += ["", *(t.markdown() + "\n" for t in report.tables)]
    parts += [
        f"- gate {g.name}: {'PASS' if g.is_passed else 'FAIL'}: {g.detail}" for g in report.gates
    ]
    with path.open("a", encoding="utf-8") as f:
        f.write("\n".join(parts) + "\n")


def _clean(value: object) -> object:
    """NaN and infinities become null, so the JSON is strict."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _json_default(value: object) -> object:
    as_dict = getattr(value, "as_dict", None)
    if as_dict is not None:
        return _clean(as_dict())
    return str(value)
