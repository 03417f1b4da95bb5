"""The training corpus: Python source read from the training machine's own installation, plus
chat turns made from it and from the synthetic generators, encoded into one token stream.

Raw files: the standard library's train split, then installed packages' sources in a fixed
pseudo-random order (by path hash) up to a character budget; a package file whose name the split
rule holds out, or whose text equals a held-out file's, is skipped. Chat turns: "write a
function" tasks from those files, forced tool calls, JSON objects and greetings, each rendered by
the model's own chat template with thinking on or off, exactly as the server renders a request.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import random
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import synthetic
import tokenizers
import torch
from sparkinfer.bench.evals.code_corpus import (
    FunctionTask,
    function_tasks,
    is_held_out,
    read_source,
    split_files,
    stdlib_root,
)
from sparkinfer.model.chat_template import ChatOptions, ChatTemplate
from sparkinfer.model.tokenizer import Tokenizer

MAX_FILE_CHARS = 200_000
ASSISTANT_OPEN = "<|im_start|>assistant\n"
EMPTY_THINK = "<think>\n\n</think>\n\n"


@dataclass
class SourceCorpus:
    """Raw file texts for training and the standard library's held-out texts."""

    train: list[str]
    held_out: list[str]
    num_stdlib_train: int
    num_package_files: int


def collect_sources(*, char_budget: int, use_packages: bool) -> SourceCorpus:
    """Read the train split of the standard library, then package sources up to the budget."""
    root = stdlib_root()
    train_paths, held_paths = split_files(root)
    held = [t for p in held_paths if (t := read_source(root / p))]
    held_digests = {hashlib.sha256(t.encode()).digest() for t in held}
    train = [t for p in train_paths if (t := read_source(root / p)) and len(t) <= MAX_FILE_CHARS]
    num_stdlib = len(train)
    size = sum(map(len, train))
    if use_packages:
        purelib = Path(sysconfig.get_paths()["purelib"])
        paths = [p for p in _package_files(purelib) if not is_held_out(p)]
        paths.sort(key=lambda p: hashlib.sha256(p.encode()).digest())
        for p in paths:
            if size >= char_budget:
                break
            text = read_source(purelib / p)
            if not text or len(text) > MAX_FILE_CHARS:
                continue
            if hashlib.sha256(text.encode()).digest() in held_digests:
                continue
            train.append(text)
            size += len(text)
    return SourceCorpus(train, held, num_stdlib, len(train) - num_stdlib)


def _package_files(purelib: Path) -> list[str]:
    found: list[str] = []
    for path in purelib.rglob("*.py"):
        rel = path.relative_to(purelib).as_posix()
        if "__pycache__" not in rel and path.is_file():
            found.append(rel)
    return found


def plain_encoder(tok: tokenizers.Tokenizer) -> tokenizers.Tokenizer:
    """A copy that encodes control-token text as ordinary bytes (source files quote them)."""
    spec = json.loads(tok.to_str())
    spec["added_tokens"] = []
    return tokenizers.Tokenizer.from_str(json.dumps(spec))


class ChatEncoder:
    """Turns → ids: the prompt as the server renders and encodes it, then the target reply."""

    def __init__(self, tokenizer: Tokenizer, template: ChatTemplate) -> None:
        self.tokenizer = tokenizer
        self.template = template

    def encode(self, turn: synthetic.Turn, *, thinking: bool) -> list[int]:
        history = turn.messages[:-1]
        prompt = self.template.render(
            history, tools=turn.tools, options=ChatOptions(enable_thinking=thinking)
        )
        reply = self._reply_text(turn)
        completion = ("\n</think>\n\n" if thinking else "") + reply + "<|im_end|>"
        return self.tokenizer.encode_chat(prompt.segments) + self.tokenizer.encode(
            completion, allow_special=True
        )

    def _reply_text(self, turn: synthetic.Turn) -> str:
        """The target message as the template renders it in history, after its think block."""
        full = self.template.render(
            turn.messages, tools=turn.tools, options=ChatOptions(add_generation_prompt=False)
        ).text
        reply = full[full.rindex(ASSISTANT_OPEN) + len(ASSISTANT_OPEN) :]
        if reply.startswith(EMPTY_THINK):
            reply = reply[len(EMPTY_THINK) :]
        return reply.removesuffix("\n").removesuffix("<|im_end|>")


def task_turn(task: FunctionTask) -> synthetic.Turn:
    return synthetic.Turn(
        [{"role": "user", "content": task.prompt}, {"role": "assistant", "content": task.answer}]
    )


@dataclass
class ChatCounts:
    tasks: int
    tool_calls: int
    json: int
    greetings: int


_worker_encoder: ChatEncoder | None = None


def _start_worker(folder: Path) -> None:
    global _worker_encoder
    tokenizer = Tokenizer.from_checkpoint(folder)
    _worker_encoder = ChatEncoder(tokenizer, ChatTemplate.builtin(tokenizer))


def _encode_turn(job: tuple[synthetic.Turn, bool]) -> list[int]:
    assert _worker_encoder is not None
    return _worker_encoder.encode(job[0], thinking=job[1])


def _tasks_of(text: str) -> list[FunctionTask]:
    return list(function_tasks(text))


def chat_documents(
    sources: Sequence[str],
    tokenizer_folder: Path,
    *,
    rng: random.Random,
    max_tasks: int,
    task_repeats: int,
    num_tool_calls: int,
    num_json: int,
    num_greetings: int,
) -> tuple[list[list[int]], ChatCounts]:
    """Encoded chat turns: function tasks from the sources, then the synthetic kinds. The turns
    and their thinking switches come from `rng` in order; workers only parse and encode."""
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(initializer=_start_worker, initargs=(tokenizer_folder,)) as pool:
        tasks = [t for found in pool.map(_tasks_of, sources, chunksize=16) for t in found]
        docs, counts = _encode_turns(
            pool, tasks, rng=rng, max_tasks=max_tasks, task_repeats=task_repeats,
            num_tool_calls=num_tool_calls,
            num_json=num_json, num_greetings=num_greetings,
        )  # fmt: skip
    return docs, counts


def _encode_turns(
    pool,
    tasks: list[FunctionTask],
    *,
    rng: random.Random,
    max_tasks: int,
    task_repeats: int,
    num_tool_calls: int,
    num_json: int,
    num_greetings: int,
) -> tuple[list[list[int]], ChatCounts]:
    rng.shuffle(tasks)
    turns = [task_turn(t) for t in tasks[:max_tasks]] * task_repeats
    for _ in range(num_tool_calls):
        turns += synthetic.tool_call_turns(rng)
    turns += [synthetic.json_turn(rng) for _ in range(num_json)]
    turns += [synthetic.greeting_turn(rng) for _ in range(num_greetings)]
    jobs = [(t, rng.random() < 0.5) for t in turns]
    docs = pool.map(_encode_turn, jobs, chunksize=64)
    counts = ChatCounts(min(len(tasks), max_tasks), 2 * num_tool_calls, num_json, num_greetings)
    return docs, counts


def pack(docs: Sequence[Sequence[int]], *, eos_id: int, num_tokens: int, seed: int) -> torch.Tensor:
    """Documents in seeded random order, each followed by `eos_id`, repeated in new orders
    until `num_tokens` ids are reached: one int32 stream."""
    rng = random.Random(seed)
    out: list[int] = []
    order = list(range(len(docs)))
    while len(out) < num_tokens:
        rng.shuffle(order)
        for i in order:
            out.extend(docs[i])
            out.append(eos_id)
            if len(out) >= num_tokens:
                break
    return torch.tensor(out[:num_tokens], dtype=torch.int32)
