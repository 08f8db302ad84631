"""What a speculative round costs: :class:`DraftCosts` (passed in) and :class:`CostSamples` (measured).

A round of ``n`` drafts costs ``n c + c_verify(n)`` seconds: ``c`` one draft step, ``c_verify(n)`` the rest (the
target's pass over ``n + 1`` positions, verification, bookkeeping). The ``"optimal"`` draft-length schedule
(:mod:`diversed_hf.drafting.length.optimal`) reads them; users pass them as ``generate(...,
assistant_costs=DraftCosts(...))``.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ...verifiers.checks import is_real

__all__ = ["CostSamples", "DraftCosts", "LinearVerifyCost", "check_draft_costs"]

_COST_SAMPLES = 256  # pairs of consecutive rounds of different lengths kept per (pair, device, batch size)
_RECENT_ROUNDS = 64  # the last timed rounds the scale of the costs is the median over
_REFIT_EVERY = 16  # the fit of the costs is refreshed once this many rounds were timed since


@dataclass(frozen=True)
class LinearVerifyCost:
    """``c_verify(n) = max(intercept + slope n, floor)`` seconds: the fit
    :func:`diversed_hf.drafting.length.optimal.measured_draft_costs` returns."""

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
        if not is_real(step) or not math.isfinite(step) or step <= 0:
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
                f"`DraftCosts.verify_seconds` must be finite and > 0 for n = 1..{num_draft_tokens}, got "
                f"{curve.tolist()}."
            )
        return curve


def check_draft_costs(costs, schedule: str) -> None:
    """``assistant_costs``: a :class:`DraftCosts` or None, and only with the ``"optimal"`` schedule."""
    if costs is None:
        return
    if not isinstance(costs, DraftCosts):
        raise TypeError(
            f"`assistant_costs` must be a diversed_hf.DraftCosts or None, got {type(costs).__name__}: "
            "`assistant_costs=DraftCosts(draft_step_seconds=..., verify_seconds=...)`."
        )
    if schedule != "optimal":
        raise ValueError(
            f'`assistant_costs` is read only by `num_assistant_tokens_schedule="optimal"`, got {schedule!r}: pass '
            '`num_assistant_tokens_schedule="optimal"` as well, or remove `assistant_costs`.'
        )


def weighted_median(values: list[tuple[float, float]]) -> float:
    """The median of ``(value, weight)`` pairs, weighted."""
    values = sorted(values)
    half, total = sum(w for _, w in values) / 2, 0.0
    for value, weight in values:
        total += weight
        if total >= half:
            return value
    return values[-1][0]


class CostSamples:
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
        delta = weighted_median(delta) if delta else 0.0
        kappa = weighted_median(kappa) if kappa else 0.0
        step = statistics.median(d / (delta + n) for n, d, _ in self.recent)  # s_d = c
        rest = statistics.median(r / (1.0 + kappa * n) for n, _, r in self.recent)  # s_r
        self._fitted = DraftCosts(
            draft_step_seconds=max(step, 1e-12), verify_seconds=LinearVerifyCost(step * delta + rest, rest * kappa)
        )
        return self._fitted
