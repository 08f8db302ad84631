"""Drafting a token tree with a draft model, early exit or an EagleDraft: one draft pass per level over the nodes
it expands.

:class:`TreeCandidateGenerator` is a :class:`~diversed_hf.drafting.candidates.DiversedCandidateGenerator` (same cache
layout between rounds, same per-row budgets) whose round builds a :class:`~diversed_hf.drafting.tree.DraftTree`
instead of a chain: the draft reads what its cache lacks (the root's distribution), then each level's expanded nodes
in one pass with a tree mask (each node sees the prefix, its ancestors and itself; its position is the root's plus
its depth). After verification the loop hands back the accepted path (:meth:`keep_path`): the draft cache keeps the
prefix and the path's expanded nodes in order, so the usual realignment applies (the cache lags two tokens).
:class:`FeatureTreeCandidateGenerator` does the same for an EagleDraft, whose cache goes back to the round's start.
"""

from __future__ import annotations

import torch

from .. import compat
from ..common import round_profile
from ..common.pairs import draft_input_ids
from ..verifiers import ops
from ..verifiers.checks import check_finite_mass_now_or_later
from .candidates import DiversedCandidateGenerator, DraftCandidates, next_token_scores
from .feature_candidates import FeatureCandidateGenerator
from .tree import DraftTree, TreeSpec, child_tokens

__all__ = ["FeatureTreeCandidateGenerator", "TreeCandidateGenerator", "TreeCandidates"]


class TreeCandidates:
    """What a tree round's drafting returns: the tree, and the sequence and mask it grows from."""

    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, tree: DraftTree):
        self.input_ids = input_ids  # (B, L)
        self.attention_mask = attention_mask  # (B, L)
        self.tree = tree


class _Nodes:
    """The candidates a round drafts, before the best are kept: per-row tensors indexed by candidate, grown level
    by level (a candidate's level is the same in every row)."""

    def __init__(self, batch: int, device):
        self.device = device
        self.tokens = torch.zeros(batch, 0, dtype=torch.long, device=device)  # (B, C)
        self.parents = torch.zeros(batch, 0, dtype=torch.long, device=device)  # (B, C) candidate, -1: the root
        self.scores = torch.zeros(batch, 0, device=device)  # (B, C) cumulative draft probability (see tree.py)
        self.expanded = torch.zeros(batch, 0, dtype=torch.long, device=device)  # (B, C) expansion index, -1: none
        self.ancestors = torch.zeros(batch, 0, 0, dtype=torch.bool, device=device)  # (B, C, C) ancestor-or-self
        self.levels: list[int] = []  # (C,) level of each candidate
        self.sampled: list[bool] = []  # (C,) drawn from its parent's q

    def add(self, parents: torch.Tensor, tokens: torch.Tensor, scores: torch.Tensor, level: int, sampled: list):
        """Append children (B, k) of the candidates ``parents`` (B, k) (-1: the root)."""
        count, batch = tokens.shape[1], tokens.shape[0]
        first = self.tokens.shape[1]
        self.tokens = torch.cat([self.tokens, tokens], dim=1)
        self.parents = torch.cat([self.parents, parents], dim=1)
        self.scores = torch.cat([self.scores, scores], dim=1)
        self.expanded = torch.cat([self.expanded, torch.full_like(tokens, -1)], dim=1)
        total = first + count
        ancestors = torch.zeros(batch, total, total, dtype=torch.bool, device=self.device)
        ancestors[:, :first, :first] = self.ancestors
        inherited = (
            self.ancestors.gather(  # (B, k, first) the parents' rows, zeros for the root
                1, parents.clamp(min=0)[:, :, None].expand(batch, count, first)
            )
            & (parents >= 0)[:, :, None]
        )
        ancestors[:, first:, :first] = inherited
        ancestors[:, torch.arange(first, total), torch.arange(first, total)] = True
        self.ancestors = ancestors
        self.levels += [level] * count
        self.sampled += sampled

    def span(self, level: int) -> range:
        """The candidates of ``level`` (created together, so contiguous)."""
        first = self.levels.index(level)
        return range(first, first + self.levels.count(level))

    def path_tokens(self, nodes: torch.Tensor, level: int) -> torch.Tensor:  # (B,) candidates -> (B, level)
        """The tokens from the root's child down to ``nodes`` (all of ``level``)."""
        chosen = self.ancestors[torch.arange(nodes.shape[0], device=self.device), nodes]  # (B, C)
        columns = []
        for above in range(1, level + 1):
            span = self.span(above)
            inside = chosen[:, span.start : span.stop]  # (B, width): exactly one ancestor per level
            columns.append(self.tokens[:, span.start : span.stop].gather(1, inside.long().argmax(1, keepdim=True)))
        return torch.cat(columns, dim=1)


