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

_OPENERS = ("Write", "Please write", "Can you write", "Could you write", "I need", "I want",
            "Create", "Code", "Make", "Build", "Produce", "Write me", "Please create", "Define",
            "Implement", "Please code", "Draft", "We need")  # fmt: skip
_OBJECTS = ("a Python {kind} `{sig}`", "the Python {kind} `{sig}`", "a {kind} `{sig}` in Python",
            "`{sig}` in Python", "a Python {kind} called `{sig}`", "the {kind} `{sig}`",
            "a {kind} named `{sig}`", "python {kind} `{sig}`")  # fmt: skip
_JOINS = (": {desc}", ". {desc}", " - {desc}", " that does this: {desc}", "? {desc}", ".\n{desc}")
TRAIN_PHRASINGS = (
    "Write a Python {kind} `{sig}`: {desc}",  # the README's form first
    *(f"{o} {b}{j}" for o in _OPENERS for b in _OBJECTS for j in _JOINS),
    "Task: {desc} Write it as the Python {kind} `{sig}`.",
    "{desc} Write this as `{sig}` in Python.",
    "Python {kind} `{sig}`: {desc}",
)
HELD_OUT_PHRASINGS = (
    "Write Python code for a {kind} `{sig}`. {desc}",
    "Please implement the Python {kind} `{sig}`: {desc}",
    "Give me a Python {kind} `{sig}`. {desc}",
    "Help me write `{sig}` in Python. {desc}",
)
README_PROMPT = "Write a Python function `is_even(n)`: Return True when n is even."
README_TESTS = ("assert is_even(4) is True", "assert is_even(7) is False")
_VERBS = ("compute", "get", "make", "calc", "find", "do", "solve", "process", "build", "eval",
          "check", "count", "sum", "apply", "handle", "return", "run", "convert", "pick",
          "collect", "gather", "test", "measure", "fetch", "derive", "produce", "keep",
          "turn")  # fmt: skip
_NOUNS = ("result", "answer", "value", "output", "thing", "task", "data", "item", "stuff", "it",
          "numbers", "total", "list", "text", "word", "letters", "pairs", "score", "entries",
          "digits", "chars", "keys", "values", "amount", "count", "things", "info", "parts",
          "number", "string", "record", "table", "size", "mix", "blob")  # fmt: skip
_SOLO = ("f", "g", "h", "func", "solution", "helper", "my_function", "transform", "run", "work",
         "foo", "bar", "baz", "main_task", "answer", "calc", "compute", "check", "fn",
         "op")  # fmt: skip
_CLASS_PARTS = ("My", "Simple", "Basic", "Tiny", "Custom", "Little", "Plain", "Smart", "Quick",
                "Demo", "Test", "Toy", "Handy", "Fancy")  # fmt: skip
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


def _invented_name(rng: random.Random, family: Family) -> str:
    while True:
        roll = rng.random()
        if family.is_class:
            name = rng.choice(_CLASS_PARTS) + rng.choice(family.names)
        elif roll < 0.2:
            name = rng.choice(_SOLO)
        elif roll < 0.6:
            name = f"{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}"
        elif roll < 0.8:
            name = f"{rng.choice(_NOUNS)}_{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}"
        else:
            name = f"{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}_{rng.randint(1, 99)}"
        if name not in _HELD_OUT_NAMES:
            return name


def sample_training_task(rng: random.Random) -> WrittenTask:
    """A random training task: a family's own name (40%) or an invented one (60%), so the model
    takes the name from the request; any training phrasing."""
    family = rng.choice(FAMILIES)
    name = rng.choice(family.names) if rng.random() < 0.4 else _invented_name(rng, family)
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
