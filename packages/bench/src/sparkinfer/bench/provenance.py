"""Where a figure came from: git revision, GPU, command line, versions and time."""

from __future__ import annotations

import datetime as dt
import platform
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

_PACKAGE_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class RunInfo:
    """Printed above every report and stored in its JSON."""

    command: str
    git_rev: str
    is_dirty: bool
    gpu: str
    torch_version: str
    python_version: str
    started_at: str

    def lines(self) -> list[str]:
        dirty = " (with uncommitted changes)" if self.is_dirty else ""
        return [
            f"command: {self.command}",
            f"git: {self.git_rev}{dirty}",
            f"gpu: {self.gpu}",
            f"torch {self.torch_version}, python {self.python_version}, at {self.started_at}",
        ]

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _git(*args: str) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(
            ["git", *args], cwd=_PACKAGE_DIR, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None


def git_revision() -> tuple[str, bool]:
    """HEAD's commit hash (or 'unknown' outside a checkout) and whether the tree has changes."""
    rev = _git("rev-parse", "HEAD")
    if rev is None or rev.returncode != 0:
        return "unknown", False
    status = _git("status", "--porcelain", "--untracked-files=no")
    is_dirty = bool(status is not None and status.returncode == 0 and status.stdout.strip())
    return rev.stdout.strip(), is_dirty


def gpu_name() -> str:
    """The first CUDA device's name, or 'cpu'."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return "cpu"


def collect(argv: list[str], *, git_rev: str | None = None) -> RunInfo:
    """Provenance of this run; `git_rev` (--git-rev) names the revision of a copied tree."""
    rev, is_dirty = git_revision()
    if git_rev:  # a copy's .git (if any) may not be the tree that runs
        rev, is_dirty = f"{git_rev} (given by --git-rev)", False
    return RunInfo(
        command=shlex.join(["sparkinfer-bench", *argv]),
        git_rev=rev,
        is_dirty=is_dirty,
        gpu=gpu_name(),
        torch_version=torch.__version__,
        python_version=platform.python_version() or sys.version.split()[0],
        started_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )
