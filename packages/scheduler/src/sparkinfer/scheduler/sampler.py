"""Sampling on the device for a whole batch: penalties, bias, filters, seeds, logprobs.

Order per row: logit_bias, repetition / presence / frequency penalties, min_tokens (stop ids
masked), the request's logits_processor (e.g. a grammar mask), then greedy argmax or temperature
-> min_p -> top_k -> top_p -> draw. A verify row of a speculating request draws as if the drafts
before it were outputs already (`draft_prefixes`): penalties count them and the logits processor
reads them, so each row gets the token a step without speculation would draw there. Logprobs
are those of the raw model distribution (before any of the above), as the OpenAI API reports
them; `token_logprobs` gives the same for given tokens (prompt logprobs).

A seeded request draws its noise from a generator seeded with (seed, output position), so its
tokens depend on nothing else in the batch and survive preemption; unseeded rows share the
sampler's generator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from sparkinfer.model.forward_batch import host_to_device
from sparkinfer.scheduler.batch import SampledToken
from sparkinfer.scheduler.request import Request, TokenLogprob

_SEED_STRIDE = 1_000_003  # spreads (seed, position) pairs over generator seeds


class Sampler:
    """Turns fp32 logits [N, vocab] for N requests into one token each."""

    def __init__(
        self, *, eos_token_ids: Sequence[int], device: torch.device | str, seed: int = 0
    ) -> None:
        self.eos_token_ids = tuple(eos_token_ids)
        self.device = torch.device(device)
        self._generator = torch.Generator(self.device).manual_seed(seed)
        self._row_generator = torch.Generator(self.device)

    def sample(
        self,
        logits: torch.Tensor,
        reqs: Sequence[Request],
        output_idxs: Sequence[int] | None = None,
        inflight_outputs: Sequence[torch.Tensor | None] = (),
    ) -> list[SampledToken]:
        """logits [N, vocab] fp32 (row i belongs to reqs[i]) -> a token per request, on the host.

        output_idxs[i]: index among reqs[i]'s outputs of the token drawn (default: the next one
        after those it holds); it seeds the row's draw and counts toward min_tokens.
        inflight_outputs[i]: reqs[i]'s last output token [1] int64 on the device, when the host
        does not know it yet (empty: every output is known); the penalties count it.
        """
        idxs = [r.num_output_tokens for r in reqs] if output_idxs is None else list(output_idxs)
        drawn = self.draw(logits, reqs, idxs, inflight_outputs)
        return drawn.to_host(non_blocking=False).samples()

    def draw(
        self,
        logits: torch.Tensor,
        reqs: Sequence[Request],
        output_idxs: Sequence[int],
        inflight_outputs: Sequence[torch.Tensor | None] = (),
        pending_outputs: Sequence[int | None] = (),
        *,
        draft_prefixes: Sequence[Sequence[int]] = (),
    ) -> DrawnTokens:
        """The drawn tokens and the logprobs asked for, left on the device (no host sync but a
        logits processor's own).

        pending_outputs[i]: reqs[i]'s last output token when the host has read it but the request
        does not hold it yet (empty or None: none); its logits processor reads it.
        draft_prefixes[i]: the drafts before row i's position in a verify (empty: none), taken
        as outputs for this draw.
        """
        after = _Following(pending_outputs, draft_prefixes)
        token_ids = self._draw_ids(logits, reqs, output_idxs, inflight_outputs, after)
        rows = [i for i, r in enumerate(reqs) if r.params.logprobs is not None]
        if not rows:
            return DrawnTokens(token_ids)
        index = _ints(rows, logits.device)
        raw = torch.log_softmax(logits[index], dim=-1)  # the model's own distribution
        chosen = raw.gather(1, token_ids[index].unsqueeze(1)).squeeze(1)
        num_tops = tuple(reqs[i].params.logprobs or 0 for i in rows)
        top_values, top_ids = raw.topk(max(num_tops), dim=-1)
        return DrawnTokens(token_ids, tuple(rows), num_tops, chosen, top_values, top_ids)

    def _draw_ids(
        self,
        logits: torch.Tensor,
        reqs: Sequence[Request],
        output_idxs: Sequence[int],
        inflight_outputs: Sequence[torch.Tensor | None],
        after: _Following,
    ) -> torch.Tensor:
        """The drawn token ids [N] int64 on the device."""
        if any(self._changes_logits(r, i) for r, i in zip(reqs, output_idxs, strict=True)):
            logits = logits.clone()  # the caller's logits stay the model's (logprobs read them)
        self._apply_bias(logits, reqs)
        self._apply_penalties(logits, reqs, inflight_outputs, after)
        self._mask_early_stops(logits, reqs, output_idxs)
        self._apply_processors(logits, reqs, after)
        token_ids = logits.argmax(dim=-1)
        random_rows = [i for i, r in enumerate(reqs) if not r.params.is_greedy]
        if random_rows:
            rows = _ints(random_rows, logits.device)
            picked = [reqs[i] for i in random_rows]
            drawn = self._draw(logits[rows], picked, [output_idxs[i] for i in random_rows])
            token_ids[rows] = drawn
        return token_ids

    def _changes_logits(self, req: Request, output_idx: int) -> bool:
        """Whether a bias, penalty, early-stop mask or logits processor edits req's row."""
        p = req.params
        if p.logit_bias or _has_penalty(req) or p.logits_processor is not None:
            return True
        return bool(self._early_stop_ids(req, output_idx))

    def _early_stop_ids(self, req: Request, output_idx: int) -> list[int]:
        """The ids that may not end req yet (its output `output_idx` is before min_tokens)."""
        p = req.params
        if output_idx >= p.min_tokens:
            return []
        return list(p.stop_token_ids) + ([] if p.ignore_eos else list(self.eos_token_ids))

    @staticmethod
    def counts_outputs(req: Request) -> bool:
        """Whether drawing req's next token counts its earlier outputs (penalties)."""
        return _has_penalty(req)

    @staticmethod
    def needs_host_history(req: Request) -> bool:
        """Whether drawing req's next token reads its earlier tokens on the host (a logits
        processor, e.g. a grammar): the step before must be read before this draw."""
        return req.params.logits_processor is not None

    def _apply_bias(self, logits: torch.Tensor, reqs: Sequence[Request]) -> None:
        entries = [(i, t, b) for i, r in enumerate(reqs) for t, b in r.params.logit_bias]
        if not entries:
            return
        rows, cols, values = zip(*entries, strict=True)
        index = (_ints(rows, logits.device), _ints(cols, logits.device))
        logits.index_put_(index, _floats(values, logits.device), accumulate=True)

    def _apply_penalties(
        self,
        logits: torch.Tensor,
        reqs: Sequence[Request],
        inflight_outputs: Sequence[torch.Tensor | None],
        after: _Following,
    ) -> None:
        rows = [i for i, r in enumerate(reqs) if _has_penalty(r)]
        if not rows:
            return
        vocab = logits.shape[1]
        for i in rows:  # few rows carry penalties; per row keeps the count tensors small
            req, row = reqs[i], logits[i]
            p = req.params
            out = _ints(req.output_token_ids, logits.device)
            late = inflight_outputs[i] if inflight_outputs else None
            if late is not None:  # the last output, still on the device, counts too
                out = torch.cat([out, late])
            drafts = after.drafts(i)
            if drafts:  # a verify row: the drafts before it count as outputs
                out = torch.cat([out, _ints(drafts, logits.device)])
            counts = torch.zeros(vocab, device=logits.device).index_add_(
                0, out, torch.ones(len(out), device=logits.device)
            )
            if p.repetition_penalty != 1.0:
                seen = counts > 0
                seen[_ints(req.token_ids[: req.num_prompt_tokens], logits.device)] = True
                scaled = torch.where(
                    row > 0, row / p.repetition_penalty, row * p.repetition_penalty
                )
                row.copy_(torch.where(seen, scaled, row))
            row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).float()

    def _mask_early_stops(
        self, logits: torch.Tensor, reqs: Sequence[Request], output_idxs: Sequence[int]
    ) -> None:
        for i, req in enumerate(reqs):
            stops = self._early_stop_ids(req, output_idxs[i])
            if stops:
                logits[i, _ints(stops, logits.device)] = float("-inf")

    def _apply_processors(
        self, logits: torch.Tensor, reqs: Sequence[Request], after: _Following
    ) -> None:
        for i, req in enumerate(reqs):
            if req.params.logits_processor is None:
                continue
            history = after.history(i, req.output_token_ids)
            req.params.logits_processor(history, logits[i])

    def _draw(
        self, logits: torch.Tensor, reqs: Sequence[Request], output_idxs: Sequence[int]
    ) -> torch.Tensor:
        """Temperature, min_p, top_k, top_p, then a draw by the exponential race. -> [n]."""
        temps = _floats([r.params.temperature for r in reqs], logits.device)
        logits = logits / temps.unsqueeze(1)
        min_ps = [r.params.min_p for r in reqs]
        if any(m > 0 for m in min_ps):
            probs = torch.softmax(logits, dim=-1)
            floor = _floats(min_ps, logits.device).unsqueeze(1)
            cut = probs < floor * probs.max(dim=-1, keepdim=True).values
            logits = logits.masked_fill(cut, float("-inf"))
        vocab = logits.shape[1]
        # A top_k beyond the vocabulary keeps every token; clamped, it always fits an int64
        # tensor, so one request's value can never fail the step it shares with others.
        top_ks = [min(r.params.top_k, vocab) if r.params.top_k > 0 else vocab for r in reqs]
        top_ps = [r.params.top_p for r in reqs]
        if any(k < vocab for k in top_ks) or any(p < 1.0 for p in top_ps):
            logits = _top_k_top_p(logits, top_ks, top_ps)
        probs = torch.softmax(logits, dim=-1)
        # argmax(p / q) with q ~ Exp(1) draws from p (the exponential race).
        noise = torch.empty_like(probs)
        for i, req in enumerate(reqs):
            seed = req.params.seed
            if seed is None:
                noise[i].exponential_(generator=self._generator)
            else:
                row_seed = (seed * _SEED_STRIDE + output_idxs[i]) % (1 << 63)
                self._row_generator.manual_seed(row_seed)
                noise[i].exponential_(generator=self._row_generator)
        return (probs / noise).argmax(dim=-1)


