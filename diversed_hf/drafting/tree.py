"""Token trees: a round drafts several continuations and the target checks them all in one pass (docs/method.md §8).

A tree's root is the round's last committed token; a node is a drafted token, its children are candidates for the
token after it. Each expanded node gets its children from the draft's distribution ``q`` there:

- **child 0** is the chain's draft: sampled from ``q`` (``do_sample=True``) or its argmax (greedy), so a tree with one
  child per node is exactly today's chain (``assistant_tree_top_k=1``);
- **children 1..k-1** are ``q``'s best other tokens (its second guesses), in order: deterministic, verified as point
  masses after child 0 (:mod:`diversed_hf.verifiers.tree`).

Two shapes, read like every drafting knob from ``generate``'s keywords, else the call's or the assistant's
``generation_config``:

- **dynamic** (EAGLE-2): ``num_assistant_tokens`` levels (the depth); at each level the ``assistant_tree_top_k`` (K)
  best nodes by cumulative draft probability are expanded into K children each; the round verifies the
  ``assistant_tree_size`` (M) best nodes. Child 0 of a sampled tree scores as its parent, so whether it is kept never
  depends on its own token: the condition under which the verification is exact (docs/method.md §8);
- **static** (``assistant_tree``): a list of paths of child ranks, vLLM's ``speculative_token_tree`` format:
  ``[(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]`` is a chain of three with a second guess at the first two levels.

The verified tree is laid out by level, the same number of slots per level in every row (a row with fewer nodes
at a level has invalid slots there), so that the logits processors see every slot of a level at one sequence length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..verifiers.checks import is_integer
from .protocol import capabilities_of

__all__ = ["DraftTree", "TreeSpec", "child_tokens"]

#: the keywords (and generation-config attributes) that shape a tree
TREE_KNOBS = ("assistant_tree_top_k", "assistant_tree_size", "assistant_tree")


@dataclass(frozen=True)
class TreeSpec:
    """The tree a round drafts: ``depth`` levels and either ``top_k`` / ``size`` (dynamic) or ``paths`` (static)."""

    depth: int
    top_k: int = 1
    size: int | None = None
    paths: tuple[tuple[int, ...], ...] | None = None
    #: read from a generation config (a shipped draft's best shape for batch 1), not passed to ``generate``: a wide
    #: batch shrinks it (:meth:`for_batch`); a tree the caller asks for is drafted as asked
    from_config: bool = False

    def __post_init__(self):
        if self.paths is not None:
            object.__setattr__(self, "paths", _check_paths(self.paths))
            object.__setattr__(self, "depth", max(len(path) for path in self.paths))
            object.__setattr__(self, "top_k", 1 + max(path[-1] for path in self.paths))
            object.__setattr__(self, "size", len(self.paths))
            return
        if not is_integer(self.top_k) or self.top_k < 1:
            raise ValueError(
                f"`assistant_tree_top_k` must be a positive integer (the children of each expanded node; 1 drafts a "
                f"chain), got {self.top_k!r}."
            )
        object.__setattr__(self, "top_k", int(self.top_k))
        size = self.size if self.size is not None else self.depth * self.top_k
        if not is_integer(size) or size < 1:
            raise ValueError(
                f"`assistant_tree_size` must be a positive integer (the nodes a round verifies), got {self.size!r}."
            )
        if size < self.depth:
            raise ValueError(
                f"`assistant_tree_size={size}` is below the tree's depth `num_assistant_tokens={self.depth}`: the "
                f"round verifies the {size} best nodes and the first child of each kept node must fit. Pass "
                f"`assistant_tree_size` >= {self.depth}, or draft fewer levels."
            )
        object.__setattr__(self, "size", int(min(size, self.max_nodes)))

    @property
    def is_static(self) -> bool:
        return self.paths is not None

    @property
    def max_nodes(self) -> int:
        """Nodes a dynamic tree drafts before the best ``size`` are kept: ``K`` at level 1, ``K * K`` after."""
        return self.top_k + (self.depth - 1) * self.top_k * self.top_k

    def for_batch(self, batch_size: int) -> TreeSpec | None:
        """The tree each row drafts in a batch of ``batch_size``: a dynamic tree from a generation config is sized for
        one row, and a batch shares the target pass, so each row verifies ``size / batch_size`` nodes; where that
        leaves no room beyond the chain, the rows draft the chain (``None``). Measured on this CPU: at batch 8 a tree
        of 12 was slower than the chain (RESULTS.md, "Token trees"). Static trees and trees passed to ``generate``
        are kept as given."""
        if self.is_static or batch_size <= 1 or not self.from_config:
            return self
        size = self.size // batch_size
        if size <= self.depth:
            return None
        return TreeSpec(depth=self.depth, top_k=self.top_k, size=size, from_config=True)

    @classmethod
    def resolve(cls, assistant_model, generation_config, depth: int, **given) -> TreeSpec | None:
        """The call's tree from the keywords ``given`` (``assistant_tree_top_k``, ``assistant_tree_size``,
        ``assistant_tree``), else ``generation_config``, else the assistant's; ``None`` for today's chain
        (``assistant_tree_top_k=1`` passed alone asks for the chain whatever a config says)."""
        top_k_given = given.get("assistant_tree_top_k")
        if is_integer(top_k_given) and top_k_given == 1 and all(given.get(n) is None for n in TREE_KNOBS[1:]):
            return None  # (True == 1 too: a bool is refused below, by name)
        values = {}
        for name in TREE_KNOBS:
            value = given.get(name)
            for config in (generation_config, getattr(assistant_model, "generation_config", None)):
                if value is None and config is not None:
                    value = getattr(config, name, None)
            values[name] = value
        top_k, size, paths = values["assistant_tree_top_k"], values["assistant_tree_size"], values["assistant_tree"]
        from_config = all(given.get(name) is None for name in TREE_KNOBS)
        if paths is not None:
            if top_k is not None and given.get("assistant_tree_top_k") is not None:
                raise ValueError(
                    "Pass either `assistant_tree` (a static tree) or `assistant_tree_top_k` (a dynamic one), not both."
                )
            return cls(depth=depth, paths=paths, from_config=from_config)
        if top_k is None and size is None:
            return None
        if top_k is None:
            raise ValueError(
                f"`assistant_tree_size={size!r}` needs `assistant_tree_top_k` (the children of each expanded node): "
                "pass both, or `assistant_tree` for a static tree."
            )
        spec = cls(depth=depth, top_k=top_k, size=size, from_config=from_config)
        return None if spec.top_k == 1 and size is None else spec


def _check_paths(paths) -> tuple[tuple[int, ...], ...]:
    """A static tree: paths of child ranks, each path's parent listed, no duplicates, no negative ranks."""
    fix = "e.g. `assistant_tree=[(0,), (1,), (0, 0)]`: each path lists child ranks from the root"
    if isinstance(paths, (str, bytes)) or not hasattr(paths, "__iter__"):
        raise TypeError(f"`assistant_tree` must be a list of paths of child ranks, got {paths!r} ({fix}).")
    checked = []
    for path in paths:
        if isinstance(path, (str, bytes)) or not hasattr(path, "__iter__"):
            raise TypeError(f"`assistant_tree` has the path {path!r}: each path is a tuple of child ranks ({fix}).")
        path = tuple(path)
        if not path or not all(is_integer(rank) and rank >= 0 for rank in path):
            raise ValueError(
                f"`assistant_tree` has the path {path!r}: a path is a non-empty tuple of non-negative ranks ({fix})."
            )
        checked.append(tuple(int(rank) for rank in path))
    if not checked:
        raise ValueError(f"`assistant_tree` is empty: give at least one path ({fix}).")
    seen = set()
    for path in checked:
        if path in seen:
            raise ValueError(f"`assistant_tree` lists the path {path} twice: list each node once.")
        seen.add(path)
    for path in checked:
        if len(path) > 1 and path[:-1] not in seen:
            raise ValueError(
                f"`assistant_tree` has the path {path} but not its parent {path[:-1]}: list every node's parent too."
            )
        if path[-1] > 0 and path[:-1] + (path[-1] - 1,) not in seen:
            raise ValueError(
                f"`assistant_tree` has the path {path} but not its elder sibling {path[:-1] + (path[-1] - 1,)}: a "
                "node's children are its draft's best tokens in order, so ranks must start at 0 with no gaps."
            )
    return tuple(sorted(checked, key=lambda path: (len(path), path)))


