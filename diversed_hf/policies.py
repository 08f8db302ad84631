"""State of the ``"optimal"`` draft-length schedule: round costs, the cross-call cache, the per-row estimator.

:class:`~diversed_hf.candidates.DiversedCandidateGenerator` drives one :class:`OptimalSchedule` per call. Each
round every row drafts the ``n`` in ``1..N`` with the most expected tokens per second,
``E[T_n] / (n c + c_verify(n))`` (:func:`diversed_hf.theory.optimal_draft_length`).

**Costs.** ``c`` is a draft step, ``c_verify(n)`` the rest of a round with ``n`` drafts (the target's pass,
verification, bookkeeping). They are ``assistant_costs`` (:class:`DraftCosts`) when passed, else measured on the
(target, draft) pair at the batch size (else the nearest one timed) and kept across calls: drafting is modelled as
``s_d (delta + n)`` and the rest as ``s_r (1 + kappa n)``; the shapes ``delta``, ``kappa`` come from consecutive
rounds of different lengths (timed under the same load), the scales ``s_d``, ``s_r`` from the last
``_RECENT_ROUNDS`` rounds (``_CostSamples``), so ``c = s_d`` and ``c_verify(n) = s_d delta + s_r (1 + kappa n)``.
A call that finds costs uses them throughout; only a call that finds none warms up (:data:`OPTIMAL_WARMUP`) and
fits its own rounds as they come. The shapes rest on far-apart lengths: the calls after a warm-up draft one token
in their second round until :data:`OPTIMAL_PROBES` such pairs are timed. Every call's timings refine the cache.

**Acceptance.** ``E[T_n] = 1 + sum_{k<=n} m_k``, with ``m_k`` the row's estimate of
``E[prod_{t<k} a_t(x_t) beta_k]`` (the per-round terms of :func:`diversed_hf.theory.expected_tokens_per_round`)::

    m_k = (s_k + w * prior_k) / (c_k + w)        (prior_k unknown: m_k = s_k / c_k)

``s_k`` / ``c_k`` are the row's own sum and count of the terms at position ``k`` (its rounds that drafted ``k``),
``prior_k`` the mean pooled from earlier calls with the same pair and setting (verifier, greedy or sampled, logits
processors; the last :data:`OPTIMAL_POOL_ROUNDS` rounds per position, older ones fade) and
``w`` = :data:`OPTIMAL_PRIOR_ROUNDS`: the prior weighs as much as that many of the row's rounds. A position pooled
from fewer than :data:`OPTIMAL_MIN_POOLED_ROUNDS` rounds has no prior. A row with no estimate at some position
(the first call, ``N`` above what earlier calls drafted) drafts ``N``, which observes every position; lengths stay
in ``1..N`` (and within the row's length budget, :meth:`~diversed_hf.candidates.DiversedCandidateGenerator.plan_draft_lengths`).

The round right after the prompt accepts differently (on the testbed's arith task the terms at positions 13-16
are about 0.5-0.6 there and 0.3 in later rounds), so it is pooled apart: it drafts ``N`` until its own prior covers
``1..N``, then the length that prior makes best; it counts as the row's own data only where no later-round prior is.

The cache lives in a module-level ``weakref.WeakKeyDictionary`` keyed by the draft model (then a weak reference to
the target): nothing is written on the models, and it goes with them. :func:`measured_draft_costs` reads the
costs; :func:`clear_draft_statistics` forgets everything for a draft.
"""

from __future__ import annotations

import math
import statistics
import weakref
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch

from . import theory