def _top_k_top_p(logits: torch.Tensor, top_ks: list[int], top_ps: list[float]) -> torch.Tensor:
    """Mask all but each row's top_k logits, then the tail beyond top_p of the probability mass."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[1], device=logits.device).unsqueeze(0)
    k = _ints(top_ks, logits.device).unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(ranks >= k, float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # the top token always stays
    p = _floats(top_ps, logits.device).unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(mass_before > p, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)


@dataclass(frozen=True)
class _Following:
    """Tokens a draw takes as outputs beyond those its request holds: the one read on the host
    but not appended yet (`pending`), then a verify row's drafts before it (`prefixes`)."""

    pending: Sequence[int | None]
    prefixes: Sequence[Sequence[int]]

    def drafts(self, row: int) -> Sequence[int]:
        return self.prefixes[row] if self.prefixes else ()

    def history(self, row: int, outputs: Sequence[int]) -> Sequence[int]:
        late = self.pending[row] if self.pending else None
        drafts = self.drafts(row)
        if late is None and not drafts:
            return outputs
        return [*outputs, *([] if late is None else [late]), *drafts]


def _has_penalty(req: Request) -> bool:
    p = req.params
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0 or p.frequency_penalty != 0


@dataclass(frozen=True)
class DrawnTokens:
    """One step's draws: token ids [N] int64 and, for the rows that asked, logprobs of the raw
    distribution: the chosen token's [R] and the top max(num_tops) [R, k] (values, ids)."""

    token_ids: torch.Tensor
    logprob_rows: tuple[int, ...] = ()  # rows with logprobs, and how many top entries each wants
    num_tops: tuple[int, ...] = ()
    chosen: torch.Tensor | None = None
    top_values: torch.Tensor | None = None
    top_ids: torch.Tensor | None = None

    def to_host(self, *, non_blocking: bool) -> DrawnTokens:
        """The same on the host; non_blocking on CUDA copies into pinned memory (read it only
        after an event recorded behind the copy has completed)."""

        def copy(t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None or not t.is_cuda:
                return t
            if not non_blocking:
                return t.cpu()
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            return host.copy_(t, non_blocking=True)

        tensors = (self.chosen, self.top_values, self.top_ids)
        chosen, top_values, top_ids = (copy(t) for t in tensors)
        token_ids = copy(self.token_ids)
        assert token_ids is not None
        return DrawnTokens(token_ids, self.logprob_rows, self.num_tops, chosen, top_values, top_ids)

    def samples(self) -> list[SampledToken]:
        """Host values -> a SampledToken per row (with its TokenLogprob where asked)."""
        tokens: list[int] = host_list(self.token_ids)
        out = [SampledToken(t) for t in tokens]
        if self.chosen is None or self.top_values is None or self.top_ids is None:
            return out
        chosen: list[float] = host_list(self.chosen)
        values: list[list[float]] = host_list(self.top_values)
        ids: list[list[int]] = host_list(self.top_ids)
        for j, (row, k) in enumerate(zip(self.logprob_rows, self.num_tops, strict=True)):
            top = tuple(zip(ids[j][:k], values[j][:k], strict=True))
            out[row] = SampledToken(tokens[row], TokenLogprob(tokens[row], chosen[j], top))
        return out


def token_logprobs(
    logits: torch.Tensor, token_ids: Sequence[int], num_top: int
) -> list[TokenLogprob]:
    """Raw logits [N, vocab] fp32 -> row i's logprob of token_ids[i] and its num_top most likely."""
    logprobs = torch.log_softmax(logits, dim=-1)
    index = _ints(token_ids, logits.device).unsqueeze(1)
    chosen: list[float] = host_list(logprobs.gather(1, index).squeeze(1))
    if not num_top:
        return [TokenLogprob(t, lp) for t, lp in zip(token_ids, chosen, strict=True)]
    values, ids = logprobs.topk(num_top, dim=-1)
    top_ids: list[list[int]] = host_list(ids)
    top_lps: list[list[float]] = host_list(values)
    return [
        TokenLogprob(t, lp, tuple(zip(i, v, strict=True)))
        for t, lp, i, v in zip(token_ids, chosen, top_ids, top_lps, strict=True)
    ]


def host_list(t: torch.Tensor) -> Any:
    """`t.tolist()`, typed Any: torch annotates it as a bare list; callers declare the shape."""
    return t.tolist()  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]


def _ints(values: Sequence[int], device: torch.device) -> torch.Tensor:
    return host_to_device(torch.tensor(values, dtype=torch.int64), device)


def _floats(values: Sequence[float], device: torch.device) -> torch.Tensor:
    return host_to_device(torch.tensor(values, dtype=torch.float32), device)
