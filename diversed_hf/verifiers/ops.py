"""Pure tensor math of verification against a mixture (docs/method.md §2, §3).

Vocabulary (as in vLLM's rejection sampler): a drafted token is *accepted* or rejected; at the
first rejection a *recovered* token is drawn from the residual; when every draft survives, a
*bonus* token is drawn from the target.

For a verification distribution ``pi`` and a draft distribution ``q`` (Leviathan et al., 2023):

    accept x ~ q with probability   a(x) = min(1, pi(x) / q(x))
    recovered token                 ~ norm(max(0, pi - q))
    acceptance probability          beta = sum_x min(q(x), pi(x)) = 1 - TV(q, pi)

and every token emitted at a drafted position is distributed as ``pi``. For the DIVERSED
mixture ``nu = w p + (1 - w) q`` (w = weight on the *target*): ``a(x) = min(1, 1 - w + w p(x)/q(x))``,
``nu - q = w (p - q)`` so the residual is the usual ``norm(max(0, p - q))``, and
``beta = 1 - w TV(p, q)``.

Nothing here draws random numbers except :func:`sample`, which takes an optional generator.
"""

from __future__ import annotations

import torch

#: how a weight ``w`` pools ``p`` and ``q``: ``"probs"`` (the mixture :func:`mix_probs`) or ``"logits"`` (the geometric
#: pool :func:`geometric_pool_probs` of the official DIVERSED code); heads and verifiers read it here
MIXING_SPACES = ("probs", "logits")


def fit_vocabulary(
    logits: torch.Tensor,  # (..., model_vocab)
    vocab_size: int,
) -> torch.Tensor:  # (..., vocab_size)
    """A draft's logits over the target's ``vocab_size`` ids (docs/method.md §2).

    Ids the draft scores beyond the target's vocabulary are dropped (the softmax then gives them zero
    probability: ``q`` is a distribution over the target's ids); ids the draft does not score get
    ``-inf`` (probability 0: the draft never proposes them, while recovered and bonus tokens, drawn
    from the target, still can be them). The target's own logits are never changed.
    """
    width = logits.shape[-1]
    if width >= vocab_size:
        return logits[..., :vocab_size]
    padding = logits.new_full((*logits.shape[:-1], vocab_size - width), float("-inf"))  # (..., V - model_vocab)
    return torch.cat([logits, padding], dim=-1)


def total_variation(
    probs_a: torch.Tensor,  # (..., vocab)
    probs_b: torch.Tensor,  # (..., vocab)
) -> torch.Tensor:  # (...)
    """TV(a, b) = 1/2 sum_x |a(x) - b(x)|."""
    return 0.5 * (probs_a - probs_b).abs().sum(dim=-1)


def mix_probs(
    draft_probs: torch.Tensor,  # (..., vocab)
    target_probs: torch.Tensor,  # (..., vocab)
    target_weight: torch.Tensor,  # (...)
) -> torch.Tensor:  # (..., vocab)
    """nu = w p + (1 - w) q, the DIVERSED verification distribution (docs/method.md §2)."""
    w = target_weight.unsqueeze(-1).to(target_probs.dtype)  # (..., 1)
    return w * target_probs + (1.0 - w) * draft_probs


def geometric_pool_probs(
    draft_probs: torch.Tensor,  # (..., vocab)
    target_probs: torch.Tensor,  # (..., vocab)
    target_weight: torch.Tensor,  # (...)
) -> torch.Tensor:  # (..., vocab) probabilities
    """softmax(w log p + (1 - w) log q): the geometric pool of the official DIVERSED code (``mixing="logits"``).

    Returns **probabilities** (the pooled distribution), not log-probabilities.

    Log-probabilities differ from logits by a per-row constant, which the softmax removes, so this
    equals ``softmax(w z_p + (1 - w) z_q)`` on processed logits. A weight of exactly 0 (or 1) ignores
    the other model entirely, including tokens it filtered out (``0 * -inf`` is taken as 0). Where the
    two supports are disjoint the pool is undefined and the target distribution is used.
    """
    w = target_weight.unsqueeze(-1).to(target_probs.dtype)  # (..., 1)
    target_term = torch.where(w > 0, w * target_probs.log(), torch.zeros_like(target_probs))  # (..., vocab)
    draft_term = torch.where(w < 1, (1.0 - w) * draft_probs.log(), torch.zeros_like(draft_probs))  # (..., vocab)
    pooled = (target_term + draft_term).softmax(dim=-1)  # (..., vocab)
    undefined = pooled.isnan().any(dim=-1, keepdim=True)  # (..., 1)
    return torch.where(undefined, target_probs, pooled)


