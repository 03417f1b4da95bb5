"""The training corpus: Python source read from the training machine's own installation, plus
synthetic chat turns, encoded into one token stream with a loss mask.

Raw files: the standard library's train split, then installed packages' sources in a fixed
pseudo-random order (by path hash) up to a character budget; a package file whose name the split
rule holds out, or whose text equals a held-out file's, is skipped. Chat turns: "write a
function" tasks whose answers pass their own tests, tool calls and plain answers under declared
tools, JSON objects and greetings, each rendered by the model's own chat template with thinking on
or off, exactly as the server renders a request; the loss counts only the replies.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import random
import sysconfig
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import synthetic
import tokenizers
import tool_turns
import torch
from sparkinfer.bench.evals.code_corpus import is_held_out, read_source, split_files, stdlib_root
from sparkinfer.bench.evals.task_check import passes_tests
from sparkinfer.bench.evals.task_prompts import (
    WrittenTask,
    check_training_tasks,
    readme_task,
    sample_training_task,
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
    """Turns → ids: the prompt as the server renders and encodes it, then the target reply. The
    mask marks the reply's tokens (and the end of the turn): the loss counts only those."""

    def __init__(self, tokenizer: Tokenizer, template: ChatTemplate) -> None:
        self.tokenizer = tokenizer
        self.template = template

    def encode(self, turn: synthetic.Turn, *, thinking: bool) -> tuple[list[int], list[int]]:
        history = turn.messages[:-1]
        prompt = self.template.render(
            history, tools=turn.tools, options=ChatOptions(enable_thinking=thinking)
        )
        reply = self._reply_text(turn)
        completion = ("\n</think>\n\n" if thinking else "") + reply + "<|im_end|>"
        head = self.tokenizer.encode_chat(prompt.segments)
        tail = self.tokenizer.encode(completion, allow_special=True)
        return head + tail, [0] * len(head) + [1] * len(tail)

    def _reply_text(self, turn: synthetic.Turn) -> str:
        """The target message as the template renders it in history, after its think block."""
        full = self.template.render(
            turn.messages, tools=turn.tools, options=ChatOptions(add_generation_prompt=False)
        ).text
        reply = full[full.rindex(ASSISTANT_OPEN) + len(ASSISTANT_OPEN) :]
        if reply.startswith(EMPTY_THINK):
            reply = reply[len(EMPTY_THINK) :]
        return reply.removesuffix("\n").removesuffix("<|im_end|>")


@dataclass
class ChatCounts:
    tasks: int  # distinct checked "write a function" turns
    task_families: int
    tool_calls: int  # call turns, and as many answers that read a result
    unserved: int  # tools declared, none fits: a plain answer
    plain_with_tools: int  # code or greetings with unrelated tools declared
    json: int
    greetings: int
    readme_copies: int


@dataclass(frozen=True)
class ChatMix:
    num_tasks: int
    num_tool_calls: int
    num_unserved: int
    num_plain_with_tools: int
    num_json: int
    num_greetings: int
    num_readme: int
    thinking_rate: float  # share of turns rendered with thinking on (the server's default)


_worker_encoder: ChatEncoder | None = None


def _start_worker(folder: Path) -> None:
    global _worker_encoder
    tokenizer = Tokenizer.from_checkpoint(folder)
    _worker_encoder = ChatEncoder(tokenizer, ChatTemplate.builtin(tokenizer))


def _encode_turn(job: tuple[synthetic.Turn, bool]) -> tuple[list[int], list[int]]:
    assert _worker_encoder is not None
    return _worker_encoder.encode(job[0], thinking=job[1])


def checked_tasks(rng: random.Random, num: int) -> list[WrittenTask]:
    """`num` sampled training tasks, each kept only when its solution passes its own tests (run in
    child processes with a time limit; each distinct solution and test pair runs once)."""
    tasks = [sample_training_task(rng) for _ in range(num)]
    pairs = sorted({(t.solution, t.test_code) for t in tasks})
    chunks = [pairs[i : i + 500] for i in range(0, len(pairs), 500)]
    with ThreadPoolExecutor(max(1, min(16, os.cpu_count() or 1))) as pool:
        results = [ok for found in pool.map(passes_tests, chunks) for ok in found]
    passed = {p for p, ok in zip(pairs, results, strict=True) if ok}
    return [t for t in tasks if (t.solution, t.test_code) in passed]


def chat_documents(
    tokenizer_folder: Path, *, rng: random.Random, mix: ChatMix
) -> tuple[list[tuple[list[int], list[int]]], ChatCounts]:
    """Encoded chat turns with their loss masks. The turns and their thinking switches come from
    `rng` in order; workers only render and encode."""
    tasks = checked_tasks(rng, mix.num_tasks)
    check_training_tasks(tasks)
    readme = readme_task()
    if passes_tests([(readme.solution, readme.test_code)]) != [True]:
        raise RuntimeError("the README example's reference answer fails its tests: fix its family")
    turns = [synthetic.task_turn(t) for t in tasks]
    turns += [synthetic.task_turn(readme)] * mix.num_readme
    for _ in range(mix.num_tool_calls):
        turns += tool_turns.call_turns(rng)
    turns += [tool_turns.unserved_turn(rng) for _ in range(mix.num_unserved)]
    for _ in range(mix.num_plain_with_tools):
        plain = (
            synthetic.task_turn(rng.choice(tasks))
            if rng.random() < 0.7
            else synthetic.greeting_turn(rng)
        )
        turns.append(tool_turns.with_tools(rng, plain))
    turns += [synthetic.json_turn(rng) for _ in range(mix.num_json)]
    turns += [synthetic.greeting_turn(rng) for _ in range(mix.num_greetings)]
    jobs = [(t, rng.random() < mix.thinking_rate) for t in turns]
    ctx = multiprocessing.get_context("fork")
    workers = min(16, os.cpu_count() or 1)
    with ctx.Pool(workers, initializer=_start_worker, initargs=(tokenizer_folder,)) as pool:
        docs = pool.map(_encode_turn, jobs, chunksize=256)
    counts = ChatCounts(
        len(tasks),
        len({t.family for t in tasks}),
        mix.num_tool_calls,
        mix.num_unserved,
        mix.num_plain_with_tools,
        mix.num_json,
        mix.num_greetings,
        mix.num_readme,
    )
    return docs, counts


def pack(
    docs: Sequence[tuple[Sequence[int], Sequence[int]]], *, eos_id: int, num_tokens: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) documents in seeded random order, each followed by `eos_id`, repeated in new
    orders until `num_tokens` ids are reached: one int32 stream of ids and one uint8 loss mask
    (1 where the token is a target)."""
    rng = random.Random(seed)
    ids = [np.append(np.asarray(d[0], dtype=np.int32), np.int32(eos_id)) for d in docs]
    masks = [np.append(np.asarray(d[1], dtype=np.uint8), np.uint8(1)) for d in docs]
    per_pass = sum(len(a) for a in ids)
    order = list(range(len(docs)))
    id_parts: list[np.ndarray] = []
    mask_parts: list[np.ndarray] = []
    for _ in range(-(-num_tokens // per_pass)):
        rng.shuffle(order)
        id_parts += [ids[i] for i in order]
        mask_parts += [masks[i] for i in order]
    return (
        torch.from_numpy(np.concatenate(id_parts)[:num_tokens].copy()),
        torch.from_numpy(np.concatenate(mask_parts)[:num_tokens].copy()),
    )
