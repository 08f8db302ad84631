"""Verifying a token tree against any verification distribution ``pi`` (docs/method.md §8).

The walk starts at the root (the round's last committed token) and, at each node that has children, tests them in
their order against ``pi`` at that node, the distribution a chain would verify against there:

- a **sampled** child ``x ~ q`` (child 0 of a sampled tree) is kept with probability ``min(1, r(x) / q(x))``, with
  ``r = pi``; after a rejection ``r`` becomes the verifier's residual ``norm(max(0, pi - q))``;
- a **point-mass** child ``x`` (the draft's second guesses; every child of a greedy tree) is kept with probability
  ``r(x)``; after a rejection ``r`` loses ``x`` and is renormalised;
- a kept child becomes the next node; when every child is rejected the token comes from the last ``r``; at a node
  without children (a leaf) it is the bonus token from the target's ``p``, as after a full chain.

Each stage is speculative sampling of ``r`` with the stage's proposal, so the token emitted at a node follows
``pi`` there exactly, whatever the number of children; with one sampled child per node this is the chain's round.
The condition: whether a stage exists may depend on anything but its own token (tree.py scores child 0 as its parent
for that reason). Greedy: a child is kept when it is ``argmax pi``; else ``argmax pi`` is emitted.

Rules that are not speculative sampling of a ``pi`` (:class:`~diversed_hf.verifiers.LenientVerifier`,
:class:`~diversed_hf.verifiers.TypicalAcceptanceVerifier`) and block verification have no tree form here:
:func:`check_tree_verifier` refuses them by name.
"""

from __future__ import annotations

import torch

from . import ops
from .block import BlockVerifier
from .checks import check_verification_output
from .rules import VerificationResult, Verifier

__all__ = ["check_tree_verifier", "verify_tree"]


def check_tree_verifier(verifier: Verifier) -> None:
    """Refuse, before any forward, a verifier without a tree form."""
    own_rule = (
        type(verifier).token_acceptance is not Verifier.token_acceptance
        or type(verifier).__call__ is not Verifier.__call__
    )
    if isinstance(verifier, BlockVerifier) or own_rule:
        raise ValueError(
            f"{type(verifier).__name__} has no token-tree form: trees verify each node by speculative sampling of the "
            "verifier's `pi` (ExactVerifier, StaticEnsembleVerifier, SpecCascadeVerifier, HeadVerifier and rules that "
            "define only `verification_probs`). Draft a chain with it (leave `assistant_tree_top_k` and "
            "`assistant_tree` unset)."
        )


def verify_tree(
    verifier: Verifier,
    tokens: torch.Tensor,  # (B, S) node tokens, slots 1..S
    children: torch.Tensor,  # (B, S + 1, C) each slot's children slots in order, -1 padded
    sampled: torch.Tensor,  # (B, S) bool: drawn from its parent's q
    draft_probs: torch.Tensor,  # (B, S + 1, vocab) q at each slot (zeros where not expanded)
    target_probs_at,  # (step, slots (B,), path tokens (B, step), reached (B,)) -> p, untempered p or None (B, vocab)
    depth: int,
    *,
    untempered_draft_probs: torch.Tensor | None = None,  # (B, S + 1, vocab) softmax(raw logits) of the draft
    draft_hidden: torch.Tensor | None = None,  # (B, S + 1, d_draft)
    target_hidden: torch.Tensor | None = None,  # (B, S + 1, d)
    do_sample: bool = True,
    generator: torch.Generator | None = None,
) -> tuple[VerificationResult, torch.Tensor, torch.Tensor]:  # result, path slots (B, depth), p (B, depth + 1, vocab)
    """One tree round: a :class:`VerificationResult` laid out as a chain of ``depth`` drafts (``num_accepted`` = the
    path's length; ``position_acceptance`` = the probability that the path's node accepts one of its children, 0
    past the stop; ``drafted_acceptance`` = whether it did), the accepted path (slots, 0 past its end) and ``p`` at
    the slot of each emitted token. ``p`` and ``pi`` are computed only where the walk goes (``target_probs_at``: the
    logits processors read each row's path), one slot per row and step; ``reached`` says which rows the walk brought
    to the step (a row past its end stays at its last slot, a filler). The walk reads nothing from the device: it
    runs every step of ``depth``, masked where rows stopped, so a GPU never waits on it. A rule that reads temperature-1
    probabilities (``requires_untempered_probs``) gets the draft's (``untempered_draft_probs``) and the target's
    (``target_probs_at``'s second value) at each node, as in a chain."""
    batch, device = tokens.shape[0], tokens.device
    rows = torch.arange(batch, device=device)
    node = torch.zeros(batch, dtype=torch.long, device=device)  # (B,) the walk's current slot
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    path = torch.zeros(batch, depth, dtype=torch.long, device=device)
    num_accepted = torch.zeros(batch, dtype=torch.long, device=device)
    next_tokens = torch.zeros(batch, dtype=torch.long, device=device)
    position_acceptance = torch.zeros(batch, depth, device=device)
    drafted_acceptance = torch.zeros(batch, depth, device=device)
    weights = torch.full((batch, depth), float("nan"), device=device)
    visited = []  # p at each step's slot, (B, vocab) each
    slot_tokens = torch.cat([torch.zeros_like(tokens[:, :1]), tokens], dim=1)  # (B, S + 1)
    slot_sampled = torch.cat([torch.zeros_like(sampled[:, :1]), sampled], dim=1)  # (B, S + 1)
    for step in range(depth + 1):
        kids = children[rows, node]  # (B, C)
        has_kids = alive & (kids[:, 0] >= 0) & (step < depth)  # (B,)
        leaf = alive & ~has_kids
        p_node, p_untempered = target_probs_at(step, node, slot_tokens.gather(1, path[:, :step]), alive)  # (B, V) each
        visited.append(p_node)
        # the bonus token, from p, where a row reached a leaf (its mass is checked with the round's decisions)
        bonus = ops.sample(p_node, generator, check=False) if do_sample else p_node.argmax(dim=-1)
        next_tokens = torch.where(leaf, bonus, next_tokens)
        if step == depth:  # no node has children at the last step
            break
        q_node = torch.where(has_kids[:, None], draft_probs[rows, node], p_node)  # a stand-in where unused
        context = {
            "draft_hidden": None if draft_hidden is None else draft_hidden[rows, node][:, None],
            "target_hidden": None if target_hidden is None else target_hidden[rows, node][:, None],
        }
        if verifier.requires_untempered_probs:  # the rule's own inputs at the node; a stand-in where unused
            untempered_q = untempered_draft_probs[rows, node] if untempered_draft_probs is not None else None
            if untempered_q is not None and p_untempered is not None:
                untempered_q = torch.where(has_kids[:, None], untempered_q, p_untempered)
            context["untempered_draft_probs"] = None if untempered_q is None else untempered_q[:, None]
            context["untempered_target_probs"] = None if p_untempered is None else p_untempered[:, None]
        pi_node, weight = verifier.verification_probs(q_node[:, None], p_node[:, None], **context)  # (B, 1, vocab)
        if type(verifier).__module__.split(".")[:2] != ["diversed_hf", "verifiers"]:
            check_verification_output(type(verifier).__qualname__, (pi_node, weight), (batch, 1, q_node.shape[1]))
        if weight is not None:
            weights[:, step] = torch.where(has_kids, weight[:, 0].float(), weights[:, step])
        chosen, emitted, accept_probability = _test_children(
            kids, slot_tokens, slot_sampled, q_node, p_node, pi_node[:, 0], verifier, do_sample, generator
        )  # (B,) kept child's slot or -1, (B,) token when none kept, (B,)
        kept = has_kids & (chosen >= 0)
        rejected = has_kids & (chosen < 0)
        position_acceptance[:, step] = torch.where(has_kids, accept_probability, position_acceptance[:, step])
        drafted_acceptance[:, step] = kept.float()
        next_tokens = torch.where(rejected, emitted, next_tokens)
        path[:, step] = torch.where(kept, chosen, 0)
        num_accepted += kept.long()
        node = torch.where(kept, chosen, node)
        alive = kept
    result = VerificationResult(num_accepted, next_tokens, position_acceptance, weights, drafted_acceptance)
    return result, path, torch.stack(visited, dim=1)