def child_tokens(
    probs: torch.Tensor,  # (rows, vocab) the draft's q at the expanded nodes
    count: int,
    do_sample: bool,
    generator: torch.Generator | None,
    sample,
) -> torch.Tensor:  # (rows, count)
    """A node's ``count`` children: child 0 drawn from ``q`` (argmax when greedy), then ``q``'s best other tokens."""
    first = sample(probs, generator) if do_sample else probs.argmax(dim=-1)  # (rows,)
    if count == 1:
        return first[:, None]
    others = probs.scatter(1, first[:, None], -1.0).topk(count - 1, dim=-1).indices  # (rows, count - 1)
    return torch.cat([first[:, None], others], dim=1)


@dataclass
class DraftTree:
    """The nodes one round verifies, per row, in slots: slot 0 is the root (the last committed token), slots
    ``1..S`` the nodes, grouped by level (``level_sizes``: the same in every row)."""

    tokens: torch.Tensor  # (B, S) node tokens (0 where invalid)
    parents: torch.Tensor  # (B, S) slot of each node's parent (0: the root)
    valid: torch.Tensor  # (B, S) bool: a node of this row's tree
    sampled: torch.Tensor  # (B, S) bool: drawn from its parent's q (child 0 of a sampled tree), else a point mass
    ancestors: torch.Tensor  # (B, S, S) bool: slot j is an ancestor of (or is) slot i
    children: torch.Tensor  # (B, S + 1, C) slots of each slot's valid children in verification order, -1 padded
    draft_probs: torch.Tensor  # (B, S + 1, vocab) q at each slot (zeros where the slot was not expanded)
    untempered_draft_probs: torch.Tensor | None  # (B, S + 1, vocab) softmax(raw logits) there, for rules that read it
    draft_hidden: torch.Tensor | None  # (B, S + 1, d_draft) the draft's hidden state at each slot, when asked
    draft_columns: torch.Tensor  # (B, S) the draft cache column of each node it was fed at (-1: never fed)
    level_sizes: tuple[int, ...]  # slots per level, levels 1..depth
    depth_limits: torch.Tensor  # (B,) levels each row may accept (its remaining budget less its last token)

    @property
    def num_slots(self) -> int:
        return self.tokens.shape[1]

    @property
    def depths(self) -> list[int]:  # (S,) the level of each slot
        return [level + 1 for level, size in enumerate(self.level_sizes) for _ in range(size)]

    @property
    def num_nodes(self) -> torch.Tensor:  # (B,) valid nodes per row
        return self.valid.sum(dim=1)


