"""State of the ``"optimal"`` draft-length schedule: the cross-call statistics, the per-row estimator, the stopping
rule.

:class:`~diversed_hf.drafting.candidates.DiversedCandidateGenerator` drives one :class:`OptimalSchedule` per call. The
schedule maximises expected tokens per second. It has two modes:

1. **Stopping rule** (once the pair and setting have statistics, :meth:`OptimalSchedule.stopping_rule`). Every row
   may draft up to ``N``; after its ``k``-th draft it drafts one more only if what that draft is expected to add,
   ``r_k * abar``, is worth its cost at the pair's rate: ``r_k * abar >= R * (c + c_verify(k + 1) - c_verify(k))``.
   ``r_k = prod_{t<=k} a_hat(q_t(x_t))`` estimates the chance that the round's ``k`` drafts are all accepted from
   the draft's own confidence in the tokens it drew (a token's acceptance ``a_t(x_t)`` averaged over earlier
   rounds, per confidence bin, :data:`OPTIMAL_CONFIDENCE_EDGES`, shrunk toward the mean ``abar`` with weight
   :data:`OPTIMAL_CALIBRATION_PRIOR`); ``R`` is the tokens per row per unit of cost on the pair's recent rounds
   (the last :data:`OPTIMAL_RATE_ROUNDS`, each costed ``n c + c_verify(n)``, so ``R`` is in the costs' unit).
   Comparing a marginal gain with ``R`` times its marginal cost is the optimality condition of a rate (tokens per
   round over cost per round, Dinkelbach): the gains fall with ``k``, so stopping at the first ``k`` that fails it
   is the best stopping time given what the draft has shown.
   The confidence is the draft's probability of its own token, so stopping does not depend on the target: the
   law the verifier emits at each drafted position is unchanged (as with ``assistant_confidence_threshold``). A
   batch computes each draft step for every row, so it decides as one: it drafts again while the mean reach of the
   rows still drafting passes the test, and then every such row drafts (and has its draft verified). The round
   right after the prompt accepts differently (on the testbed's arith task, more of the drafts the draft doubts), so
   it has its own calibration once 256 of its drafts are pooled.
2. **Per-row lengths** (until then: a call whose pair and setting have fewer than
   :data:`OPTIMAL_MIN_CALIBRATION` drafted tokens or :data:`OPTIMAL_MIN_RATE_ROUNDS` rounds pooled). Each
   round every row drafts the ``n`` in ``1..N`` with the most expected tokens per second,
   ``E[T_n] / (n c + c_verify(n))`` (:func:`diversed_hf.verifiers.theory.optimal_draft_length`), ``E[T_n] = 1 +
   sum_{k<=n} m_k`` with ``m_k`` the row's estimate of ``E[prod_{t<k} a_t(x_t) beta_k]`` (the per-round terms of
   :func:`diversed_hf.verifiers.theory.expected_tokens_per_round`)::

       m_k = (s_k + w * prior_k) / (c_k + w)        (prior_k unknown: m_k = s_k / c_k)

   ``s_k`` / ``c_k`` are the row's own sum and count of the terms at position ``k``, ``prior_k`` the mean pooled
   from earlier calls with the same pair and setting (the last :data:`OPTIMAL_POOL_ROUNDS` rounds per position)
   and ``w`` = :data:`OPTIMAL_PRIOR_ROUNDS`. A position pooled from fewer than :data:`OPTIMAL_MIN_POOLED_ROUNDS`
   rounds has no prior; a row with no estimate at some position drafts ``N``, which observes every position. The
   round right after the prompt accepts differently, so it is pooled apart.

Rounds whose drafts the draft itself doubts are cut short, confident ones run to ``N``; docs/method.md §6 explains
why this, not a better per-round length, is what can beat a constant ``N``.

**Costs** (:mod:`diversed_hf.drafting.length.costs`): ``assistant_costs`` when passed, else measured on the pair at the
batch size (else the nearest one timed) and kept across calls. Only a call that finds none warms up
(:data:`OPTIMAL_WARMUP`); the calls after a warm-up draft one token in their second round until
:data:`OPTIMAL_PROBES` pairs of far-apart lengths are timed (the slope of ``c_verify`` rests on them).

**Settings.** Acceptance statistics are kept per setting (:func:`acceptance_setting`: verifier or head, greedy or
sampled, logits processors), the rate per setting and batch size. Everything lives in a module-level
``weakref.WeakKeyDictionary`` keyed by the draft model (then a weak reference to the target): nothing is written
on the models, and it goes with them. :func:`measured_draft_costs` reads the costs; :func:`clear_draft_statistics`
forgets everything for a draft.
"""

