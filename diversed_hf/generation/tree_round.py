"""A token-tree round in the batched loop: one target pass over every node, the walk, the caches compacted.

The tree strategy (:class:`~diversed_hf.generation.rounds.TreeRound`) calls :func:`verify_tree_round` with the round's
explicit state (:class:`~diversed_hf.generation.round_state.RoundContext`) when the candidate generator drafted a tree
(:class:`~diversed_hf.drafting.tree_candidates.TreeCandidates`). The target reads ``[last token, nodes]`` (the whole
prompt too in the first round) with a tree mask: a node sees the prefix, its ancestors and itself, at position ``root +
depth``. After the walk (:func:`~diversed_hf.verifiers.tree.verify_tree`) each row's accepted path is moved to the
columns right after the prefix in both caches, and the round is handed on as a chain of ``depth`` drafts whose first
``n_b`` are the path: commit and realignment run unchanged.
"""

from __future__ import annotations

import torch

from .. import compat
from ..common import round_profile
from ..drafting.candidates import DraftCandidates, next_token_scores
from ..verifiers import ops
from ..verifiers.checks import check_finite_mass_now_or_later
from ..verifiers.tree import verify_tree
from .round_state import RoundContext, RoundOutcome

__all__ = ["verify_tree_round"]


def verify_tree_round(context: RoundContext, candidates) -> RoundOutcome:
    """Steps 2-3 of a tree round: the verification, and the round as the chain of each row's accepted path
    (``DraftCandidates``) for commit and realignment."""
    needs_hidden = context.needs_hidden
    with round_profile.phase("target forward"):
        out = _target_pass(context, candidates, needs_hidden)
    with round_profile.phase("verification math"):
        logits = out.logits[:, -(candidates.tree.num_slots + 1) :]  # (B, S + 1, model_vocab)
        processed = [] if context.recording else None  # the processed scores at each step's slot
        result, path, target_probs = _walk(context, candidates, logits, out, needs_hidden, processed)
    along = torch.cat([torch.zeros_like(path[:, :1]), path], dim=1)  # (B, depth + 1) the slot of each emitted token
    features = None
    if context.candidates.reads_target_features:  # the draft's features: the target's at the root and the path's
        features = context.candidates.target_features(out.hidden_states)[:, -(candidates.tree.num_slots + 1) :]
        features = features.gather(1, along[:, :, None].expand(-1, -1, features.shape[2]))  # (B, depth + 1, d)
    chain = _keep_path(context, candidates, path)
    target_scores = None
    if processed is not None:
        raw = logits.float().gather(1, along[:, :, None].expand(-1, -1, logits.shape[2]))  # (B, depth + 1, V')
        target_scores = (torch.stack(processed, dim=1), raw)
    return RoundOutcome(result, target_probs, target_scores, chain, features, candidates.tree.num_nodes)


def _target_pass(context: RoundContext, candidates, needs_hidden: bool):
    """The target's one pass over ``[last token, nodes]`` (the whole prompt too in the first round) with the tree
    mask: a node sees the prefix, its ancestors and itself, at position ``root + depth``."""
    tree = candidates.tree
    # the columns the cache lacks (the last token, or the whole prompt) and the prefix's mask (B, P): the cache's
    # columns (holes included) and those
    ids, mask = context.target_cache.inputs(candidates.input_ids, candidates.attention_mask, context.length)
    batch, length = mask.shape  # B, P
    num_slots = tree.num_slots  # S
    depths = torch.tensor(tree.depths, device=ids.device)  # (S,)
    fresh = ids.shape[1]  # prefix columns the target reads now
    cached = length - fresh  # the cache's width, or 0 in the first round
    columns = torch.arange(length, device=ids.device)
    real = mask.bool()  # (B, P)
    prefix_rows = columns[cached:, None] >= columns[None, :]  # (fresh, L) causal over the prefix
    prefix_allowed = (prefix_rows[None] & real[:, None, :]) | (columns[cached:, None] == columns[None, :])[None]
    node_prefix = real[:, None, :].expand(batch, num_slots, length)  # (B, S, L)
    allowed = torch.cat(
        [
            torch.cat([prefix_allowed, torch.zeros(batch, fresh, num_slots, dtype=torch.bool, device=ids.device)], 2),
            torch.cat([node_prefix, tree.ancestors], dim=2),
        ],
        dim=1,
    )  # (B, fresh + S, P + S)
    positions = (mask.long().cumsum(dim=1) - 1).clamp(min=0)  # (B, P)
    root = positions[:, -1:]  # (B, 1)
    positions = torch.cat([positions[:, cached:], root + depths[None, :]], dim=1)  # (B, fresh + S)
    return compat.forward_tree(
        context.target,
        torch.cat([ids, tree.tokens], dim=1),
        allowed,
        positions,
        context.target_cache.cache,
        logits_to_keep=num_slots + 1,
        output_hidden_states=needs_hidden,
    )


