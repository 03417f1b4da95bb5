"""Which decode rows draft, and how many drafts: per-request support, acceptance and a cost
model of measured step times (plain Python, no torch).

Support: every request may draft. A verify row draws as a one-token step would draw there, the
drafts before it taken as outputs (`sampler`): penalties count them and a logits processor (a
grammar) masks the row given them, so a grammar never accepts a draft it would have masked.

Acceptance: each request keeps counts of drafts accepted and rejected, from which a per-draft
acceptance rate a (a geometric model: draft j is accepted with probability a^j) and the tokens a
step with k drafts is expected to give, 1 + a + ... + a^k. Depth per request: a request's first
verify drafts `num_speculative_tokens` (a drafter that is right drafts at full depth from the
first step); after it, draft j is worth one more verify row while a^j is at least that row's
measured price (in plain tokens' time, from the fits below) and `MIN_ACCEPTANCE`, so a request
whose drafts are often right drafts `num_speculative_tokens` deep and one whose later drafts
rarely land drafts fewer. A request under that floor (its first draft not worth a row) stops
drafting for a cool-down (`FIRST_COOLDOWN_STEPS`, doubling each time up to
`MAX_COOLDOWN_STEPS`) and then tries again: prompt lookup and MTP both go through stretches where
drafts do not match. The first verify after a cool-down is a probe of one draft: if it accepts
nothing, the request cools down again at once (a drafter that is never right so costs one verify
row per cool-down, not the several that take a fresh estimate under the threshold). A step where
prompt lookup finds no match counts as a rejected draft.

What one request's probe costs the batch: its step is read at once (and so is the step before,
whose tokens the drafts start from), so every request in it loses the overlap with the next
step. Cool-downs therefore end on the policy's step clock, on the first step at least their
length away whose index is a multiple of that length: requests cooling down probe in the same
steps however they arrived, and a batch pays about one probe step a cool-down, not one per
request. The policy also counts, over every request, how often a verify's first draft was
accepted; while that share is under `MIN_ACCEPTANCE` (the drafter has been wrong lately, e.g. an
MTP head that does not fit the model), a new request does not verify at once but probes with the
others, at the next multiple of `FIRST_COOLDOWN_STEPS`. A drafter that is never right so pays
about three verify steps over 128 new tokens at any batch size (`test_speculative_policy`).

Cost: two straight-line fits of step time against rows, one for plain decode steps and one for
verify steps (steps with prompt chunks are left out), measured from the scheduler's side
(schedule to update, so host time counts). A step drafts when the expected tokens per second with
drafts beat the plain step's; until both fits have points, and every `PROBE_INTERVAL` steps
after that when some request may draft, it drafts anyway, so the verify fit follows the batch as
it changes. A drafter's own cost counts where it is paid: the MTP head catches up over a
request's rows only when the request drafts (`mtp_drafter`), so the verify fit carries the head
and the decode fit a plain step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkinfer.scheduler.batch import SpecOutcome
from sparkinfer.scheduler.config import SchedulerConfig
from sparkinfer.scheduler.request import (
    FIRST_COOLDOWN_STEPS,
    PRIOR_ACCEPTED,
    PRIOR_REJECTED,
    Request,
    RequestSpec,
)

MIN_ACCEPTANCE = 0.15
MAX_COOLDOWN_STEPS = 64
PROBE_INTERVAL = 64
_DECAY = 0.9  # weight of older verifies in a request's acceptance counts
_FIT_DECAY = 0.98  # weight of older steps in the step-time fits
_MIN_FIT_POINTS = 4


@dataclass
class _LineFit:
    """Least squares of y = c0 + c1 * x with exponentially fading weights."""

    n: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0
    num_points: int = 0

    def add(self, x: float, y: float) -> None:
        d = _FIT_DECAY
        self.n, self.sx, self.sy = d * self.n + 1, d * self.sx + x, d * self.sy + y
        self.sxx, self.sxy = d * self.sxx + x * x, d * self.sxy + x * y
        self.num_points += 1

    def slope(self) -> float | None:
        """dy/dx (never below 0), once the fit has enough points."""
        if self.num_points < _MIN_FIT_POINTS:
            return None
        var = self.n * self.sxx - self.sx * self.sx
        return 0.0 if var <= 1e-12 else max(0.0, (self.n * self.sxy - self.sx * self.sy) / var)

    def predict(self, x: float) -> float | None:
        slope = self.slope()
        if slope is None:
            return None
        return (self.sy - slope * self.sx) / self.n + slope * x


@dataclass
class SpecCounters:
    """Totals for telemetry (vLLM's spec_decode counters)."""

    num_drafts: int = 0  # verifies of a request with at least one draft
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list[int])