from __future__ import annotations

import bisect
import math
import weakref
from collections.abc import Hashable

import torch

from .costs import CostSamples, DraftCosts

__all__ = [
    "OptimalSchedule",
    "StoppingRule",
    "acceptance_setting",
    "clear_draft_statistics",
    "measured_draft_costs",
]

#: rounds of the "optimal" schedule before it chooses, in a call that knows no costs (the first call of a pair at a
#: batch size, without ``assistant_costs``): two at N (the first feeds the prompt, so only the second is timed), one
#: at a single draft (a second verification cost), then per-row choices
OPTIMAL_WARMUP = ("full", "full", "single")
#: pairs of consecutive timed rounds whose lengths differ by at least N // 2 a pair's costs need at a batch size:
#: until then each call's second round drafts one token (a probe: the slope of ``c_verify`` rests on such pairs)
OPTIMAL_PROBES = 3
#: weight, in rounds, of the prior (earlier calls of the pair, pooled) in a row's per-position estimate
OPTIMAL_PRIOR_ROUNDS = 8.0
#: rounds a position needs in the pool before it has a prior: the far positions' terms are products of many
#: acceptances, noisy; a row explores them (drafts N) until this many rounds are pooled
OPTIMAL_MIN_POOLED_ROUNDS = 32.0
#: rounds per position the pooled prior keeps; beyond, older calls fade (their sums are scaled down)
OPTIMAL_POOL_ROUNDS = 512.0
#: upper edges of the draft-confidence bins the stopping rule calibrates acceptance in (the last bin ends at 1)
OPTIMAL_CONFIDENCE_EDGES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)
#: weight, in drafted tokens, of the mean acceptance in each bin's estimate (bins seen rarely lean on the mean)
OPTIMAL_CALIBRATION_PRIOR = 8.0
#: drafted tokens the calibration needs pooled (per setting) before a call uses the stopping rule
OPTIMAL_MIN_CALIBRATION = 256.0
#: drafted tokens per bin the calibration keeps; beyond, older calls fade
OPTIMAL_CALIBRATION_TOKENS = 4096.0
#: rounds (after each call's first) the rate needs pooled (per setting and batch size) before the stopping rule
OPTIMAL_MIN_RATE_ROUNDS = 16.0
#: rounds the rate keeps; beyond, older calls fade
OPTIMAL_RATE_ROUNDS = 256.0
_SETTINGS_PER_PAIR = 32  # acceptance priors kept per pair (verifier and sampling settings)


