"""The tensors of a distillation batch and the training-time-test unrolling of an
:class:`~diversed_hf.drafting.eagle.EagleDraft` over them (``docs/eagle.md``, "Training").

Unrolled step ``k`` feeds column ``j`` the draft's own predicted feature of step ``k - 1`` at column ``j - 1``, so
column ``j`` is the ``k + 1``-th token of a chain drafted after column ``j - k``. It attends as that draft token does
while drafting (:mod:`diversed_hf.drafting.feature_candidates`: the draft cache holds only columns computed from the
target's features, and a draft token sees those and its own chain): to the columns up to ``j - k`` as step 0
computed them, and to its chain's columns of steps 1 to ``k`` (EAGLE-3's training-time test, as SpecForge trains it),
never to other chains' predicted columns.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from .. import compat
from .eagle_data import Sequence

__all__ = ["UNROLLING", "batch_tensors", "chain_attention", "unrolled_features"]

#: how unrolled columns attend, recorded in a distillation's run.json: checkpoints trained before it was recorded
#: (each column of a step attending to every predicted column before it) are not resumed under it
UNROLLING = "chain"


def batch_tensors(sequences: list[Sequence], device) -> dict:
    """Right-padded tensors of a batch; ``loss_mask`` marks the response positions (features and labels exist)."""
    width = max(s.ids.shape[0] for s in sequences)
    batch, d, k = len(sequences), sequences[0].hidden.shape[1], sequences[0].top_ids.shape[1]
    ids = torch.zeros(batch, width, dtype=torch.long)
    mask = torch.zeros(batch, width, dtype=torch.long)
    hidden = torch.zeros(batch, width, d)
    top_ids = torch.zeros(batch, width, k, dtype=torch.long)
    top_logprobs = torch.full((batch, width, k), float("-inf"))
    loss_mask = torch.zeros(batch, width, dtype=torch.bool)
    for row, s in enumerate(sequences):
        n = s.ids.shape[0]
        ids[row, :n], mask[row, :n] = s.ids, 1
        hidden[row, : n - 1] = s.hidden.float()
        top_ids[row, : n - 1], top_logprobs[row, : n - 1] = s.top_ids.long(), s.top_logprobs.float()
        loss_mask[row, s.prompt_length - 1 : n - 1] = True  # positions predicting a response token
    tensors = dict(ids=ids, mask=mask, hidden=hidden, top_ids=top_ids, top_logprobs=top_logprobs, loss_mask=loss_mask)
    return {name: value.to(device) for name, value in tensors.items()}


def chain_attention(valid: torch.Tensor, step: int) -> torch.Tensor:  # (batch, T, (step + 1) T) bool
    """Which keys column ``j`` attends to at unrolled ``step`` (``valid`` ``(batch, T)``: the columns that are not
    padding): step 0's columns up to ``j - step`` (the target-fed context of the chain drafted after ``j - step``)
    and, of each step ``t`` in ``1..step``, column ``j - step + t`` (the chain's own draft tokens; ``t = step`` is
    ``j`` itself, which every row keeps, padding included, so no row attends to nothing)."""
    width = valid.shape[1]
    columns = torch.arange(width, device=valid.device)
    query, key = columns[:, None], columns[None, :]
    context = (key <= query - step)[None] & valid[:, None, :]  # (batch, T, T)
    own = [(key == query - step + t)[None].expand_as(context) for t in range(1, step + 1)]
    return torch.cat([context, *own], dim=2)


def unrolled_features(draft, ids: torch.Tensor, mask: torch.Tensor, hidden: torch.Tensor, steps: int) -> Iterator:
    """The draft's predicted features ``(batch, T, d)`` at each of ``steps`` unrolled steps over a batch
    (:func:`batch_tensors`: ``ids``, ``mask``, ``hidden`` the target's features): step 0 reads the target's feature
    of the column before each token, step ``k`` the draft's own prediction of step ``k - 1``; every step's keys stay
    in one cache that the later steps attend to through :func:`chain_attention`."""
    features = torch.cat([torch.zeros_like(hidden[:, :1]), hidden[:, :-1]], dim=1)  # column j holds h_{j-1}
    position_ids = (mask.cumsum(dim=1) - 1).clamp(min=0)
    valid, cache = mask.bool(), compat.new_cache()
    for step in range(steps):
        attention = compat.additive_mask(chain_attention(valid, step), torch.float32)
        predicted = draft.features(
            ids, features, attention_mask=attention, position_ids=position_ids, cache=cache, use_cache=True
        )
        yield predicted
        features = torch.cat([torch.zeros_like(predicted[:, :1]), predicted[:, :-1]], dim=1)
