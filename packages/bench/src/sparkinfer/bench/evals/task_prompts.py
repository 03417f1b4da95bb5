""" "Write a function" tasks made from `task_families`: a request in one of several phrasings, the
reference answer, and the unit tests that check it; split into training and held-out tasks.

The held-out split keeps apart, for every family, one function (or class) name, and four request
phrasings whose openings ("Give me", "Help me write", "Write Python code for", "Please implement")
no training phrasing uses: no training task uses either. A held-out task therefore pairs a name
and a phrasing the model never saw with a behaviour it was taught. Most training tasks use
invented names, so the model learns to take the name from the request rather than from the
behaviour.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from sparkinfer.bench.evals.task_families import FAMILIES, Family
from sparkinfer.bench.evals.task_names import (
    HELD_OUT_NAMES,
    invented_args,
    invented_name,
    is_training_name,
)

_OPENERS = ("Write", "Please write", "Can you write", "Could you write", "I need", "I want",
            "Create", "Code", "Make", "Build", "Produce", "Write me", "Please create", "Define",
            "Implement", "Please code", "Draft", "We need", "Show me", "Let's write", "Write up",
            "Put together", "Sketch", "Compose", "Generate", "Provide", "Prepare", "Construct",
            "Kindly write", "Quickly write")  # fmt: skip
_OBJECTS = ("a Python {kind} `{sig}`", "the Python {kind} `{sig}`", "a {kind} `{sig}` in Python",
            "`{sig}` in Python", "a Python {kind} called `{sig}`", "the {kind} `{sig}`",
            "a {kind} named `{sig}`", "python {kind} `{sig}`", "a short Python {kind} `{sig}`",
            "a {kind} with the signature `{sig}`")  # fmt: skip
_JOINS = (": {desc}", ". {desc}", " - {desc}", " that does this: {desc}", "? {desc}", ".\n{desc}")
_GRID_PHRASINGS = (
    "Write a Python {kind} `{sig}`: {desc}",  # the README's form first
    *(f"{o} {b}{j}" for o in _OPENERS for b in _OBJECTS for j in _JOINS),
)
_FREE_PHRASINGS = (  # the name after the description, or alone in front
    "Task: {desc} Write it as the Python {kind} `{sig}`.",
    "{desc} Write this as `{sig}` in Python.",
    "Python {kind} `{sig}`: {desc}",
    "{desc} Call it `{sig}`.",
    "{desc} Name the {kind} `{sig}`.",
    "{desc} The {kind} should be `{sig}`.",
    "{desc}\nSignature: `{sig}`",
    "Signature: `{sig}`. {desc}",
    "`{sig}`: {desc}",
    "Write a {kind} that does this: {desc} Use the signature `{sig}`.",
    "I need a Python {kind}. {desc} Its signature is `{sig}`.",
    "In Python, write `{sig}`. {desc}",
    "Define `{sig}` so that it does this: {desc}",
    "{desc} Put it in a Python {kind} named `{sig}`.",
    "Python, {kind} `{sig}`. {desc}",
    "Name: `{sig}`. Behaviour: {desc}",
)
FREE_PHRASING_SHARE = 0.25  # training tasks in a `_FREE_PHRASINGS` form, the rest in the grid's
TRAIN_PHRASINGS = (*_GRID_PHRASINGS, *_FREE_PHRASINGS)
HELD_OUT_PHRASINGS = (
    "Write Python code for a {kind} `{sig}`. {desc}",
    "Please implement the Python {kind} `{sig}`: {desc}",
    "Give me a Python {kind} `{sig}`. {desc}",
    "Help me write `{sig}` in Python. {desc}",
)
README_PROMPT = "Write a Python function `is_even(n)`: Return True when n is even."
README_TESTS = ("assert is_even(4) is True", "assert is_even(7) is False")


def _check_split() -> None:
    """No training phrasing opens like a held-out one or equals one."""
    heads = tuple(p.split("{")[0] for p in HELD_OUT_PHRASINGS)
    for phrasing in TRAIN_PHRASINGS:
        if phrasing in HELD_OUT_PHRASINGS or phrasing.startswith(heads):
            raise AssertionError(f"training phrasing {phrasing!r} is held out: reword it")


_check_split()
FAMILY_NAME_SHARE = 0.1  # training tasks under one of the family's own names
INVENTED_ARGS_SHARE = 0.6  # training tasks whose argument names are invented, not the family's


@dataclass(frozen=True)
class WrittenTask:
    """A request, its reference answer (a fenced code block) and the tests any answer must pass."""

    family: str
    name: str
    prompt: str
    solution: str  # the code alone
    tests: tuple[str, ...]

    @property
    def answer(self) -> str:
        return f"```python\n{self.solution}\n```"

    @property
    def test_code(self) -> str:
        return "\n".join(self.tests)


def build_task(family: Family, name: str, args: tuple[str, ...], desc_idx: int, phrasing: str):
    """One task of `family` under the given name, argument names, description and phrasing."""
    sig = name if family.is_class else f"{name}({', '.join(args)})"
    desc = family.descs[desc_idx].format(*args, name=name)
    kind = "class" if family.is_class else "function"
    prompt = phrasing.format(kind=kind, sig=sig, desc=desc)
    body = family.body.format(*args, name=name)
    solution = body if family.is_class else f"def {sig}:\n{body}"
    tests = tuple(t.format(name=name) for t in family.tests)
    return WrittenTask(family.key, name, prompt, solution, tests)


def sample_training_task(rng: random.Random) -> WrittenTask:
    """A random training task: a family's own name (FAMILY_NAME_SHARE) or an invented one
    (`task_names`), the family's argument names or invented ones, any training phrasing. Names
    and phrasings of the held-out split never occur (`task_names.is_training_name`)."""
    family = rng.choice(FAMILIES)
    if rng.random() < FAMILY_NAME_SHARE:
        name = rng.choice(family.names)
    else:
        name = invented_name(rng, family)
    if not family.is_class and rng.random() < INVENTED_ARGS_SHARE:
        args = invented_args(rng, family, name)
    else:
        args = rng.choice(family.args)
    free = rng.random() < FREE_PHRASING_SHARE
    phrasing = rng.choice(_FREE_PHRASINGS if free else _GRID_PHRASINGS)
    return build_task(family, name, args, rng.randrange(len(family.descs)), phrasing)


def check_training_tasks(tasks: list[WrittenTask]) -> None:
    """Raise when a training task uses a held-out name, an invented name that holds one or a word
    only held-out names use, or a held-out phrasing: the held-out split must stay unseen."""
    heads = tuple(p.split("{")[0] for p in HELD_OUT_PHRASINGS)
    own = {name for f in FAMILIES for name in f.names}
    for task in tasks:
        name_ok = task.name in own or is_training_name(task.name)
        if task.name in HELD_OUT_NAMES or not name_ok or task.prompt.startswith(heads):
            raise AssertionError(f"training task {task.prompt!r} uses the held-out split")


def held_out_tasks(num: int = 32, *, seed: int = 0) -> list[WrittenTask]:
    """`num` tasks over distinct families (all of them when num is larger), each with its
    family's held-out name and a held-out phrasing."""
    rng = random.Random(seed)
    families = list(FAMILIES)
    rng.shuffle(families)
    tasks = []
    for i, family in enumerate(families[:num]):
        phrasing = HELD_OUT_PHRASINGS[i % len(HELD_OUT_PHRASINGS)]
        args = rng.choice(family.args)
        desc_idx = rng.randrange(len(family.descs))
        tasks.append(build_task(family, family.held_out_name, args, desc_idx, phrasing))
    return tasks


def readme_task() -> WrittenTask:
    """The README's own example, with its tests."""
    family = next(f for f in FAMILIES if f.key == "is_even")
    return build_task(family, "is_even", ("n",), 0, TRAIN_PHRASINGS[0])