# Statistics the "optimal" schedule keeps across calls ----------------------------------------------------------------
# draft model -> {weakref(target) or None: _PairStatistics}; nothing is stored on the models themselves.
_STATISTICS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _PairStatistics:
    def __init__(self):
        self.costs: dict[tuple[str, int], CostSamples] = {}  # (device, batch size) ->
        self.acceptance: dict[Hashable, tuple[torch.Tensor, torch.Tensor]] = {}  # setting -> sums (K,), counts (K,)
        self.calibration: dict[Hashable, tuple[torch.Tensor, torch.Tensor]] = {}  # setting -> per confidence bin
        self.rates: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # (setting, device, batch) -> per width

    def nearest_samples(self, device: str, batch_size: int) -> CostSamples | None:
        """The rounds timed at this batch size, else at the nearest timed one (on this device)."""
        sizes = sorted(
            (abs(b - batch_size), -b) for (d, b), samples in list(self.costs.items()) if d == device and samples.recent
        )
        return self.costs[(device, -sizes[0][1])] if sizes else None

    def nearest_costs(self, device: str, batch_size: int) -> DraftCosts | None:
        samples = self.nearest_samples(device, batch_size)
        return None if samples is None else samples.fit()

    def pool(self, setting: Hashable, sums: torch.Tensor, counts: torch.Tensor) -> None:
        """Add a call's per-position sums and counts ``(N,)`` to the setting's prior."""
        old_sums, old_counts = self.acceptance.pop(setting, (sums.new_zeros(0), counts.new_zeros(0)))
        width = max(old_sums.numel(), sums.numel())

        def padded(values):  # (width,)
            return torch.nn.functional.pad(values, (0, width - values.numel()))

        sums, counts = padded(old_sums) + padded(sums), padded(old_counts) + padded(counts)
        fade = OPTIMAL_POOL_ROUNDS / counts.clamp(min=OPTIMAL_POOL_ROUNDS)  # (K,) <= 1
        self.acceptance[setting] = (sums * fade, counts * fade)
        while len(self.acceptance) > _SETTINGS_PER_PAIR:
            self.acceptance.pop(next(iter(self.acceptance)))

    def pool_calibration(self, setting: Hashable, sums: torch.Tensor, counts: torch.Tensor) -> None:
        """Add a call's acceptance sums and counts per confidence bin ``(K,)``; older calls fade."""
        old_sums, old_counts = self.calibration.pop(setting, (torch.zeros_like(sums), torch.zeros_like(counts)))
        sums, counts = old_sums + sums, old_counts + counts
        fade = OPTIMAL_CALIBRATION_TOKENS / counts.clamp(min=OPTIMAL_CALIBRATION_TOKENS)  # (K,) <= 1
        self.calibration[setting] = (sums * fade, counts * fade)
        while len(self.calibration) > _SETTINGS_PER_PAIR:
            self.calibration.pop(next(iter(self.calibration)))

    def pool_rate(self, key: tuple, tokens: torch.Tensor, rounds: torch.Tensor) -> None:
        """Add a call's rounds at a setting and batch size: tokens emitted per row (summed) and rounds, both ``(W,)``
        by the round's draft length (index = length); older calls fade."""
        old_tokens, old_rounds = self.rates.pop(key, (tokens.new_zeros(0), rounds.new_zeros(0)))
        width = max(old_tokens.numel(), tokens.numel())

        def padded(values):  # (width,)
            return torch.nn.functional.pad(values, (0, width - values.numel()))

        tokens, rounds = padded(old_tokens) + padded(tokens), padded(old_rounds) + padded(rounds)
        fade = OPTIMAL_RATE_ROUNDS / max(float(rounds.sum()), OPTIMAL_RATE_ROUNDS)
        self.rates[key] = (tokens * fade, rounds * fade)
        while len(self.rates) > 4 * _SETTINGS_PER_PAIR:
            self.rates.pop(next(iter(self.rates)))

    def prior(self, setting: Hashable, width: int) -> torch.Tensor | None:  # (width,) pooled means, NaN = unknown
        """The pooled means; NaN at positions pooled from fewer than ``OPTIMAL_MIN_POOLED_ROUNDS`` rounds (a row
        drafts ``N`` there until it has a round of its own, so they keep being observed)."""
        if setting not in self.acceptance:
            return None
        sums, counts = self.acceptance[setting]
        enough = counts >= OPTIMAL_MIN_POOLED_ROUNDS  # (K,)
        means = torch.where(enough, sums / counts.clamp(min=1e-12), torch.full_like(sums, float("nan")))
        return torch.nn.functional.pad(means, (0, max(0, width - means.numel())), value=float("nan"))[:width]


def _pair_statistics(draft, target) -> _PairStatistics:
    per_draft = _STATISTICS.get(draft)
    if per_draft is None:
        per_draft = _STATISTICS[draft] = {}
    for key in [k for k in per_draft if k is not None and k() is None]:  # targets that are gone
        del per_draft[key]
    key = None if target is None else weakref.ref(target)
    if key not in per_draft:
        per_draft[key] = _PairStatistics()
    return per_draft[key]


