""""Write a function" tasks made from `task_families`: a request in one of several phrasings, the
reference answer, and the unit tests that check it; split into training and held-out tasks.

The held-out split keeps apart, for every family, one function (or class) name and four request
phrasings: no training task uses either. A held-out task therefore pairs a name and a phrasing the
model never saw with a behaviour it was taught. Training tasks also use invented names, so the
model learns to take the name from the request rather than from the behaviour.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from sparkinfer.bench.evals.task_families import FAMILIES, Family

TRAIN_PHRASINGS = (
    "Write a Python {kind} `{sig}`: {desc}",
    "Write a {kind} `{sig}` in Python. {desc}",
    "Implement `{sig}` in Python. {desc}",
    "Please write the Python {kind} `{sig}`. {desc}",
    "Can you write a Python {kind} `{sig}`? {desc}",
    "I need a Python {kind} `{sig}`. {desc}",
    "Python {kind} `{sig}`: {desc}",
    "Code a {kind} `{sig}` that does this: {desc}",
    "Create a Python {kind} called `{sig}`. {desc}",
    "Define `{sig}` in Python. {desc}",
    "write a python {kind} `{sig}` - {desc}",
    "Task: {desc} Write it as the Python {kind} `{sig}`.",
)
HELD_OUT_PHRASINGS = (
    "Write Python code for a {kind} `{sig}`. {desc}",
    "Please implement the Python {kind} `{sig}`: {desc}",
    "Give me a Python {kind} `{sig}`. {desc}",
    "Help me write `{sig}` in Python. {desc}",
)
README_PROMPT = "Write a Python function `is_even(n)`: Return True when n is even."
README_TESTS = ("assert is_even(4) is True", "assert is_even(7) is False")
_VERBS = ("compute", "get", "make", "calc", "find", "do", "solve", "process", "build", "eval")
_NOUNS = ("result", "answer", "value", "output", "thing", "task", "data", "item", "stuff", "it")
_SOLO = ("f", "g", "func", "solution", "helper", "my_function", "transform", "run", "work")
_HELD_OUT_NAMES = frozenset(f.held_out_name for f in FAMILIES)


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


def _invented_name(rng: random.Random) -> str:
    while True:
        roll = rng.random()
        if roll < 0.3:
            name = rng.choice(_SOLO)
        elif roll < 0.7:
            name = f"{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}"
        else:
            name = f"{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}_{rng.randint(1, 99)}"
        if name not in _HELD_OUT_NAMES:
            return name


def sample_training_task(rng: random.Random) -> WrittenTask:
    """A random training task: a family's own or an invented name, any training phrasing."""
    family = rng.choice(FAMILIES)
    if family.is_class or rng.random() < 0.7:
        name = rng.choice(family.names)
    else:
        name = _invented_name(rng)
    args = rng.choice(family.args)
    return build_task(
        family, name, args, rng.randrange(len(family.descs)), rng.choice(TRAIN_PHRASINGS)
    )


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
