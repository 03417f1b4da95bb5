"""Tool-use turns from random tool schemas: a request that a declared tool serves and the call
that answers it (declared name, declared parameter names, values copied from the request); the
plain answer that reads the tool's result; and requests that no declared tool serves, answered in
plain text, so the model calls a tool only when a declared one fits and never invents one.

Each tool kind has several names, parameter names and request phrasings; a turn declares one to
three kinds, each under a drawn name and drawn parameter names (its own or invented ones), in
random order.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from synthetic import Turn


@dataclass(frozen=True)
class Param:
    slot: str  # the request's placeholder
    names: tuple[str, ...]
    kind: str  # "string" or "integer"
    about: str


@dataclass(frozen=True)
class ToolKind:
    names: tuple[str, ...]
    purpose: str  # "get a weather forecast": what the tool does, for plain answers
    params: tuple[Param, ...]
    requests: tuple[str, ...]


CITIES = ("Paris", "Berlin", "Tokyo", "Lima", "Oslo", "Cairo", "Madrid", "Toronto", "Nairobi",
          "Rome", "Sydney", "Denver", "Lisbon", "Seoul", "Dublin", "Quito", "Vienna", "Austin",
          "Mumbai", "Prague", "Boston", "Zurich", "Hanoi", "Accra", "Bergen", "Kyoto")  # fmt: skip
TOPICS = ("the Eiffel Tower", "photosynthesis", "Ada Lovelace", "black holes", "the Nile",
          "quantum computing", "Python decorators", "the Roman Empire", "jazz", "volcanoes",
          "Marie Curie", "the moon landing", "machine learning", "coffee", "honey bees",
          "the Great Wall", "chess openings", "rust programming", "tea ceremonies")  # fmt: skip
CURRENCIES = ("USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "INR")
PEOPLE = ("alice@example.com", "bob@example.org", "carol@mail.com", "dev-team@example.com",
          "hiro@example.net", "grace@company.io")  # fmt: skip
SUBJECTS = ("Meeting notes", "Lunch on Friday", "Quarterly report", "Project update",
            "Invoice 42", "Holiday plans", "Build failure")  # fmt: skip
LANGUAGES = ("French", "Spanish", "German", "Japanese", "Italian", "Portuguese", "Korean")
PHRASES = ("good morning", "thank you very much", "where is the station", "I like coffee",
           "see you tomorrow", "the cat is asleep")  # fmt: skip
SYMBOLS = ("AAPL", "MSFT", "NVDA", "GOOG", "AMZN", "TSLA", "IBM")

_POOLS: dict[str, tuple[Any, ...]] = {"city": CITIES, "query": TOPICS, "from": CURRENCIES,
                                      "to": CURRENCIES, "email": PEOPLE, "subject": SUBJECTS,
                                      "language": LANGUAGES, "phrase": PHRASES,
                                      "symbol": SYMBOLS}  # fmt: skip
_RANGES = {"days": (1, 14), "a": (1, 999), "b": (1, 999), "amount": (1, 5000),
           "minutes": (1, 120), "nights": (1, 21)}  # fmt: skip

P_CITY = Param("city", ("city", "location", "place", "city_name"), "string", "The city name")
KINDS = (
    ToolKind(("get_weather", "weather_forecast", "fetch_weather", "get_forecast"),
             "get a weather forecast",
             (P_CITY, Param("days", ("days", "num_days", "n_days"), "integer", "Number of days")),
             ("What's the weather in {city} for the next {days} days?",
              "Give me the {days}-day forecast for {city}.",
              "How will the weather be in {city} over the next {days} days?",
              "Weather in {city} for {days} days, please.",
              "Tell me the forecast for {city}, {days} days ahead.",
              "I'm going to {city}. What will the weather be like for {days} days?")),
    ToolKind(("add", "add_numbers", "sum_numbers", "calculator_add"), "add numbers",
             (Param("a", ("a", "x", "first", "left"), "integer", "The first number"),
              Param("b", ("b", "y", "second", "right"), "integer", "The second number")),
             ("What is {a} plus {b}?", "Add {a} and {b}.", "Compute the sum of {a} and {b}.",
              "Use the calculator to add {a} to {b}.", "What do {a} and {b} add up to?",
              "Please add {a} + {b}.")),
    ToolKind(("lookup", "search", "search_web", "look_up", "wiki_search"),
             "look things up",
             (Param("query", ("query", "term", "q", "topic"), "string", "What to look up"),),
             ("Look up {query}.", "Search for information about {query}.",
              "Can you look up {query} for me?", "Find out about {query}.",
              "What can you find on {query}?", "Search the web for {query}.")),
    ToolKind(("convert_currency", "currency_convert", "exchange"), "convert currencies",
             (Param("amount", ("amount", "value"), "integer", "How much money"),
              Param("from", ("from_currency", "source", "base"), "string", "Currency code"),
              Param("to", ("to_currency", "target", "quote"), "string", "Currency code")),
             ("Convert {amount} {from} to {to}.", "How much is {amount} {from} in {to}?",
              "Exchange {amount} {from} into {to}, please.")),
    ToolKind(("send_email", "email_send", "compose_email"), "send emails",
             (Param("email", ("to", "recipient", "address"), "string", "Recipient address"),
              Param("subject", ("subject", "title"), "string", "Subject line")),
             ("Send an email to {email} with the subject {subject}.",
              "Email {email} about \"{subject}\".",
              "Please write to {email}, subject: {subject}.")),
    ToolKind(("get_time", "current_time", "time_in"), "tell the time",
             (P_CITY,),
             ("What time is it in {city}?", "Tell me the current time in {city}.",
              "What's the local time in {city} right now?")),
    ToolKind(("translate", "translate_text", "translator"), "translate text",
             (Param("phrase", ("text", "phrase", "source_text"), "string", "Text to translate"),
              Param("language", ("language", "target_language", "lang"), "string",
                    "Language to translate into")),
             ("Translate \"{phrase}\" into {language}.",
              "How do you say \"{phrase}\" in {language}?",
              "Please translate '{phrase}' to {language}.")),
    ToolKind(("get_stock_price", "stock_quote", "stock_price"), "quote stock prices",
             (Param("symbol", ("symbol", "ticker"), "string", "Ticker symbol"),),
             ("What's the stock price of {symbol}?", "Get me a quote for {symbol}.",
              "How is {symbol} trading right now?")),
    ToolKind(("set_timer", "start_timer", "timer"), "set timers",
             (Param("minutes", ("minutes", "duration", "mins"), "integer", "Length in minutes"),),
             ("Set a timer for {minutes} minutes.", "Start a {minutes} minute timer.",
              "Remind me in {minutes} minutes.")),
    ToolKind(("book_hotel", "reserve_hotel", "hotel_booking"), "book hotels",
             (P_CITY, Param("nights", ("nights", "num_nights", "stay"), "integer",
                            "Number of nights")),
             ("Book a hotel in {city} for {nights} nights.",
              "I need a hotel in {city} for {nights} nights.",
              "Reserve a room in {city}, {nights} nights.")),
)  # fmt: skip


@dataclass(frozen=True)
class Declared:
    kind: ToolKind
    name: str
    param_names: tuple[str, ...]
    description: str

    def schema(self) -> dict[str, Any]:
        props = {n: {"type": p.kind, "description": p.about}
                 for n, p in zip(self.param_names, self.kind.params, strict=True)}  # fmt: skip
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": {"type": "object", "properties": props,
                           "required": list(props)}}}  # fmt: skip


_NAME_VERBS = ("get", "fetch", "run", "call", "do", "query", "use", "find", "lookup", "compute",
               "make", "request", "tool", "api", "service", "check")  # fmt: skip
_NAME_NOUNS = ("info", "data", "result", "thing", "value", "report", "item", "answer", "helper",
               "status", "record", "details", "stats", "action", "task", "job")  # fmt: skip
_PARAM_NAMES = ("arg", "arg1", "arg2", "value", "input", "x", "y", "param", "p", "field", "key",
                "n", "count", "name", "q", "target", "item", "amount", "text", "where", "when",
                "what", "size", "level", "number", "label", "source", "dest", "kind",
                "mode")  # fmt: skip


def _declare(rng: random.Random, kind: ToolKind) -> Declared:
    """The kind under one of its own names and parameter names, or (half the time each) under
    invented ones, so the model takes both from the schema rather than from the request."""
    if rng.random() < 0.5:
        name = rng.choice(kind.names)
    else:
        name = f"{rng.choice(_NAME_VERBS)}_{rng.choice(_NAME_NOUNS)}"
    params: list[str] = []
    for p in kind.params:
        pool = p.names if rng.random() < 0.5 else _PARAM_NAMES
        params.append(rng.choice([n for n in pool if n not in params]))
    purpose = kind.purpose
    description = rng.choice((f"A tool to {purpose}.", f"{purpose[0].upper()}{purpose[1:]}.",
                              f"Use this to {purpose}.", f"Lets you {purpose}."))  # fmt: skip
    return Declared(kind, name, tuple(params), description)


def _values(rng: random.Random, kind: ToolKind) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for p in kind.params:
        if p.slot in _RANGES:
            values[p.slot] = rng.randint(*_RANGES[p.slot])
        else:
            choices = [v for v in _POOLS[p.slot] if v not in values.values()]
            values[p.slot] = rng.choice(choices)
    return values


def _toolbox(rng: random.Random, *, must: ToolKind | None, avoid: ToolKind | None):
    kinds = [k for k in KINDS if k is not must and k is not avoid]
    chosen = rng.sample(kinds, rng.randint(0 if must else 1, 2))
    if must is not None:
        chosen.insert(rng.randint(0, len(chosen)), must)
    while True:
        tools = [_declare(rng, k) for k in chosen]
        if len({t.name for t in tools}) == len(tools):
            return tools


def call_turns(rng: random.Random) -> list[Turn]:
    """A request a declared tool serves, its call, and the answer that reads the result."""
    kind = rng.choice(KINDS)
    tools = _toolbox(rng, must=kind, avoid=None)
    target = next(t for t in tools if t.kind is kind)
    values = _values(rng, kind)
    request = rng.choice(kind.requests).format(**values)
    args = {n: values[p.slot] for n, p in zip(target.param_names, kind.params, strict=True)}
    call = {"type": "function", "function": {"name": target.name, "arguments": args}}
    user = {"role": "user", "content": request}
    asked = {"role": "assistant", "content": "", "tool_calls": [call]}
    result = {"result": rng.choice(("ok", "done", "sunny", "42", "found", "sent"))}
    tool_msg = {"role": "tool", "content": json.dumps(result)}
    reply = f"{target.name} returned: {result['result']}."
    schemas = [t.schema() for t in tools]
    return [
        Turn([user, asked], schemas),
        Turn([user, asked, tool_msg, {"role": "assistant", "content": reply}], schemas),
    ]


def unserved_turn(rng: random.Random) -> Turn:
    """A request for a kind of tool that is not declared, answered in plain text."""
    kind = rng.choice(KINDS)
    tools = _toolbox(rng, must=None, avoid=kind)
    request = rng.choice(kind.requests).format(**_values(rng, kind))
    names = " and ".join(f"`{t.name}`" for t in tools)
    reply = (
        f"I cannot {kind.purpose} here: the only tool{'s' if len(tools) > 1 else ''} I have "
        f"{'are' if len(tools) > 1 else 'is'} {names}."
    )
    messages = [{"role": "user", "content": request}, {"role": "assistant", "content": reply}]
    return Turn(messages, [t.schema() for t in tools])


def with_tools(rng: random.Random, turn: Turn) -> Turn:
    """A plain turn (code, greeting) with unrelated tools declared: still answered in text."""
    return Turn(turn.messages, [t.schema() for t in _toolbox(rng, must=None, avoid=None)])
