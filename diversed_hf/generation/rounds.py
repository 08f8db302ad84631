"""The two round strategies of the batched loop (:mod:`.loop`), chosen once per call: a chain of drafts per row, or
a token tree (docs/method.md §8).

A strategy owns steps 2-3 of a round, the target's one pass and the verifier, and the candidate generator that drafts
for it; it hands the round back as a chain of drafts (for a tree: its accepted path, :mod:`.tree_round`), so the
loop's commit and realignment are the same for both. :func:`round_strategy` picks it: a tree the batch leaves wide
enough (``TreeSpec.for_batch``), else a chain.
"""

from __future__ import annotations

import torch

from .. import compat
from ..common import round_profile
from ..drafting.candidates import DiversedCandidateGenerator, next_token_scores
from ..drafting.feature_candidates import FeatureCandidateGenerator
from ..drafting.protocol import DrafterCapabilities
from ..drafting.tree import TreeSpec
from ..drafting.tree_candidates import FeatureTreeCandidateGenerator, TreeCandidateGenerator, TreeCandidates
from ..verifiers.checks import check_finite_mass_now_or_later
from .round_state import RoundContext, RoundOutcome
from .tree_round import verify_tree_round

__all__ = ["ChainRound", "TreeRound", "round_strategy"]


def round_strategy(tree: TreeSpec | None, batch_size: int) -> ChainRound | TreeRound:
    """The call's strategy: a tree (shrunk for a wide batch, maybe to a chain), else a chain."""
    tree = None if tree is None else tree.for_batch(batch_size)
    return ChainRound() if tree is None else TreeRound(tree)


class ChainRound:
    """A chain of ``N_r = max_b N_b`` drafts per row, verified position by position (docs/method.md §2)."""

    counts_nodes = False  # the stats count drafted tokens, not tree nodes

    def generator(self, capabilities: DrafterCapabilities) -> tuple[type, dict]:
        """The candidate generator class that drafts for this strategy, and its extra arguments."""
        if capabilities.candidate_generator is not None:  # prompt lookup, translated drafts, DFlash, Gemma 4
            return capabilities.candidate_generator, {}
        return (FeatureCandidateGenerator if capabilities.reads_target_features else DiversedCandidateGenerator), {}

    def verify(self, context: RoundContext, candidates) -> RoundOutcome:
        """Steps 2-3: one target pass over what its cache lacks (``[last token, x_1..x_N_r]``, or the whole
        prompt and the drafts in the first round), then the verifier (``docs/method.md §2``).

        ``q_t = softmax(candidate_logits_t)`` (the draft's processed scores, as ``get_candidates`` returns them) and
        ``p_i = softmax(processed target logits)`` at each of the ``N_r + 1`` positions.
        """
        candidate_ids = candidates[0]  # (B, L + N_r)
        num_round_drafts = candidate_ids.shape[1] - context.length  # N_r
        # (B, N_r + 1), the prompt too in round 1; the mask over the cache's columns (holes included) and those
        fresh, mask = context.target_cache.inputs(candidate_ids, candidates.attention_mask, context.length)
        with round_profile.phase("target forward"):
            out = compat.forward_with_cache(
                context.target,
                fresh,
                mask,
                context.target_cache.cache,
                logits_to_keep=num_round_drafts + 1,
                output_hidden_states=context.needs_hidden,
            )
        with round_profile.phase("verification math"):
            return _chain_verification(context, candidates, out, num_round_drafts)


class TreeRound:
    """A token tree per row: every node verified in one target pass, the walk, the accepted path kept
    (:func:`~diversed_hf.generation.tree_round.verify_tree_round`)."""

    counts_nodes = True  # the stats count the nodes verified

    def __init__(self, tree: TreeSpec):
        self.tree = tree

    def generator(self, capabilities: DrafterCapabilities) -> tuple[type, dict]:
        """The chain's generator, drafting a tree: a feature draft's, or a draft model's."""
        tree_generator = FeatureTreeCandidateGenerator if capabilities.reads_target_features else TreeCandidateGenerator
        return tree_generator, {"tree": self.tree}

    def verify(self, context: RoundContext, candidates) -> RoundOutcome:
        if not isinstance(candidates, TreeCandidates):  # no row may draft this round: the target's token alone
            return _CHAIN.verify(context, candidates)
        return verify_tree_round(context, candidates)