__all__ = [
    "DraftCosts",
    "LinearVerifyCost",
    "OptimalSchedule",
    "acceptance_setting",
    "check_draft_costs",
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
_COST_SAMPLES = 256  # pairs of consecutive rounds of different lengths kept per (pair, device, batch size)
_RECENT_ROUNDS = 64  # the last timed rounds the scale of the costs is the median over
_REFIT_EVERY = 16  # the fit of the costs is refreshed once this many rounds were timed since
_SETTINGS_PER_PAIR = 32  # acceptance priors kept per pair (verifier and sampling settings)


@dataclass(frozen=True)
class LinearVerifyCost:
    """``c_verify(n) = max(intercept + slope n, floor)`` seconds: the fit :func:`measured_draft_costs` returns."""

    intercept: float
    slope: float
    floor: float = 0.0

    def __call__(self, n: int) -> float:
        return max(self.intercept + self.slope * n, self.floor)


@dataclass(frozen=True)
class DraftCosts:
    """What a round costs, for ``num_assistant_tokens_schedule="optimal"``: ``generate(..., assistant_costs=...)``.

    A round of ``n`` drafts costs ``n * draft_step_seconds + verify_seconds(n)``; only ratios matter, so any unit
    works if both fields use it. Passed costs replace the measured ones (the call then needs no warm-up).

    Args:
        draft_step_seconds: one draft step (one token for every row of the batch), > 0.
        verify_seconds: the rest of a round with ``n`` drafts (the target's pass over ``n + 1`` positions,
            verification, bookkeeping): a callable ``n -> seconds`` (e.g. :class:`LinearVerifyCost`), or a
            sequence / 1-D tensor whose entry ``n - 1`` is for ``n`` drafts, with at least ``num_assistant_tokens``
            entries. Values must be finite and > 0.
    """

    draft_step_seconds: float
    verify_seconds: Callable[[int], float] | Sequence[float] | torch.Tensor

    def __post_init__(self):
        step = self.draft_step_seconds
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step) or step <= 0:
            raise ValueError(
                f"`DraftCosts.draft_step_seconds` must be a finite number of seconds > 0, got {step!r}. Time one draft "
                "step of your pair (or read `measured_draft_costs(target, draft)` after a call)."
            )
        verify = self.verify_seconds
        if not callable(verify) and (
            isinstance(verify, (str, bytes)) or not isinstance(verify, (Sequence, torch.Tensor)) or len(verify) == 0
        ):
            raise TypeError(
                f"`DraftCosts.verify_seconds` must be a callable n -> seconds or a non-empty sequence / 1-D tensor "
                f"(entry n - 1 for n drafts), got {type(verify).__name__} {verify!r}. E.g. "
                "`verify_seconds=lambda n: 0.012 + 0.0003 * n`."
            )

    def verify_curve(self, num_draft_tokens: int) -> torch.Tensor:  # (N,) float64 seconds for n = 1..N
        """``verify_seconds`` at ``n = 1..num_draft_tokens``, checked."""
        if callable(self.verify_seconds):
            values = [self.verify_seconds(n) for n in range(1, num_draft_tokens + 1)]
            if any(isinstance(v, bool) or not isinstance(v, (int, float, torch.Tensor)) for v in values):
                raise TypeError(f"`DraftCosts.verify_seconds(n)` must return a number of seconds, got {values!r}.")
            curve = torch.tensor([float(v) for v in values], dtype=torch.float64)
        else:
            try:
                curve = torch.as_tensor(self.verify_seconds, dtype=torch.float64).cpu()
            except (TypeError, ValueError, RuntimeError) as error:
                raise TypeError(f"`DraftCosts.verify_seconds` must hold numbers of seconds: {error}") from None
            if curve.dim() != 1 or curve.numel() < num_draft_tokens:
                raise ValueError(
                    f"`DraftCosts.verify_seconds` has shape {tuple(curve.shape)}; it needs one entry per draft length "
                    f"n = 1..num_assistant_tokens = {num_draft_tokens}. Pass {num_draft_tokens} values or a callable."
                )
            curve = curve[:num_draft_tokens]
        if not bool((curve.isfinite() & (curve > 0)).all()):
            raise ValueError(
                f"`DraftCosts.verify_seconds` must be finite and > 0 for n = 1..{num_draft_tokens}, got {curve.tolist()}."
            )
        return curve


def check_draft_costs(costs, schedule: str) -> None:
    """``assistant_costs``: a :class:`DraftCosts` or None, and only with the ``"optimal"`` schedule."""
    if costs is None:
        return
    if not isinstance(costs, DraftCosts):
        raise TypeError(
            f"`assistant_costs` must be a diversed_hf.candidates.DraftCosts or None, got {type(costs).__name__}: "
            "`assistant_costs=DraftCosts(draft_step_seconds=..., verify_seconds=...)`."
        )
    if schedule != "optimal":
        raise ValueError(
            f"`assistant_costs` is read only by `num_assistant_tokens_schedule=\"optimal\"`, got {schedule!r}: pass "
            "`num_assistant_tokens_schedule=\"optimal\"` as well, or remove `assistant_costs`."
        )


