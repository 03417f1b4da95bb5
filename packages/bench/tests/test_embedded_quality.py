"""The embedded code model, measured on held-out files of this machine's standard library (the
split rule of `evals.code_corpus`) and on held-out "write a function" tasks (`evals.task_prompts`):
logits and perplexity equal transformers', perplexity far below a uniform guess, MTP drafts that
agree with the trunk's own next-but-one token, answers to held-out tasks that pass their unit
tests at the checkpoint's default sampling, the README example right on every run, and no answer
that loops until the length limit."""

from __future__ import annotations

import json
import math
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest
import torch
from sparkinfer.bench.evals.code_corpus import (
    answer_code,
    function_tasks,
    parses,
    read_source,
    split_files,
    stdlib_root,
)
from sparkinfer.bench.evals.task_check import passes_tests
from sparkinfer.bench.evals.task_prompts import WrittenTask, held_out_tasks, readme_task
from sparkinfer.model.cache_spec import allocate_caches
from sparkinfer.model.chat_template import ChatOptions, ChatTemplate
from sparkinfer.model.config import parse_generation_defaults, parse_model_config
from sparkinfer.model.decoder import Qwen3_8ForCausalLM
from sparkinfer.model.embedded import embedded_checkpoint_dir
from sparkinfer.model.forward_batch import ForwardBatch
from sparkinfer.model.tokenizer import Tokenizer
from sparkinfer.model.weights import load_model

if TYPE_CHECKING:
    from sparkinfer.scheduler.request import SamplingParams as SamplingParamsT

NUM_FILES = 6  # held-out files scored, their first WINDOW tokens each
WINDOW = 384
NUM_TASKS = 16
MAX_ANSWER_TOKENS = 160
BLOCK = 16
NUM_README_RUNS = 10
HELD_OUT_GOAL = 24  # of 32
REPEAT_NGRAM = 4  # an answer that hit the length limit with a 4-gram seen 3 times is degenerate


@dataclass
class Scored:
    ids: list[int]
    hidden: torch.Tensor  # [T, hidden], after the final norm
    logits: torch.Tensor  # [T, vocab] fp32


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_checkpoint(embedded_checkpoint_dir())


@pytest.fixture(scope="module")
def model() -> Qwen3_8ForCausalLM:
    return load_model(
        embedded_checkpoint_dir(), device="cpu", dtype=torch.float32, progress=False, use_mtp=True
    )


@pytest.fixture(scope="module")
def held_out_windows(tokenizer: Tokenizer) -> list[list[int]]:
    root = stdlib_root()
    texts = [t for p in split_files(root)[1] if (t := read_source(root / p)) and len(t) > 4000]
    assert len(texts) >= NUM_FILES, "this Python installation holds too few held-out files"
    return [tokenizer.encode(t)[:WINDOW] for t in texts[:NUM_FILES]]