def measured_draft_costs(target, draft, *, batch_size: int = 1, device=None) -> DraftCosts | None:
    """The costs the ``"optimal"`` schedule measured for ``(target, draft)`` at ``batch_size`` (else the nearest
    batch size timed), or None before any call timed them. Pass them as ``assistant_costs`` to skip measuring."""
    per_draft = _STATISTICS.get(draft) or {}
    statistics_ = per_draft.get(None if target is None else weakref.ref(target))
    if device is None:
        device = next(iter(draft.parameters()), torch.empty(0)).device
    device = str(torch.device(device))
    return None if statistics_ is None else statistics_.nearest_costs(device, batch_size)


def clear_draft_statistics(draft=None) -> None:
    """Forget the costs and acceptance priors the ``"optimal"`` schedule kept for ``draft`` (every draft: None)."""
    if draft is None:
        _STATISTICS.clear()
    else:
        _STATISTICS.pop(draft, None)


def acceptance_setting(verifier, do_sample: bool, logits_processor=()) -> Hashable:
    """What the acceptance prior is keyed by besides the pair: the verifier (its head for a head verifier), greedy
    or sampled, and the logits processors' scalar settings (temperature, top-k, ...)."""
    head = getattr(verifier, "head", None)
    name = type(verifier).__qualname__
    if isinstance(head, torch.nn.Module):
        token = (name, weakref.ref(head))
    elif type(verifier).__hash__ is None:  # unhashable: its fields, as its repr shows them
        token = (name, repr(verifier))
    elif type(verifier).__hash__ is object.__hash__:  # identity: keep a weak reference, not the object
        try:
            token = (name, weakref.ref(verifier))
        except TypeError:
            token = (name, id(verifier))
    else:  # hashed by value (a frozen dataclass such as ExactVerifier())
        token = verifier
    scalars = (bool, int, float, str)
    processors = tuple(  # a wrapper (processors.FullBatch, RowWidth) is keyed by the processor it runs
        (
            type(p).__qualname__,
            tuple(sorted((k, v) for k, v in getattr(p, "__dict__", {}).items() if isinstance(v, scalars))),
        )
        for p in (getattr(p, "processor", p) for p in logits_processor)
    )
    return token, bool(do_sample), processors


class StoppingRule:
    """The ``"optimal"`` schedule's stopping rule for one call (module docstring, mode 1).

    After draft ``k`` a row's reach ``r_k = prod_{t<=k} acceptance[bin(q_t(x_t))]``; it drafts again while
    ``r_k * mean_acceptance >= thresholds[k - 1]`` (tokens: the per-row rate times the next draft's cost). A batch
    drafts again while the mean of ``r_k`` over its rows still drafting passes the same test. The ``*_scalar``
    methods do it on Python floats, for one row (no tensor operation per draft step).
    """

    def __init__(self, edges: torch.Tensor, acceptance: torch.Tensor, mean_acceptance: float, thresholds: torch.Tensor):
        self.edges = edges  # (K - 1,) upper edges of the confidence bins
        self.acceptance = acceptance  # (K,) estimated a(x) per bin
        self.mean_acceptance = mean_acceptance  # abar, the expected acceptance of the next draft
        self.thresholds = thresholds  # (N - 1,) for k = 1..N-1
        self._edges, self._acceptance = edges.tolist(), acceptance.tolist()
        self._limits = [t / mean_acceptance if mean_acceptance > 0 else math.inf for t in thresholds.tolist()]

    def keep_drafting_batch(self, reach: torch.Tensor, drafting: torch.Tensor, step: int) -> torch.Tensor:  # () bool
        """Whether a batch drafts once more after ``step + 1`` drafts: the mean gain of the rows still ``drafting``
        (batch,) against the per-row threshold (the step is computed for every row, so every row drafts it)."""
        if step >= self.thresholds.numel():
            return torch.zeros((), dtype=torch.bool, device=reach.device)
        gain = (reach * drafting).sum() / drafting.sum().clamp(min=1) * self.mean_acceptance
        return gain >= self.thresholds[step]

    def update_reach(self, reach: torch.Tensor, confidence: torch.Tensor) -> torch.Tensor:  # (batch,)
        """``reach`` times the estimated acceptance of a draft of confidence ``confidence`` (batch,)."""
        return reach * self.acceptance[torch.bucketize(confidence.to(self.edges.dtype), self.edges)]

    def keep_drafting_scalar(self, reach: float, step: int) -> bool:
        return step < len(self._limits) and reach >= self._limits[step]

    def update_reach_scalar(self, reach: float, confidence: float) -> float:
        return reach * self._acceptance[bisect.bisect_left(self._edges, confidence)]