# Statistics the "optimal" schedule keeps across calls ----------------------------------------------------------------
# draft model -> {weakref(target) or None: _PairStatistics}; nothing is stored on the models themselves.
_STATISTICS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _weighted_median(values: list[tuple[float, float]]) -> float:
    """The median of ``(value, weight)`` pairs, weighted."""
    values = sorted(values)
    half, total = sum(w for _, w in values) / 2, 0.0
    for value, weight in values:
        total += weight
        if total >= half:
            return value
    return values[-1][0]


class _CostSamples:
    """Timed rounds of one (pair, device, batch size) and the costs fitted to them.

    A round of ``n`` drafts is modelled as drafting ``s_d (delta + n)`` and the rest ``s_r (1 + kappa n)`` seconds.
    The shapes ``delta`` and ``kappa`` come from pairs of consecutive rounds of one call with different lengths (a
    probe and its neighbour): the two are timed under the same machine load, so their ratio does not depend on it;
    each pair solves for the shape, and the fit takes the median weighted by the squared length gap. The scales
    ``s_d`` and ``s_r`` are the medians over the last ``_RECENT_ROUNDS`` rounds, so they follow a machine that slows
    down or speeds up (other processes, clocks) without confusing that with the slope.
    """

    def __init__(self):
        self.recent: deque = deque(maxlen=_RECENT_ROUNDS)  # (n, drafting seconds, rest-of-round seconds)
        self.pairs: deque = deque(maxlen=_COST_SAMPLES)  # (n_a, drafting_a, rest_a, n_b, drafting_b, rest_b)
        self.added = 0  # rounds timed since the last fit
        self._fitted: DraftCosts | None = None
        self._curves: dict[tuple[int, str], tuple[float, torch.Tensor]] = {}  # (N, device) -> (c, n c + c_verify(n))

    def add(self, width: int, drafting: float, rest: float, previous: tuple[int, float, float] | None = None) -> None:
        """One timed round, and the timed round before it in the same call, if any."""
        self.recent.append((width, drafting, rest))
        self.added += 1
        new_pair = previous is not None and previous[0] != width
        if new_pair:
            self.pairs.append((*previous, width, drafting, rest))
        if self.added >= _REFIT_EVERY or new_pair or self._fitted is None:
            self._fitted, self._curves, self.added = None, {}, 0

    def round_seconds(self, num_draft_tokens: int, device: torch.device) -> tuple[float, torch.Tensor] | None:
        """``(c, n c + c_verify(n) for n = 1..N)`` of the current fit (cached until it is refreshed)."""
        key = (num_draft_tokens, str(device))
        if key not in self._curves:
            fitted = self.fit()
            if fitted is None:
                return None
            lengths = torch.arange(1, num_draft_tokens + 1, dtype=torch.float64)  # (N,)
            total = lengths * fitted.draft_step_seconds + fitted.verify_curve(num_draft_tokens)  # (N,)
            self._curves[key] = fitted.draft_step_seconds, total.to(device)
        return self._curves[key]

    def count_pairs(self, min_gap: int) -> int:
        """Pairs of consecutive rounds whose lengths differ by at least ``min_gap``."""
        return sum(abs(p[0] - p[3]) >= min_gap for p in self.pairs)

    def fit(self) -> DraftCosts | None:
        """``c = s_d`` per draft step and ``c_verify(n) = s_d delta + s_r (1 + kappa n)`` (class docstring); while no
        pair of lengths is timed, ``delta = kappa = 0``."""
        if self._fitted is not None:
            return self._fitted
        if not self.recent:
            return None
        delta, kappa = [], []
        for n_a, d_a, r_a, n_b, d_b, r_b in self.pairs:
            weight = float((n_a - n_b) ** 2)
            if d_a > 0 and d_b > 0 and d_a != d_b:  # d_a / d_b = (delta + n_a) / (delta + n_b)
                ratio = d_a / d_b
                delta.append((max(0.0, (n_a - ratio * n_b) / (ratio - 1.0)), weight))
            if r_a > 0 and r_b > 0 and r_a * n_b != r_b * n_a:  # r_a / r_b = (1 + kappa n_a) / (1 + kappa n_b)
                ratio = r_a / r_b
                kappa.append((max(0.0, (1.0 - ratio) / (ratio * n_b - n_a)), weight))
        delta = _weighted_median(delta) if delta else 0.0
        kappa = _weighted_median(kappa) if kappa else 0.0
        step = statistics.median(d / (delta + n) for n, d, _ in self.recent)  # s_d = c
        rest = statistics.median(r / (1.0 + kappa * n) for n, _, r in self.recent)  # s_r
        self._fitted = DraftCosts(
            draft_step_seconds=max(step, 1e-12), verify_seconds=LinearVerifyCost(step * delta + rest, rest * kappa)
        )
        return self._fitted