class _TreeDrafting:
    """A round that drafts a :class:`~diversed_hf.drafting.tree.DraftTree` (``tree``, a
    :class:`~diversed_hf.drafting.tree.TreeSpec`), mixed into a chain's candidate generator."""

    def __init__(self, *args, tree: TreeSpec, **kwargs):
        super().__init__(*args, **kwargs)
        self.tree_spec = tree
        self.round_start = 0  # L of the round drafted

    def get_candidates(self, input_ids, attention_mask=None, **kwargs):
        limits = self.draft_lengths  # (B,) levels each row may accept this round
        if input_ids.shape[0] == 0:
            return super().get_candidates(input_ids, attention_mask=attention_mask)
        self._check_round_start(input_ids)
        if attention_mask is None:
            attention_mask = self._prompt_mask_to(input_ids)
        self.round_start = input_ids.shape[1]
        self._start_round(input_ids)
        chunk = input_ids[:, self.cache.get_seq_length() :]  # what the cache lacks: the prompt, or the last columns
        with round_profile.phase("draft forward"):
            logits, hidden = self.draft_forward(chunk, attention_mask)  # (B, V'), (B, d) or None
        root_probs, root_untempered = self._probs(input_ids, logits)  # (B, vocab), (B, vocab) or None
        # The tree grows to its full depth, its levels past a row's budget left out in its layout, whose one read
        # (every level's widest row) is the round's one read while drafting.
        tree = self._grow(input_ids, attention_mask, (root_probs, root_untempered), hidden, limits)
        self.awaiting_update = True
        if tree is None:  # no row may draft (each has one token left): the target's token alone
            no_drafts = torch.zeros_like(limits)
            return DraftCandidates(input_ids, None, draft_lengths=no_drafts, attention_mask=attention_mask)
        return TreeCandidates(input_ids, attention_mask, tree)

    def _start_round(self, input_ids) -> None:
        """What the chain's generator sets up before its first draft pass."""

    def _tree_inputs(self, parent_hidden) -> dict:  # (B, E, d) -> the draft's extra inputs at a level
        return {}

    def _tree_hidden(self, out):  # (B, E, d) or None: the draft's state at the expanded nodes
        return out.hidden_states[-1] if self.output_hidden_states else None

    def _probs(self, prefix: torch.Tensor, logits: torch.Tensor):  # (B, vocab), and (B, vocab) or None
        """``q`` at one node from its logits, and ``softmax(raw logits)`` when the verifier reads it."""
        scores, raw = next_token_scores(self.logits_processor, prefix, logits, self.vocab_size)
        probs = scores.softmax(dim=-1)
        check_finite_mass_now_or_later(probs, "draft", self.deferred_checks)
        return probs, raw.softmax(dim=-1) if self.output_untempered_probs else None

    def _children(self, probs: torch.Tensor, count: int, parent_scores: torch.Tensor):
        """``count`` children of each row's node with distribution ``probs`` (B, vocab): tokens, scores, sampled."""
        tokens = child_tokens(probs, count, self.do_sample, self.generator, lambda p, g: ops.sample(p, g, check=False))
        scores = parent_scores[:, None] * probs.gather(1, tokens)  # (B, count)
        if self.do_sample:  # child 0 scores as its parent: whether it is kept never depends on its own token
            scores[:, 0] = parent_scores
        return tokens, scores, [self.do_sample] + [False] * (count - 1)

    def _grow(self, input_ids, attention_mask, root, root_hidden, limits) -> DraftTree | None:
        spec, batch, device = self.tree_spec, input_ids.shape[0], input_ids.device
        length = input_ids.shape[1]
        nodes = _Nodes(batch, device)
        root_probs, root_untempered = root  # (B, vocab), (B, vocab) or None
        expanded_probs, expanded_hidden = [root_probs], [root_hidden]  # expansion 0: the root
        expanded_untempered = [root_untempered]  # softmax(raw logits) at each expansion, when the verifier reads it
        fed: list[torch.Tensor] = []  # (B,) candidate fed at draft cache column length + i
        root_positions = attention_mask.sum(dim=1) - 1  # (B,)
        depth = spec.depth
        static = {} if spec.is_static else None  # static trees: path of child ranks -> candidate
        # level 1: the root's children
        count = sum(1 for path in spec.paths if len(path) == 1) if spec.is_static else spec.top_k
        tokens, scores, sampled = self._children(root_probs, count, torch.ones(batch, device=device))
        nodes.add(torch.full_like(tokens, -1), tokens, scores, 1, sampled)
        if spec.is_static:
            static.update({(rank,): rank for rank in range(count)})
        for level in range(1, depth):
            if spec.is_static:
                plan = [
                    (path, sum(1 for other in spec.paths if other[:-1] == path))
                    for path in spec.paths
                    if len(path) == level
                ]
                plan = [(path, k) for path, k in plan if k > 0]
                if not plan:
                    break
                expand = torch.tensor([static[path] for path, _ in plan], device=device).expand(batch, -1)  # (B, E)
                counts = [k for _, k in plan]
            else:
                span = nodes.span(level)
                width = min(spec.top_k, len(span))
                level_scores = nodes.scores[:, span.start : span.stop]  # (B, width of the level)
                best = level_scores.topk(width, dim=1, sorted=True).indices.sort(dim=1).values
                expand = span.start + best  # (B, E)
                counts = [spec.top_k] * width
            parents = nodes.parents.gather(1, expand)  # (B, E) candidates, -1: the root
            parent_expansion = torch.where(parents >= 0, nodes.expanded.gather(1, parents.clamp(min=0)), 0)
            parent_hidden = None
            if expanded_hidden[0] is not None:
                stacked = torch.stack(expanded_hidden, dim=1)  # (B, X, d)
                parent_hidden = stacked.gather(1, parent_expansion[:, :, None].expand(-1, -1, stacked.shape[2]))
            probs, untempered, hidden = self._expand(
                nodes, expand, fed, input_ids, attention_mask, root_positions, level, parent_hidden
            )
            width = expand.shape[1]
            children, child_scores, sampled = self._children(  # every expanded node's children at once
                probs.reshape(batch * width, -1), max(counts), nodes.scores.gather(1, expand).reshape(-1)
            )
            children = children.reshape(batch, width, -1)  # (B, E, max count)
            child_scores = child_scores.reshape(batch, width, -1)
            for e, child_count in enumerate(counts):
                node = expand[:, e]  # (B,)
                nodes.expanded[torch.arange(batch, device=device), node] = len(expanded_probs)
                expanded_probs.append(probs[:, e])
                expanded_untempered.append(None if untempered is None else untempered[:, e])
                expanded_hidden.append(None if hidden is None else hidden[:, e])
                tokens, scores = children[:, e, :child_count], child_scores[:, e, :child_count]
                first = len(nodes.levels)
                nodes.add(node[:, None].expand_as(tokens), tokens, scores, level + 1, sampled[:child_count])
                if spec.is_static:
                    static.update({plan[e][0] + (rank,): first + rank for rank in range(child_count)})
        expanded = (expanded_probs, expanded_untempered, expanded_hidden)
        return _layout(nodes, spec, limits, expanded, fed, length)

    def _expand(self, nodes: _Nodes, expand, fed, input_ids, attention_mask, root_positions, level, parent_hidden):
        """One draft pass over the nodes ``expand`` (B, E) of ``level``: their distributions (B, E, vocab), the
        untempered ones (B, E, vocab) when the verifier reads them, else None, and their hidden states (B, E, d) or
        None. Each sees the prefix, its fed ancestors and itself."""
        batch, width = expand.shape
        fed.extend(expand[:, e] for e in range(width))
        fed_nodes = torch.stack(fed, dim=1)  # (B, F) candidates at draft cache columns length + f
        rows = torch.arange(batch, device=expand.device)[:, None, None]
        on_path = nodes.ancestors[rows, expand[:, :, None], fed_nodes[:, None, :]]  # (B, E, F)
        prefix = attention_mask.bool()[:, None, :].expand(batch, width, -1)  # (B, E, L)
        allowed = torch.cat([prefix, on_path], dim=2)  # (B, E, L + F): the cache holds L + F - E columns already
        positions = (root_positions + level)[:, None].expand(batch, width)
        tokens = nodes.tokens.gather(1, expand)  # (B, E)
        with round_profile.phase("draft forward"):
            out = compat.forward_tree(
                self.draft_model,
                draft_input_ids(self.draft_model, tokens, self.vocab_size),
                allowed,
                positions,
                self.cache,
                logits_to_keep=width,
                output_hidden_states=self.output_hidden_states,
                **self._tree_inputs(parent_hidden),
            )
        if len(self.logits_processor):  # each node's processors read its own prefix: the sequence and its path
            scored = [
                next_token_scores(
                    self.logits_processor,
                    torch.cat([input_ids, nodes.path_tokens(expand[:, e], level)], dim=1),  # (B, L + level)
                    out.logits[:, e],
                    self.vocab_size,
                )
                for e in range(width)
            ]
            scores = torch.stack([processed for processed, _ in scored], dim=1)  # (B, E, vocab)
            raw = torch.stack([raw for _, raw in scored], dim=1)  # (B, E, vocab)
        else:
            scores = raw = ops.fit_vocabulary(out.logits[:, -width:], self.vocab_size).float()  # (B, E, vocab)
        probs = scores.softmax(dim=-1)
        check_finite_mass_now_or_later(probs, "draft", self.deferred_checks)
        untempered = raw.softmax(dim=-1) if self.output_untempered_probs else None
        return probs, untempered, self._tree_hidden(out)

    def keep_path(self, columns: torch.Tensor) -> None:
        """After verification: the draft cache keeps the prefix and the accepted path's fed nodes ``columns``
        (B, A - 1) in order (the cache lags two tokens behind the new sequence)."""
        compat.compact_cache(self.cache, self.round_start, columns)


