"""Python source as a code corpus: files split into train / held-out by path, and the
"write a function" tasks drawn from them.

The embedded model is trained on the Python installation of the machine that trains it and
evaluated on the held-out files of the machine that tests it. Neither copies source text into the
repository: both read it from the local installation, and both apply the same rule, so a file
held out on one machine is held out on every machine that has it. The rule hashes the file's name
(with its folder's for `__init__.py` and `__main__.py`), not its content or full path, so a module
that moved between Python versions (`ctypes/test/x.py` to `test/test_ctypes/x.py`) stays on the
side it was on.
"""

from __future__ import annotations

import ast
import hashlib
import re
import sysconfig
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HELD_OUT_PERCENT = 5  # of the standard library's files, by path hash
_SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
MAX_TASK_CHARS = 1200  # longer functions make poor single-turn answers
MAX_TASK_LINES = 30
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:\n```|\Z)", re.DOTALL)


def stdlib_root() -> Path:
    """The standard library folder of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


def split_key(relpath: str) -> str:
    """What the split rule hashes: the file name, or folder/name for package markers."""
    parts = relpath.split("/")
    if parts[-1] in ("__init__.py", "__main__.py") and len(parts) > 1:
        return "/".join(parts[-2:])
    return parts[-1]


def is_held_out(relpath: str) -> bool:
    """The split rule: a file (a posix path relative to the library root) is held out when the
    hash of its `split_key` falls in the first HELD_OUT_PERCENT of 100 buckets."""
    digest = hashlib.sha256(split_key(relpath).encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") % 100 < HELD_OUT_PERCENT


def source_files(root: Path) -> list[str]:
    """Relative posix paths of every `.py` file under root, sorted, outside installed packages."""
    found: list[str] = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if _SKIPPED_DIRS.isdisjoint(rel.parts[:-1]) and path.is_file():
            found.append(rel.as_posix())
    return sorted(found)


def read_source(path: Path) -> str | None:
    """A file's text, or None when it is not UTF-8 (a few test fixtures are not)."""
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def split_files(root: Path) -> tuple[list[str], list[str]]:
    """(train, held_out) relative paths of root's source files, by `is_held_out`."""
    files = source_files(root)
    return [f for f in files if not is_held_out(f)], [f for f in files if is_held_out(f)]


@dataclass(frozen=True)
class FunctionTask:
    """One function with a docstring: its signature and summary make the prompt; its source,
    with the docstring cut to that summary line, the answer."""

    name: str
    signature: str  # name(args), as written
    summary: str  # the docstring's first line
    source: str  # the function, dedented, without decorators, its docstring one line

    @property
    def prompt(self) -> str:
        return f"Write a Python function `{self.signature}`: {self.summary}"

    @property
    def answer(self) -> str:
        return f"```python\n{self.source}\n```"


def function_tasks(text: str) -> Iterator[FunctionTask]:
    """The functions and methods of one module that make good tasks: a docstring whose first
    line is a summary, at most MAX_TASK_LINES lines and MAX_TASK_CHARS characters once the
    docstring is cut to that line, and a body besides the docstring."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return
    lines = text.splitlines()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            task = _task(node, lines)
            if task is not None:
                yield task


def _task(node: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> FunctionTask | None:
    doc = ast.get_docstring(node)
    summary = doc.strip().splitlines()[0].strip() if doc and doc.strip() else ""
    first = node.body[0]
    if not summary or len(summary) > 160 or '"""' in summary or summary.endswith("\\"):
        return None
    if len(node.body) < 2 or node.end_lineno is None or first.end_lineno is None:
        return None
    if first.lineno == node.lineno:  # the docstring shares the def line
        return None
    indent = lines[first.lineno - 1][
        : len(lines[first.lineno - 1]) - len(lines[first.lineno - 1].lstrip())
    ]
    body = [
        *lines[node.lineno - 1 : first.lineno - 1],
        f'{indent}"""{summary}"""',
        *lines[first.end_lineno : node.end_lineno],
    ]
    if len(body) > MAX_TASK_LINES:
        return None
    source = textwrap.dedent("\n".join(body)).rstrip()
    if len(source) > MAX_TASK_CHARS or not source.startswith(("def ", "async def ")):
        return None
    if not parses(source):  # a summary that ends in a quote or a backslash breaks the one-liner
        return None
    return FunctionTask(node.name, f"{node.name}({ast.unparse(node.args)})", summary, source)


def answer_code(text: str) -> str:
    """The code of an answer: the first fenced block if there is one, else the whole text."""
    match = _FENCE.search(text)
    return (match.group(1) if match else text).strip("\n")


def parses(code: str) -> bool:
    """True when `code` is valid Python."""
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True