class OptimalSchedule:
    """One call of the ``"optimal"`` schedule (module docstring): per-row estimates, costs, warm-up, pooling.

    ``start`` gives the first round's lengths; after each verified round ``observe`` (and ``drop`` when rows
    leave), then ``lengths`` for the next round; ``finish`` pools the call into the pair's priors. Per round this is
    about twenty tensor operations on ``(batch, N)``, no Python loop over rows.
    """

    def __init__(
        self, draft, num_draft_tokens: int, *, target=None, setting: Hashable = None, costs: DraftCosts | None = None
    ):
        self.num_draft_tokens = num_draft_tokens  # N
        self.costs = costs
        self._given_curve = None if costs is None else costs.verify_curve(num_draft_tokens)  # (N,), checked now
        self.statistics = _pair_statistics(draft, target)
        self.setting = setting

    def start(self, batch_size: int, device: torch.device) -> torch.Tensor | None:  # (batch,) first lengths
        self.device = torch.device(device)
        self.device_key = str(self.device)
        self.round_index = 0
        width = self.num_draft_tokens
        prior = self.statistics.prior(self.setting, width)  # (N,) pooled means or None
        if prior is None:
            prior = torch.full((width,), float("nan"), dtype=torch.float64)
        known = ~prior.isnan()  # (N,)
        # numerator and denominator of m_k per row, prior included: w prior_k + s_k over w [prior known] + c_k
        self.prior_sums = (OPTIMAL_PRIOR_ROUNDS * prior.nan_to_num(0.0)).to(device)  # (N,)
        self.prior_counts = (OPTIMAL_PRIOR_ROUNDS * known.double()).to(device)  # (N,)
        self.sums = self.prior_sums.expand(batch_size, width).clone()  # (batch, N)
        self.counts = self.prior_counts.expand(batch_size, width).clone()  # (batch, N)
        self.left: tuple[torch.Tensor, torch.Tensor] | None = None  # own (sums, counts) (N,) of rows that left
        self.first_sums = torch.zeros(width, dtype=torch.float64, device=device)  # the first round, summed over rows
        self.first_counts = torch.zeros_like(self.first_sums)
        first = self.statistics.prior(_first_round(self.setting), width)  # (N,) the rounds right after the prompt
        self.first_prior = None if first is None or bool(first.isnan().any()) else first.to(device)
        self.complete = bool(known.all())  # every row has an estimate at every position (the prior covers 1..N)
        self._aranges: dict[int, torch.Tensor] = {}
        self._round_seconds: dict[int, tuple[float, torch.Tensor]] = {}  # batch size -> (c, n c + c_verify(n) (N,))
        if costs := self.costs:
            lengths = torch.arange(1, width + 1, dtype=torch.float64)  # (N,)
            self._given = costs.draft_step_seconds, (lengths * costs.draft_step_seconds + self._given_curve).to(device)
        samples = self.statistics.nearest_samples(self.device_key, batch_size) if self.costs is None else None
        self.warming_up = self.costs is None and (samples is None or samples.fit() is None)
        timed_here = self.statistics.costs.get((self.device_key, batch_size))
        self.probing = (  # a cached call probes a one-draft round while too few pairs of far-apart lengths are timed
            not self.warming_up
            and self.costs is None
            and width > 1
            and (timed_here is None or timed_here.count_pairs(max(1, width // 2)) < OPTIMAL_PROBES)
        )
        self._previous: tuple[int, int, float, float] | None = (
            None  # (batch, n, drafting, rest) of the last timed round
        )
        self.rate_key = (self.setting, self.device_key, batch_size)
        self.edges = torch.tensor(OPTIMAL_CONFIDENCE_EDGES, dtype=torch.float32, device=device)  # (K - 1,)
        # acceptance per confidence bin, (K,): [0] the round right after the prompt, [1] the later rounds
        self.calibration_sums = torch.zeros(2, len(OPTIMAL_CONFIDENCE_EDGES) + 1, dtype=torch.float64, device=device)
        self.calibration_counts = torch.zeros_like(self.calibration_sums)  # (2, K)
        # tokens emitted per row (summed) and rounds, by draft length, of the call's rounds after the first
        self.rate_tokens = torch.zeros(width + 1, dtype=torch.float64)  # (N + 1,)
        self.rate_rounds = torch.zeros(width + 1, dtype=torch.float64)  # (N + 1,)
        self._full: torch.Tensor | None = None  # (batch,) N, the lengths under the stopping rule
        later = self.stopping_rule(batch_size)
        first = self.stopping_rule(batch_size, _first_round(self.setting)) if later is not None else None
        self.rules = (first or later, later)  # the first round's (its own calibration when pooled), the later rounds'
        self.rule = self.rules[0]
        return self.lengths()

    def stopping_rule(self, batch_size: int, calibration_key: Hashable = None) -> StoppingRule | None:
        """The call's :class:`StoppingRule`, or None while the pair and setting lack the statistics it needs
        (then the per-row lengths decide, module docstring)."""
        calibration = self.statistics.calibration.get(self.setting if calibration_key is None else calibration_key)
        rate = self.statistics.rates.get(self.rate_key)
        costs = None if self.warming_up else self._costs(batch_size)
        if calibration is None or costs is None or rate is None:
            return None
        step_seconds, round_seconds = costs  # c, n c + c_verify(n) (N,)
        tokens, rounds = (values[1 : self.num_draft_tokens + 1].to(round_seconds) for values in rate)  # (<= N,) n >= 1
        if float(rounds.sum()) < OPTIMAL_MIN_RATE_ROUNDS:
            return None
        sums, counts = calibration  # (K,)
        if float(counts.sum()) < OPTIMAL_MIN_CALIBRATION:
            return None
        mean = float(sums.sum() / counts.sum())
        acceptance = (sums + OPTIMAL_CALIBRATION_PRIOR * mean) / (counts + OPTIMAL_CALIBRATION_PRIOR)  # (K,)
        marginal = round_seconds.diff().clamp(min=step_seconds)  # (N - 1,) cost of draft k + 1 after k drafts
        # tokens per row per second of the rounds pooled, each costed by the model: the unit of the costs, whatever
        # it is
        per_row_rate = float(tokens.sum() / (rounds * round_seconds[: rounds.numel()]).sum())
        return StoppingRule(
            edges=self.edges,
            acceptance=acceptance.float().to(self.device),
            mean_acceptance=mean,
            thresholds=(per_row_rate * marginal).float().to(self.device),
        )

    def observe(
        self,
        position_acceptance: torch.Tensor,  # (batch, N_r) beta_k of the round
        drafted_acceptance: torch.Tensor,  # (batch, N_r) a_k(x_k) of the round
        draft_lengths: torch.Tensor,  # (batch,) N_b
        seconds: tuple[float, float] | None,  # (drafting, rest of the round)
        confidence: torch.Tensor | None = None,  # (batch, N_r) q_k(x_k), the draft's probability of its tokens
        num_matches: torch.Tensor | int | None = None,  # (batch,) accepted drafts
    ) -> None:
        """Add the round's ``prod_{t<k} a_t(x_t) beta_k`` per row and drafted position, its acceptance per
        confidence bin, its timings and the tokens it emitted."""
        width = position_acceptance.shape[1]  # N_r
        if width:
            if width not in self._aranges:
                self._aranges[width] = torch.arange(width, device=position_acceptance.device)
            drafted = self._aranges[width] < draft_lengths[:, None]  # (batch, N_r)
            if confidence is not None:
                bins = torch.bucketize(confidence[drafted].float(), self.edges)  # (drafted,)
                which = min(self.round_index, 1)  # the round right after the prompt accepts differently
                self.calibration_sums[which].index_add_(0, bins, drafted_acceptance[drafted].double())
                self.calibration_counts[which].index_add_(0, bins, torch.ones_like(bins, dtype=torch.float64))
            if self.rule is None:  # the per-row estimates decide lengths (mode 2); the rule does not read them
                ones = drafted_acceptance.new_ones(drafted_acceptance.shape[0], 1)  # (batch, 1)
                reach = torch.cat([ones, drafted_acceptance[:, :-1]], dim=-1).cumprod(
                    dim=-1
                )  # (batch, N_r) prod_{t<k} a_t
                # past a row's draft length a position may hold anything (NaN included): dropped; before it, all is
                # finite
                terms = torch.where(drafted, reach * position_acceptance, 0.0)  # (batch, N_r)
                if self.round_index == 0:  # right after the prompt: pooled apart; the row's own only where no prior is
                    self.first_sums[:width] += terms.sum(dim=0)
                    self.first_counts[:width] += drafted.sum(dim=0)
                    if not self.complete:
                        unknown = self.prior_counts[:width] == 0  # (N_r,)
                        self.sums[:, :width] += terms * unknown
                        self.counts[:, :width] += drafted & unknown
                elif width == self.num_draft_tokens:
                    self.sums += terms
                    self.counts += drafted
                else:
                    self.sums[:, :width] += terms
                    self.counts[:, :width] += drafted
        if num_matches is not None and self.round_index >= 1 and 0 < width <= self.num_draft_tokens:
            # each row emits its accepted drafts and one more token; per row, on average (round 0 also fed the prompt)
            self.rate_tokens[width] += float(torch.as_tensor(num_matches, dtype=torch.float64).mean()) + 1.0
            self.rate_rounds[width] += 1.0
        if seconds is not None and self.round_index >= 1 and width:  # round 0 also fed the prompt
            batch_size = position_acceptance.shape[0]
            previous = self._previous[1:] if self._previous is not None and self._previous[0] == batch_size else None
            self.statistics.costs.setdefault((self.device_key, batch_size), CostSamples()).add(
                width, *seconds, previous
            )
            self._previous = (batch_size, width, *seconds)
        self.round_index += 1
        self.rule = self.rules[1]

    def drop(self, kept: torch.Tensor) -> None:  # (kept,) rows that continue
        gone = torch.ones(self.sums.shape[0], dtype=torch.bool, device=self.sums.device)  # (batch,)
        gone[kept] = False
        sums = (self.sums[gone] - self.prior_sums).sum(dim=0)  # (N,)
        counts = (self.counts[gone] - self.prior_counts).sum(dim=0)  # (N,)
        self.left = (sums, counts) if self.left is None else (self.left[0] + sums, self.left[1] + counts)
        self.sums, self.counts = self.sums[kept], self.counts[kept]

    def estimates(self) -> torch.Tensor:  # (batch, N) m_k per row, NaN where nothing is known
        return self.sums / self.counts  # 0 / 0 = NaN: neither a prior nor a round at that position

    def _costs(self, batch_size: int) -> tuple[float, torch.Tensor] | None:  # c, n c + c_verify(n) (N,)
        if self.costs is not None:
            return self._given
        if batch_size in self._round_seconds:
            return self._round_seconds[batch_size]
        samples = self.statistics.nearest_samples(self.device_key, batch_size)
        costs = None if samples is None else samples.round_seconds(self.num_draft_tokens, self.device)
        if costs is not None and not self.warming_up:  # fixed for the call; a warm-up call follows its own rounds
            self._round_seconds[batch_size] = costs
        return costs

    def lengths(self) -> torch.Tensor | None:  # (batch,) long in 1..N; None: keep the current lengths
        """The next round's draft length per row: a warm-up or probe length, else
        ``argmax_n E[T_n] / (n c + c_verify(n))`` (``N`` for a row that knows nothing about some position)."""
        batch_size = self.sums.shape[0]
        if self.rule is not None:  # the stopping rule decides within the round (module docstring, mode 1)
            if self._full is None or self._full.shape[0] != batch_size:
                self._full = torch.full((batch_size,), self.num_draft_tokens, dtype=torch.long, device=self.device)
            return self._full
        if self.warming_up and self.round_index < len(OPTIMAL_WARMUP):
            full = OPTIMAL_WARMUP[self.round_index] == "full"
            return torch.full((batch_size,), self.num_draft_tokens if full else 1, dtype=torch.long, device=self.device)
        if self.probing and self.round_index == 1:  # round 0 also fed the prompt: probe the first timed round
            return torch.ones(batch_size, dtype=torch.long, device=self.device)
        costs = self._costs(batch_size)
        if costs is None:
            return None  # nothing timed yet (a very short call)
        if self.round_index == 0:  # right after the prompt: its own prior; explore (draft N) until it covers 1..N
            if self.first_prior is None:
                return torch.full((batch_size,), self.num_draft_tokens, dtype=torch.long, device=self.device)
            return _best_lengths(self.first_prior[None], costs[1]).expand(batch_size)
        means = self.estimates()  # (batch, N)
        if self.complete:
            return _best_lengths(means, costs[1])
        unknown = means.isnan().any(dim=-1)  # (batch,)
        self.complete = not bool(unknown.any())
        return _best_lengths(means.nan_to_num(0.0), costs[1]).masked_fill_(unknown, self.num_draft_tokens)

    def finish(self) -> None:
        """Pool the call's per-position terms (every row, the prior left out) into the pair's priors for this setting:
        the first round's and the later rounds'."""
        seeded = self.prior_counts == 0  # (N,) where the first round also counted as the rows' own data
        sums = (self.sums - self.prior_sums).sum(dim=0) - self.first_sums * seeded  # (N,)
        counts = (self.counts - self.prior_counts).sum(dim=0) - self.first_counts * seeded  # (N,)
        if self.left is not None:
            sums, counts = sums + self.left[0], counts + self.left[1]
        first = (_first_round(self.setting), self.first_sums.cpu(), self.first_counts.cpu())
        for key, key_sums, key_counts in ((self.setting, sums.cpu(), counts.cpu()), first):
            if bool((key_counts > 0.5).any()):
                self.statistics.pool(key, key_sums, key_counts.round())
        keys = (_first_round(self.setting), self.setting)
        for key, sums, counts in zip(keys, self.calibration_sums, self.calibration_counts):
            if float(counts.sum()) > 0:
                self.statistics.pool_calibration(key, sums.cpu(), counts.cpu())
        if float(self.rate_rounds.sum()) > 0:
            self.statistics.pool_rate(self.rate_key, self.rate_tokens, self.rate_rounds)


def _best_lengths(
    position_terms: torch.Tensor,  # (batch, N) estimates of E[prod_{t<k} a_t(x_t) beta_k], no NaN
    round_seconds: torch.Tensor,  # (N,) n c + c_verify(n)
) -> torch.Tensor:  # (batch,) in 1..N
    """:func:`diversed_hf.verifiers.theory.optimal_draft_length` with the round costs computed once per call (fewer
    operations per round): ``argmax_n (1 + sum_{k<=n} m_k) / round_seconds(n)``."""
    return position_terms.cumsum(dim=-1).add_(1.0).div_(round_seconds).argmax(dim=-1).add_(1)


def _first_round(setting: Hashable) -> Hashable:
    """The key of the prior of the round right after the prompt (it feeds a different context: on the testbed's
    arith task ``E[T_16]`` is about 14 there and 10 in later rounds)."""
    return ("first round", setting)