def _test_children(kids, slot_tokens, slot_sampled, q, p, pi, verifier, do_sample, generator):
    """The children ``kids`` (B, C) of each row's node, in order: the slot kept (-1: none), the token emitted when
    none is, and the probability that one is kept given the drafted children."""
    batch, width = kids.shape
    exists = kids >= 0  # (B, C)
    child_tokens = slot_tokens.gather(1, kids.clamp(min=0))  # (B, C)
    chosen = torch.full((batch,), -1, dtype=torch.long, device=kids.device)
    if not do_sample:
        choice = pi.argmax(dim=-1)  # (B,)
        match = exists & (child_tokens == choice[:, None])  # (B, C)
        found = match.any(dim=1)
        chosen = torch.where(found, kids.gather(1, match.long().argmax(1, keepdim=True)).squeeze(1), chosen)
        return chosen, choice, found.float()
    residual = pi.clone()  # (B, vocab) r: what the next stage verifies against
    first_sampled = slot_sampled.gather(1, kids[:, :1].clamp(min=0)).squeeze(1) & exists[:, 0]  # (B,)
    acceptance = verifier.token_acceptance(q[:, None], p[:, None], pi[:, None])[:, 0]  # (B, vocab) a(x)
    stage_zero = (q * acceptance).sum(dim=-1)  # (B,) beta of the sampled stage
    after_zero = verifier.residual_probs(q, p, pi)  # (B, vocab)
    accept_probability = torch.zeros(batch, device=kids.device)
    undecided = exists[:, 0].clone()
    for k in range(width):  # every stage, masked where a row has decided or has fewer children: no device read
        live = undecided & exists[:, k]
        token = child_tokens[:, k]  # (B,)
        is_sampled = first_sampled & (k == 0)
        mass = residual.sum(dim=-1).clamp(min=torch.finfo(residual.dtype).tiny)
        point = residual.gather(1, token[:, None]).squeeze(1) / mass  # (B,) point-mass acceptance
        ratio = acceptance.gather(1, token[:, None]).squeeze(1)  # (B,) min(1, pi(x) / q(x))
        keep = torch.where(is_sampled, ratio, point)
        uniform = torch.rand(batch, generator=generator, device=kids.device, dtype=keep.dtype)
        hit = live & (uniform < keep)
        chosen = torch.where(hit, kids[:, k], chosen)
        # the chance this stage keeps one, given that it is reached; then the stage's residual
        stage_probability = torch.where(is_sampled, stage_zero, point)
        reach = 1.0 - accept_probability  # 1 at the first stage
        accept_probability = torch.where(live, accept_probability + reach * stage_probability, accept_probability)
        removed = residual.scatter(1, token[:, None], 0.0)
        residual = torch.where((live & is_sampled)[:, None], after_zero, torch.where(live[:, None], removed, residual))
        undecided = live & ~hit
    mass = residual.clamp(min=0).sum(dim=-1, keepdim=True)  # (B, 1); none only for rows whose stages all kept one
    # (B,) from the last residual; pi has mass where p and q have (checked with the round's decisions)
    emitted = ops.sample(torch.where(mass > 0, residual.clamp(min=0), pi), generator, check=False)
    return chosen, emitted, accept_probability