def _walk(context: RoundContext, candidates, logits, out, needs_hidden: bool, processed: list | None):
    """The walk down the tree (:func:`~diversed_hf.verifiers.tree.verify_tree`): ``(result, path (B, depth), target
    probabilities (B, depth + 1, V))``; each step's processed target scores appended to ``processed`` when given."""
    tree, seq = candidates.tree, candidates.input_ids
    batch = seq.shape[0]

    def target_probs_at(step, slots, path_tokens, reached):  # p at each row's slot, its processors on its prefix
        slot_logits = logits[torch.arange(batch, device=seq.device), slots]  # (B, model_vocab)
        if not len(context.logits_processor):
            scores = raw = ops.fit_vocabulary(slot_logits, context.vocab_size).float()
        else:
            prefix = torch.cat([seq, path_tokens], dim=1)  # (B, L + step)
            scores, raw = next_token_scores(context.logits_processor, prefix, slot_logits, context.vocab_size)
        if processed is not None:
            processed.append(scores)
        probs = scores.softmax(dim=-1)
        # checked where the walk is: a row past its end sits at a filler, read by nothing the round keeps
        check_finite_mass_now_or_later(torch.where(reached[:, None], probs, 1.0), "target", context.checks)
        return probs, raw.softmax(dim=-1) if context.verifier.requires_untempered_probs else None

    return verify_tree(
        context.verifier,
        tree.tokens,
        tree.children,
        tree.sampled,
        tree.draft_probs,
        target_probs_at,
        max(len(tree.level_sizes), 1),
        untempered_draft_probs=tree.untempered_draft_probs,
        draft_hidden=tree.draft_hidden,
        target_hidden=out.hidden_states[-1][:, -(tree.num_slots + 1) :] if needs_hidden else None,
        do_sample=context.do_sample,
        generator=context.generator,
    )


def _keep_path(context: RoundContext, candidates, path) -> DraftCandidates:
    """Each row's accepted path moved right after the prefix in both caches; returns the round as a chain of
    ``depth`` drafts whose first ``n_b`` are the path."""
    tree, seq, mask = candidates.tree, candidates.input_ids, candidates.attention_mask
    length, depth = seq.shape[1], path.shape[1]
    # Every row's path is kept to the tree's depth (slots past its end: fillers), so nothing is read here; the
    # realignment crops both caches to the longest path A, read with the round's decisions.
    # The target cache: the path's nodes (column P - 1 + slot, P the prefix's width in it: the cache's C columns and
    # the last token's) right after the prefix, then P + depth columns.
    width = context.target_cache.mask.shape[1] + 1  # P
    compat.compact_cache(context.target_cache.cache, width, width - 1 + path.clamp(min=1))
    draft_columns = tree.draft_columns.gather(1, (path[:, : max(depth - 1, 0)] - 1).clamp(min=0))
    context.candidates.keep_path(draft_columns.clamp(min=length - 1))  # the draft cache: L + depth - 1 columns
    drafts = tree.tokens.gather(1, (path - 1).clamp(min=0))  # (B, depth): the path, then filler
    return DraftCandidates(
        torch.cat([seq, drafts], dim=1),  # (B, L + depth): the path, then filler
        None,
        draft_lengths=tree.depth_limits.clamp(max=depth),
        attention_mask=torch.cat([mask, torch.ones_like(drafts)], dim=1),
    )
