"""Long-context determinism: the same arithmetic question after prose of increasing depth, greedy.

Three runs per depth must produce identical text; any difference fails the gate. Whether the answer
is right is reported beside it (a random-weight model cannot answer, so by default it does not
gate).

With a concurrency N (`run_concurrency`) it checks batch invariance instead: each of a few probe
prompts alone, then the probes among the others of a batch of N sent at once, then the same
batch again; every probe must match its output alone and every request its first send.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from sparkinfer.bench import corpus
from sparkinfer.bench.calibration import chars_per_token
from sparkinfer.bench.client import GenRequest, OpenAIClient
from sparkinfer.bench.report import Gate, Plot, Table, log

DEFAULT_DEPTHS = (2048, 4096, 8192, 12288, 24576, 32768)
INTRO = "Read the following story carefully, then answer the question after it.\n\n"
QUESTION = (
    "\n\nQuestion: A warehouse holds 347 crates. In the morning 128 crates are shipped out, and in "
    "the afternoon 59 crates arrive. How many crates are in the warehouse at the end of the day? "
    "Answer with the number only."
)
EXPECTED_ANSWER = "278"
NUM_PROBES = 4
CONCURRENCY_DEPTH = 256  # prompt tokens of the shortest prompt in a concurrent batch
DEPTH_STEP = 24  # each prompt of a batch is this many tokens longer than the one before


def build_prompt(depth_tokens: int, chars_per_tok: float) -> str:
    """INTRO + about `depth_tokens` tokens of prose + QUESTION."""
    return INTRO + corpus.prose(int(depth_tokens * chars_per_tok)) + QUESTION


@dataclass
class DepthResult:
    depth: int
    prompt: str
    prompt_tokens: int | None = None
    outputs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    reference: str | None = None  # the offline plain-torch path's answer, with --reference

    @property
    def is_deterministic(self) -> bool:
        return not self.errors and len(set(self.outputs)) == 1

    @property
    def num_correct(self) -> int:
        return sum(EXPECTED_ANSWER in out for out in self.outputs)

    @property
    def matches_reference(self) -> bool | None:
        if self.reference is None:
            return None
        return self.is_deterministic and self.outputs[0] == self.reference


async def run_depths(
    client: OpenAIClient, depths: Sequence[int], *, num_runs: int, max_tokens: int, seed: int
) -> list[DepthResult]:
    """`num_runs` sequential greedy requests per depth (seeded, temperature 0)."""
    cpt = await chars_per_token(client)
    results = []
    for depth in depths:
        res = DepthResult(depth=depth, prompt=build_prompt(depth, cpt))
        for run in range(num_runs):
            log(f"determinism: depth {depth}, run {run + 1}/{num_runs}")
            out = await client.generate(
                GenRequest(prompt=res.prompt, max_tokens=max_tokens, is_fixed_len=False, seed=seed)
            )
            if out.error:
                res.errors.append(out.error)
                continue
            res.prompt_tokens = out.prompt_tokens
            res.outputs.append(out.text)
        results.append(res)
    return results


@dataclass
class ConcurrencyResult:
    """Outputs of one batch-invariance check: probes alone, then the batch (probes first) twice."""

    concurrency: int
    alone: list[str | None] = field(default_factory=list)
    first: list[str | None] = field(default_factory=list)
    second: list[str | None] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def num_probes_identical(self) -> int:
        return sum(a is not None and a == b for a, b in zip(self.alone, self.first, strict=False))

    @property
    def num_batch_identical(self) -> int:
        return sum(a is not None and a == b for a, b in zip(self.first, self.second, strict=True))

    @property
    def is_invariant(self) -> bool:
        return (
            not self.errors
            and self.num_probes_identical == len(self.alone)
            and self.num_batch_identical == self.concurrency
        )


async def run_concurrency(
    client: OpenAIClient,
    concurrency: int,
    *,
    num_probes: int = NUM_PROBES,
    max_tokens: int,
    seed: int,
) -> ConcurrencyResult:
    """Each probe alone, then a batch of `concurrency` requests at once whose first ones are the
    probes, then that batch again (greedy, seeded). Prompts differ in length, so the batch's rows
    cross kernel tiles, chunk budgets and split plans that a probe alone never sees."""
    cpt = await chars_per_token(client)
    prompts = [build_prompt(CONCURRENCY_DEPTH + i * DEPTH_STEP, cpt) for i in range(concurrency)]
    res = ConcurrencyResult(concurrency=concurrency)

    async def one(prompt: str) -> str | None:
        out = await client.generate(
            GenRequest(prompt=prompt, max_tokens=max_tokens, is_fixed_len=True, seed=seed)
        )
        if out.error:
            res.errors.append(out.error)
            return None
        return out.text

    for i, prompt in enumerate(prompts[: min(num_probes, concurrency)]):
        log(f"determinism: probe {i + 1} alone")
        res.alone.append(await one(prompt))
    for name, outputs in (("first", res.first), ("second", res.second)):
        log(f"determinism: {concurrency} requests at once ({name} send)")
        outputs.extend(await asyncio.gather(*(one(p) for p in prompts)))
    return res


def concurrency_table(results: list[ConcurrencyResult]) -> Table:
    rows = [
        [
            r.concurrency,
            f"{r.num_probes_identical}/{len(r.alone)}",
            f"{r.num_batch_identical}/{r.concurrency}",
            len(r.errors),
        ]
        for r in results
    ]
    notes = [f"concurrency {r.concurrency} error: {e[:200]}" for r in results for e in r.errors[:1]]
    return Table(
        "determinism: greedy, probes alone vs among the batch, and the batch sent twice",
        ["concurrency", "probes = alone", "batch = its resend", "errors"],
        rows,
        notes,
    )


def concurrency_gates(results: list[ConcurrencyResult]) -> list[Gate]:
    bad = [r.concurrency for r in results if not r.is_invariant]
    return [Gate("batch invariance", not bad, f"differing or failed at: {bad or 'none'}")]


def table(results: list[DepthResult], *, num_runs: int) -> Table:
    has_ref = any(r.reference is not None for r in results)
    cols = ["depth", "prompt tokens", "identical", "correct", "distinct outputs", "first output"]
    rows = []
    for r in results:
        row: list[object] = [
            r.depth,
            r.prompt_tokens,
            r.is_deterministic,
            f"{r.num_correct}/{num_runs}",
            len(set(r.outputs)) + len(r.errors),
            _short(r.outputs[0] if r.outputs else r.errors[0]),
        ]
        if has_ref:
            row.append(r.matches_reference)
        rows.append(row)
    notes = [
        f"depth {r.depth} run outputs: {[_short(o) for o in r.outputs]}"
        for r in results
        if not r.is_deterministic and r.outputs
    ]
    notes += [f"depth {r.depth} error: {e[:200]}" for r in results for e in r.errors[:1]]
    return Table(
        f"determinism: greedy, {num_runs} runs per depth, expected answer {EXPECTED_ANSWER}",
        [*cols, "= reference"] if has_ref else cols,
        rows,
        notes,
    )


def gates(results: list[DepthResult], *, is_correct_required: bool) -> list[Gate]:
    bad = [r.depth for r in results if not r.is_deterministic]
    out = [Gate("cross-run determinism", not bad, f"differing or failed depths: {bad or 'none'}")]
    if any(r.reference is not None for r in results):
        off = [r.depth for r in results if r.matches_reference is False]
        out.append(Gate("matches reference", not off, f"depths off the reference: {off or 'none'}"))
    if is_correct_required:
        wrong = [r.depth for r in results if r.num_correct != len(r.outputs) or r.errors]
        out.append(Gate("correct answer", not wrong, f"wrong at depths: {wrong or 'none'}"))
    return out


def plot(results: list[DepthResult], num_runs: int) -> Plot:
    x = [r.prompt_tokens or r.depth for r in results]
    return Plot(
        "determinism.png",
        "Determinism and correctness vs depth",
        "prompt tokens",
        "runs",
        x,
        {
            "identical runs": [float(num_runs if r.is_deterministic else 0) for r in results],
            "correct runs": [float(r.num_correct) for r in results],
        },
        is_log_x=True,
    )


def _short(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= 40 else flat[:37] + "..."
