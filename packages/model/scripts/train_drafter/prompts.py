"""The drafter's prompts, as token ids: chat requests the embedded model serves and raw Python.

- tasks: "write a function" requests of the task families (`evals.task_prompts`), rendered by
  the built-in chat template exactly as the server renders them, thinking on or off;
- functions: "write a function" requests made from docstrings of standard-library functions
  (`evals.code_corpus.function_tasks`), rendered the same way;
- source: standard-library code continued as raw text, from the file's start (as the bench's
  `--prompt held-out` decodes it) or from a random line, 48 to 1,024 tokens long (log-uniform):
  the drafter must serve contexts as long as the bench's 512 plus its new tokens, and the target's
  continuations of long code often fall into loops that a drafter should copy;
- opening (held-out only): the first 512 tokens of the longest held-out files, exactly the bench's
  `spec --prompt held-out --context 512` prompts.

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
MIN_SOURCE_TOKENS, MAX_SOURCE_TOKENS = 48, 1024
FROM_FILE_START = 0.5  # of source prompts, the share that starts at the file's first line
BENCH_CONTEXT = 512  # the bench's `spec --context` default for held-out code


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
        """Code from the file's start or a random line, its length log-uniform in
        [MIN_SOURCE_TOKENS, MAX_SOURCE_TOKENS]; None when the file is shorter."""
        lines = text.splitlines(keepends=True)
        if len(lines) < 8:
            return None
        at_start = rng.random() < FROM_FILE_START
        start = 0 if at_start else rng.randrange(0, max(1, len(lines) - 8))
        ratio = MAX_SOURCE_TOKENS / MIN_SOURCE_TOKENS
        n = round(MIN_SOURCE_TOKENS * ratio ** rng.random())
        ids = self.tokenizer.encode("".join(lines[start : start + n]))  # a token a line at least
        return Prompt("source", ids[:n]) if len(ids) >= n else None

    def opening(self, text: str) -> Prompt | None:
        """The bench's held-out prompt of a file: its first BENCH_CONTEXT tokens, repeated when
        the file is shorter (as `spec_prompts` does)."""
        ids = self.tokenizer.encode(text)
        if not ids:
            return None
        return Prompt("opening", (ids * (1 + BENCH_CONTEXT // len(ids)))[:BENCH_CONTEXT])


def _sources(files: list[str]) -> list[str]:
    root = stdlib_root()
    return [t for f in files if (t := read_source(root / f)) and len(t) > 400]


def _functions(texts: list[str]) -> list[str]:
    """The request of each documented function in the texts."""
    return [task.prompt for text in texts for task in function_tasks(text)]


def training_prompts(maker: PromptMaker, rng: random.Random) -> Iterator[Prompt]:
    """Training prompts without end, rendered as they are drawn: 35% tasks, 20% library
    functions, 45% source code (most of the tokens: a task's continuation is short)."""
    train_files, _ = split_files(stdlib_root())
    rng.shuffle(train_files)
    texts = _sources(train_files[:1500])
    functions = _functions(texts[:300])
    while True:
        roll = rng.random()
        if roll < 0.35:
            yield maker.chat("task", sample_training_task(rng).prompt, rng)
        elif roll < 0.55 and functions:
            yield maker.chat("function", rng.choice(functions), rng)
        elif (p := maker.source(rng.choice(texts), rng)) is not None:
            yield p


def held_out_prompts(maker: PromptMaker, num_each: int, rng: random.Random) -> list[Prompt]:
    """Held-out prompts: `num_each` tasks (held-out names and phrasings), library functions,
    source code of the held-out files, and the bench's openings of the longest held-out files
    (kind "opening", the bench's `--prompt held-out` metric)."""
    _, held_files = split_files(stdlib_root())
    texts = _sources(held_files)
    functions = _functions(texts)
    rng.shuffle(functions)
    out = [maker.chat("task", t.prompt, rng) for t in held_out_tasks(num_each, seed=1)]
    out += [maker.chat("function", f, rng) for f in functions[:num_each]]
    sources = [p for t in texts if (p := maker.source(t, rng)) is not None]
    longest = sorted(texts, key=len, reverse=True)[:num_each]
    openings = [p for t in longest if (p := maker.opening(t)) is not None]
    return out + sources[:num_each] + openings
