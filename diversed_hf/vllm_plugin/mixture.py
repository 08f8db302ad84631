"""The mixture a vLLM engine verifies against, and one verification round against it (torch only).

vLLM's rejection sampler holds, for the ``T`` drafted positions of a step (all requests flattened), the target's
processed logits ``z_t``, the probabilities ``q_t`` the draft sampled each drafted token from, and a bonus token it
sampled from the target at each request's next position. The plugin verifies against

    nu_t = w_t p_t + (1 - w_t) q_t,      p_t = softmax(z_t)

with ``nu_t`` and ``w_t`` from the project's own verifier (``verification_probs``), and the acceptance and residual
rules of :class:`diversed_hf.verifiers.Verifier`: every token emitted at a drafted position follows ``nu_t``, the
bonus token follows ``p_{N+1}``, and greedy requests keep drafts while ``x_t == argmax nu_t``, emit ``argmax nu_t``
at the first mismatch and ``argmax p_{N+1}`` as the bonus (docs/method.md §2).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..verifiers.rules import Verifier

__all__ = ["mixture_rejection_sample", "mixture_verification"]


def _target_probs(draft_probs: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:  # (T, vocab) p_t
    if draft_probs.shape != target_logits.shape:
        raise ValueError(
            f"The draft's probabilities {tuple(draft_probs.shape)} and the target's logits "
            f"{tuple(target_logits.shape)} "
            "at the drafted positions differ in shape: the draft and the target must share one vocabulary "
            "(same vocab_size in both configs)."
        )
    return target_logits.softmax(dim=-1, dtype=torch.float32)


def _verification_probs(
    verifier, draft_probs, target_probs, draft_hidden, target_hidden, judge_hidden=None
) -> torch.Tensor:
    """``nu_t`` ``(T, vocab)`` by one verifier (hidden states only for a rule that reads them)."""
    hidden = {}
    if verifier.reads_judge_hidden:
        if judge_hidden is None:
            raise RuntimeError(
                "A judge got no hidden states for this step: the plugin keeps the target's states after each drafted "
                "token for engines that load judges. Report this with the request pattern that caused it."
            )
        hidden = dict(judge_hidden=judge_hidden[None])  # (1, T, d_target)
    elif verifier.requires_hidden_states:
        if draft_hidden is None or target_hidden is None:
            raise RuntimeError(
                "A DIVERSED head that reads hidden states got none for this step: the plugin keeps both models' "
                "hidden states for engines with such a head. Report this with the request pattern that caused it."
            )
        hidden = dict(draft_hidden=draft_hidden[None], target_hidden=target_hidden[None])  # (1, T, d)
    verify_probs, _ = verifier.verification_probs(draft_probs[None], target_probs[None], **hidden)
    return verify_probs[0]


def mixture_verification(
    verifiers: Verifier | Sequence[Verifier],  # one for every request, or one per request (B,)
    num_draft_tokens: list[int],  # (B,) drafts per request, summing to T
    draft_probs: torch.Tensor,  # (T, vocab) q_t
    target_probs: torch.Tensor,  # (T, vocab) p_t
    draft_hidden: torch.Tensor | None = None,  # (T, d_draft)
    target_hidden: torch.Tensor | None = None,  # (T, d_target)
    judge_hidden: torch.Tensor | None = None,  # (T, d_target) the target's states after each drafted token
) -> tuple[torch.Tensor, torch.Tensor]:  # (T, vocab) nu_t, (T, vocab) the residual after a rejection
    """``nu_t`` and the residual at every drafted position, each request by its own rule (requests sharing a rule
    are verified together)."""
    if isinstance(verifiers, Verifier):
        verifiers = [verifiers] * len(num_draft_tokens)
    if len(verifiers) != len(num_draft_tokens):
        raise ValueError(f"{len(verifiers)} verifiers for {len(num_draft_tokens)} requests: pass one per request.")
    verify_probs, residual = torch.empty_like(target_probs), torch.empty_like(target_probs)
    groups: dict[int, tuple[Verifier, list[int]]] = {}  # id(rule) -> (rule, the flattened positions it verifies)
    start = 0
    for verifier, count in zip(verifiers, num_draft_tokens):
        groups.setdefault(id(verifier), (verifier, []))[1].extend(range(start, start + count))
        start += count
    for verifier, positions in groups.values():
        if not positions:
            continue
        index = torch.tensor(positions, device=target_probs.device)  # (T_g,)
        hidden = [None if states is None else states[index] for states in (draft_hidden, target_hidden, judge_hidden)]
        probs = _verification_probs(verifier, draft_probs[index], target_probs[index], *hidden)  # (T_g, vocab)
        verify_probs[index] = probs
        residual[index] = verifier.residual_probs(draft_probs[index], target_probs[index], probs)
    return verify_probs, residual


def mixture_rejection_sample(
    verifiers: Verifier | Sequence[Verifier],  # one for every request, or one per request (B,)
    draft_token_ids: torch.Tensor,  # (T,) drafted ids of all requests, flattened; -1 pads a slot that must be rejected
    num_draft_tokens: list[int],  # (B,) drafts per request, summing to T
    max_spec_len: int,
    draft_probs: torch.Tensor,  # (T, vocab) q_t
    target_logits: torch.Tensor,  # (T, vocab) the target's processed logits z_t
    bonus_token_ids: torch.Tensor,  # (B, 1) sampled by vLLM from the target at each request's next position
    is_greedy: torch.Tensor,  # (B,) bool
    uniform: torch.Tensor,  # (T,) U[0, 1) per drafted token (vLLM's, seeded per request where asked)
    recovery_noise: torch.Tensor,  # (B, vocab) Exp(1) per request: argmax residual / noise draws from the residual
    *,
    draft_hidden: torch.Tensor | None = None,  # (T, d_draft) for rules that read hidden states
    target_hidden: torch.Tensor | None = None,  # (T, d_target)
    judge_hidden: torch.Tensor | None = None,  # (T, d_target) for judges: the target's states after each draft
) -> torch.Tensor:  # (B, max_spec_len + 1) int32, -1 after the last emitted token
    """One verification round against ``nu_t`` for every request (each by its own rule), in vLLM's output layout.

    Random requests keep ``x_t`` while ``u_t < min(1, nu_t(x_t) / q_t(x_t))`` and at the first rejection emit a token
    from the verifier's residual (``norm(max(0, nu_t - q_t))``; for the probability mixture that is
    ``norm(max(0, p_t - q_t))``); greedy requests keep ``x_t`` while it is ``argmax nu_t`` and emit ``argmax nu_t``
    at the first mismatch. A request that keeps all its drafts appends vLLM's bonus token (drawn from ``p``).
    """
    batch_size, num_tokens = len(num_draft_tokens), draft_token_ids.shape[0]
    device = draft_token_ids.device
    output = torch.full((batch_size, max_spec_len + 1), -1, dtype=torch.int32, device=device)
    counts = torch.tensor(num_draft_tokens, device=device)  # (B,)
    if num_tokens == 0:
        output[:, 0] = bonus_token_ids[:, 0].to(torch.int32)
        return output
    request = torch.repeat_interleave(torch.arange(batch_size, device=device), counts)  # (T,)
    position = torch.arange(num_tokens, device=device) - (counts.cumsum(0) - counts)[request]  # (T,) slot in request

    target_probs = _target_probs(draft_probs, target_logits)  # (T, vocab) p_t
    draft_probs = draft_probs.to(torch.float32)  # (T, vocab) q_t
    verify_probs, residual = mixture_verification(
        verifiers, num_draft_tokens, draft_probs, target_probs, draft_hidden, target_hidden, judge_hidden
    )  # (T, vocab) nu_t, (T, vocab)
    safe_ids = draft_token_ids.clamp(min=0).long().unsqueeze(-1)  # (T, 1)
    ratio = (verify_probs.gather(-1, safe_ids) / draft_probs.gather(-1, safe_ids)).squeeze(-1)  # (T,) nu(x)/q(x)
    drafted_q = draft_probs.gather(-1, safe_ids).squeeze(-1)  # (T,)
    choice = verify_probs.argmax(dim=-1)  # (T,) argmax nu_t
    greedy = is_greedy[request]  # (T,)
    accepted = torch.where(
        greedy, draft_token_ids.long() == choice, (drafted_q > 0) & (uniform.to(ratio.dtype) < ratio)
    )
    accepted &= draft_token_ids >= 0  # (T,)
    recovered = (residual / recovery_noise[request]).argmax(dim=-1)  # (T,)
    replacement = torch.where(greedy, choice, recovered)  # (T,)

    keep = torch.zeros(batch_size, max_spec_len, dtype=torch.bool, device=device)  # (B, S)
    keep[request, position] = accepted
    drafted = torch.full((batch_size, max_spec_len), -1, dtype=torch.long, device=device)  # (B, S)
    drafted[request, position] = draft_token_ids.long()
    replaced = torch.full((batch_size, max_spec_len), -1, dtype=torch.long, device=device)  # (B, S)
    replaced[request, position] = replacement
    num_accepted = keep.long().cumprod(dim=-1).sum(dim=-1).clamp(max=counts)  # (B,)
    slots = torch.arange(max_spec_len + 1, device=device)  # (S + 1,)
    padded_drafted = torch.cat([drafted, drafted.new_full((batch_size, 1), -1)], dim=-1)  # (B, S + 1)
    padded_replaced = torch.cat([replaced, replaced.new_full((batch_size, 1), -1)], dim=-1)  # (B, S + 1)
    bonus = bonus_token_ids.reshape(batch_size, 1).long()  # (B, 1)
    stop = num_accepted.unsqueeze(-1)  # (B, 1)
    tokens = torch.where(slots < stop, padded_drafted, -1)  # (B, S + 1)
    tokens = torch.where((slots == stop) & (stop < counts.unsqueeze(-1)), padded_replaced, tokens)
    tokens = torch.where((slots == stop) & (stop == counts.unsqueeze(-1)), bonus, tokens)
    output.copy_(tokens.to(torch.int32))
    return output