_CHAIN = ChainRound()


def _chain_verification(context: RoundContext, candidates, out, num_round_drafts: int) -> RoundOutcome:
    """Step 3 of :meth:`verify`: the target's distributions from its logits ``out``, then the verifier."""
    candidate_ids, candidate_logits = candidates  # (B, L + N_r), (B, N_r, V)
    length, needs_hidden = context.length, context.needs_hidden
    target_probs, target_untempered, processed = _target_distributions(context, candidate_ids, out.logits, length)
    check_finite_mass_now_or_later(target_probs, "target", context.checks)
    if candidate_logits is None:  # no draft this round: only the target's token
        draft_probs = target_probs.new_zeros(target_probs.shape[0], 0, target_probs.shape[2])  # (B, 0, V)
    else:
        draft_probs = candidate_logits.softmax(dim=-1)  # (B, N_r, V) q_t
    result = context.verifier(
        candidate_ids[:, length:],  # (B, N_r)
        draft_probs,  # (B, N_r, V)
        target_probs,
        draft_hidden=candidates.draft_hidden,  # (B, N_r, d_draft) or None
        target_hidden=out.hidden_states[-1][:, -(num_round_drafts + 1) :] if needs_hidden else None,  # (B, N_r + 1, d)
        untempered_draft_probs=candidates.untempered_draft_probs,  # (B, N_r, V) or None
        untempered_target_probs=target_untempered,  # (B, N_r + 1, V) or None
        draft_lengths=candidates.draft_lengths,  # (B,)
        do_sample=context.do_sample,
        generator=context.generator,
        validate=False,  # the loop builds well-formed inputs; the checks cost ~2% of a round on CPU
    )
    target_scores = None if processed is None else (processed, out.logits[:, -(num_round_drafts + 1) :].float())
    features = None
    if context.candidates.reads_target_features:  # the draft's features for the next round
        features = context.candidates.target_features(out.hidden_states)[:, -(num_round_drafts + 1) :]  # (B, N_r+1, d)
    return RoundOutcome(result, target_probs, target_scores, candidates, target_hidden=features)


def _target_distributions(
    context: RoundContext,
    candidate_ids: torch.Tensor,  # (B, L + N_r)
    logits: torch.Tensor,  # (B, N_r + 1, model_vocab)
    length: int,  # L
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:  # (B, N_r + 1, V) each; the last two optional
    """``p_i = softmax(processed logits_i)``; if the verifier reads them, ``softmax(logits_i)``; if scores are
    recorded (``output_scores`` / ``output_logits``), the processed logits themselves.

    Without logits processors both are one softmax over all positions (the same numbers as per position).
    """
    needs_untempered = context.verifier.requires_untempered_probs
    needs_scores = context.recording
    if not len(context.logits_processor):
        fitted = logits[:, :, : context.vocab_size].float()  # (B, N_r + 1, V)
        target_probs = fitted.softmax(dim=-1)  # (B, N_r + 1, V)
        return target_probs, target_probs if needs_untempered else None, fitted if needs_scores else None
    target_probs, target_untempered, processed = [], [], []
    for i in range(logits.shape[1]):
        scores, raw = next_token_scores(
            context.logits_processor, candidate_ids[:, : length + i], logits[:, i], context.vocab_size
        )
        target_probs.append(scores.softmax(dim=-1))  # (B, V)
        if needs_untempered:
            target_untempered.append(raw.softmax(dim=-1))  # (B, V)
        if needs_scores:
            processed.append(scores)  # (B, V)
    untempered = torch.stack(target_untempered, dim=1) if needs_untempered else None  # (B, N_r + 1, V)
    return torch.stack(target_probs, dim=1), untempered, torch.stack(processed, dim=1) if needs_scores else None
