"""Run code against its unit tests in a separate Python process, each pair under a time limit.

One child interpreter (isolated mode, address space capped) takes many (code, tests) pairs on
stdin; for each it executes the code and then the tests in a fresh namespace, under an interval
timer, and reports which pairs ran without an exception. Output the code prints is discarded.
When the child dies or hangs as a whole, its pairs are retried one per process, so one bad answer
fails only itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence

MEMORY_LIMIT_BYTES = 1 << 30

_CHILD = r"""
import io, json, resource, signal, sys
resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))
job = json.loads(sys.stdin.read())
out = sys.stdout
sys.stdout = sys.stderr = io.StringIO()
sys.setrecursionlimit(2000)

def expire(signum, frame):
    raise TimeoutError("time limit")

signal.signal(signal.SIGALRM, expire)
results = []
for code, tests in job["pairs"]:
    ok = False
    try:
        signal.setitimer(signal.ITIMER_REAL, job["time_limit_s"])
        namespace = {"__name__": "__checked__"}
        exec(compile(code, "<answer>", "exec"), namespace)
        exec(compile(tests, "<tests>", "exec"), namespace)
        ok = True
    except BaseException:
        ok = False
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    sys.stdout.seek(0), sys.stdout.truncate()
    results.append(ok)
out.write(json.dumps(results))
""".replace("LIMIT_BYTES", str(MEMORY_LIMIT_BYTES))


def passes_tests(pairs: Sequence[tuple[str, str]], *, time_limit_s: float = 2.0) -> list[bool]:
    """For each (code, tests) pair: True when the code and then its tests run without raising."""
    if not pairs:
        return []
    found = _run_child(pairs, time_limit_s)
    if found is not None:
        return found
    if len(pairs) == 1:
        return [False]
    return [passes_tests([p], time_limit_s=time_limit_s)[0] for p in pairs]


def _run_child(pairs: Sequence[tuple[str, str]], time_limit_s: float) -> list[bool] | None:
    job = json.dumps({"time_limit_s": time_limit_s, "pairs": [list(p) for p in pairs]})
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-c", _CHILD], input=job, capture_output=True, text=True,
            timeout=10 + 2 * time_limit_s * len(pairs),
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return None
    if done.returncode != 0:
        return None
    try:
        results = json.loads(done.stdout)
    except json.JSONDecodeError:
        return None
    return [bool(r) for r in results] if len(results) == len(pairs) else None
