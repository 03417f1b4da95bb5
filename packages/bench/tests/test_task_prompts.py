"""The "write a function" tasks: every reference answer passes its own tests, and no training
task uses a held-out name or phrasing."""

from __future__ import annotations

import random

import pytest
from sparkinfer.bench.evals.task_check import passes_tests
from sparkinfer.bench.evals.task_families import FAMILIES
from sparkinfer.bench.evals.task_names import is_training_name
from sparkinfer.bench.evals.task_prompts import (
    HELD_OUT_PHRASINGS,
    README_PROMPT,
    TRAIN_PHRASINGS,
    build_task,
    check_training_tasks,
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


def test_invented_names_keep_clear_of_the_held_out_split() -> None:
    rng = random.Random(1)
    tasks = [sample_training_task(rng) for _ in range(5000)]
    check_training_tasks(tasks)
    own = {n for f in FAMILIES for n in f.names}
    invented = [t for t in tasks if t.name not in own]
    assert len({t.name for t in invented}) > 0.8 * len(invented)  # names never repeat much
    held_words = {w for f in FAMILIES for w in f.held_out_name.lower().split("_")} - {
        w for f in FAMILIES for n in f.names for w in n.lower().split("_")
    }
    for task in invented:
        assert is_training_name(task.name)
        assert not held_words & set(task.name.lower().split("_")), task.name


def test_the_split_check_refuses_held_out_names() -> None:
    family = FAMILIES[0]
    task = build_task(family, family.held_out_name, family.args[0], 0, TRAIN_PHRASINGS[0])
    with pytest.raises(AssertionError):
        check_training_tasks([task])
    invented = build_task(
        family, f"get_{family.held_out_name}_now", family.args[0], 0, TRAIN_PHRASINGS[0]
    )
    with pytest.raises(AssertionError):
        check_training_tasks([invented])