def check_tree_call(
    target, drafter, verifier, policy, *, tree: TreeSpec, vocab_size: int, threshold_given, num_return_sequences
) -> None:
    """Refuse, before any forward, what a tree round cannot run (each error names the argument and the fix). A
    streamer is served as for a chain: each round's accepted path is the chain view the loop commits and streams."""
    from .. import compat
    from ..verifiers.tree import check_tree_verifier

    kind = capabilities_of(drafter).no_trees
    if kind is not None:
        raise ValueError(
            "Token trees (`assistant_tree_top_k` / `assistant_tree`) draft with a draft model, early exit or an "
            f"EagleDraft, but the drafter is {type(drafter).__name__}, which {kind}: "
            "draft a chain with it (leave the tree knobs unset), or pass a small causal LM as `assistant_model`."
        )
    check_tree_verifier(verifier)
    if tree.top_k > vocab_size:
        knob = "`assistant_tree` has a child rank" if tree.is_static else f"`assistant_tree_top_k={tree.top_k}` is"
        raise ValueError(
            f"{knob} beyond the vocabulary the pair verifies ({vocab_size} ids): a node has at most that many "
            f"children. Pass `assistant_tree_top_k` of at most {vocab_size} (static ranks below it), e.g. 2 to 4."
        )
    if policy.schedule != "constant":
        raise ValueError(
            f"`num_assistant_tokens_schedule={policy.schedule!r}` changes the draft length each round, but a token "
            "tree has a fixed shape (`num_assistant_tokens` levels): use the 'constant' schedule with a tree."
        )
    if threshold_given:
        raise ValueError(
            "`assistant_confidence_threshold` stops a chain early, but a token tree verifies its best "
            "`assistant_tree_size` nodes instead: drop the threshold, or draft a chain."
        )
    if num_return_sequences not in (None, 1):
        raise ValueError(
            f"`num_return_sequences={num_return_sequences}` with a token tree: repeat the prompts in the batch instead "
            "(each row drafts its own tree), or draft a chain."
        )
    compat.check_tree_attention(target, "target")
    compat.check_tree_attention(drafter, "draft")
