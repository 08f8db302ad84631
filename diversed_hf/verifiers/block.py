"""Block verification: judge the drafted block as a whole (Sun et al. 2024, arXiv 2403.10444; docs/method.md §2).

Token-wise verification keeps draft ``t`` with probability ``min(1, pi_t(x_t) / q_t(x_t))`` and stops at the
first rejection. Block verification keeps a running weight along the block,

    rho_0 = 1,    rho_t = min(1, rho_{t-1} pi_t(x_t) / q_t(x_t))

so a later draft the verification distribution likes (``pi > q``) can make up for an earlier one it did not.
Going from the end of the block to its start, the round keeps the first ``t`` drafts with probability

    h_L = rho_L                                              (L: the drafts the row counts)
    h_t = e_t / (e_t + 1 - rho_t),   e_t = sum_x max(0, rho_t pi_{t+1}(x) - q_{t+1}(x))      (t < L)

(0 where ``e_t = 0``: the round never stops where the residual below is empty), the longest such prefix
wins (``tau = max {t : u_t < h_t}``, 0 if none), and the next token is

    bonus      ~ p_{L+1}                                        if tau = L
    recovered  ~ norm(max(0, rho_tau pi_{tau+1} - q_{tau+1}))   otherwise.

Why the law is ``pi``'s (the proof sketch is in docs/method.md): ``h_t`` is chosen so that
``P(tau >= t | x_1..x_t) = rho_t``, i.e. ``P(x_1..x_t drafted and kept) = min(m_{t-1} pi_t(x_t), Q(x_1..x_t))``
with ``m`` that mass one position earlier, and the residual emits exactly the mass of ``pi``'s law the kept
prefixes leave out. Since ``rho_t >= prod_{s<=t} min(1, pi_s / q_s)`` path by path, the round keeps at least as
many drafts as token-wise verification in expectation. With ``rho = 1`` at every ``t`` before the stop (greedy
drafts that match ``argmax pi``) it is token-wise verification exactly.

Statistics, in the library's two per-position quantities (``VerificationResult``): the position acceptance
``beta_t = sum_x min(pi_t(x), q_t(x) / rho_{t-1})`` (the probability that position ``t`` is kept given that the
prefix before it is, ``>=`` token-wise ``beta_t``) and the drafted factor ``rho_t / rho_{t-1}`` (which may exceed
1), so that ``prod_{s<t} factor_s * beta_t = E[rho_t | x_1..x_{t-1}]`` and the library's estimator
``1 + sum_t prod_{s<t} factor_s beta_t`` (:func:`diversed_hf.verifiers.theory.expected_tokens_per_round`) stays
unbiased.

Pure tensor math; random numbers only from the ``generator`` passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import ops
from .checks import check_round_inputs
from .rules import VerificationResult, Verifier

__all__ = ["BlockVerifier", "block_round", "running_weights", "stop_probabilities", "block_residual"]


def running_weights(
    draft_ids: torch.Tensor,  # (batch, N)
    draft_probs: torch.Tensor,  # (batch, N, vocab)
    verify_probs: torch.Tensor,  # (batch, N, vocab)
) -> torch.Tensor:  # (batch, N + 1) rho_0 = 1, rho_1..rho_N
    """``rho_t = min(1, rho_{t-1} pi_t(x_t) / q_t(x_t))`` along the drafted block, ``rho_0 = 1``.

    A draft ``q_t(x_t) = 0`` never happens when sampling from ``q``; it counts as ``pi/q = inf`` (``rho_t = 1``
    unless ``rho_{t-1} pi_t(x_t) = 0``), as :func:`diversed_hf.verifiers.ops.ratio_acceptance` counts it.
    """
    drafted_verify = verify_probs.gather(-1, draft_ids.unsqueeze(-1)).squeeze(-1)  # (batch, N) pi_t(x_t)
    drafted_draft = draft_probs.gather(-1, draft_ids.unsqueeze(-1)).squeeze(-1)  # (batch, N) q_t(x_t)
    weights = [drafted_verify.new_ones(drafted_verify.shape[0])]  # [(batch,)] rho_0
    for t in range(draft_ids.shape[1]):
        kept_mass = weights[-1] * drafted_verify[:, t]  # (batch,) rho_{t-1} pi_t(x_t)
        ratio = (kept_mass / drafted_draft[:, t]).clamp(max=1.0)  # (batch,) inf / 1 where q_t(x_t) = 0
        weights.append(torch.where(kept_mass > 0, ratio, torch.zeros_like(ratio)))
    return torch.stack(weights, dim=1)


def _excess(
    weight: torch.Tensor,  # (...) rho
    draft_probs: torch.Tensor,  # (..., vocab) q
    verify_probs: torch.Tensor,  # (..., vocab) pi
) -> torch.Tensor:  # (..., vocab)
    """``max(0, rho pi - q)``: what ``pi``'s law still owes after the prefix kept with weight ``rho``."""
    return (weight.unsqueeze(-1) * verify_probs - draft_probs).clamp(min=0)