def _batch(model: Qwen3_8ForCausalLM, num_tokens: int, positions=None):
    num_blocks = -(-(num_tokens + 1) // BLOCK)
    caches = allocate_caches(
        model.cache_spec(), num_blocks=num_blocks, block_size=BLOCK, num_slots=1, device="cpu"
    )
    return ForwardBatch.build(
        [num_tokens], [0], [list(range(num_blocks))], [0], caches=caches, block_size=BLOCK,
        device="cpu", positions=positions,
    )  # fmt: skip


@pytest.fixture(scope="module")
def scored(model: Qwen3_8ForCausalLM, held_out_windows: list[list[int]]) -> list[Scored]:
    out = []
    for ids in held_out_windows:
        with torch.no_grad():
            hidden = model(torch.tensor(ids), _batch(model, len(ids)))
            out.append(Scored(ids, hidden, model.compute_logits(hidden)))
    return out


def _nll(logits: torch.Tensor, ids: list[int]) -> tuple[float, int]:
    target = torch.tensor(ids[1:])
    loss = torch.nn.functional.cross_entropy(logits[:-1], target, reduction="sum")
    return loss.item(), len(target)


def test_logits_and_perplexity_equal_transformers(scored: list[Scored]) -> None:
    from transformers import Qwen3_5ForCausalLM

    hf = Qwen3_5ForCausalLM.from_pretrained(embedded_checkpoint_dir(), dtype=torch.float32).eval()
    ours_nll = theirs_nll = 0.0
    count = 0
    for s in scored[:3]:
        with torch.no_grad():
            ref = hf(torch.tensor([s.ids])).logits[0]
        scale = ref.abs().max().item()
        assert (s.logits - ref).abs().max().item() <= 1e-4 * scale
        a, n = _nll(s.logits, s.ids)
        b, _ = _nll(ref, s.ids)
        ours_nll, theirs_nll, count = ours_nll + a, theirs_nll + b, count + n
    assert math.exp(ours_nll / count) == pytest.approx(math.exp(theirs_nll / count), rel=1e-4)


def test_held_out_perplexity_is_far_below_uniform(
    scored: list[Scored], tokenizer: Tokenizer
) -> None:
    total, count = 0.0, 0
    for s in scored:
        nll, n = _nll(s.logits, s.ids)
        total, count = total + nll, count + n
    perplexity = math.exp(total / count)
    print(f"held-out perplexity {perplexity:.2f} over {count} tokens")
    assert perplexity < tokenizer.vocab_size / 100  # uniform: the vocabulary size


def test_mtp_first_drafts_agree_with_the_trunk(
    model: Qwen3_8ForCausalLM, scored: list[Scored]
) -> None:
    head = model.mtp
    assert head is not None
    agree = total = 0
    for s in scored:
        n = len(s.ids) - 1  # row p pairs H_p with the known token at p + 1
        embeds = model.embed_input_ids(torch.tensor(s.ids[1:]))
        batch = _batch(model, n, positions=torch.arange(1, n + 1))
        with torch.no_grad():
            drafts = model.compute_logits(head(embeds, s.hidden[:-1], batch)).argmax(-1)
        trunk_next = s.logits[1:].argmax(-1)  # the trunk's own token for p + 2
        agree += int((drafts[:-1] == trunk_next[:-1]).sum())
        total += n - 1
    rate = agree / total
    print(f"MTP first-draft agreement {rate:.3f} over {total} positions")
    assert rate >= 0.5


def test_half_of_the_write_a_function_answers_parse(
    model: Qwen3_8ForCausalLM, tokenizer: Tokenizer
) -> None:
    from sparkinfer.scheduler.config import SchedulerConfig
    from sparkinfer.scheduler.engine import Engine
    from sparkinfer.scheduler.request import SamplingParams

    root = stdlib_root()
    tasks = [t for p in split_files(root)[1] for t in function_tasks(read_source(root / p) or "")]
    random.Random(0).shuffle(tasks)
    template = ChatTemplate.from_checkpoint(embedded_checkpoint_dir(), tokenizer)
    options = ChatOptions(enable_thinking=False)
    prompts = [
        tokenizer.encode_chat(
            template.render([{"role": "user", "content": t.prompt}], options=options).segments
        )
        for t in tasks[:NUM_TASKS]
    ]
    config = SchedulerConfig(
        max_num_seqs=NUM_TASKS, max_model_len=1024, eos_token_ids=tokenizer.eos_token_ids
    )
    engine = Engine.from_model(model, config, device="cpu")
    params = SamplingParams(temperature=0.0, max_tokens=MAX_ANSWER_TOKENS)
    try:
        with ThreadPoolExecutor(NUM_TASKS) as pool:
            answers = list(pool.map(lambda ids: engine.generate(ids, params), prompts))
    finally:
        engine.shutdown()
    ok = sum(parses(answer_code(tokenizer.decode(a, skip_special=True))) for a in answers)
    print(f"{ok} of {len(answers)} answers parse")
    assert ok >= len(answers) / 2


@dataclass
class Answer:
    task: WrittenTask
    text: str
    is_length: bool  # stopped by max_tokens, not by an end token


def _default_params(seed: int) -> SamplingParamsT:
    from sparkinfer.scheduler.request import SamplingParams

    folder = embedded_checkpoint_dir()
    config = parse_model_config(json.loads((folder / "config.json").read_text()))
    gen = parse_generation_defaults(
        json.loads((folder / "generation_config.json").read_text()), config=config
    )
    return SamplingParams(
        temperature=gen.temperature, top_k=gen.top_k, top_p=gen.top_p, min_p=gen.min_p,
        repetition_penalty=gen.repetition_penalty, seed=seed, max_tokens=MAX_ANSWER_TOKENS,
    )  # fmt: skip


@pytest.fixture(scope="module")
def default_answers(model: Qwen3_8ForCausalLM, tokenizer: Tokenizer) -> list[Answer]:
    """The held-out tasks and NUM_README_RUNS runs of the README example, rendered as the server
    renders a request by default (thinking on), sampled with the checkpoint's defaults, one seed
    each, through one engine."""
    from sparkinfer.scheduler.config import SchedulerConfig
    from sparkinfer.scheduler.engine import Engine

    tasks = held_out_tasks() + [readme_task()] * NUM_README_RUNS
    template = ChatTemplate.from_checkpoint(embedded_checkpoint_dir(), tokenizer)
    prompts = [
        tokenizer.encode_chat(
            template.render([{"role": "user", "content": t.prompt}], options=ChatOptions()).segments
        )
        for t in tasks
    ]
    config = SchedulerConfig(
        max_num_seqs=len(tasks), max_model_len=1024, eos_token_ids=tokenizer.eos_token_ids
    )
    engine = Engine.from_model(model, config, device="cpu")
    try:
        with ThreadPoolExecutor(len(tasks)) as pool:
            outs = list(pool.map(lambda i: engine.generate(prompts[i], _default_params(i)),
                                 range(len(tasks))))  # fmt: skip
    finally:
        engine.shutdown()
    eos = set(tokenizer.eos_token_ids)
    return [
        Answer(t, tokenizer.decode(out, skip_special=True),
               len(out) >= MAX_ANSWER_TOKENS and out[-1] not in eos)
        for t, out in zip(tasks, outs, strict=True)
    ]  # fmt: skip


def _passing(answers: list[Answer]) -> list[bool]:
    return passes_tests([(answer_code(a.text), a.task.test_code) for a in answers])


@pytest.mark.xfail(
    strict=True,
    reason="issue 53: the shipped model passes 12 of 32 (most bodies are right, but it often "
    "writes a training name instead of the held-out one); the goal stays 24",
)
def test_held_out_functions_pass_their_unit_tests(default_answers: list[Answer]) -> None:
    held = default_answers[:-NUM_README_RUNS]
    ok = _passing(held)
    for a, passed in zip(held, ok, strict=True):
        print(f"{'PASS' if passed else 'FAIL'} {a.task.prompt}\n{answer_code(a.text)}")
    print(f"{sum(ok)} of {len(held)} held-out functions pass their unit tests")
    assert sum(ok) >= HELD_OUT_GOAL


def test_the_readme_example_is_right_on_every_run(default_answers: list[Answer]) -> None:
    runs = default_answers[-NUM_README_RUNS:]
    ok = _passing(runs)
    print(f"README example right on {sum(ok)} of {len(runs)} runs")
    assert all(ok), [a.text for a, good in zip(runs, ok, strict=True) if not good]


def _has_repeated_ngram(ids: list[str], n: int = REPEAT_NGRAM, times: int = 3) -> bool:
    counts: dict[tuple[str, ...], int] = {}
    for i in range(len(ids) - n + 1):
        gram = tuple(ids[i : i + n])
        counts[gram] = counts.get(gram, 0) + 1
        if counts[gram] >= times:
            return True
    return False


def test_no_answer_loops_until_the_length_limit(default_answers: list[Answer]) -> None:
    held = default_answers[:-NUM_README_RUNS]
    looping = [a.text for a in held if a.is_length and _has_repeated_ngram(a.text.split())]
    print(f"{len(looping)} of {len(held)} answers ended by length with a repeated 4-gram")
    assert not looping, looping