class _PairStatistics:
    def __init__(self):
        self.costs: dict[tuple[str, int], _CostSamples] = {}  # (device, batch size) ->
        self.acceptance: dict[Hashable, tuple[torch.Tensor, torch.Tensor]] = {}  # setting -> sums (K,), counts (K,)

    def nearest_samples(self, device: str, batch_size: int) -> _CostSamples | None:
        """The rounds timed at this batch size, else at the nearest timed one (on this device)."""
        sizes = sorted((abs(b - batch_size), -b) for (d, b), samples in list(self.costs.items()) if d == device and samples.recent)
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
    processors = tuple(
        (type(p).__qualname__, tuple(sorted((k, v) for k, v in getattr(p, "__dict__", {}).items() if isinstance(v, scalars))))
        for p in logits_processor
    )
    return token, bool(do_sample), processors


class OptimalSchedule:
    """One call of the ``"optimal"`` schedule (module docstring): per-row estimates, costs, warm-up, pooling.

    ``start`` gives the first round's lengths; after each verified round ``observe`` (and ``drop`` when rows
    leave), then ``lengths`` for the next round; ``finish`` pools the call into the pair's priors. Per round this is
    about twenty tensor operations on ``(batch, N)``, no Python loop over rows.
    """

    def __init__(self, draft, num_draft_tokens: int, *, target=None, setting: Hashable = None, costs: DraftCosts | None = None):
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
            not self.warming_up and self.costs is None and width > 1
            and (timed_here is None or timed_here.count_pairs(max(1, width // 2)) < OPTIMAL_PROBES)
        )
        self._previous: tuple[int, int, float, float] | None = None  # (batch, n, drafting, rest) of the last timed round
        return self.lengths()

    def observe(
        self,
        position_acceptance: torch.Tensor,  # (batch, N_r) beta_k of the round
        drafted_acceptance: torch.Tensor,  # (batch, N_r) a_k(x_k) of the round
        draft_lengths: torch.Tensor,  # (batch,) N_b
        seconds: tuple[float, float] | None,  # (drafting, rest of the round)
    ) -> None:
        """Add the round's ``prod_{t<k} a_t(x_t) beta_k`` per row and drafted position, and its timings."""
        width = position_acceptance.shape[1]  # N_r
        if width:
            if width not in self._aranges:
                self._aranges[width] = torch.arange(width, device=position_acceptance.device)
            drafted = self._aranges[width] < draft_lengths[:, None]  # (batch, N_r)
            ones = drafted_acceptance.new_ones(drafted_acceptance.shape[0], 1)  # (batch, 1)
            reach = torch.cat([ones, drafted_acceptance[:, :-1]], dim=-1).cumprod(dim=-1)  # (batch, N_r) prod_{t<k} a_t
            # past a row's draft length a position may hold anything (NaN included): dropped; before it, all is finite
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
        if seconds is not None and self.round_index >= 1 and width:  # round 0 also fed the prompt
            batch_size = position_acceptance.shape[0]
            previous = self._previous[1:] if self._previous is not None and self._previous[0] == batch_size else None
            self.statistics.costs.setdefault((self.device_key, batch_size), _CostSamples()).add(width, *seconds, previous)
            self._previous = (batch_size, width, *seconds)
        self.round_index += 1

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


def _best_lengths(
    position_terms: torch.Tensor,  # (batch, N) estimates of E[prod_{t<k} a_t(x_t) beta_k], no NaN
    round_seconds: torch.Tensor,  # (N,) n c + c_verify(n)
) -> torch.Tensor:  # (batch,) in 1..N
    """:func:`diversed_hf.theory.optimal_draft_length` with the round costs computed once per call (fewer operations
    per round): ``argmax_n (1 + sum_{k<=n} m_k) / round_seconds(n)``."""
    return position_terms.cumsum(dim=-1).add_(1.0).div_(round_seconds).argmax(dim=-1).add_(1)


def _first_round(setting: Hashable) -> Hashable:
    """The key of the prior of the round right after the prompt (it feeds a different context: on the testbed's
    arith task ``E[T_16]`` is about 14 there and 10 in later rounds)."""
    return ("first round", setting)