def stop_probabilities(
    weights: torch.Tensor,  # (batch, N + 1) rho_0..rho_N
    draft_probs: torch.Tensor,  # (batch, N, vocab)
    verify_probs: torch.Tensor,  # (batch, N, vocab)
    draft_lengths: torch.Tensor,  # (batch,) L_b <= N, the drafts row b counts
) -> torch.Tensor:  # (batch, N + 1) h_0..h_N
    """``h_t``, the probability of keeping the first ``t`` drafts when no longer prefix was kept (module docstring).

    ``h_0 = 1`` (keeping nothing is always possible), ``h_{L_b} = rho_{L_b}``, ``h_t = e_t / (e_t + 1 - rho_t)``
    for ``0 < t < L_b`` (0 where ``e_t`` is 0) and 0 past ``L_b``.
    """
    num_draft_tokens = draft_probs.shape[1]
    excess = _excess(weights[:, :-1], draft_probs, verify_probs).sum(dim=-1)  # (batch, N) e_0..e_{N-1}
    denominator = excess + (1.0 - weights[:, :-1])  # (batch, N)
    inner = torch.where(excess > 0, excess / denominator.clamp(min=torch.finfo(excess.dtype).tiny), 0.0)  # (batch, N)
    inner = torch.cat([inner, inner.new_zeros(inner.shape[0], 1)], dim=1).clamp(0.0, 1.0)  # (batch, N + 1)
    positions = torch.arange(num_draft_tokens + 1, device=weights.device)  # (N + 1,)
    last = positions == draft_lengths[:, None]  # (batch, N + 1)
    stop = torch.where(last, weights, torch.where(positions < draft_lengths[:, None], inner, 0.0))  # (batch, N + 1)
    stop[:, 0] = 1.0
    return stop


def block_residual(
    weight: torch.Tensor,  # (batch,) rho_tau
    draft_probs: torch.Tensor,  # (batch, vocab) q_{tau+1}
    verify_probs: torch.Tensor,  # (batch, vocab) pi_{tau+1}
) -> torch.Tensor:  # (batch, vocab)
    """``norm(max(0, rho pi - q))``, the recovered token's law after keeping ``tau`` drafts with weight ``rho``.

    With ``rho = 1`` it is token-wise SD's residual ``norm(max(0, pi - q))``. Empty only where the round never
    stops (``h = 0``); ``pi`` then keeps the tensor a distribution.
    """
    positive = _excess(weight, draft_probs, verify_probs)  # (batch, vocab)
    return ops.residual(positive, torch.zeros_like(positive), fallback=verify_probs)


