"""How the server under test counts tokens, so prompts hit a target length on any tokenizer."""

from __future__ import annotations

from sparkinfer.bench import corpus
from sparkinfer.bench.client import OpenAIClient
from sparkinfer.bench.report import log


async def tokens_per_word(client: OpenAIClient, seed: int) -> float:
    """Tokens per random word as the server counts them (the slope of two probes), else 1.0."""
    short = corpus.random_prompt(40, 10**6, seed, 1.0)
    long = corpus.random_prompt(240, 10**6 + 1, seed, 1.0)
    n_short, n_long = (
        await client.count_prompt_tokens(short),
        await client.count_prompt_tokens(long),
    )
    if n_short is None or n_long is None or n_long <= n_short:
        log("server reports no prompt usage: assuming 1 token per random word")
        return 1.0
    return (n_long - n_short) / (len(long.split()) - len(short.split()))


async def chars_per_token(client: OpenAIClient) -> float:
    """Characters of shipped prose per server token (the slope of two probes)."""
    short, long = corpus.prose(300), corpus.prose(2300)
    n_short, n_long = (
        await client.count_prompt_tokens(short),
        await client.count_prompt_tokens(long),
    )
    if n_short is None or n_long is None or n_long <= n_short:
        log(
            f"server reports no prompt usage: assuming {corpus.DEFAULT_CHARS_PER_TOKEN} chars/token"
        )
        return corpus.DEFAULT_CHARS_PER_TOKEN
    return (len(long) - len(short)) / (n_long - n_short)
