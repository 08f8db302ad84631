"""Distribution features: statistics of ``p_t`` and ``q_t`` an ensemble head may read (docs/method.md §4).

Besides (or instead of) the two models' hidden states, a :class:`~diversed_hf.heads.head.DiversedHead` may read a
fixed set of named statistics of the two next-token distributions of a position. They are computed by one
function, :func:`distribution_features`, from the **verification distributions** -- the target's and the
draft's probabilities after the same logits processors (temperature, top-k, top-p), over the target's
vocabulary: exactly the ``p_t`` and ``q_t`` the verifier mixes into ``nu_t = w_t p_t + (1 - w_t) q_t``.
Generation (:class:`~diversed_hf.verifiers.HeadVerifier`) and training rollouts
(:func:`~diversed_hf.training.rollout.sample_from_mixture`) both call it on those tensors, so a head sees the same
numbers in both.

Every feature depends on the context only, never on the drafted token ``x_t``: a weight that read the
token under test would make the emitted law something other than ``nu_t`` (docs/method.md §4).

Each feature is mapped to ``[0, 1]`` by a fixed scaling, so a head's input is well-conditioned without a
learned normalisation (and a head does not depend on the scale of a particular vocabulary):

==================================== ==================================================================
``tv``                               ``TV(p, q) = 1/2 sum_x |p(x) - q(x)|``
``target_entropy`` / ``draft_entropy`` ``H(p) / log V`` (``V`` the vocabulary size): 0 for a point mass, 1 for uniform
``target_top1`` / ``draft_top1``     ``max_x p(x)``
``argmax_agree``                     ``1[argmax p = argmax q]`` (ties go to the lowest id, as ``torch.argmax``)
``target_margin`` / ``draft_margin`` ``min(log p_(1) - log p_(2), MARGIN_CAP) / MARGIN_CAP``: the top-1 minus top-2
                                     log-probability, in units of ``MARGIN_CAP`` nats (1 when ``p_(2) = 0``)
==================================== ==================================================================

The ``mlp`` head normalises its hidden-state inputs but not these (:class:`HiddenLayerNorm`). This module is
part of the math layer: it imports only torch and :mod:`diversed_hf.verifiers.ops`.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch

from . import ops

__all__ = ["FEATURE_NAMES", "MARGIN_CAP", "HiddenLayerNorm", "check_feature_names", "distribution_features"]

#: every feature a head may read, in the order the docs list them
FEATURE_NAMES = (
    "tv",
    "target_entropy",
    "draft_entropy",
    "target_top1",
    "draft_top1",
    "argmax_agree",
    "target_margin",
    "draft_margin",
)
#: log-probability margin (nats) at which the ``*_margin`` features saturate at 1: beyond it (second token
#: e^10 ~ 22000 times less likely than the first) a distribution is as good as certain.
MARGIN_CAP = 10.0


def check_feature_names(names: Iterable[str], argument: str = "features") -> list[str]:
    """``names`` as a list, after checking each is in :data:`FEATURE_NAMES` and none repeats.

    ``argument`` is the name the error messages give the value (``"features"``, ``"head_features"``).
    """
    if isinstance(names, str):
        raise TypeError(
            f"`{argument}` must be a list of feature names, got the string {names!r}; write [{names!r}]. "
            f"Valid names: {list(FEATURE_NAMES)}."
        )
    try:
        names = list(names)
    except TypeError:
        raise TypeError(
            f"`{argument}` must be a list of feature names, got {type(names).__name__} {names!r}. "
            f"Valid names: {list(FEATURE_NAMES)}."
        ) from None
    for name in names:
        if name not in FEATURE_NAMES:
            raise ValueError(f"`{argument}` has an unknown feature {name!r}; valid names are {list(FEATURE_NAMES)}.")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"`{argument}` names {repeated} more than once; list each feature once.")
    return names


def distribution_features(
    draft_probs: torch.Tensor,  # (..., vocab) q_t, after the logits processors
    target_probs: torch.Tensor,  # (..., vocab) p_t, after the same processors
    names: Iterable[str],
) -> torch.Tensor:  # (..., len(names)), each in [0, 1]
    """The features ``names`` (see the module's table) of each position, in that order, in float32 (or float64).

    Only the requested statistics are computed. With no names the result has a last dimension of 0, so a
    caller can always pass it to the head.
    """
    names = check_feature_names(names)
    if draft_probs.shape != target_probs.shape:
        raise ValueError(
            f"`draft_probs` {tuple(draft_probs.shape)} and `target_probs` {tuple(target_probs.shape)} must have the "
            "same shape (..., vocab): the features compare the two distributions of each position."
        )
    dtype = torch.promote_types(target_probs.dtype, torch.float32)  # never below float32
    probs = {"target": target_probs.to(dtype), "draft": draft_probs.to(dtype)}
    if not names:
        return probs["target"].new_zeros(target_probs.shape[:-1] + (0,))  # (..., 0)
    vocab_size = target_probs.shape[-1]
    top_two: dict[str, torch.Tensor] = {}  # role -> (..., 2), shared by *_top1 and *_margin

    def largest_two(role: str) -> torch.Tensor:  # (..., 2) the two largest probabilities, the second 0 if V = 1
        if role not in top_two:
            values = probs[role].topk(min(2, vocab_size), dim=-1).values  # (..., min(2, V))
            top_two[role] = torch.nn.functional.pad(values, (0, 2 - values.shape[-1]))
        return top_two[role]

    columns = []
    for name in names:
        if name == "tv":
            column = ops.total_variation(probs["target"], probs["draft"])  # (...)
        elif name == "argmax_agree":
            column = (probs["target"].argmax(dim=-1) == probs["draft"].argmax(dim=-1)).to(dtype)  # (...)
        else:
            role, statistic = name.split("_", 1)
            if statistic == "entropy":  # entr(0) = 0: masked-out tokens (top-k, top-p) add nothing
                column = torch.special.entr(probs[role]).sum(dim=-1) / math.log(max(vocab_size, 2))  # (...)
            elif statistic == "top1":
                column = largest_two(role)[..., 0]  # (...)
            else:  # margin; log 0 = -inf gives an infinite margin, capped at 1
                top = largest_two(role)  # (..., 2)
                column = (top[..., 0].log() - top[..., 1].log()).clamp(0.0, MARGIN_CAP) / MARGIN_CAP  # (...)
        columns.append(column.clamp(0.0, 1.0))  # rounding must not leave [0, 1] (an entropy of 1 + 1e-7)
    return torch.stack(columns, dim=-1)  # (..., F)


class HiddenLayerNorm(torch.nn.LayerNorm):
    """The ``mlp`` head's first layer: LayerNorm of the hidden-state columns; the features after them pass through.

    Features are already in [0, 1]; normalising them together with thousands of hidden-state values would scale
    them by each token's hidden-state spread. With no features this is exactly ``nn.LayerNorm(hidden_size)``
    (same parameters and names), so the ``mlp`` heads saved before features existed load as they were.
    """

    def __init__(self, hidden_size: int, num_features: int):
        super().__init__(hidden_size)
        self.num_features = num_features

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:  # (..., d_hidden + F) -> (..., d_hidden + F)
        if not self.num_features:
            return super().forward(inputs)
        hidden, features = inputs.split([inputs.shape[-1] - self.num_features, self.num_features], dim=-1)
        return torch.cat([super().forward(hidden), features], dim=-1)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, features passed through={self.num_features}"