def block_round(
    draft_ids: torch.Tensor,  # (batch, N)
    draft_probs: torch.Tensor,  # (batch, N, vocab)
    verify_probs: torch.Tensor,  # (batch, N, vocab)
    bonus_probs: torch.Tensor,  # (batch, vocab) p_{L_b + 1}
    draft_lengths: torch.Tensor,  # (batch,) L_b
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # (batch,), (batch,), (batch, N), (batch, N)
    """One sampled block-verification round: ``(num_accepted, next_tokens, position_acceptance, drafted_factor)``.

    ``num_accepted`` is ``tau`` and ``next_tokens`` the recovered or bonus token (module docstring);
    ``position_acceptance`` is ``beta_t = sum_x min(pi_t(x), q_t(x) / rho_{t-1})`` and ``drafted_factor``
    ``rho_t / rho_{t-1}`` (0 where ``rho_{t-1} = 0``), whose use is explained in the module docstring.
    """
    batch_size, num_draft_tokens = draft_ids.shape
    rows = torch.arange(batch_size, device=draft_ids.device)  # (batch,)
    weights = running_weights(draft_ids, draft_probs, verify_probs)  # (batch, N + 1)
    stop = stop_probabilities(weights, draft_probs, verify_probs, draft_lengths)  # (batch, N + 1)
    uniform = torch.rand(
        (batch_size, num_draft_tokens), generator=generator, device=draft_ids.device, dtype=stop.dtype
    )  # (batch, N)
    kept = torch.cat([stop.new_ones(batch_size, 1, dtype=torch.bool), uniform < stop[:, 1:]], dim=1)  # (batch, N + 1)
    positions = torch.arange(num_draft_tokens + 1, device=draft_ids.device)  # (N + 1,)
    num_accepted = torch.where(kept, positions, 0).max(dim=1).values  # (batch,) tau
    at = num_accepted.clamp(max=num_draft_tokens - 1)  # (batch,) the position after the kept prefix
    recovered_probs = block_residual(weights[rows, num_accepted], draft_probs[rows, at], verify_probs[rows, at])
    all_accepted = (num_accepted == draft_lengths).unsqueeze(-1)  # (batch, 1)
    next_tokens = ops.sample(torch.where(all_accepted, bonus_probs, recovered_probs), generator)  # (batch,)

    before = weights[:, :-1]  # (batch, N) rho_{t-1}
    reachable = before > 0  # (batch, N)
    scaled_draft = draft_probs / before.clamp(min=torch.finfo(before.dtype).tiny).unsqueeze(-1)  # (batch, N, vocab)
    position_acceptance = torch.where(
        reachable,
        torch.minimum(verify_probs, scaled_draft).sum(dim=-1),
        torch.minimum(verify_probs, draft_probs).sum(dim=-1),
    ).clamp(max=1.0)  # (batch, N); unreachable positions get token-wise beta (their reach is 0 anyway)
    drafted_factor = torch.where(reachable, weights[:, 1:] / before.clamp(min=torch.finfo(before.dtype).tiny), 0.0)
    return num_accepted, next_tokens, position_acceptance, drafted_factor  # drafted_factor: (batch, N)


@dataclass(frozen=True)
class BlockVerifier(Verifier):
    """Block verification (Sun et al. 2024, arXiv 2403.10444) of the drafts against ``base``'s ``pi``.

    The drafted block is judged as a whole: a running weight ``rho_t = min(1, rho_{t-1} pi_t(x_t) / q_t(x_t))``
    lets a later draft rescue an earlier one, the longest prefix whose test passes is kept, and the recovered
    token comes from ``norm(max(0, rho_tau pi_{tau+1} - q_{tau+1}))`` (:mod:`diversed_hf.verifiers.block`;
    docs/method.md §2). The emitted law is ``pi``'s at drafted positions and ``p``'s at the bonus, as token by token,
    and at least as many drafts are kept in expectation. ``pi`` must depend on the prefix only, never on the drafted
    token (true of every verifier here). For lossy SD and typical acceptance ``pi`` is what their ``verification_probs``
    declares, the law they emit at a drafted position. Greedy (``do_sample=False``): ``rho`` is 1 up to the first
    ``x_t != argmax pi_t``, so block and token-wise verification coincide and this calls ``base``.
    """

    base: Verifier = field(default=None)

    def __post_init__(self):
        if not isinstance(self.base, Verifier) or isinstance(self.base, BlockVerifier):
            raise TypeError(
                f"`base` must be a token-wise Verifier such as ExactVerifier() or HeadVerifier(head), got "
                f"{type(self.base).__name__}. Use `BlockVerifier(ExactVerifier())` for lossless block verification."
            )
        if self.base.reads_judge_hidden:
            raise ValueError(
                f"Block verification (`BlockVerifier`, `block_verification=True`) cannot run {type(self.base).__name__}"
                ": a judge keeps a draft by the target's state after that very token, and block verification needs a "
                "distribution `pi` fixed before the token is drawn. Verify a judge token by token (drop "
                "`block_verification`), or block-verify a rule of its own (`BlockVerifier(ExactVerifier())`)."
            )

    @property
    def requires_hidden_states(self) -> bool:
        return self.base.requires_hidden_states

    @property
    def requires_untempered_probs(self) -> bool:
        return self.base.requires_untempered_probs

    @property
    def head(self) -> torch.nn.Module | None:  # base's, for a head verifier (generate checks it against the pair)
        return getattr(self.base, "head", None)

    def verification_probs(self, draft_probs, target_probs, **context):
        return self.base.verification_probs(draft_probs, target_probs, **context)

    def __call__(
        self,
        draft_ids,
        draft_probs,
        target_probs,
        *,
        draft_lengths=None,
        do_sample=True,
        generator=None,
        validate=True,
        **context,
    ) -> VerificationResult:
        """One round, arguments as :meth:`Verifier.__call__`; ``drafted_acceptance`` holds ``rho_t / rho_{t-1}``."""
        if validate:
            check_round_inputs(draft_ids, draft_probs, target_probs, draft_lengths, **context)
        if not do_sample or draft_ids.shape[1] == 0:
            return self.base(
                draft_ids,
                draft_probs,
                target_probs,
                draft_lengths=draft_lengths,
                do_sample=do_sample,
                generator=generator,
                validate=False,
                **context,
            )
        batch_size, num_draft_tokens = draft_ids.shape
        if draft_lengths is None:
            draft_lengths = torch.full((batch_size,), num_draft_tokens, dtype=torch.long, device=draft_ids.device)
        else:
            draft_ids = ops.without_placeholders(draft_ids, draft_lengths)  # (batch, N)
        verify_probs, target_weight = self.base._round_verification_probs(draft_probs, target_probs, **context)
        bonus_probs = target_probs[torch.arange(batch_size, device=draft_ids.device), draft_lengths]  # (batch, vocab)
        num_accepted, next_tokens, position_acceptance, drafted_factor = block_round(
            draft_ids, draft_probs, verify_probs, bonus_probs, draft_lengths, generator
        )  # (batch,), (batch,), (batch, N), (batch, N)
        return VerificationResult(num_accepted, next_tokens, position_acceptance, target_weight, drafted_factor)
