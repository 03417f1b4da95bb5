import pytest
from sparkinfer.scheduler._request_checks import request_max_len
from sparkinfer.scheduler.errors import ContextLengthExceeded, InvalidRequest, RequestTooLarge
from sparkinfer.scheduler.request import SamplingParams


def max_len(prompt_len: int, max_tokens: int | None, *, cached: int = 16, window: int = 32) -> int:
    params = SamplingParams(max_tokens=max_tokens)
    return request_max_len(
        [1] * prompt_len, params, vocab_size=10, max_model_len=window, max_cached_tokens=cached
    )


def test_max_len_is_the_window_or_the_cache_plus_the_last_sample():
    assert max_len(4, 6) == 10
    assert max_len(4, None) == 17  # 16 cached tokens, and the last sample never enters the cache
    assert max_len(4, None, cached=100) == 32
    assert max_len(4, 13) == 17


def test_what_does_not_fit_is_refused_with_what_to_do():
    with pytest.raises(RequestTooLarge, match="needs 17 tokens of KV cache; it holds 16"):
        max_len(4, 14)
    with pytest.raises(RequestTooLarge, match="the KV cache holds 16"):
        max_len(17, None)
    with pytest.raises(ContextLengthExceeded, match="raise max_model_len"):
        max_len(32, None, cached=100)
    with pytest.raises(InvalidRequest, match=r"stop_token_ids holds 10; token ids must be in"):
        request_max_len(
            [1], SamplingParams(stop_token_ids=(10,)), vocab_size=10, max_model_len=32,
            max_cached_tokens=16,
        )  # fmt: skip
