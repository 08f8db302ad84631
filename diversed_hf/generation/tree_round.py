"""A token-tree round in the batched loop: one target pass over every node, the walk, the caches compacted.

The loop (:mod:`diversed_hf.generation.loop`) calls :func:`verify_tree_round` in place of its chain verification when
the candidate generator drafted a tree (:class:`~diversed_hf.drafting.tree_candidates.TreeCandidates`). The target
reads ``[last token, nodes]`` (the whole prompt too in the first round) with a tree mask: a node sees the prefix, its
ancestors and itself, at position ``root + depth``. After the walk (:func:`~diversed_hf.verifiers.tree.verify_tree`)
each row's accepted path is moved to the columns right after the prefix in both caches, and the round is handed on
as a chain of ``depth`` drafts whose first ``n_b`` are the path: commit and realignment run unchanged.
"""

from __future__ import annotations

import torch

from .. import compat
from ..drafting.candidates import DraftCandidates, next_token_scores
from ..verifiers.checks import check_finite_mass
from ..verifiers.tree import verify_tree
from . import round_profile

__all__ = ["verify_tree_round"]


def verify_tree_round(loop, candidates):
    """Steps 2-3 of a tree round for ``loop`` (a ``_SpeculativeLoop``): returns what its ``verify`` returns, and
    the chain view of the round (``DraftCandidates``) for commit and realignment."""
    tree, seq, mask = candidates.tree, candidates.input_ids, candidates.attention_mask  # tree, (B, L), (B, L)
    batch, length = seq.shape
    num_slots = tree.num_slots  # S
    depths = torch.tensor(tree.depths, device=seq.device)  # (S,)
    cached = loop.target_cache.get_seq_length()  # L - 1, or 0 in the first round
    fresh = length - cached  # prefix columns the target reads now (the last token, or the whole prompt)
    columns = torch.arange(length, device=seq.device)
    real = mask.bool()  # (B, L)
    prefix_rows = columns[cached:, None] >= columns[None, :]  # (fresh, L) causal over the prefix
    prefix_allowed = (prefix_rows[None] & real[:, None, :]) | (columns[cached:, None] == columns[None, :])[None]
    node_prefix = real[:, None, :].expand(batch, num_slots, length)  # (B, S, L)
    allowed = torch.cat(
        [
            torch.cat([prefix_allowed, torch.zeros(batch, fresh, num_slots, dtype=torch.bool, device=seq.device)], 2),
            torch.cat([node_prefix, tree.ancestors], dim=2),
        ],
        dim=1,
    )  # (B, fresh + S, L + S)
    positions = (mask.long().cumsum(dim=1) - 1).clamp(min=0)  # (B, L)
    root = positions[:, -1:]  # (B, 1)
    positions = torch.cat([positions[:, cached:], root + depths[None, :]], dim=1)  # (B, fresh + S)
    needs_hidden = loop.verifier.requires_hidden_states
    with round_profile.phase("target forward"):
        out = compat.forward_tree(
            loop.target,
            torch.cat([seq[:, cached:], tree.tokens], dim=1),
            allowed,
            positions,
            loop.target_cache,
            logits_to_keep=num_slots + 1,
            output_hidden_states=needs_hidden,
        )
    with round_profile.phase("verification math"):
        target_probs, processed = _slot_distributions(loop, seq, tree, out.logits)  # (B, S + 1, V) each
        check_finite_mass(target_probs, "target")
        result, path = verify_tree(
            loop.verifier,
            tree.tokens,
            tree.children,
            tree.sampled,
            tree.draft_probs,
            target_probs,
            max(len(tree.level_sizes), 1),
            draft_hidden=tree.draft_hidden,
            target_hidden=out.hidden_states[-1][:, -(num_slots + 1) :] if needs_hidden else None,
            do_sample=loop.do_sample,
            generator=loop.generator,
        )
    longest = int(result.num_accepted.max())  # A
    path = path[:, :longest]  # (B, A) slots of each row's path (0 past its end)
    # the target cache: the path's nodes (column L - 1 + slot) right after the prefix, then L + A columns
    compat.compact_cache(loop.target_cache, length, length - 1 + path.clamp(min=1))
    draft_columns = tree.draft_columns.gather(1, (path[:, : max(longest - 1, 0)] - 1).clamp(min=0))
    loop.candidates.keep_path(path, draft_columns.clamp(min=length - 1))  # the draft cache: L + A - 1 columns
    if loop.state.tree_nodes is not None:
        loop.state.tree_nodes[loop.active] += tree.num_nodes
    depth = result.position_acceptance.shape[1]
    path_tokens = tree.tokens.gather(1, (path - 1).clamp(min=0))  # (B, A)
    drafts = torch.nn.functional.pad(path_tokens, (0, depth - longest))  # (B, depth)
    chain = DraftCandidates(
        torch.cat([seq, drafts], dim=1),  # (B, L + depth): the path, then filler
        None,
        draft_lengths=tree.depth_limits.clamp(max=depth),
        attention_mask=torch.cat([mask, torch.ones_like(drafts)], dim=1),
    )
    along = torch.cat([torch.zeros_like(path[:, :1]), torch.nn.functional.pad(path, (0, depth - longest))], dim=1)
    index = along[:, :, None].expand(-1, -1, target_probs.shape[2])  # (B, depth + 1, V): the slot of each token
    target_scores = None
    if processed is not None:
        raw = out.logits[:, -(num_slots + 1) :].float()
        target_scores = (processed.gather(1, index), raw.gather(1, along[:, :, None].expand(-1, -1, raw.shape[2])))
    return (result, target_probs.gather(1, index), target_scores), chain


def _slot_distributions(loop, seq, tree, logits):
    """``p`` at the root and every node (B, S + 1, V), after the logits processors read each slot's own prefix
    (the sequence and the path to it); and the processed scores when they are recorded."""
    vocab, num_slots = loop.vocab_size, tree.num_slots
    logits = logits[:, -(num_slots + 1) :]  # (B, S + 1, model_vocab)
    recording = loop.state.recorder is not None
    if not len(loop.logits_processor):
        fitted = logits[:, :, :vocab].float()
        return fitted.softmax(dim=-1), fitted if recording else None
    probs, processed = [], []
    slot_depths = [0] + tree.depths
    paths = _paths(tree)  # (B, S + 1, depth) tokens from the root's child to each slot
    for slot in range(num_slots + 1):
        prefix = torch.cat([seq, paths[:, slot, : slot_depths[slot]]], dim=1)  # (B, L + depth of the slot)
        scores, _ = next_token_scores(loop.logits_processor, prefix, logits[:, slot], vocab)
        probs.append(scores.softmax(dim=-1))
        processed.append(scores)
    return torch.stack(probs, dim=1), torch.stack(processed, dim=1) if recording else None


def _paths(tree) -> torch.Tensor:  # (B, S + 1, depth)
    """Each slot's path tokens, level by level (0 past the slot's depth)."""
    batch, num_slots = tree.tokens.shape
    depth = len(tree.level_sizes)
    paths = torch.zeros(batch, num_slots + 1, depth, dtype=tree.tokens.dtype, device=tree.tokens.device)
    first = 0
    for level, size in enumerate(tree.level_sizes):
        level_slots = slice(first, first + size)  # slots first + 1 .. first + size (node index first .. )
        on_path = tree.ancestors[:, :, level_slots]  # (B, S, size): which node of this level is an ancestor
        token = (on_path.long() * tree.tokens[:, None, level_slots]).sum(dim=2)  # (B, S)
        paths[:, 1:, level] = token
        first += size
    return paths
