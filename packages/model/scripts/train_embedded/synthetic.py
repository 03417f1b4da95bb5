"""Synthetic chat turns for what code alone does not teach: JSON objects whose values come from
the request, a greeting that says what the model is, and "write a function" tasks (their answers
checked by `task_check` before they are kept). Tool turns live in `tool_turns`. Every turn comes
from a seeded generator, so the corpus is reproducible.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from sparkinfer.bench.evals.task_prompts import WrittenTask


@dataclass(frozen=True)
class Turn:
    """A conversation whose last message is the assistant's target, and the tools it offers."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None


def task_turn(task: WrittenTask) -> Turn:
    return Turn(
        [{"role": "user", "content": task.prompt}, {"role": "assistant", "content": task.answer}]
    )


NAMES = ("Alice", "Bob", "Carol", "Dmitri", "Esther", "Farid", "Grace", "Hiro", "Ingrid", "Jamal",
         "Kofi", "Lena", "Mateo", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tariq",
         "Uma", "Victor", "Wen", "Ximena", "Yusuf", "Zoe")  # fmt: skip
CITIES = ("Paris", "Berlin", "Tokyo", "Lima", "Oslo", "Cairo", "Madrid", "Toronto", "Nairobi",
          "Rome", "Sydney", "Denver", "Lisbon", "Seoul", "Dublin", "Quito", "Vienna", "Austin",
          "Mumbai", "Prague", "Boston", "Zurich", "Hanoi", "Accra")  # fmt: skip
TITLES = ("Dune", "Emma", "Ulysses", "Beloved", "Solaris", "Kindred", "Middlemarch", "Neuromancer",
          "Persuasion", "Frankenstein", "Rebecca", "Lolita", "Walden")  # fmt: skip
PRODUCTS = ("lamp", "chair", "kettle", "bicycle", "notebook", "backpack", "guitar", "toaster",
            "umbrella", "camera", "desk", "blender")  # fmt: skip
COLORS = ("red", "blue", "green", "black", "white", "yellow", "purple", "orange", "grey")
SPECIES = ("cat", "dog", "parrot", "rabbit", "turtle", "hamster", "goldfish")
ROLES = ("engineer", "designer", "teacher", "nurse", "chef", "pilot", "analyst", "baker")
POOLS: dict[str, tuple[str, ...]] = {"name": NAMES, "author": NAMES, "owner": NAMES,
                                     "city": CITIES, "title": TITLES, "product": PRODUCTS,
                                     "color": COLORS, "species": SPECIES,
                                     "role": ROLES}  # fmt: skip
RANGES = {"age": (1, 99), "year": (1800, 2025), "id": (1, 99999), "quantity": (1, 500),
          "price": (1, 3000), "salary": (1000, 200000), "pages": (20, 1500)}  # fmt: skip
ENTITIES = (
    (("{name} lives in {city} and is {age} years old.", "{name}, {age}, from {city}.",
      "Meet {name}: {age} years old, living in {city}."), ("name", "city", "age")),
    (("The book {title} by {author} came out in {year}.",
      "{author} wrote {title}, published in {year}."), ("title", "author", "year")),
    (("Order {id} holds {quantity} items for {name}.",
      "{name} ordered {quantity} items (order {id})."),
     ("id", "quantity", "name")),
    (("The {color} {product} costs {price} dollars.",
      "A {product} in {color} for {price} dollars."),
     ("color", "product", "price")),
    (("{owner} has a {species} that is {age} years old.", "{owner}'s {species} is {age}."),
     ("owner", "species", "age")),
    (("{name} works as a {role} in {city}.", "{name} is a {role} based in {city}."),
     ("name", "role", "city")),
    (("{title} has {pages} pages and was written by {author}.",), ("title", "pages", "author")),
    (("{name} earns {salary} a year as a {role}.",), ("name", "salary", "role")),
)  # fmt: skip
JSON_PHRASINGS = (
    "Reply with a JSON object with the fields {fields} for: {sentence}",
    "Return a JSON object with {fields} for this: {sentence}",
    "Extract {fields} as JSON from: {sentence}",
    "{sentence} Give me this as a JSON object with {fields}.",
    "Give the JSON object ({fields}) for: {sentence}",
    "As JSON with keys {fields}: {sentence}",
)


def _field_list(fields: tuple[str, ...], rng: random.Random) -> str:
    typed = rng.random() < 0.6
    parts = [f"{k} ({'an integer' if k in RANGES else 'a string'})" if typed else k for k in fields]
    return ", ".join(parts[:-1]) + f"{',' if len(parts) > 2 else ''} and " + parts[-1]


def json_turn(rng: random.Random) -> Turn:
    """A sentence and a request for its facts as a JSON object, keys in the order asked."""
    sentences, fields = rng.choice(ENTITIES)
    values: dict[str, Any] = {}
    for key in fields:
        values[key] = rng.randint(*RANGES[key]) if key in RANGES else rng.choice(POOLS[key])
    order = list(fields)
    if rng.random() < 0.3:
        rng.shuffle(order)
    sentence = rng.choice(sentences).format(**values)
    prompt = rng.choice(JSON_PHRASINGS).format(
        fields=_field_list(tuple(order), rng), sentence=sentence
    )
    answer = json.dumps({k: values[k] for k in order})
    return Turn([{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}])


INTRODUCTIONS = (
    "Hello! I am qwen3.8-code-tiny, a small model of the Qwen3.8 architecture that ships with "
    "SparkInfer for testing. I write short Python functions, call the tools you declare and "
    "answer in JSON.",
    "Hi! I am qwen3.8-code-tiny, SparkInfer's built-in test model: a tiny Qwen3.8-architecture "
    "model trained on Python. Ask me for a short Python function.",
    "I am qwen3.8-code-tiny, a small code model that SparkInfer serves by default. I am not a "
    "general assistant: I write short Python functions, make tool calls and reply in JSON.",
)
GREETINGS = ("Hello", "Hi", "Hello!", "Hi there", "Who are you?", "What can you do?", "Hey",
             "Good morning", "What are you?", "Introduce yourself.", "hello", "hi!",
             "Hey, what is this model?", "Which model are you?", "Hello, who am I talking to?",
             "What can you help me with?", "Good evening!")  # fmt: skip


def greeting_turn(rng: random.Random) -> Turn:
    """A greeting and the model's description of itself."""
    return Turn(
        [
            {"role": "user", "content": rng.choice(GREETINGS)},
            {"role": "assistant", "content": rng.choice(INTRODUCTIONS)},
        ]
    )