class TreeCandidateGenerator(_TreeDrafting, DiversedCandidateGenerator):
    """Drafts a token tree with a draft model (or early exit); arguments as the chain's generator, plus ``tree``."""


class FeatureTreeCandidateGenerator(_TreeDrafting, FeatureCandidateGenerator):
    """Drafts a token tree with a draft that reads the target's features (an EagleDraft): the root's pass reads the
    columns its cache lacks with the target's features; a node reads its token with its parent's predicted feature.
    After the round the draft cache goes back to the round's start, as for a chain (every node was computed from the
    draft's own features), so the accepted path needs no compaction."""

    def _start_round(self, input_ids) -> None:
        if self.features is None or self.features.shape[1] != input_ids.shape[1]:
            raise ValueError(
                "A feature draft drafts a tree in diversed_hf's loop only, after the target's features of every "
                "column: `target.generate(..., assistant_model=draft, assistant_tree_top_k=...)`."
            )
        self.round_length = input_ids.shape[1]
        self.step_features = None

    def _tree_inputs(self, parent_hidden) -> dict:
        return {"target_hidden": parent_hidden}

    def _tree_hidden(self, out):
        return out.last_hidden_state

    def keep_path(self, columns: torch.Tensor) -> None:
        """Nothing to keep: the realignment crops the draft cache to the round's start."""


