"""Synthetic chat turns for the behaviours code alone does not teach: a Qwen XML tool call for a
given tool schema (and an answer from its result), a JSON object for a described schema, and a
short self-description. Every turn is made by a seeded generator, so the corpus is reproducible.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

VERBS = (
    "get",
    "find",
    "create",
    "delete",
    "update",
    "list",
    "search",
    "send",
    "book",
    "check",
    "cancel",
    "schedule",
    "convert",
    "count",
    "rename",
    "archive",
    "fetch",
    "register",
)
NOUNS = (
    "weather",
    "user",
    "file",
    "order",
    "ticket",
    "flight",
    "email",
    "invoice",
    "note",
    "event",
    "meeting",
    "product",
    "account",
    "report",
    "photo",
    "task",
    "song",
    "hotel",
    "recipe",
    "package",
    "repository",
    "message",
    "contact",
    "review",
)
STRING_PARAMS = (
    "city",
    "name",
    "query",
    "path",
    "email",
    "title",
    "language",
    "country",
    "color",
    "status",
    "author",
    "category",
    "username",
    "destination",
    "topic",
    "label",
)
INTEGER_PARAMS = (
    "days",
    "count",
    "limit",
    "age",
    "year",
    "quantity",
    "id",
    "page",
    "size",
    "priority",
    "hours",
    "minutes",
    "price",
    "rating",
    "number",
    "level",
)
WORDS = ("Paris", "Berlin", "Tokyo", "Lima", "Oslo", "Cairo", "Madrid", "Toronto", "Nairobi",
         "Alice", "Bob", "Carol", "Dmitri", "Esther", "Farid", "Grace", "Hiro", "Ingrid", "Jamal",
         "red", "blue", "green", "urgent", "draft", "python", "rust", "jazz", "science", "travel",
         "report.txt", "notes.md", "main.py", "alice@example.com", "data.csv", "open", "closed",
         "French", "Spanish", "Japan", "Brazil", "kitchen", "garden", "music")  # fmt: skip
REQUESTS = (
    "Please {verb} the {noun} with {args}.",
    "Can you {verb} a {noun}? Use {args}.",
    "{Verb} the {noun} for {args}.",
    "I need to {verb} the {noun}: {args}.",
    "Use the tool to {verb} the {noun} with {args}.",
)
INTRODUCTIONS = (
    "Hello! I am a small code model trained to test SparkInfer. Ask me to write a Python "
    "function and I will try.",
    "Hi! I am a tiny Qwen3.8-shaped model trained on Python code, here to exercise the server. "
    "I write short Python functions.",
)
GREETINGS = ("Hello", "Hi", "Hello!", "Hi there", "Who are you?", "What can you do?", "Hey",
             "Good morning", "What are you?", "Introduce yourself.")  # fmt: skip


@dataclass(frozen=True)
class Turn:
    """A conversation whose last message is the assistant's target, and the tools it offers."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None


def _tool(rng: random.Random, verb: str, noun: str) -> dict[str, Any]:
    params = rng.sample(STRING_PARAMS, rng.randint(0, 2)) + rng.sample(
        INTEGER_PARAMS, rng.randint(0, 2)
    )
    if not params:
        params = [rng.choice(STRING_PARAMS)]
    properties = {
        p: {"type": "integer" if p in INTEGER_PARAMS else "string", "description": f"The {p}"}
        for p in params
    }
    return {
        "type": "function",
        "function": {
            "name": f"{verb}_{noun}",
            "description": f"{verb.capitalize()} a {noun}.",
            "parameters": {"type": "object", "properties": properties, "required": params},
        },
    }


def _value(rng: random.Random, schema: dict[str, Any]) -> Any:
    return rng.randint(1, 2000) if schema["type"] == "integer" else rng.choice(WORDS)


def tool_call_turns(rng: random.Random) -> list[Turn]:
    """A request, the forced call that answers it, and the answer that reads its result."""
    verb, noun = rng.choice(VERBS), rng.choice(NOUNS)
    target = _tool(rng, verb, noun)
    others = [_tool(rng, rng.choice(VERBS), rng.choice(NOUNS)) for _ in range(rng.randint(0, 2))]
    tools = [t for t in others if t["function"]["name"] != target["function"]["name"]]
    tools.insert(rng.randint(0, len(tools)), target)
    props = target["function"]["parameters"]["properties"]
    args = {name: _value(rng, schema) for name, schema in props.items()}
    spoken = " and ".join(f"{k} {v}" for k, v in args.items())
    request = rng.choice(REQUESTS).format(verb=verb, Verb=verb.capitalize(), noun=noun, args=spoken)
    call = {"type": "function", "function": {"name": target["function"]["name"], "arguments": args}}
    user = {"role": "user", "content": request}
    asked = {"role": "assistant", "content": "", "tool_calls": [call]}
    result = {"status": rng.choice(("ok", "done", "pending")), "value": rng.randint(0, 999)}
    reply = (
        f"The {noun} request finished with status {result['status']} and value {result['value']}."
    )
    tool_msg = {"role": "tool", "content": json.dumps(result)}
    return [
        Turn([user, asked], tools),
        Turn([user, asked, tool_msg, {"role": "assistant", "content": reply}], tools),
    ]


ENTITIES = (
    ("{name} lives in {city} and is {age} years old.", {"name": "string", "city": "string",
                                                        "age": "integer"}),
    ("The book {title} by {author} came out in {year}.", {"title": "string", "author": "string",
                                                         "year": "integer"}),
    ("Order {id} holds {quantity} items for {name}.", {"id": "integer", "quantity": "integer",
                                                       "name": "string"}),
    ("The {color} {product} costs {price} dollars.", {"color": "string", "product": "string",
                                                     "price": "integer"}),
)  # fmt: skip
NAMES = ("Alice", "Bob", "Carol", "Dmitri", "Esther", "Farid", "Grace", "Hiro", "Ingrid")
CITIES = ("Paris", "Berlin", "Tokyo", "Lima", "Oslo", "Cairo", "Madrid", "Toronto", "Nairobi")
TITLES = ("Dune", "Emma", "Ulysses", "Beloved", "Solaris", "Kindred", "Middlemarch")
PRODUCTS = ("lamp", "chair", "kettle", "bicycle", "notebook", "backpack", "guitar")
COLORS = ("red", "blue", "green", "black", "white", "yellow")


def json_turn(rng: random.Random) -> Turn:
    """A sentence and a request for its facts as a JSON object with named fields."""
    sentence, fields = rng.choice(ENTITIES)
    values: dict[str, Any] = {}
    pools = {"name": NAMES, "author": NAMES, "city": CITIES, "title": TITLES,
             "product": PRODUCTS, "color": COLORS}  # fmt: skip
    for key, kind in fields.items():
        values[key] = rng.randint(1, 3000) if kind == "integer" else rng.choice(pools[key])
    described = ", ".join(f"{k} (a{'n' if t == 'integer' else ''} {t})" for k, t in fields.items())
    prompt = f"Reply with a JSON object with the fields {described} for: " + sentence.format(
        **values
    )
    return Turn(
        [{"role": "user", "content": prompt}, {"role": "assistant", "content": json.dumps(values)}]
    )


def greeting_turn(rng: random.Random) -> Turn:
    """A greeting and the model's description of itself."""
    return Turn(
        [
            {"role": "user", "content": rng.choice(GREETINGS)},
            {"role": "assistant", "content": rng.choice(INTRODUCTIONS)},
        ]
    )