class SpecPolicy:
    """Owns the per-request acceptance counts, the step-time fits and the counters."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.counters = SpecCounters(accepted_per_position=[0] * config.num_speculative_tokens)
        self._decode_fit = _LineFit()
        self._verify_fit = _LineFit()
        self._steps_since_probe = 0
        self._step = 0  # steps planned: the clock cool-downs end on
        # Decayed counts of verifies whose first draft was accepted, and not, over every request.
        self._first_hits, self._first_misses = PRIOR_ACCEPTED, PRIOR_REJECTED
        self._is_on = True
        self._row_price = 0.0  # a verify row's time in plain decode tokens' time (0: unmeasured)

    def may_draft(self, req: Request) -> bool:
        """Whether req drafts when it decodes next (its tokens then have to be on the host)."""
        if not self.config.speculative_adaptive:
            return self.config.is_speculative
        spec = req.spec
        is_waiting = spec.is_new and self._is_wrong_lately  # `_start` will cool it down
        return self.config.is_speculative and spec.cooldown_steps <= 1 and not is_waiting

    def plan_step(self, decodes: list[Request]) -> None:
        """Decide whether this step drafts at all (the cost model), before its rows are cut."""
        if not self.config.speculative_adaptive:
            self._is_on = True
            return
        self._step += 1
        for req in decodes:
            if req.spec.is_new:
                self._start(req.spec)
            req.spec.cooldown_steps = max(0, req.spec.cooldown_steps - 1)
        self._steps_since_probe += 1
        self._row_price = self._measured_row_price(len(decodes))
        candidates = [r for r in decodes if self.may_draft(r) and r.spec.cooldown_steps == 0]
        self._is_on = self._pays(decodes, candidates)
        if not self._is_on and candidates and self._steps_since_probe >= PROBE_INTERVAL:
            self._is_on = True
        # A probe counts once a candidate drafts in it: one whose step before overlapped this
        # (its token still in flight) cannot draft until the step after, which this one's
        # being read at once (`is_on`) makes possible; resetting here would spend the probe
        # on a read-at-once step that drafts nothing, every PROBE_INTERVAL steps.
        if self._is_on and any(not r.num_inflight_tokens for r in candidates):
            self._steps_since_probe = 0

    @property
    def is_on(self) -> bool:
        """Whether this step drafts, and so whether the step before it is read at once."""
        return self.config.is_speculative and self._is_on

    def num_lookahead(self, req: Request, max_tokens: int) -> int:
        """Drafts req may have this step: within the budget and the blocks (`max_tokens` past
        its input token), short of its max length, and only with every token on the host."""
        if not self.is_on or req.num_inflight_tokens or not self.may_draft(req):
            return 0
        if self.config.speculative_adaptive and req.spec.cooldown_steps:
            return 0
        room = req.max_len - req.num_tokens - 1  # every emitted token must fit
        return max(0, min(self.depth(req), max_tokens, room))

    def depth(self, req: Request) -> int:
        """Drafts req's own acceptance pays for: draft j (accepted with probability a^j) while
        a^j is worth a verify row (its measured price, at least `MIN_ACCEPTANCE`); always the
        first, whose worth the cool-down and the step's cost model judge. A request's first
        verify drafts num_speculative_tokens (a drafter that is right drafts at full depth at
        once), a probe after a cool-down one (a drafter still wrong costs one row). Without
        `speculative_adaptive`: num_speculative_tokens."""
        k = self.config.num_speculative_tokens
        if not self.config.speculative_adaptive:
            return k
        if not req.spec.num_verifies:
            return k
        if req.spec.is_probing:
            return 1
        a, floor = req.spec.acceptance, self._floor
        depth = 1
        while depth < k and a ** (depth + 1) >= floor:
            depth += 1
        return depth

    def record(self, req: Request, outcome: SpecOutcome) -> None:
        """Count one verify of req's drafts and update its acceptance."""
        spec, c = req.spec, self.counters
        spec.num_verifies += 1
        spec.num_draft_tokens += outcome.num_drafts
        spec.num_accepted_tokens += outcome.num_accepted
        c.num_drafts += 1
        c.num_draft_tokens += outcome.num_drafts
        c.num_accepted_tokens += outcome.num_accepted
        for j in range(outcome.num_accepted):
            c.accepted_per_position[j] += 1
        self._count_first_draft(is_accepted=outcome.num_accepted > 0)
        if self._failed_probe(spec, is_rejected=outcome.num_accepted == 0):
            return
        rejected = 1.0 if outcome.num_accepted < outcome.num_drafts else 0.0
        spec.accepted_weight = _DECAY * spec.accepted_weight + outcome.num_accepted
        spec.rejected_weight = _DECAY * spec.rejected_weight + rejected
        self._cool_down_if_low(spec)

    def _cool_down_if_low(self, spec: RequestSpec) -> None:
        """Cool a request down when even its first draft is not worth a verify row."""
        if self.config.speculative_adaptive and spec.acceptance < self._floor:
            self._cool_down(spec)

    @property
    def _floor(self) -> float:
        """The least acceptance a draft needs: `MIN_ACCEPTANCE`, or a verify row's measured
        price in plain tokens where that is higher."""
        return max(MIN_ACCEPTANCE, self._row_price)

    def _failed_probe(self, spec: RequestSpec, *, is_rejected: bool) -> bool:
        """End a probe (the first verify after a cool-down); True when it accepted nothing and
        the request so cooled down again."""
        was_probing, spec.is_probing = spec.is_probing, False
        if was_probing and is_rejected and self.config.speculative_adaptive:
            self._cool_down(spec)
            return True
        return False

    def _start(self, spec: RequestSpec) -> None:
        """A request's first decode step: it may draft at once, but while the drafter's first
        drafts have been rejected across requests (their recent share accepted under
        `MIN_ACCEPTANCE`) it waits, as a probe, for the next step whose index is a multiple of
        FIRST_COOLDOWN_STEPS, with the requests cooling down (called before the count-down)."""
        spec.is_new = False
        if self._is_wrong_lately:
            length = FIRST_COOLDOWN_STEPS
            spec.cooldown_steps = -(-self._step // length) * length - self._step + 1
            spec.is_probing = True

    @property
    def _is_wrong_lately(self) -> bool:
        """Whether the recent share of verifies whose first draft was accepted, over every
        request, is under `MIN_ACCEPTANCE`."""
        return self._first_hits / (self._first_hits + self._first_misses) < MIN_ACCEPTANCE

    def _cool_down(self, spec: RequestSpec) -> None:
        """Stop drafting for at least next_cooldown steps, up to the first step whose index is a
        multiple of it: requests cooling down probe in the same steps, so a batch pays about
        one probe step a cool-down, whatever its size and however its requests arrived."""
        length = spec.next_cooldown
        spec.cooldown_steps = -(-(self._step + length) // length) * length - self._step
        spec.next_cooldown = min(MAX_COOLDOWN_STEPS, 2 * length)
        spec.accepted_weight, spec.rejected_weight = PRIOR_ACCEPTED, PRIOR_REJECTED
        spec.is_probing = True

    def record_no_drafts(self, req: Request) -> None:
        """req had lookahead rows but its drafter proposed nothing (no n-gram match): counted
        as a rejected draft, so a request whose text never repeats cools down too and its steps
        overlap again."""
        spec = req.spec
        self._count_first_draft(is_accepted=False)
        if self._failed_probe(spec, is_rejected=True):
            return
        spec.accepted_weight *= _DECAY
        spec.rejected_weight = _DECAY * spec.rejected_weight + 1.0
        self._cool_down_if_low(spec)

    def _count_first_draft(self, *, is_accepted: bool) -> None:
        self._first_hits = _DECAY * self._first_hits + is_accepted
        self._first_misses = _DECAY * self._first_misses + (not is_accepted)

    def record_step(self, *, num_rows: int, is_verify: bool, seconds: float) -> None:
        """One decode-only step's time: num_rows forward rows (drafts included)."""
        (self._verify_fit if is_verify else self._decode_fit).add(num_rows, seconds)

    def _measured_row_price(self, num_decodes: int) -> float:
        """One more verify row's time over a plain step's time per token (0: not measured)."""
        row_s = self._verify_fit.slope()
        plain_s = self._decode_fit.predict(num_decodes)
        if row_s is None or plain_s is None or plain_s <= 0 or num_decodes == 0:
            return 0.0
        return row_s * num_decodes / plain_s

    def _pays(self, decodes: list[Request], candidates: list[Request]) -> bool:
        if not candidates:
            return False
        depths = [self.depth(r) for r in candidates]
        num_rows = len(decodes) + sum(depths)
        plain_s = self._decode_fit.predict(len(decodes))
        verify_s = self._verify_fit.predict(num_rows)
        if plain_s is None or verify_s is None or plain_s <= 0 or verify_s <= 0:
            return True  # not measured yet: find out
        spec_tokens = len(decodes) - len(candidates)
        spec_tokens += sum(
            r.spec.expected_tokens(d) for r, d in zip(candidates, depths, strict=True)
        )
        return spec_tokens / verify_s > len(decodes) / plain_s
