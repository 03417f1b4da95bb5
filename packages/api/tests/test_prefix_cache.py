"""The prefix cache through the server: a repeated long prompt reports its cached tokens."""

from __future__ import annotations

import openai

from .conftest import serve


def test_a_repeated_prompt_reports_cached_tokens_and_the_same_text() -> None:
    with serve(max_num_seqs=4, prefix_cache_snapshots=2, prefix_cache_min_tokens=128) as running:
        client = openai.OpenAI(base_url=running.v1, api_key="unused")
        model = client.models.list().data[0].id
        prompt = [(7 * i + 3) % 200 + 10 for i in range(300)]  # token ids: 300 tokens
        first, again = (
            client.completions.create(model=model, prompt=prompt, max_tokens=5, temperature=0)
            for _ in range(2)
        )
        assert first.usage is not None and again.usage is not None
        assert first.usage.prompt_tokens_details is not None
        assert again.usage.prompt_tokens_details is not None
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        assert again.usage.prompt_tokens_details.cached_tokens == 256  # its 128-token checkpoint
        assert again.choices[0].text == first.choices[0].text
