"""The drafter's prompts, as token ids: chat requests the embedded model serves and raw Python.

- tasks: "write a function" requests of the task families (`evals.task_prompts`), rendered by
  the built-in chat template exactly as the server renders them, thinking on or off;
- functions: "write a function" requests made from docstrings of standard-library functions
  (`evals.code_corpus.function_tasks`), rendered the same way;
- source: the opening of a standard-library file cut at a line start, continued as raw text.

Training prompts come from the training splits (training phrasings and names, the library's
train files); held-out prompts from the held-out ones (`held_out_tasks`, held-out files), which no
training prompt uses.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from sparkinfer.bench.evals.code_corpus import function_tasks, read_source, split_files, stdlib_root
from sparkinfer.bench.evals.task_prompts import held_out_tasks, sample_training_task
from sparkinfer.model.chat_template import ChatOptions, ChatTemplate
from sparkinfer.model.tokenizer import Tokenizer

MAX_PROMPT_TOKENS = 256
MIN_SOURCE_TOKENS, MAX_SOURCE_TOKENS = 48, 192


@dataclass(frozen=True)
class Prompt:
    kind: str  # "task", "function" or "source"
    ids: list[int]


class PromptMaker:
    """Renders requests with the target's tokenizer and the built-in chat template."""

    def __init__(self, tokenizer: Tokenizer, thinking_rate: float) -> None:
        self.tokenizer = tokenizer
        self.template = ChatTemplate.builtin(tokenizer)
        self.thinking_rate = thinking_rate

    def chat(self, kind: str, text: str, rng: random.Random) -> Prompt:
        options = ChatOptions(enable_thinking=rng.random() < self.thinking_rate)
        rendered = self.template.render([{"role": "user", "content": text}], options=options)
        return Prompt(kind, self.tokenizer.encode_chat(rendered.segments)[-MAX_PROMPT_TOKENS:])

    def source(self, text: str, rng: random.Random) -> Prompt | None:
        lines = text.splitlines(keepends=True)
        if len(lines) < 8:
            return None
        start = rng.randrange(0, max(1, len(lines) - 8))
        ids = self.tokenizer.encode("".join(lines[start : start + 200]))
        n = rng.randint(MIN_SOURCE_TOKENS, MAX_SOURCE_TOKENS)
        return Prompt("source", ids[:n]) if len(ids) >= n else None


def _sources(files: list[str]) -> list[str]:
    root = stdlib_root()
    return [t for f in files if (t := read_source(root / f)) and len(t) > 400]


def _functions(texts: list[str]) -> list[str]:
    """The request of each documented function in the texts."""
    return [task.prompt for text in texts for task in function_tasks(text)]


def training_prompts(maker: PromptMaker, rng: random.Random) -> Iterator[Prompt]:
    """Training prompts without end, rendered as they are drawn: 45% tasks, 25% library
    functions, 30% source openings."""
    train_files, _ = split_files(stdlib_root())
    rng.shuffle(train_files)
    texts = _sources(train_files[:1500])
    functions = _functions(texts[:300])
    while True:
        roll = rng.random()
        if roll < 0.45:
            yield maker.chat("task", sample_training_task(rng).prompt, rng)
        elif roll < 0.7 and functions:
            yield maker.chat("function", rng.choice(functions), rng)
        elif (p := maker.source(rng.choice(texts), rng)) is not None:
            yield p


def held_out_prompts(maker: PromptMaker, num_each: int, rng: random.Random) -> list[Prompt]:
    """Held-out prompts: `num_each` tasks (held-out names and phrasings), library functions and
    source openings of the held-out files."""
    _, held_files = split_files(stdlib_root())
    texts = _sources(held_files)
    functions = _functions(texts)
    rng.shuffle(functions)
    out = [maker.chat("task", t.prompt, rng) for t in held_out_tasks(num_each, seed=1)]
    out += [maker.chat("function", f, rng) for f in functions[:num_each]]
    sources = [p for t in texts if (p := maker.source(t, rng)) is not None]
    return out + sources[:num_each]
