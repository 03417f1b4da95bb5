import math

import torch
from sparkinfer.scheduler.request import Request, SamplingParams
from sparkinfer.scheduler.sampler import Sampler, token_logprobs

VOCAB = 10


def req(params: SamplingParams, output: tuple[int, ...] = (), prompt=(0,)) -> Request:
    r = Request("r", list(prompt), params, max_len=100)
    r.token_ids.extend(output)
    return r


def sample(params, logits, **kw):
    return Sampler(eos_token_ids=(9,), device="cpu").sample(logits, [req(params, **kw)])[0]


def peaked(*ranks):
    """Logits where token ranks[0] is most likely, then ranks[1], and so on."""
    logits = torch.zeros(1, VOCAB)
    for i, t in enumerate(ranks):
        logits[0, t] = 10.0 - i
    return logits


def test_greedy_and_logit_bias():
    assert sample(SamplingParams(temperature=0), peaked(3, 4)).token_id == 3
    biased = SamplingParams(temperature=0, logit_bias=((4, 5.0),))
    assert sample(biased, peaked(3, 4)).token_id == 4


def test_penalties_move_away_from_repeated_tokens():
    logits = peaked(3, 4)
    freq = SamplingParams(temperature=0, frequency_penalty=2.0)
    presence = SamplingParams(temperature=0, presence_penalty=2.0)
    repetition = SamplingParams(temperature=0, repetition_penalty=2.0)
    assert sample(freq, logits, output=(3,)).token_id == 4
    assert sample(presence, logits, output=(3,)).token_id == 4
    assert sample(repetition, logits, prompt=(3,)).token_id == 4


def test_edits_leave_the_callers_logits_as_the_model_gave_them():
    """Bias, penalties and early-stop masks edit a copy: the logits are the runner's (a graph's
    output) and logprobs read the model's own distribution from them."""
    logits = peaked(3, 4, 9)
    before = logits.clone()
    sampler = Sampler(eos_token_ids=(9,), device="cpu")
    for params in (
        SamplingParams(temperature=0, logit_bias=((4, 5.0),), logprobs=2),
        SamplingParams(temperature=0, frequency_penalty=2.0),
        SamplingParams(temperature=0, min_tokens=2),
    ):
        sampler.sample(logits, [req(params, output=(3,))])
        assert torch.equal(logits, before)
    assert sampler.sample(logits, [req(SamplingParams(temperature=0))])[0].token_id == 3


def test_penalties_count_an_output_still_on_the_device():
    """With steps overlapped, a request's last output may not have reached the host: passed as
    an in-flight output it is penalised exactly as when the host holds it."""
    logits = peaked(3, 4, 5)
    sampler = Sampler(eos_token_ids=(), device="cpu")
    for params in (
        SamplingParams(temperature=0, frequency_penalty=3.0),
        SamplingParams(temperature=0, presence_penalty=3.0),
        SamplingParams(temperature=0, repetition_penalty=2.0),
    ):
        known = sampler.sample(logits, [req(params, output=(4, 3))])[0].token_id
        inflight = sampler.sample(logits, [req(params, output=(4,))], [1], [torch.tensor([3])])[
            0
        ].token_id
        assert inflight == known == 5


def test_min_tokens_masks_eos_and_stop_ids():
    logits = peaked(9, 5, 2)
    assert sample(SamplingParams(temperature=0), logits).token_id == 9
    assert sample(SamplingParams(temperature=0, min_tokens=1), logits).token_id == 5
    p = SamplingParams(temperature=0, min_tokens=1, stop_token_ids=(5,))
    assert sample(p, logits).token_id == 2
    no_eos = SamplingParams(temperature=0, min_tokens=1, ignore_eos=True)
    assert sample(no_eos, logits).token_id == 9


def test_top_k_top_p_min_p_keep_only_the_head():
    logits = torch.zeros(1, VOCAB)
    logits[0, :3] = torch.tensor([2.0, 1.9, 1.8])
    for params in (
        SamplingParams(top_k=2, seed=1),
        SamplingParams(top_p=0.3, seed=1),
        SamplingParams(min_p=0.95, seed=1),
    ):
        seen = {sample(params, logits, output=(0,) * i).token_id for i in range(50)}
        assert seen <= {0, 1} and seen, params


def test_top_k_beyond_int64_keeps_every_token_and_spares_the_batch():
    logits = torch.zeros(2, VOCAB)
    logits[:, :2] = 5.0
    huge = req(SamplingParams(top_k=2**70, seed=1))
    other = req(SamplingParams(top_k=1))
    tokens = Sampler(eos_token_ids=(), device="cpu").sample(logits, [huge, other])
    assert tokens[1].token_id in (0, 1)
    assert 0 <= tokens[0].token_id < VOCAB


def test_seeded_rows_repeat_and_do_not_depend_on_the_batch():
    logits = torch.zeros(3, VOCAB)
    params = SamplingParams(temperature=1.0, seed=42)
    sampler = Sampler(eos_token_ids=(), device="cpu")
    alone = sampler.sample(logits[:1], [req(params)])[0].token_id
    other = req(SamplingParams(temperature=1.0))
    batched = sampler.sample(logits, [other, req(params), other])[1].token_id
    assert alone == batched
    draws = {
        sampler.sample(logits[:1], [req(params, output=(1,) * i)])[0].token_id for i in range(30)
    }
    assert len(draws) > 3  # the seed advances with the output position


def test_logprobs_are_raw_with_top_alternatives():
    logits = peaked(3, 4, 5)
    out = sample(SamplingParams(temperature=0, logprobs=2, logit_bias=((4, 100.0),)), logits)
    assert out.token_id == 4
    raw = torch.log_softmax(logits[0], -1)
    assert math.isclose(out.logprob.logprob, float(raw[4]))
    assert [t for t, _ in out.logprob.top] == [3, 4]


def test_token_logprobs_of_given_tokens():
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(0))
    want = torch.log_softmax(logits, dim=-1)
    got = token_logprobs(logits, [4, 0, 9], 2)
    assert [e.token_id for e in got] == [4, 0, 9]
    assert [e.logprob for e in got] == [want[0, 4].item(), want[1, 0].item(), want[2, 9].item()]
    assert [[t for t, _ in e.top] for e in got] == want.topk(2).indices.tolist()
    assert token_logprobs(logits, [1, 2, 3], 0)[0].top == ()


def test_tiny_temperature_is_greedy():
    # Logits divided by 1e-40 overflow to inf, so the softmax was all NaN and token 0 came out.
    logits = peaked(3, 4)
    logits[0, 7] = float("-inf")  # a padded vocabulary id
    for temperature in (1e-6, 1e-30, 1e-40):
        params = SamplingParams(temperature=temperature, seed=1)
        assert params.is_greedy
        assert {sample(params, logits, output=(0,) * i).token_id for i in range(5)} == {3}
