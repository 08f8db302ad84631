"""Verifiers: every speculative-decoding method as "verify the drafts against some distribution".

A verifier gets, for a batch of rows, the ``N`` drafted ids, the draft distributions ``q_1..q_N``
that produced them and the target distributions ``p_1..p_{N+1}`` from the single verification
pass (both after the same logits processors), and decides per row how many drafts are *accepted*
and which token comes next: a *recovered* token drawn from the residual at the first rejection,
or a *bonus* token drawn from ``p_{N+1}`` when every draft survives (docs/method.md §2, §3).

Every method here except lossy SD is ordinary speculative sampling against a per-position
verification distribution ``pi_t``:

    accept x_t ~ q_t  with probability  min(1, pi_t(x_t) / q_t(x_t))
    recovered token   ~ norm(max(0, pi_t - q_t))

so each token emitted at a drafted position follows ``pi_t`` exactly:

=========================== ==========================================================
``ExactVerifier``           ``pi = p`` (lossless SD, Leviathan et al. 2023)
``StaticEnsembleVerifier``  ``pi = w p + (1 - w) q``, constant ``w``
``HeadVerifier``            ``pi = w_t p + (1 - w_t) q``, ``w_t`` from a :class:`DiversedHead`
``SpecCascadeVerifier``     ``pi = q`` or ``p`` by a deferral rule, or a token-level blend
``LenientVerifier``         accept with ``min(1, p / (l q))``, residual ``norm(max(0, p - q))``
``TypicalAcceptanceVerifier`` accept ``x`` when ``p(x) > min(eps, alpha exp(-H(p)))``; recover ``argmax p``
``BlockVerifier(base)``     the whole block against ``base``'s ``pi`` (Sun et al. 2024): same law, more kept
=========================== ==========================================================

**Writing a new rule.** Like a transformers ``LogitsProcessor``, a verifier is one small method:
subclass :class:`Verifier` and implement :meth:`Verifier.verification_probs`, which maps the draft
and target distributions of the drafted positions to the distribution ``pi`` to verify against::

    @dataclass(frozen=True)
    class ConfidenceVerifier(Verifier):
        # Trust the draft where the target is unsure: pi = q where max p < threshold, else p.
        threshold: float = 0.5

        def verification_probs(self, draft_probs, target_probs, **context):
            unsure = target_probs.max(dim=-1).values < self.threshold  # (batch, N)
            verify_probs = torch.where(unsure.unsqueeze(-1), draft_probs, target_probs)  # (batch, N, vocab)
            return verify_probs, (~unsure).to(target_probs.dtype)  # pi, and the target's weight

The base class does the rest (acceptance ``min(1, pi/q)``, residual, bonus, greedy, batching,
per-row draft lengths), and checks what a rule written outside this module returns: ``pi`` of the drafts'
shape, finite, non-negative and summing to 1 (an error names the rule's class). Rules that are not "SD against
``pi``" also override :meth:`Verifier.token_acceptance` and :meth:`Verifier.residual_probs` (see
:class:`LenientVerifier`).

Acceptance has three names here, for three quantities:

- ``a_t(x)`` -- :meth:`Verifier.token_acceptance`: the probability that token ``x``, if drafted at
  position ``t``, is kept (``(batch, N, vocab)``);
- ``a_t(x_t)`` -- ``VerificationResult.drafted_acceptance``: the same for the token actually drafted;
- ``beta_t = sum_x q_t(x) a_t(x)`` -- ``VerificationResult.position_acceptance``: the probability
  that position ``t`` accepts, before its token is drawn; for a mixture ``beta_t = 1 - w_t TV(p_t, q_t)``.

``w`` is always the weight on the **target**. In greedy mode (``do_sample=False``) drafts are
kept while ``x_t == argmax pi_t``; the first mismatch emits ``argmax pi_t`` and the bonus token is
``argmax p_{N+1}`` (what transformers does for ``assistant_ensemble_weight``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from . import ops
from .checks import check_round_inputs, check_verification_output, is_real
from .distribution_features import distribution_features

__all__ = [
    "Verifier",
    "VerificationResult",
    "ExactVerifier",
    "LenientVerifier",
    "StaticEnsembleVerifier",
    "SpecCascadeVerifier",
    "HeadVerifier",
    "TypicalAcceptanceVerifier",
    "CASCADE_RULES",
    "MIXING_SPACES",
    "check_round_inputs",
]

MIXING_SPACES = ops.MIXING_SPACES  # re-exported: diversed_hf.verifiers has always named it
CASCADE_RULES = ("chow", "diff", "opt", "token_v1", "token_v2", "token_v3")


@dataclass(frozen=True)
class VerificationResult:
    """What one verification round decided for each row."""

    num_accepted: torch.Tensor  # (batch,) drafts kept before the first rejection, in [0, N]
    next_tokens: torch.Tensor  # (batch,) recovered token (num_accepted < N) or bonus token (== N)
    position_acceptance: torch.Tensor  # (batch, N) beta_t = sum_x q_t(x) a_t(x), along the drafted prefix
    target_weight: torch.Tensor | None = None  # (batch, N) w_t used at each drafted position, if defined
    drafted_acceptance: torch.Tensor | None = None  # (batch, N) a_t(x_t): probability each drafted token is kept


class Verifier:
    """Base class: subclasses define the verification distribution ``pi`` (and may override the rule).

    Subclasses implement :meth:`verification_probs` -- the one method a new rule needs; lossy rules
    also override :meth:`token_acceptance` and :meth:`residual_probs`. Calling the verifier runs one
    round for a batch.
    """

    #: the verifier reads last-layer hidden states of both models (the generation loop then asks for them)
    requires_hidden_states: ClassVar[bool] = False
    #: ``verification_probs`` takes ``judge_hidden``: the target's states after each drafted token (a judge)
    reads_judge_hidden: ClassVar[bool] = False
    #: the verifier's rule reads temperature-1 probabilities (before temperature/top-k/top-p)
    requires_untempered_probs: ClassVar[bool] = False

    def verification_probs(
        self,
        draft_probs: torch.Tensor,  # (batch, N, vocab)
        target_probs: torch.Tensor,  # (batch, N, vocab)
        *,
        draft_hidden: torch.Tensor | None = None,  # (batch, N, d_draft)
        target_hidden: torch.Tensor | None = None,  # (batch, N, d_target)
        untempered_draft_probs: torch.Tensor | None = None,  # (batch, N, vocab)
        untempered_target_probs: torch.Tensor | None = None,  # (batch, N, vocab)
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # (batch, N, vocab), (batch, N) or None
        """The distribution each emitted drafted-position token follows, and the target weight if one is defined."""
        raise NotImplementedError

    def token_acceptance(
        self,
        draft_probs: torch.Tensor,  # (batch, N, vocab)
        target_probs: torch.Tensor,  # (batch, N, vocab)
        verify_probs: torch.Tensor,  # (batch, N, vocab)
    ) -> torch.Tensor:  # (batch, N, vocab)
        """``a(x)``: probability of keeping each token ``x`` if it were drafted, ``min(1, pi(x) / q(x))``."""
        return ops.ratio_acceptance(draft_probs, verify_probs)

    def residual_probs(
        self,
        draft_probs: torch.Tensor,  # (..., vocab)
        target_probs: torch.Tensor,  # (..., vocab)
        verify_probs: torch.Tensor,  # (..., vocab)
    ) -> torch.Tensor:  # (..., vocab)
        """Distribution of the recovered token after a rejection: norm(max(0, pi - q))."""
        return ops.residual(verify_probs, draft_probs, fallback=verify_probs)

    def __call__(
        self,
        draft_ids: torch.Tensor,  # (batch, N)
        draft_probs: torch.Tensor,  # (batch, N, vocab)
        target_probs: torch.Tensor,  # (batch, N + 1, vocab)
        *,
        draft_hidden: torch.Tensor | None = None,  # (batch, N, d_draft)
        target_hidden: torch.Tensor | None = None,  # (batch, N + 1, d_target)
        untempered_draft_probs: torch.Tensor | None = None,  # (batch, N, vocab)
        untempered_target_probs: torch.Tensor | None = None,  # (batch, N + 1, vocab)
        draft_lengths: torch.Tensor | None = None,  # (batch,) drafts that count per row, <= N
        do_sample: bool = True,
        generator: torch.Generator | None = None,
        validate: bool = True,
    ) -> VerificationResult:
        """One verification round. Row ``b`` only considers its first ``draft_lengths[b]`` drafts (all by
        default): keeping all of them earns the bonus token from the target at the next position.

        ``validate`` checks every argument first (shapes, ids, lengths, that probabilities are
        distributions); the generation loop, which builds them itself, turns it off.
        """
        if validate:
            check_round_inputs(
                draft_ids,
                draft_probs,
                target_probs,
                draft_lengths,
                draft_hidden=draft_hidden,
                target_hidden=target_hidden,
                untempered_draft_probs=untempered_draft_probs,
                untempered_target_probs=untempered_target_probs,
            )
        batch_size, num_draft_tokens = draft_ids.shape
        rows = torch.arange(batch_size, device=draft_ids.device)  # (batch,)
        if draft_lengths is None:
            draft_lengths = torch.full((batch_size,), num_draft_tokens, dtype=torch.long, device=draft_ids.device)
        else:
            draft_ids = ops.without_placeholders(draft_ids, draft_lengths)  # (batch, N)
        bonus_probs = target_probs[rows, draft_lengths]  # (batch, vocab)
        if num_draft_tokens == 0:
            greedy = bonus_probs.argmax(dim=-1)
            next_tokens = ops.sample(bonus_probs, generator, check=validate) if do_sample else greedy
            empty = draft_probs.new_zeros(batch_size, 0)  # (batch, 0)
            return VerificationResult(rows.new_zeros(batch_size), next_tokens, empty, None, empty)

        drafted_target_probs = target_probs[:, :num_draft_tokens]  # (batch, N, vocab)
        verify_probs, target_weight = self._round_verification_probs(
            draft_probs,
            target_probs,
            draft_hidden=draft_hidden,
            target_hidden=target_hidden,
            untempered_draft_probs=untempered_draft_probs,
            untempered_target_probs=untempered_target_probs,
        )  # (batch, N, vocab), (batch, N) or None
        acceptance = self.token_acceptance(draft_probs, drafted_target_probs, verify_probs)  # (batch, N, vocab) a(x)
        position_acceptance = (draft_probs * acceptance).sum(dim=-1)  # (batch, N) beta_t
        counts = torch.arange(num_draft_tokens, device=draft_ids.device) < draft_lengths[:, None]  # (batch, N)

        if do_sample:
            drafted_acceptance = acceptance.gather(-1, draft_ids.unsqueeze(-1)).squeeze(-1)  # (batch, N)
            uniform = torch.rand(
                drafted_acceptance.shape, generator=generator, device=draft_ids.device, dtype=drafted_acceptance.dtype
            )  # (batch, N)
            num_accepted = ops.num_leading_true((uniform < drafted_acceptance) & counts)  # (batch,)
            stop = num_accepted.clamp(max=num_draft_tokens - 1)  # (batch,)
            recovered_probs = self.residual_probs(
                draft_probs[rows, stop], drafted_target_probs[rows, stop], verify_probs[rows, stop]
            )  # (batch, vocab)
            all_accepted = (num_accepted == draft_lengths).unsqueeze(-1)  # (batch, 1)
            # the loop (validate=False) checks the distributions' mass with its round's decisions, in one read
            next_tokens = ops.sample(torch.where(all_accepted, bonus_probs, recovered_probs), generator, check=validate)
        else:
            choice = verify_probs.argmax(dim=-1)  # (batch, N)
            drafted_acceptance = (draft_ids == choice).to(position_acceptance.dtype)  # (batch, N): deterministic
            # Greedy drafting is deterministic too, so the draft at each position is kept with probability 1 or 0.
            position_acceptance = drafted_acceptance
            num_accepted = ops.num_leading_true((draft_ids == choice) & counts)  # (batch,)
            choice = torch.cat([choice, choice[:, :1]], dim=-1)  # (batch, N + 1)
            choice.scatter_(-1, draft_lengths[:, None], bonus_probs.argmax(dim=-1, keepdim=True))
            next_tokens = choice.gather(-1, num_accepted.unsqueeze(-1)).squeeze(-1)  # (batch,)
        return VerificationResult(num_accepted, next_tokens, position_acceptance, target_weight, drafted_acceptance)

    def _round_verification_probs(
        self,
        draft_probs: torch.Tensor,  # (batch, N, vocab)
        target_probs: torch.Tensor,  # (batch, N + 1, vocab)
        *,
        draft_hidden: torch.Tensor | None = None,  # (batch, N, d_draft)
        target_hidden: torch.Tensor | None = None,  # (batch, N + 1, d_target)
        untempered_draft_probs: torch.Tensor | None = None,  # (batch, N, vocab)
        untempered_target_probs: torch.Tensor | None = None,  # (batch, N + 1, vocab)
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # (batch, N, vocab), (batch, N) or None
        """``verification_probs`` at the ``N`` drafted positions of a round; a rule written outside this module is
        checked."""
        num_draft_tokens = draft_probs.shape[1]
        if self.requires_hidden_states and (draft_hidden is None or target_hidden is None):
            raise ValueError(f"{type(self).__name__} needs `draft_hidden` and `target_hidden`.")
        output = self.verification_probs(
            draft_probs,
            target_probs[:, :num_draft_tokens],
            draft_hidden=draft_hidden,
            target_hidden=None if target_hidden is None else target_hidden[:, :num_draft_tokens],
            untempered_draft_probs=untempered_draft_probs,
            untempered_target_probs=(
                None if untempered_target_probs is None else untempered_target_probs[:, :num_draft_tokens]
            ),
        )
        if type(self).__module__ != __name__:  # a rule written elsewhere: its pi is checked, the library's are not
            check_verification_output(type(self).__qualname__, output, tuple(draft_probs.shape))
        return output


def _unit_interval(verifier, name: str, *, open_low: bool = False, fix: str = "") -> None:
    """Check ``verifier.<name>`` is a number in [0, 1] (or (0, 1]) and store it as a Python float (numpy scalars
    too)."""
    value = getattr(verifier, name)
    interval = "(0, 1]" if open_low else "[0, 1]"
    if not is_real(value):
        raise TypeError(
            f"`{name}` must be a number in {interval}, got {type(value).__name__} {value!r}. {fix}".rstrip()
        )
    low_ok = value > 0 if open_low else value >= 0
    if math.isnan(value) or not (low_ok and value <= 1):
        raise ValueError(f"`{name}` must be a number in {interval}, got {value!r}. {fix}".rstrip())
    object.__setattr__(verifier, name, float(value))  # frozen dataclasses: prints, compares and hashes as a float


def _check_mixing(mixing: str) -> None:
    if mixing not in MIXING_SPACES:
        raise ValueError(f"`mixing` must be one of {MIXING_SPACES}, got {mixing!r}.")


class _MixtureVerifier(Verifier):
    """Verification against ``nu_t = w_t p_t + (1 - w_t) q_t`` (``mixing="probs"``) or the geometric pool."""

    mixing: str = "probs"

    def target_weights(
        self,
        draft_probs: torch.Tensor,  # (batch, N, vocab)
        target_probs: torch.Tensor,  # (batch, N, vocab)
        **context: torch.Tensor | None,
    ) -> torch.Tensor:  # (batch, N)
        raise NotImplementedError

    def verification_probs(self, draft_probs, target_probs, **context):
        target_weight = self.target_weights(draft_probs, target_probs, **context)  # (batch, N)
        if self.mixing == "logits":
            return ops.geometric_pool_probs(draft_probs, target_probs, target_weight), target_weight
        return ops.mix_probs(draft_probs, target_probs, target_weight), target_weight

    def residual_probs(self, draft_probs, target_probs, verify_probs):
        if self.mixing == "logits":
            return ops.residual(verify_probs, draft_probs, fallback=verify_probs)
        # nu - q = w (p - q): for w > 0 the residual is SD's, computed without the factor w (which may
        # underflow); for w = 0 nothing is ever rejected.
        return ops.residual(target_probs, draft_probs, fallback=target_probs)


@dataclass(frozen=True)
class ExactVerifier(_MixtureVerifier):
    """Lossless speculative decoding: ``pi = p`` (``w = 1``). Sampled output follows the target exactly."""

    def target_weights(self, draft_probs, target_probs, **context):
        return target_probs.new_ones(target_probs.shape[:2])


@dataclass(frozen=True)
class StaticEnsembleVerifier(_MixtureVerifier):
    """Static ensemble ``nu = w p + (1 - w) q`` with one weight ``target_weight`` on the target.

    ``target_weight=1`` is lossless SD, ``0`` accepts every draft. Equals transformers'
    ``assistant_ensemble_weight`` (which only allows the open interval).
    """

    target_weight: float = 0.5
    mixing: str = "probs"

    def __post_init__(self):
        _unit_interval(self, "target_weight", fix="Use 1.0 for lossless SD, 0.0 to accept every draft.")
        _check_mixing(self.mixing)

    def target_weights(self, draft_probs, target_probs, **context):
        return target_probs.new_full(target_probs.shape[:2], float(self.target_weight))

    def verification_probs(self, draft_probs, target_probs, **context):
        if self.mixing == "probs":
            # Python-float arithmetic, as transformers does, so greedy output is token-identical to it.
            weight = float(self.target_weight)
            verify_probs = weight * target_probs + (1.0 - weight) * draft_probs  # (batch, N, vocab)
            return verify_probs, self.target_weights(draft_probs, target_probs)
        return super().verification_probs(draft_probs, target_probs, **context)


@dataclass(frozen=True)
class LenientVerifier(Verifier):
    """Lossy speculative decoding with lenience ``l`` in (0, 1] (Leviathan et al. 2023, App. A.5).

    Accept ``x ~ q`` with probability ``min(1, p(x) / (l q(x)))``; on rejection draw from
    ``norm(max(0, p - q))`` as in Google's speculative-cascades reference. ``l = 1`` is SD. The
    emitted distribution at a drafted position is ``q a + (1 - beta) norm(max(0, p - q))``.
    """

    lenience: float = 1.0

    def __post_init__(self):
        _unit_interval(self, "lenience", open_low=True, fix="Use 1.0 for lossless SD; smaller accepts more.")

    def token_acceptance(self, draft_probs, target_probs, verify_probs):
        return ops.ratio_acceptance(draft_probs, target_probs / self.lenience)

    def residual_probs(self, draft_probs, target_probs, verify_probs):
        return ops.residual(target_probs, draft_probs, fallback=target_probs)

    def verification_probs(self, draft_probs, target_probs, **context):
        acceptance = self.token_acceptance(draft_probs, target_probs, None)  # (batch, N, vocab)
        residual = self.residual_probs(draft_probs, target_probs, None)  # (batch, N, vocab)
        return ops.emitted_distribution(draft_probs, acceptance, residual), None


@dataclass(frozen=True)
class SpecCascadeVerifier(Verifier):
    """Speculative cascades (Narasimhan et al., 2024/25): SD against a deferral-rule distribution ``pi``.

    Sequence-level rules keep the draft (``pi = q``, ``w = 0``) when they hold, else defer to the
    target (``pi = p``, ``w = 1``):

    - ``chow``: ``max q >= 1 - alpha``
    - ``diff``: ``max q >= max p - alpha``
    - ``opt``:  ``max q >= max p - alpha * TV(p, q)``

    Token-level rules blend per token, ``pi(v) = q(v) 1[v in A] + (1 - sum_{u in A} q(u)) p(v)``:

    - ``token_v1``: ``A = {v : q(v) >= max p - alpha}``
    - ``token_v2``: ``A = {v : p(v) >= max p - alpha}``
    - ``token_v3``: ``A = {v : p(v) >= (1 - alpha) max p}``

    Rules are evaluated on temperature-1 probabilities; ``pi`` mixes the processed ones. The
    reported target weight is the target's share ``1 - sum_{u in A} q(u)`` (0 or 1 for sequence rules).
    """

    rule: str = "opt"
    alpha: float = 0.1

    requires_untempered_probs: ClassVar[bool] = True

    def __post_init__(self):
        if self.rule not in CASCADE_RULES:
            raise ValueError(f"`rule` must be one of {CASCADE_RULES}, got {self.rule!r}.")
        _unit_interval(self, "alpha", fix="`alpha` is the cascade's lenience: 0 always defers to the target.")

    def verification_probs(
        self,
        draft_probs,
        target_probs,
        *,
        untempered_draft_probs=None,
        untempered_target_probs=None,
        **context,
    ):
        rule_draft = draft_probs if untempered_draft_probs is None else untempered_draft_probs  # (batch, N, vocab)
        rule_target = target_probs if untempered_target_probs is None else untempered_target_probs  # (batch, N, vocab)
        max_draft = rule_draft.max(dim=-1).values  # (batch, N)
        max_target = rule_target.max(dim=-1).values  # (batch, N)
        if self.rule in ("chow", "diff", "opt"):
            if self.rule == "chow":
                keep_draft = max_draft >= 1.0 - self.alpha
            elif self.rule == "diff":
                keep_draft = max_draft >= max_target - self.alpha
            else:
                keep_draft = max_draft >= max_target - self.alpha * ops.total_variation(rule_target, rule_draft)
            target_weight = (~keep_draft).to(target_probs.dtype)  # (batch, N)
            return torch.where(keep_draft.unsqueeze(-1), draft_probs, target_probs), target_weight
        if self.rule == "token_v1":
            keep = rule_draft >= (max_target - self.alpha).unsqueeze(-1)  # (batch, N, vocab)
        elif self.rule == "token_v2":
            keep = rule_target >= (max_target - self.alpha).unsqueeze(-1)
        else:
            keep = rule_target >= ((1.0 - self.alpha) * max_target).unsqueeze(-1)
        kept_draft = torch.where(keep, draft_probs, torch.zeros_like(draft_probs))  # (batch, N, vocab)
        target_weight = (1.0 - kept_draft.sum(dim=-1)).clamp(min=0)  # (batch, N)
        return kept_draft + target_weight.unsqueeze(-1) * target_probs, target_weight


@dataclass(frozen=True)
class TypicalAcceptanceVerifier(Verifier):
    """Typical acceptance (Medusa, Cai et al. 2024; vLLM's ``TypicalAcceptanceSampler``): lossy, deterministic.

    A drafted token ``x`` is kept when the target finds it typical enough::

        a(x) = 1[ p(x) > min(posterior_threshold, posterior_alpha * exp(-H(p))) ],   H(p) = -sum_v p(v) log p(v)

    so a confident target (low entropy) demands up to ``posterior_threshold`` and an unsure one accepts
    lower-probability tokens. At the first rejection the recovered token is the target's most likely
    token, ``argmax p`` (vLLM's rule), so the token emitted at a drafted position follows

        o(x) = q(x) a(x) + (1 - beta) 1[x = argmax p],   beta = sum_v q(v) a(v),

    which :func:`diversed_hf.verifiers.theory.single_step_tradeoff` reports. ``p`` is the processed target
    distribution (after temperature, top-k, top-p). Both knobs in (0, 1]; Medusa's defaults are
    ``posterior_threshold=0.09`` and ``posterior_alpha=0.3``.
    """

    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3

    def __post_init__(self):
        _unit_interval(self, "posterior_threshold", open_low=True, fix="Medusa uses 0.09.")
        _unit_interval(self, "posterior_alpha", open_low=True, fix="Medusa uses 0.3.")

    def token_acceptance(self, draft_probs, target_probs, verify_probs):
        logs = torch.where(target_probs > 0, target_probs.log(), torch.zeros_like(target_probs))  # (..., vocab)
        entropy = -(target_probs * logs).sum(dim=-1)  # (...)
        bar = torch.clamp(self.posterior_alpha * torch.exp(-entropy), max=self.posterior_threshold)  # (...)
        return (target_probs > bar.unsqueeze(-1)).to(target_probs.dtype)  # (..., vocab) a(x) in {0, 1}

    def residual_probs(self, draft_probs, target_probs, verify_probs):
        best = target_probs.argmax(dim=-1, keepdim=True)  # (..., 1)
        return torch.zeros_like(target_probs).scatter_(-1, best, 1.0)  # (..., vocab) one-hot at argmax p

    def verification_probs(self, draft_probs, target_probs, **context):
        acceptance = self.token_acceptance(draft_probs, target_probs, None)  # (batch, N, vocab)
        residual = self.residual_probs(draft_probs, target_probs, None)  # (batch, N, vocab)
        return ops.emitted_distribution(draft_probs, acceptance, residual), None


@dataclass(frozen=True, eq=False)
class HeadVerifier(_MixtureVerifier):
    """DIVERSED: ``nu_t = w_t p_t + (1 - w_t) q_t`` with ``w_t = head(h^q_t, h^p_t, f_t)`` (docs/method.md §4).

    ``h^q_t`` is the draft's last-layer hidden state at the position that produced ``q_t`` (from the
    drafting pass) and ``h^p_t`` the target's at the position that produced ``p_t`` (from the single
    verification pass): no extra model calls. ``f_t`` are the head's ``config.features`` of the very
    ``p_t`` and ``q_t`` mixed here (:func:`diversed_hf.verifiers.distribution_features.distribution_features`). The
    drafted tokens never reach the head: ``w_t`` is fixed before ``x_t`` is tested. The mixing space is the head's
    ``config.mixing``.
    """

    #: a :class:`~diversed_hf.heads.head.DiversedHead` (any module with its ``config`` and call: the heads sit above)
    head: torch.nn.Module = field(default=None)

    @property
    def requires_hidden_states(self) -> bool:
        """A head on distribution features alone reads no hidden states: the models are then not asked for them."""
        return bool(self.head.config.use_hidden_states)

    def __post_init__(self):
        if self.head is None or not callable(self.head) or not hasattr(self.head, "config"):
            raise TypeError(f"`head` must be a `DiversedHead`, got {type(self.head).__name__}.")
        for name, parameter in self.head.named_parameters():
            if not bool(torch.isfinite(parameter).all()):
                raise ValueError(
                    f"`head` has NaN or infinite values in its parameter `{name}`: it would verify against garbage. "
                    "Load an intact head (re-download or re-train it)."
                )

    @property
    def mixing(self) -> str:
        return self.head.config.mixing

    def target_weights(self, draft_probs, target_probs, *, draft_hidden=None, target_hidden=None, **context):
        parameter = next(self.head.parameters())
        place = dict(device=parameter.device, dtype=parameter.dtype)
        hidden = (draft_hidden.to(**place), target_hidden.to(**place)) if self.requires_hidden_states else (None, None)
        features = distribution_features(draft_probs, target_probs, self.head.config.features)  # (batch, N, F)
        target_weight = self.head(*hidden, features.to(**place))  # (batch, N)
        if not bool(((target_weight >= 0) & (target_weight <= 1)).all()):  # also False for NaN
            raise ValueError(
                "The head returned target weights outside [0, 1] (or NaN) for these hidden states: its parameters "
                "or its inputs are not finite. Check the head (`torch.isfinite(p).all()` for each parameter) and "
                "the models."
            )
        return target_weight.to(device=target_probs.device, dtype=target_probs.dtype)
