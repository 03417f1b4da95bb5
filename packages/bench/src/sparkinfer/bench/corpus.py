"""Prompt text built from the data files shipped in sparkinfer.bench.data.

Everything here is deterministic: the same arguments give the same text on every machine, so a
prompt set sent to our server, vLLM or SGLang is byte-identical.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from sparkinfer.bench.errors import DatasetError

# Qwen-family tokenizers give about 4.5 characters per token on the shipped English prose; used
# only when a server reports no token usage to calibrate against.
DEFAULT_CHARS_PER_TOKEN = 4.5


@cache
def read_data(name: str) -> str:
    """The text of one shipped data file (e.g. 'prose.txt')."""
    return resources.files("sparkinfer.bench.data").joinpath(name).read_text(encoding="utf-8")


@cache
def words() -> tuple[str, ...]:
    """Common English words, each one token with a leading space in BPE vocabularies."""
    return tuple(read_data("words.txt").split())


def random_words(num_words: int, rng: random.Random) -> str:
    vocab = words()
    return " ".join(rng.choice(vocab) for _ in range(num_words))


def unique_prefix(request_idx: int, seed: int, num_words: int = 8) -> str:
    """A random-word opener distinct per request, so no prefix cache shares work across requests."""
    rng = random.Random(seed * 1_000_003 + request_idx)
    return f"[{request_idx}] {random_words(num_words, rng)}."


def random_prompt(num_tokens: int, request_idx: int, seed: int, tokens_per_word: float) -> str:
    """About `num_tokens` tokens of random words, starting with a per-request unique prefix."""
    rng = random.Random(seed * 7_919 + request_idx)
    num_words = max(1, round(num_tokens / tokens_per_word) - 10)
    return f"{unique_prefix(request_idx, seed)} {random_words(num_words, rng)}"


def cut(text: str, num_chars: int, *, repeat: bool = False) -> str:
    """The first `num_chars` characters of `text`, ended at a paragraph or sentence boundary."""
    if repeat and text:
        text = text * (num_chars // len(text) + 1)
    if len(text) <= num_chars:
        return text
    head = text[:num_chars]
    for sep in ("\n\n", "\n", ". "):
        idx = head.rfind(sep)
        if idx > num_chars // 2:
            return head[: idx + len(sep)].rstrip() + "\n"
    return head


def prose(num_chars: int) -> str:
    """Natural prose (generated once by scripts/make_data.py, seeded), repeated past its end."""
    return cut(read_data("prose.txt"), num_chars, repeat=True)


@dataclass(frozen=True)
class Workload:
    name: str
    prompt: str
    max_tokens: int


def workload_prompts(run_idx: int, names: tuple[str, ...] | None = None) -> list[Workload]:
    """The shipped chat/code/math/json/repetition prompts (~4K tokens each) for run `run_idx`.

    The run number opens the prompt, so repeated runs never hit a prefix cache, yet the prompts are
    identical across engines.
    """
    spec = json.loads(read_data("workloads.json"))
    known = [w["name"] for w in spec["workloads"]]
    for name in names or ():
        if name not in known:
            raise DatasetError(f"workload {name!r} is unknown; choose from {', '.join(known)}")
    out = []
    for w in spec["workloads"]:
        if names and w["name"] not in names:
            continue
        source = w["text"] if "text" in w else read_data(w["source"])
        body = cut(source, w["num_chars"], repeat="text" in w)
        prompt = f"Run {run_idx + 1}.\n\n{body.rstrip()}\n\n{w['instruction']}"
        out.append(Workload(name=w["name"], prompt=prompt, max_tokens=spec["max_tokens"]))
    return out


@dataclass(frozen=True)
class DatasetPrompt:
    """One line of a user dataset: a plain prompt, or chat messages."""

    prompt: str | None
    messages: list[dict[str, str]] | None


def load_dataset(path: Path) -> list[DatasetPrompt]:
    """Read a JSONL file: each line a string, {"prompt": str} or {"messages": [...]}."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise DatasetError(f"--dataset {path} cannot be read ({e}): give a JSONL file") from e
    prompts = []
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise DatasetError(f"--dataset {path} line {line_no} is not JSON ({e})") from e
        if isinstance(item, str):
            prompts.append(DatasetPrompt(prompt=item, messages=None))
        elif isinstance(item, dict) and isinstance(item.get("prompt"), str):
            prompts.append(DatasetPrompt(prompt=item["prompt"], messages=None))
        elif isinstance(item, dict) and isinstance(item.get("messages"), list):
            prompts.append(DatasetPrompt(prompt=None, messages=item["messages"]))
        else:
            raise DatasetError(
                f"--dataset {path} line {line_no} has neither a 'prompt' string nor a 'messages' "
                'list: write {"prompt": "..."} or '
                '{"messages": [{"role": "user", "content": "..."}]}'
            )
    if not prompts:
        raise DatasetError(f"--dataset {path} holds no prompts: add one JSON object per line")
    return prompts
