"""The theory of relaxed speculative decoding as code you can check (docs/method.md §6).

Pure torch; nothing here imports transformers or draws random numbers.

**Tokens per round.** A round drafts ``x_1..x_N ~ q`` (each conditioned on the drafts before
it), keeps them up to the first rejection and emits one more (recovered or bonus), so it emits
``T_N = accepted + 1`` tokens. Draft ``t`` is accepted with probability ``a_t(x_t)`` (for
verification against ``pi``: ``min(1, pi_t(x_t) / q_t(x_t))``), independently given the drafts, and
``beta_t = sum_x q_t(x) a_t(x)`` is its acceptance probability before ``x_t`` is drawn. Hence

    E[T_N] = sum_{k=0..N} P(first k drafts accepted) = 1 + sum_{k=1..N} E[ prod_{t<k} a_t(x_t) * beta_k ]

and the per-round value inside the expectation is an unbiased, low-variance estimator of
``E[T_N]`` (the uniform draws of verification are averaged out exactly): this is
:func:`expected_tokens_per_round`, the one estimator the library reports (``SpeculationStats``,
the bench). The tempting form ``1 + sum_k E[prod_{t<=k} beta_t]`` with ``beta_t`` along the drafted
prefix (:func:`beta_product_tokens_per_round`) is the same only when ``beta_{t+1}`` does not depend on
whether ``x_t`` was a token likely to be accepted — true when acceptance depends on position but not
on context, **biased in general**. Example: ``q_1`` uniform on ``{A, B}``, ``p_1 = delta_A``; after
``A`` the models disagree (``beta_2 = 0``), after ``B`` they agree (``beta_2 = 1``). Then
``E[T_2] = 1.5`` but ``1 + beta_1 + E[beta_1 beta_2] = 1.75``. If every ``beta_t = alpha``
independently of context, both reduce to the i.i.d. formula of Leviathan et al. (2023),
``(1 - alpha^(N+1)) / (1 - alpha)`` (:func:`iid_tokens_per_round`), which ignores that acceptance
depends on position and context.

**Speedup model.** With ``c = cost(draft token) / cost(target token)`` a round costs ``N c + 1``
target-token equivalents and emits ``E[T_N]`` tokens, so the speedup over target-only decoding is
about ``E[T_N] / (N c + 1)`` (:func:`predicted_speedup`).

**Single-step Pareto front** (Yin et al. 2024; DIVERSED Prop. 1). A single-step verification rule
accepts a draft ``x ~ q`` with probability ``a(x)`` and otherwise emits a recovered token from
``r``; its output is ``o = q a + (1 - sum q a) r``. Its *rejection* is ``1 - sum_x q(x) a(x)`` and
its *bias* ``TV(o, p)``. Because ``o >= q a``, ``TV(o, q) <= rejection``, and the triangle
inequality gives

    bias + rejection >= TV(p, q)

for every rule. The static ensemble ``nu = w p + (1 - w) q`` has rejection ``w TV(p, q)`` and bias
``(1 - w) TV(p, q)``: it is *on* the front, and sweeping ``w`` traces it
(:func:`static_ensemble_tradeoff`, :func:`single_step_tradeoff`). One step at a time, lossy SD and
the deferral cascades (``w in {0, 1}``) are on the front too; the geometric pool and the token-level
cascades can lie above it. The front is a per-position statement: DIVERSED's claim is that choosing
*where* on it to stand, per context, buys sequence-level quality for acceptance.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import ops

__all__ = [
    "Tradeoff",
    "beta_product_tokens_per_round",
    "block_tokens_per_round",
    "optimal_draft_length",
    "expected_tokens_per_round",
    "iid_tokens_per_round",
    "predicted_speedup",
    "position_acceptance",
    "single_step_tradeoff",
    "static_ensemble_tradeoff",
    "front_gap",
]


def _check_rounds(name: str, values: torch.Tensor) -> None:
    if not isinstance(values, torch.Tensor) or values.dim() != 2:
        shape = tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__
        raise ValueError(
            f"`{name}` must be a tensor of shape (num_rounds, num_draft_tokens), got {shape}. Concatenate the per-row "
            "tensors of `SpeculationStats` with `torch.cat`."
        )


def _mean_or_nan(per_round_value: torch.Tensor, per_round: bool) -> torch.Tensor:
    if per_round:
        return per_round_value
    if per_round_value.numel() == 0:
        return torch.tensor(float("nan"), dtype=torch.float64)
    return per_round_value.mean()


def expected_tokens_per_round(
    position_acceptance: torch.Tensor,  # (num_rounds, N) beta_t per round along the drafted prefix; NaN = not drafted
    drafted_acceptance: torch.Tensor,  # (num_rounds, N) a_t(x_t) of the drafted tokens; NaN = not drafted
    *,
    per_round: bool = False,
) -> torch.Tensor:  # () mean over rounds, or (num_rounds,) if per_round
    """Unbiased estimator of the expected tokens per round ``E[T_N]`` (docs/method.md §6).

    Each round contributes ``1 + sum_{k=1..N} prod_{t<k} a_t(x_t) * beta_k``: the probability of
    reaching position ``k`` given the drafted tokens, times the probability that it accepts. Its mean
    over rounds is unbiased for ``E[T_N]`` whatever the models are.

    For block verification (:class:`~diversed_hf.verifiers.BlockVerifier`) ``a_t(x_t)`` is the factor
    ``rho_t / rho_{t-1}`` of the running weight and ``beta_k`` the acceptance of position ``k`` given the prefix
    before it, so each round contributes ``1 + sum_k E[rho_k | x_1..x_{k-1}]``: unbiased too
    (:mod:`diversed_hf.verifiers.block`).

    A NaN marks a position the round did not draft (a round cut short by the length budget or the
    draft-length policy): the sum stops there, as the round's count of accepted drafts does. Returns
    NaN for zero rounds.
    """
    if drafted_acceptance is None:
        raise ValueError(
            "`drafted_acceptance` (a_t(x_t) of each drafted token, `SpeculationStats.drafted_acceptance`) is required: "
            "without it E[T_N] cannot be estimated without bias. For the beta-product form use "
            "`theory.beta_product_tokens_per_round`."
        )
    _check_rounds("position_acceptance", position_acceptance)
    if drafted_acceptance.shape != position_acceptance.shape:
        raise ValueError(
            f"`drafted_acceptance` has shape {tuple(drafted_acceptance.shape)} but `position_acceptance` has "
            f"{tuple(position_acceptance.shape)}; pass both per round and position."
        )
    betas = torch.nan_to_num(position_acceptance.double(), nan=0.0).clamp(0.0, 1.0)  # (rounds, N)
    kept = torch.nan_to_num(drafted_acceptance.double(), nan=0.0).clamp(min=0.0)  # (rounds, N)
    # Block verification reports factors rho_t / rho_{t-1} that may exceed 1; their products (a reach) never do.
    before = torch.cat([torch.ones_like(kept[:, :1]), kept[:, :-1].cumprod(dim=-1)], dim=-1).clamp(
        max=1.0
    )  # (rounds, N)
    return _mean_or_nan(1.0 + (before * betas).sum(dim=-1), per_round)  # (rounds,) -> ()


def beta_product_tokens_per_round(
    position_acceptance: torch.Tensor,  # (num_rounds, N) beta_t per round; NaN = not drafted
    *,
    per_round: bool = False,
) -> torch.Tensor:  # () mean over rounds, or (num_rounds,) if per_round
    """``1 + sum_k prod_{t<=k} beta_t`` per round: **biased** unless acceptance ignores the drafted context.

    Kept to show the bias (module docstring) and for results recorded without ``a_t(x_t)``; report
    :func:`expected_tokens_per_round` instead.
    """
    _check_rounds("position_acceptance", position_acceptance)
    betas = torch.nan_to_num(position_acceptance.double(), nan=0.0).clamp(0.0, 1.0)  # (rounds, N)
    return _mean_or_nan(1.0 + betas.cumprod(dim=-1).sum(dim=-1), per_round)  # (rounds,) -> ()


def block_tokens_per_round(
    draft_probs: torch.Tensor,  # (N, vocab) q_t, the same whatever was drafted before t
    verify_probs: torch.Tensor,  # (N, vocab) pi_t
    *,
    max_states: int = 1_000_000,
) -> float:
    """Exact ``E[T_N]`` of block verification when the distributions depend on the position only (docs/method.md §6).

    ``E[T_N] = 1 + sum_{k=1..N} P(tau >= k) = 1 + sum_k E[rho_k]`` with the running weight
    ``rho_k = min(1, rho_{k-1} pi_k(x_k) / q_k(x_k))``, ``x_k ~ q_k`` (:mod:`diversed_hf.verifiers.block`), computed by
    carrying the law of ``rho_k`` (its distinct values and their mass) from position to position. Token-wise
    verification of the same distributions gives ``1 + sum_k prod_{t<=k} beta_t`` (:func:`beta_product_tokens_per_round`
    of one round); block is never below it. ``max_states`` bounds the distinct values kept (they can grow as
    ``vocab^N``).
    """
    if (
        not (isinstance(draft_probs, torch.Tensor) and isinstance(verify_probs, torch.Tensor))
        or draft_probs.dim() != 2
        or draft_probs.shape != verify_probs.shape
    ):
        shapes = [
            tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__ for x in (draft_probs, verify_probs)
        ]
        raise ValueError(
            f"`draft_probs` and `verify_probs` must be tensors of one shape (num_draft_tokens, vocab), got {shapes[0]} "
            f"and {shapes[1]}. For distributions that depend on the drafted context, average "
            "`expected_tokens_per_round` over simulated rounds instead."
        )
    values = torch.ones(1, dtype=torch.float64)  # (S,) distinct rho_{k-1}
    mass = torch.ones(1, dtype=torch.float64)  # (S,) their probabilities
    expected = 1.0
    for draft_row, verify_row in zip(draft_probs.double(), verify_probs.double()):
        drafted = draft_row > 0  # (vocab,) tokens the draft can propose
        kept = values[:, None] * verify_row[drafted]  # (S, V') rho_{k-1} pi_k(x)
        weights = torch.where(kept > 0, (kept / draft_row[drafted]).clamp(max=1.0), torch.zeros_like(kept))  # (S, V')
        weights_mass = mass[:, None] * draft_row[drafted]  # (S, V')
        expected += float((weights * weights_mass).sum())
        values, inverse = torch.unique(weights.flatten(), return_inverse=True)  # (S',)
        mass = torch.zeros_like(values).index_add_(0, inverse, weights_mass.flatten())
        if values.numel() > max_states:
            raise ValueError(
                f"the running weight takes more than `max_states`={max_states} values after {len(draft_probs)} "
                f"positions of {draft_probs.shape[1]} tokens; raise `max_states`, use fewer positions, or estimate "
                "from simulated rounds with `expected_tokens_per_round`."
            )
    return expected


def iid_tokens_per_round(alpha, num_draft_tokens: int):
    """``E[T_N] = (1 - alpha^(N+1)) / (1 - alpha)`` when every draft is accepted independently with
    probability ``alpha`` (Leviathan et al. 2023, eq. 1); ``N + 1`` at ``alpha = 1``.

    ``alpha`` may be a float or a tensor (elementwise); the result has the same kind.
    """
    if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) or num_draft_tokens < 0:
        raise ValueError(f"`num_draft_tokens` must be a non-negative integer, got {num_draft_tokens!r}.")
    is_tensor = isinstance(alpha, torch.Tensor)
    alpha_t = torch.as_tensor(alpha, dtype=torch.float64)  # (...)
    tolerance = 1e-5  # float32 sums of probabilities overshoot 1 by a few ulps
    if bool(((alpha_t < -tolerance) | (alpha_t > 1 + tolerance) | alpha_t.isnan()).any()):
        raise ValueError(f"`alpha` is an acceptance probability and must lie in [0, 1], got {alpha!r}.")
    alpha_t = alpha_t.clamp(0.0, 1.0)
    # sum_{k=0..N} alpha^k: exact at alpha = 1 and stable near it.
    powers = alpha_t.unsqueeze(-1) ** torch.arange(num_draft_tokens + 1, dtype=torch.float64)  # (..., N + 1)
    value = powers.sum(dim=-1)  # (...)
    return value if is_tensor else float(value)


def predicted_speedup(tokens_per_round, num_draft_tokens: int, cost_ratio):
    """Speedup over target-only decoding, ``E[T_N] / (N c + 1)`` (docs/method.md §6).

    ``cost_ratio`` ``c`` is the cost of one draft token over one target token, measured in the
    same setting (e.g. seconds per token of each model decoding alone). The model charges a
    verification pass over ``N + 1`` positions like one target token, which holds while decoding is
    memory-bound; it ignores the verifier's own cost.
    """
    if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) or num_draft_tokens < 0:
        raise ValueError(f"`num_draft_tokens` must be a non-negative integer, got {num_draft_tokens!r}.")
    return tokens_per_round / (num_draft_tokens * cost_ratio + 1.0)


def optimal_draft_length(
    position_terms: torch.Tensor,  # (batch, K) estimates of E[prod_{t<k} a_t(x_t) beta_k], k = 1..K; NaN = unknown
    draft_seconds: float,  # one draft step
    verify_seconds: torch.Tensor,  # (K,) one verification pass with n = 1..K drafts
) -> torch.Tensor:  # (batch,) in 1..K
    """The draft length with the most expected tokens per second, per row (docs/method.md §6).

    ``E[T_n] = 1 + sum_{k<=n} E[prod_{t<k} a_t(x_t) beta_k]`` (the terms of
    :func:`expected_tokens_per_round`, averaged over past rounds by position) and a round of ``n``
    drafts costs ``n c + c_verify(n)`` seconds, so ``N* = argmax_n E[T_n] / (n c + c_verify(n))``.
    Unknown terms count as 0 (a position never drafted adds no expected token).
    """
    terms = torch.nan_to_num(position_terms.double(), nan=0.0).clamp(0.0, 1.0)  # (batch, K)
    expected = 1.0 + terms.cumsum(dim=-1)  # (batch, K) E[T_n], n = 1..K
    lengths = torch.arange(1, terms.shape[-1] + 1, dtype=torch.float64, device=terms.device)  # (K,)
    cost = lengths * float(draft_seconds) + verify_seconds.to(device=terms.device, dtype=torch.float64)  # (K,)
    return (expected / cost.clamp(min=1e-12)).argmax(dim=-1) + 1


def position_acceptance(
    position_acceptance: torch.Tensor,  # (num_rounds, N) beta_t, NaN = not drafted
) -> torch.Tensor:  # (N,)
    """Mean ``beta_t`` per draft position over the rounds that drafted it (NaN where none did)."""
    drafted = ~position_acceptance.isnan()  # (rounds, N)
    total = torch.nan_to_num(position_acceptance.double(), nan=0.0).sum(dim=0)  # (N,)
    count = drafted.sum(dim=0).double()  # (N,)
    return torch.where(count > 0, total / count.clamp(min=1), torch.full_like(total, float("nan")))


@dataclass(frozen=True)
class Tradeoff:
    """Single-step quantities of a verification rule at one position (each ``(...)``-shaped)."""

    rejection: torch.Tensor  # 1 - sum_x q(x) a(x)
    bias: torch.Tensor  # TV(output, p)
    total_variation: torch.Tensor  # TV(p, q): the front is bias + rejection = TV
    output_probs: torch.Tensor  # (..., vocab) distribution of the emitted token

    @property
    def gap(self) -> torch.Tensor:
        """``bias + rejection - TV(p, q)``: >= 0 for every rule, 0 on the front."""
        return self.bias + self.rejection - self.total_variation


def single_step_tradeoff(
    verifier,
    draft_probs: torch.Tensor,  # (..., vocab)
    target_probs: torch.Tensor,  # (..., vocab)
    **context: torch.Tensor,
) -> Tradeoff:
    """Rejection and bias of any :class:`~diversed_hf.verifiers.Verifier` at one position.

    Uses the verifier's own rule (``verification_probs``, ``token_acceptance``, ``residual_probs``), so it
    covers lossy SD, cascades and heads as well as mixtures. ``context`` is passed on to
    ``verification_probs`` (hidden states for a head). Leading dimensions are treated as
    ``(batch, N)``-like: a ``(vocab,)`` input is handled as one position.
    """
    squeeze = draft_probs.dim() == 1
    if squeeze:
        draft_probs, target_probs = draft_probs[None, None], target_probs[None, None]  # (1, 1, vocab)
    verify_probs, _ = verifier.verification_probs(draft_probs, target_probs, **context)  # (..., vocab)
    acceptance = verifier.token_acceptance(draft_probs, target_probs, verify_probs)  # (..., vocab)
    residual = verifier.residual_probs(draft_probs, target_probs, verify_probs)  # (..., vocab)
    output = ops.emitted_distribution(draft_probs, acceptance, residual)  # (..., vocab)
    rejection = 1.0 - (draft_probs * acceptance).sum(dim=-1)  # (...)
    bias = ops.total_variation(output, target_probs)  # (...)
    tv = ops.total_variation(target_probs, draft_probs)  # (...)
    if squeeze:
        rejection, bias, tv, output = rejection[0, 0], bias[0, 0], tv[0, 0], output[0, 0]
    return Tradeoff(rejection=rejection, bias=bias, total_variation=tv, output_probs=output)


def static_ensemble_tradeoff(
    draft_probs: torch.Tensor,  # (..., vocab)
    target_probs: torch.Tensor,  # (..., vocab)
    target_weight,  # float or (...)
) -> tuple[torch.Tensor, torch.Tensor]:  # rejection (...), bias (...)
    """Closed form for ``nu = w p + (1 - w) q``: rejection ``w TV(p, q)``, bias ``(1 - w) TV(p, q)``."""
    tv = ops.total_variation(target_probs, draft_probs)  # (...)
    weight = torch.as_tensor(target_weight, dtype=tv.dtype, device=tv.device)  # (...) or ()
    return weight * tv, (1.0 - weight) * tv


def front_gap(rejection: torch.Tensor, bias: torch.Tensor, total_variation: torch.Tensor) -> torch.Tensor:
    """``bias + rejection - TV(p, q)`` (elementwise): how far a rule is above the linear front."""
    return bias + rejection - total_variation
