"""What the code cites lives in the repository: docs/model.md and docs/style.md sections exist,
and nothing points to notes kept outside the checkout."""

import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]
SUFFIXES = {".py", ".md", ".jinja", ".toml"}
CITATION = re.compile(r"\b(model|style)\.md §(\d+)")
OUTSIDE = re.compile(r"\bSPEC(\.md)? ?§|\bSTYLE\.md\b|/work/shared")


def _tracked() -> list[pathlib.Path]:
    out = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=ROOT).stdout
    return [ROOT / p for p in out.splitlines() if pathlib.Path(p).suffix in SUFFIXES]


def _sections(doc: str) -> set[str]:
    text = (ROOT / "docs" / doc).read_text()
    return set(re.findall(r"^## (\d+)\.", text, flags=re.M))


def test_every_section_cited_exists_and_nothing_cites_outside_the_checkout():
    sections = {"model": _sections("model.md"), "style": _sections("style.md")}
    wrong = []
    for path in _tracked():
        if not path.is_file() or path.parts[-2:] == ("tests", "test_docs.py"):
            continue
        text = path.read_text(errors="replace")
        where = path.relative_to(ROOT)
        wrong += [f"{where}: {m.group(0)}" for m in CITATION.finditer(text)
                  if m.group(2) not in sections[m.group(1)]]  # fmt: skip
        wrong += [
            f"{where}: {m.group(0)!r}: cite docs/model.md or docs/style.md instead"
            for m in OUTSIDE.finditer(text)
        ]
    assert not wrong, "\n".join(wrong)