def ratio_acceptance(
    draft_probs: torch.Tensor,  # (..., vocab)
    verify_probs: torch.Tensor,  # (..., vocab)
) -> torch.Tensor:  # (..., vocab)
    """a(x) = min(1, pi(x) / q(x)) for every token x; 1 where q(x) = 0 (such a token is never drafted)."""
    ratio = verify_probs / draft_probs  # (..., vocab)
    return torch.where(draft_probs > 0, ratio.clamp(max=1.0), torch.ones_like(ratio))


def residual(
    minuend: torch.Tensor,  # (..., vocab)
    subtrahend: torch.Tensor,  # (..., vocab)
    fallback: torch.Tensor,  # (..., vocab)
) -> torch.Tensor:  # (..., vocab)
    """norm(max(0, minuend - subtrahend)), or ``fallback`` where that has no mass.

    The residual has no mass only where ``minuend == subtrahend``, i.e. where rejection has
    probability 0; the fallback then only keeps the tensor a valid distribution.
    """
    positive = (minuend - subtrahend).clamp(min=0)  # (..., vocab)
    mass = positive.sum(dim=-1, keepdim=True)  # (..., 1)
    empty = mass <= torch.finfo(positive.dtype).tiny  # (..., 1)
    return torch.where(empty, fallback, positive / mass.clamp(min=torch.finfo(positive.dtype).tiny))


def emitted_distribution(
    draft_probs: torch.Tensor,  # (..., vocab)
    acceptance: torch.Tensor,  # (..., vocab)
    residual_probs: torch.Tensor,  # (..., vocab)
) -> torch.Tensor:  # (..., vocab)
    """Distribution of the token emitted at a drafted position: q(x) a(x) + (1 - beta) r(x), beta = sum_x q a.

    For ratio acceptance against ``pi`` this is ``pi`` itself; for other rules (lossy SD) it is how
    the rule's output distribution is defined.
    """
    accepted_mass = draft_probs * acceptance  # (..., vocab)
    beta = accepted_mass.sum(dim=-1, keepdim=True)  # (..., 1)
    return accepted_mass + (1.0 - beta).clamp(min=0) * residual_probs


def sample(
    probs: torch.Tensor,  # (batch, vocab)
    generator: torch.Generator | None = None,
    *,
    check: bool = True,
) -> torch.Tensor:  # (batch,)
    """One token per row from ``probs`` (rows need not be normalised), by inverting the CDF.

    ``searchsorted(cdf, u * total, right=True)`` returns the first token whose cumulative mass exceeds
    ``u * total`` with ``u ~ U[0, 1)``: token ``x`` is drawn with probability ``probs[x] / total``, and a
    token of zero mass never is. Same law as ``torch.multinomial``, an order of magnitude faster on CPU.
    A row with no finite positive mass (all zeros, NaN, inf, negative) is an error, never an
    out-of-range id; ``check=False`` skips that test (one device sync) for callers that already made it.
    """
    cdf = probs.cumsum(dim=-1)  # (batch, vocab)
    total = cdf[:, -1:]  # (batch, 1)
    if check and not bool(((total > 0) & torch.isfinite(total)).all()):
        bad = (~((total > 0) & torch.isfinite(total))).squeeze(-1).nonzero().squeeze(-1).tolist()  # rows
        raise ValueError(
            f"cannot sample: rows {bad} of the distribution have no finite positive mass (NaN, inf or all zeros). "
            "The logits feeding them are not finite, or the logits processors removed every token."
        )
    uniform = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device, dtype=cdf.dtype)  # (batch, 1)
    # u * total can round up to total; stay strictly below it so a positive-mass token is found.
    threshold = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))  # (batch, 1)
    tokens = torch.searchsorted(cdf, threshold, right=True).squeeze(-1)  # (batch,)
    return tokens.clamp(max=probs.shape[-1] - 1)  # a negative entry can make the cdf non-monotone


def num_leading_true(mask: torch.Tensor) -> torch.Tensor:  # (batch, n) bool -> (batch,)
    """Length of the all-true prefix of each row: the number of drafts kept before the first rejection."""
    return mask.long().cumprod(dim=-1).sum(dim=-1)


def without_placeholders(
    draft_ids: torch.Tensor,  # (batch, N)
    draft_lengths: torch.Tensor,  # (batch,) N_b
) -> torch.Tensor:  # (batch, N)
    """``draft_ids`` with id 0 after each row's first ``N_b``: those slots are placeholders (vLLM pads them with -1)
    that no rule reads, and an id inside the vocabulary keeps every gather valid."""
    counted = torch.arange(draft_ids.shape[1], device=draft_ids.device) < draft_lengths[:, None]  # (batch, N)
    return torch.where(counted, draft_ids, torch.zeros_like(draft_ids))
