"""Property test of the tool_choice auto grammar: whatever tokens are drawn within it, every
call that comes out parses and validates against its declared tool, and no call markup is left
in the content.

No model is needed: a seeded random walk draws each next token among those the grammar allows
(biased towards opening calls and ending), like a sampler over arbitrary logits would.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
import xgrammar as xgr
from sparkinfer.api.chat_output import ChatOutput
from sparkinfer.api.conversation_value import Conversation
from sparkinfer.api.grammar import GrammarCompiler, auto_tool_grammar
from sparkinfer.api.schemas.chat import ChatCompletionRequest
from sparkinfer.api.tools import ToolSet, check_tools
from sparkinfer.model.tokenizer import Tokenizer

NUM_WALKS = 12
MAX_STEPS = 120
_BITS = torch.arange(32, dtype=torch.int32)
# Bounded parameter schemas: each closes within a bounded number of tokens whatever is drawn.
PROPERTIES: list[dict[str, Any]] = [
    {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
    {"type": "boolean"},
    {"type": "integer", "minimum": 0, "maximum": 99},
    {"type": "string", "maxLength": 6},
    {"type": "string", "pattern": "^[a-z]{1,4}$"},
    {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 2},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
     "additionalProperties": False},
]  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.embedded()


@pytest.fixture(scope="module")
def grammars(tokenizer: Tokenizer) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, model_vocab_size=tokenizer.vocab_size)


def _random_tools(rng: random.Random) -> list[dict[str, Any]]:
    tools = []
    for t in range(rng.randint(1, 3)):
        names = rng.sample(range(len(PROPERTIES)), rng.randint(1, 3))
        props = {f"p{i}": PROPERTIES[i] for i in names}
        required = [p for p in props if rng.random() < 0.6]
        params = {"type": "object", "properties": props, "required": required}
        tools.append({"type": "function", "function": {"name": f"tool_{t}", "parameters": params}})
    return tools


def _allowed(bitmask: torch.Tensor, vocab_size: int) -> list[int]:
    bits = (bitmask[0].unsqueeze(-1) >> _BITS) & 1  # [words, 32]
    return torch.nonzero(bits.flatten()[:vocab_size]).flatten().tolist()


def _walk(
    rng: random.Random, matcher: xgr.GrammarMatcher, tokenizer: Tokenizer, favoured: list[int]
) -> tuple[list[int], bool]:
    """Draw tokens within the grammar; True when it ended (a stop token), False when cut."""
    bitmask = xgr.allocate_token_bitmask(1, tokenizer.vocab_size)
    eos = set(tokenizer.eos_token_ids)
    out: list[int] = []
    for step in range(MAX_STEPS):
        matcher.fill_next_token_bitmask(bitmask)
        allowed = _allowed(bitmask, tokenizer.vocab_size)
        ends = [t for t in allowed if t in eos]
        opens = [t for t in favoured if t in allowed]
        if ends and rng.random() < min(0.9, step / MAX_STEPS + 0.1):
            assert matcher.accept_token(ends[0])
            return out, True
        jump = matcher.find_jump_forward_string()
        if opens and rng.random() < 0.3:
            token = rng.choice(opens)
        elif jump and rng.random() < 0.5:  # the structure's next fixed text, as a model would
            token = tokenizer.encode(jump, allow_special=True)[0]
            token = token if token in allowed else rng.choice(allowed)
        else:
            token = rng.choice(allowed)
        assert matcher.accept_token(token)
        if matcher.is_terminated():  # a stop token drawn among the others
            return out, True
        out.append(token)
    return out, False


def _spelled(tokenizer: Tokenizer, ids: list[int]) -> str:
    return b"".join(tokenizer.token_bytes(t) for t in ids).decode(errors="replace")


@pytest.mark.parametrize("seed", range(NUM_WALKS))
def test_every_call_written_under_auto_parses_and_validates(
    tokenizer: Tokenizer, grammars: GrammarCompiler, seed: int
) -> None:
    rng = random.Random(seed)
    tools = _random_tools(rng)
    is_thinking, is_parallel = seed % 3 == 0, seed % 2 == 0
    req = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "tools": tools}
    )
    toolset = check_tools(Conversation.of(req))
    assert isinstance(toolset, ToolSet)
    tag = auto_tool_grammar(
        [(t.function.name, t.function.parameters) for t in toolset.tools],
        is_parallel=is_parallel,
        is_thinking=is_thinking,
        reasoning_budget=4 if is_thinking else None,
    )
    matcher = xgr.GrammarMatcher(grammars.compile(tag))
    favoured = [tokenizer.token_to_id(t) for t in ("<tool_call>", "</think>")]
    ids, has_ended = _walk(rng, matcher, tokenizer, [t for t in favoured if t is not None])
    text = _spelled(tokenizer, ids)
    out = ChatOutput(
        is_thinking=is_thinking,
        is_reasoning_excluded=False,
        tools=toolset,
        is_tool_call_forced=False,
        response_schema=None,
    )
    out.feed(text)
    message, _ = out.final_message("stop" if has_ended else "length")
    answer = text.split("</think>", 1)[-1]
    num_opened = answer.count("<tool_call>")
    num_closed = num_opened if has_ended else answer.count("</function>\n</tool_call>")
    calls = message.tool_calls or []
    assert len(calls) == num_closed, text  # none dropped: each call was well formed
    for call in calls:
        assert toolset.check_arguments(call.function.name, call.function.arguments) is None
    assert "<tool_call>" not in (message.content or "")
    if not is_parallel:
        assert num_opened <= 1
