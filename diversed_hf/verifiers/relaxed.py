"""The field's relaxed acceptance rules behind the ``Verifier`` interface (docs/method.md §9).

- :class:`FuzzyVerifier` (fuzzy speculative decoding, Holsman et al., 2025): where a divergence between ``p_t`` and
  ``q_t`` is below ``threshold`` the drafted token is accepted outright, elsewhere the lossless test. As a
  verification distribution: ``pi_t = q_t`` where ``D(p_t, q_t) < threshold``, else ``p_t`` (a mixture whose
  target weight is 0 or 1), so its law is exact for that ``pi``, it verifies token trees, and ``threshold = 0`` is
  lossless SD.
- :class:`TopKRelaxedVerifier` (TensorRT-LLM's relaxed acceptance for MTP; SGLang's thresholds on trees): a drafted
  ``x`` is accepted outright when it is among the target's ``top_k`` and ``log p(x) >= log max p - delta``,
  elsewhere with the lossless ``min(1, p(x) / q(x))``; after a rejection the token comes from
  ``norm(max(0, p - q))``. The emitted token follows ``o(x) = q(x) a(x) + (1 - beta) r(x)``, not ``p``;
  ``top_k = 0`` is lossless SD. Greedy: a draft in that set is kept, else ``argmax p`` is emitted.
- :class:`JudgeVerifier` (judge decoding, Bachmann et al., 2025; AutoJudge, Garipov et al., 2025): a
  :class:`~diversed_hf.heads.judge.JudgeHead` reads the target's last hidden state at each drafted token (the state
  after reading it, which produced the next position's ``p``) and says whether a mismatch there matters; a draft is
  kept when the lossless test keeps it or the judge's probability is at least ``threshold``. A judge that never
  fires (``threshold`` above 1) is lossless SD; ``threshold = 0`` keeps every draft.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from . import ops
from .checks import is_integer, is_real
from .rules import VerificationResult, Verifier, _MixtureVerifier

__all__ = ["DIVERGENCES", "FuzzyVerifier", "JudgeVerifier", "TopKRelaxedVerifier", "divergence"]

#: the divergences FuzzyVerifier compares with its threshold (natural log; JS is at most ln 2, TV at most 1)
DIVERGENCES = ("js", "tv")


def divergence(target_probs: torch.Tensor, draft_probs: torch.Tensor, kind: str = "js") -> torch.Tensor:  # (...)
    """``D(p, q)`` over the last dimension: Jensen-Shannon (natural log, in ``[0, ln 2]``) or total variation."""
    if kind == "tv":
        return ops.total_variation(target_probs, draft_probs)
    middle = 0.5 * (target_probs + draft_probs)  # (..., vocab)
    kl_p = torch.special.xlogy(target_probs, target_probs) - torch.special.xlogy(target_probs, middle)
    kl_q = torch.special.xlogy(draft_probs, draft_probs) - torch.special.xlogy(draft_probs, middle)
    return (0.5 * (kl_p + kl_q).sum(dim=-1)).clamp(min=0.0)


def _non_negative(verifier, name: str, fix: str, integer: bool = False) -> None:
    value = getattr(verifier, name)
    kind = int if integer else float
    finite = is_real(value) and math.isfinite(value)
    if (
        isinstance(value, bool)
        or not is_real(value)
        or not value >= 0
        or (integer and not (finite and value == int(value)))
    ):
        what = "a non-negative integer" if integer else "a non-negative number"
        raise ValueError(f"`{name}` must be {what}, got {value!r}. {fix}")
    object.__setattr__(verifier, name, kind(value))


@dataclass(frozen=True)
class FuzzyVerifier(_MixtureVerifier):
    """Fuzzy speculative decoding: ``pi_t = q_t`` where ``D(p_t, q_t) < threshold``, else ``p_t`` (module docstring).

    ``divergence``: ``"js"`` (Jensen-Shannon, the paper's; in nats, at most ln 2 = 0.693) or ``"tv"``. The rule reads
    the processed distributions (after temperature, top-k, top-p). ``threshold = 0`` is lossless SD; a threshold above
    the divergence's maximum accepts every draft.
    """

    threshold: float = 0.1
    divergence: str = "js"
    mixing: str = field(default="probs", init=False)

    def __post_init__(self):
        _non_negative(self, "threshold", "0 is lossless SD; JS divergences lie in [0, ln 2].")
        if self.divergence not in DIVERGENCES:
            raise ValueError(f"`divergence` must be one of {DIVERGENCES}, got {self.divergence!r}.")

    def target_weights(self, draft_probs, target_probs, **context):
        close = divergence(target_probs, draft_probs, self.divergence) < self.threshold  # (batch, N)
        return (~close).to(target_probs.dtype)


@dataclass(frozen=True)
class TopKRelaxedVerifier(Verifier):
    """Top-k relaxed acceptance (module docstring): accept ``x`` outright when it is among the target's ``top_k``
    and within ``delta`` nats of the target's top-1 log-probability; elsewhere the lossless test."""

    top_k: int = 2
    delta: float = 0.5

    def __post_init__(self):
        _non_negative(self, "top_k", "0 is lossless SD; TensorRT-LLM's MTP uses up to 10.", integer=True)
        _non_negative(self, "delta", "A draft within `delta` nats of the target's top-1 log-probability is kept.")

    def relaxed_set(self, target_probs: torch.Tensor) -> torch.Tensor:  # (..., vocab) bool
        """The tokens accepted outright: among the ``top_k`` most likely under ``p`` and ``log p(x) >= log max p -
        delta`` (ties at the k-th probability count as inside)."""
        if self.top_k == 0:
            return torch.zeros_like(target_probs, dtype=torch.bool)
        k = min(self.top_k, target_probs.shape[-1])
        kth = target_probs.topk(k, dim=-1).values[..., -1:]  # (..., 1)
        best = target_probs.max(dim=-1, keepdim=True).values  # (..., 1)
        near = target_probs.log() >= best.log() - self.delta  # (..., vocab)
        return (target_probs >= kth) & near

    def token_acceptance(self, draft_probs, target_probs, verify_probs):
        lossless = ops.ratio_acceptance(draft_probs, target_probs)  # (..., vocab)
        return torch.where(self.relaxed_set(target_probs), torch.ones_like(lossless), lossless)

    def residual_probs(self, draft_probs, target_probs, verify_probs):
        return ops.residual(target_probs, draft_probs, fallback=target_probs)

    def verification_probs(self, draft_probs, target_probs, **context):
        acceptance = self.token_acceptance(draft_probs, target_probs, None)  # (batch, N, vocab)
        residual = self.residual_probs(draft_probs, target_probs, None)  # (batch, N, vocab)
        return ops.emitted_distribution(draft_probs, acceptance, residual), None

    def __call__(self, draft_ids, draft_probs, target_probs, *, do_sample: bool = True, **kwargs):
        if do_sample or draft_ids.shape[1] == 0:
            return super().__call__(draft_ids, draft_probs, target_probs, do_sample=do_sample, **kwargs)
        inside = self.relaxed_set(target_probs[:, : draft_ids.shape[1]])  # (batch, N, vocab)
        return _greedy_round(self, draft_ids, draft_probs, target_probs, inside, **kwargs)


@dataclass(frozen=True, eq=False)
class JudgeVerifier(Verifier):
    """Judge decoding (module docstring): keep a draft the lossless test keeps, or one whose judge probability
    ``judge(h_x) >= threshold`` (``h_x``: the target's last hidden state after reading the drafted token)."""

    #: a :class:`~diversed_hf.heads.judge.JudgeHead` (a module with ``config.hidden_size`` and ``logits``)
    judge: torch.nn.Module = field(default=None)
    threshold: float = 0.5

    requires_hidden_states = True
    reads_judge_hidden = True

    def __post_init__(self):
        width = getattr(getattr(self.judge, "config", None), "hidden_size", None)
        logits = getattr(self.judge, "logits", None)
        if not isinstance(self.judge, torch.nn.Module) or not callable(logits) or not is_integer(width):
            # a JudgeHead: a module whose config names the target's width, mapping states (..., d) to P(keep) (...)
            raise TypeError(
                "`judge` must be a `JudgeHead` (a classifier of the target's hidden states: "
                f"`JudgeHead.from_pretrained`, training/train_judge.py), got {type(self.judge).__name__}. A "
                "DiversedHead picks the mixture's weight instead: pass it as `diversed_head=head` or "
                "`HeadVerifier(head)`."
            )
        _non_negative(self, "threshold", "Above 1 the judge never fires (lossless SD); 0 keeps every draft.")

    def check_models(self, target, draft) -> None:
        """Refuse, before any forward, a judge trained for a target of another width."""
        width = target.config.get_text_config().hidden_size
        if self.judge.config.hidden_size != width:
            raise ValueError(
                f"`judge` reads hidden states of size {self.judge.config.hidden_size}, and the target's are {width}: "
                "use a judge trained for this target (`JudgeHead.for_target(target)`, training/train_judge.py)."
            )

    def fires(self, target_hidden: torch.Tensor) -> torch.Tensor:  # (batch, N, d) -> (batch, N) bool
        """Whether the judge keeps each drafted token whatever the lossless test says."""
        if target_hidden.shape[-1] != self.judge.config.hidden_size:
            raise ValueError(
                f"`judge` reads hidden states of size {self.judge.config.hidden_size}; got {target_hidden.shape[-1]}."
            )
        parameter = next(self.judge.parameters())
        with torch.no_grad():
            probability = self.judge(target_hidden.to(device=parameter.device, dtype=parameter.dtype))
        return probability.to(target_hidden.device).float() >= self.threshold

    def verification_probs(self, draft_probs, target_probs, *, judge_hidden=None, **context):
        """The lossless test's ``pi = p``; given ``judge_hidden`` (batch, N, d), the target's states after each
        drafted token, ``pi_t = q_t`` where the judge fires: the rule as one mixture, the form a vLLM engine verifies
        (a greedy draft, ``argmax q``, is then kept; a sampled one has ``min(1, q(x) / q(x)) = 1``)."""
        if judge_hidden is None:
            return target_probs, None  # generate's rounds act on the drafted tokens themselves (__call__)
        fires = self.fires(judge_hidden).unsqueeze(-1)  # (batch, N, 1)
        return torch.where(fires, draft_probs, target_probs), (~fires).squeeze(-1).to(target_probs.dtype)

    def __call__(self, draft_ids, draft_probs, target_probs, *, target_hidden=None, do_sample=True, **kwargs):
        num_drafts = draft_ids.shape[1]
        if num_drafts == 0:
            return super().__call__(draft_ids, draft_probs, target_probs, do_sample=do_sample, **kwargs)
        if target_hidden is None:
            raise ValueError("JudgeVerifier needs `target_hidden`: the target's hidden states at the drafted tokens.")
        judged = self.fires(target_hidden[:, 1 : num_drafts + 1])  # (batch, N): the states after each draft
        if not do_sample:
            best = target_probs[:, :num_drafts].argmax(dim=-1, keepdim=True)  # (batch, N, 1)
            inside = torch.zeros_like(target_probs[:, :num_drafts], dtype=torch.bool).scatter_(-1, best, True)
            inside = inside | judged.unsqueeze(-1) & _one_hot(draft_ids, target_probs.shape[-1])
            return _greedy_round(self, draft_ids, draft_probs, target_probs, inside, **kwargs)
        return _sampled_round(self, draft_ids, draft_probs, target_probs, judged, **kwargs)


def _one_hot(ids: torch.Tensor, vocab: int) -> torch.Tensor:  # (batch, N) -> (batch, N, vocab) bool
    return torch.nn.functional.one_hot(ids, vocab).bool()


def _lengths(draft_ids: torch.Tensor, draft_lengths: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    batch, num_drafts = draft_ids.shape
    if draft_lengths is None:
        return draft_ids, torch.full((batch,), num_drafts, dtype=torch.long, device=draft_ids.device)
    return ops.without_placeholders(draft_ids, draft_lengths), draft_lengths


def _greedy_round(verifier, draft_ids, draft_probs, target_probs, inside, *, draft_lengths=None, **ignored):
    """Greedy: a draft in ``inside`` (batch, N, vocab) or equal to ``argmax p`` is kept; the first one that is not
    becomes ``argmax p``; after a full round the bonus is ``argmax p``."""
    batch, num_drafts = draft_ids.shape
    draft_ids, draft_lengths = _lengths(draft_ids, draft_lengths)
    rows = torch.arange(batch, device=draft_ids.device)
    best = target_probs.argmax(dim=-1)  # (batch, N + 1)
    keep = inside.gather(-1, draft_ids.unsqueeze(-1)).squeeze(-1) | (draft_ids == best[:, :num_drafts])  # (batch, N)
    counts = torch.arange(num_drafts, device=draft_ids.device) < draft_lengths[:, None]
    num_accepted = ops.num_leading_true(keep & counts)  # (batch,)
    choice = torch.cat([torch.where(keep, draft_ids, best[:, :num_drafts]), best[:, :1]], dim=-1)  # (batch, N + 1)
    choice.scatter_(-1, draft_lengths[:, None], best[rows, draft_lengths][:, None])
    next_tokens = choice.gather(-1, num_accepted.unsqueeze(-1)).squeeze(-1)
    kept = keep.to(target_probs.dtype)
    return VerificationResult(num_accepted, next_tokens, kept, None, kept)


def _sampled_round(verifier, draft_ids, draft_probs, target_probs, judged, *, draft_lengths=None, generator=None, **_):
    """Sampled: a draft is kept when the judge fires or with the lossless ``min(1, p(x) / q(x))``; the first
    rejected one is replaced from ``norm(max(0, p - q))``; after a full round the bonus comes from ``p``."""
    batch, num_drafts = draft_ids.shape
    draft_ids, draft_lengths = _lengths(draft_ids, draft_lengths)
    rows = torch.arange(batch, device=draft_ids.device)
    drafted_p = target_probs[:, :num_drafts]  # (batch, N, vocab)
    lossless = ops.ratio_acceptance(draft_probs, drafted_p).gather(-1, draft_ids.unsqueeze(-1)).squeeze(-1)
    drafted_acceptance = torch.where(judged, torch.ones_like(lossless), lossless)  # (batch, N)
    uniform = torch.rand(drafted_acceptance.shape, generator=generator, device=draft_ids.device)
    counts = torch.arange(num_drafts, device=draft_ids.device) < draft_lengths[:, None]
    num_accepted = ops.num_leading_true((uniform < drafted_acceptance) & counts)
    stop = num_accepted.clamp(max=num_drafts - 1)
    recovered = ops.residual(drafted_p[rows, stop], draft_probs[rows, stop], fallback=drafted_p[rows, stop])
    bonus = target_probs[rows, draft_lengths]
    all_kept = (num_accepted == draft_lengths).unsqueeze(-1)
    next_tokens = ops.sample(torch.where(all_kept, bonus, recovered), generator)
    return VerificationResult(num_accepted, next_tokens, drafted_acceptance, None, drafted_acceptance)
