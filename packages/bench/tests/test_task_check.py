"""Code runs against its tests in a child process: passing code passes; wrong answers, endless
loops, exceptions and a process exit fail only themselves."""

from __future__ import annotations

from sparkinfer.bench.evals.task_check import passes_tests

GOOD = ("def double(n):\n    return n * 2", "assert double(3) == 6")


def test_right_and_wrong_answers() -> None:
    wrong = ("def double(n):\n    return n + 2", "assert double(3) == 6")
    broken = ("def double(n) return n", "assert double(3) == 6")
    assert passes_tests([GOOD, wrong, broken]) == [True, False, False]


def test_an_endless_loop_is_stopped_by_the_time_limit() -> None:
    loop = ("def double(n):\n    while True:\n        pass", "double(1)")
    assert passes_tests([loop, GOOD], time_limit_s=0.2) == [False, True]


def test_a_process_exit_fails_only_its_own_pair() -> None:
    exits = ("import os\nos._exit(0)", "")
    assert passes_tests([GOOD, exits, GOOD], time_limit_s=0.5) == [True, False, True]


def test_printed_output_does_not_disturb_the_results() -> None:
    noisy = ("print('[false]')\ndef one():\n    return 1", "print(one())\nassert one() == 1")
    assert passes_tests([noisy]) == [True]