def _layout(nodes: _Nodes, spec: TreeSpec, limits, expanded, fed, length) -> DraftTree | None:
    """The nodes a round verifies, in slots by level (see :class:`~diversed_hf.drafting.tree.DraftTree`);
    ``expanded``: q, the untempered q (or Nones) and the draft's hidden state (or Nones) at each expansion."""
    expanded_probs, expanded_untempered, expanded_hidden = expanded
    batch, device = nodes.tokens.shape[0], nodes.tokens.device
    levels = torch.tensor(nodes.levels, device=device)  # (C,)
    fits = levels[None, :] <= limits[:, None]  # (B, C) within the row's budget
    if spec.is_static:
        keep = fits
    else:
        scores = nodes.scores.masked_fill(~fits, -1.0)
        order = scores.sort(dim=1, descending=True, stable=True).indices[:, : spec.size]  # parents before children
        keep = torch.zeros_like(fits).scatter(1, order, True) & fits
    chosen, valid = [], []
    level_sizes = []
    spans = [nodes.span(level) for level in range(1, max(nodes.levels) + 1)]
    # every level's widest row in one read (not one a level)
    sizes = torch.stack([keep[:, span.start : span.stop].sum(dim=1).max() for span in spans]).tolist()
    for span, size in zip(spans, sizes, strict=True):
        inside = keep[:, span.start : span.stop]  # (B, width)
        if size == 0:
            break
        order = (~inside).long().sort(dim=1, stable=True).indices[:, :size]  # kept first, in creation order
        chosen.append(span.start + order)
        valid.append(inside.gather(1, order))
        level_sizes.append(size)
    if not level_sizes:  # no row may accept a level
        return None
    candidates = torch.cat(chosen, dim=1)  # (B, S)
    valid = torch.cat(valid, dim=1)  # (B, S)
    num_slots = candidates.shape[1]
    slot_of = torch.full_like(nodes.tokens, -1)  # (B, C) candidate -> slot (1..S)
    slot_of.scatter_(1, candidates, torch.arange(1, num_slots + 1, device=device).expand(batch, -1))
    slot_of = torch.where(keep, slot_of, -1)
    parent_candidates = nodes.parents.gather(1, candidates)  # (B, S)
    parents = torch.where(parent_candidates >= 0, slot_of.gather(1, parent_candidates.clamp(min=0)), 0)
    parents = torch.where(valid, parents, 0)
    rows = torch.arange(batch, device=device)[:, None, None]
    ancestors = nodes.ancestors[rows, candidates[:, :, None], candidates[:, None, :]] & valid[:, None, :]
    sampled = torch.tensor(nodes.sampled, device=device)[candidates] & valid
    tokens = nodes.tokens.gather(1, candidates).masked_fill(~valid, 0)
    # each slot's valid children, in slot order (which is creation order: child 0 first)
    is_child = (parents[:, None, :] == torch.arange(num_slots + 1, device=device)[None, :, None]) & valid[:, None, :]
    width = max(1, min(spec.top_k, num_slots))  # no node has more children than top_k: no read for the exact count
    order = (~is_child).long().sort(dim=2, stable=True).indices[:, :, :width]  # (B, S + 1, width)
    children = torch.where(is_child.gather(2, order), order + 1, -1)
    # q and the draft's hidden state at each slot (root and expanded nodes)
    expansion = nodes.expanded.gather(1, candidates).masked_fill(~valid, -1)  # (B, S)
    expansion = torch.cat([torch.zeros(batch, 1, dtype=torch.long, device=device), expansion], dim=1)  # (B, S + 1)
    at_slots = expansion.clamp(min=0)[:, :, None]  # (B, S + 1, 1) each slot's expansion

    def per_slot(per_expansion: list) -> torch.Tensor | None:  # X x (B, n) -> (B, S + 1, n), zeros where unexpanded
        if per_expansion[0] is None:
            return None
        stacked = torch.stack(per_expansion, dim=1)  # (B, X, n)
        return stacked.gather(1, at_slots.expand(-1, -1, stacked.shape[2])) * (expansion >= 0)[:, :, None]

    draft_probs, draft_hidden = per_slot(expanded_probs), per_slot(expanded_hidden)
    untempered_draft_probs = per_slot(expanded_untempered)
    fed_nodes = torch.stack(fed, dim=1) if fed else torch.zeros(batch, 0, dtype=torch.long, device=device)
    column_of = torch.full_like(nodes.tokens, -1)  # (B, C)
    if fed:
        column_of.scatter_(1, fed_nodes, length + torch.arange(fed_nodes.shape[1], device=device).expand(batch, -1))
    draft_columns = column_of.gather(1, candidates).masked_fill(~valid, -1)
    return DraftTree(
        tokens=tokens,
        parents=parents,
        valid=valid,
        sampled=sampled,
        ancestors=ancestors,
        children=children,
        draft_probs=draft_probs,
        untempered_draft_probs=untempered_draft_probs,
        draft_hidden=draft_hidden,
        draft_columns=draft_columns,
        level_sizes=tuple(level_sizes),
        depth_limits=limits.clone(),
    )
