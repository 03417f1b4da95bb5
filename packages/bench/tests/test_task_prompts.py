"""The "write a function" tasks: every reference answer passes its own tests, and no training
task uses a held-out name or phrasing."""

from __future__ import annotations

import random

from sparkinfer.bench.evals.task_check import passes_tests
from sparkinfer.bench.evals.task_families import FAMILIES
from sparkinfer.bench.evals.task_prompts import (
    HELD_OUT_PHRASINGS,
    README_PROMPT,
    TRAIN_PHRASINGS,
    build_task,
    held_out_tasks,
    readme_task,
    sample_training_task,
)


def test_every_reference_answer_passes_its_tests() -> None:
    tasks = [
        build_task(f, name, args, d, TRAIN_PHRASINGS[0])
        for f in FAMILIES
        for name in (*f.names, f.held_out_name)
        for args in f.args
        for d in range(len(f.descs))
    ]
    results = passes_tests([(t.solution, t.test_code) for t in tasks])
    assert [t.name for t, ok in zip(tasks, results, strict=True) if not ok] == []


def test_wrong_answers_fail_the_tests() -> None:
    for task in held_out_tasks()[:8]:
        wrong = task.solution.replace("return", "return None and", 1)
        assert passes_tests([(wrong, task.test_code)]) == [False], task.prompt


def test_training_tasks_never_use_held_out_names_or_phrasings() -> None:
    held = held_out_tasks()
    held_names = {t.name for t in held}
    rng = random.Random(0)
    for _ in range(5000):
        task = sample_training_task(rng)
        assert task.name not in held_names
        assert task.prompt not in {t.prompt for t in held}
        heads = {p.split("{")[0] for p in HELD_OUT_PHRASINGS}
        assert not any(h and task.prompt.startswith(h) for h in heads), task.prompt


def test_held_out_tasks_cover_distinct_families() -> None:
    held = held_out_tasks()
    assert len(held) == 32
    assert len({t.family for t in held}) == 32
    assert {t.prompt.split("`")[0] for t in held} <= {
        p.split("`")[0].format(kind=k) for p in HELD_OUT_PHRASINGS for k in ("function", "class")
    }


def test_the_readme_example() -> None:
    assert readme_task().prompt == README_PROMPT
