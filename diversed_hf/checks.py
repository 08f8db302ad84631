"""Argument checks for verification rounds called directly (the generation loop builds valid ones itself).

Every check raises a ``ValueError`` / ``TypeError`` that names the argument, what it holds and the fix.
"""

from __future__ import annotations

import torch

__all__ = ["check_finite_mass", "check_round_inputs"]


def _probability_tolerance(probs: torch.Tensor) -> float:
    return 1e-3 if probs.dtype in (torch.float32, torch.float64) else 2e-2


def _check_distribution(name: str, probs: torch.Tensor) -> None:
    """``probs`` (..., vocab) must be finite, non-negative and sum to 1 over the vocabulary."""
    if not probs.is_floating_point():
        raise TypeError(f"`{name}` must be a floating-point tensor of probabilities, got dtype {probs.dtype}.")
    if not bool(torch.isfinite(probs).all()):
        raise ValueError(f"`{name}` holds NaN or infinite values; pass probabilities (softmax of finite logits).")
    if bool((probs < 0).any()):
        raise ValueError(f"`{name}` holds negative values ({float(probs.min()):.3g}); pass probabilities, not logits.")
    sums = probs.sum(dim=-1)  # (...)
    worst = float((sums - 1).abs().max()) if sums.numel() else 0.0
    if worst > _probability_tolerance(probs):
        raise ValueError(
            f"`{name}` must sum to 1 over the vocabulary (last dimension); the sums are off by up to {worst:.3g}. Pass "
            "probabilities, e.g. `logits.softmax(-1)`, not logits or unnormalised scores."
        )


def check_round_inputs(
    draft_ids: torch.Tensor,  # (batch, N)
    draft_probs: torch.Tensor,  # (batch, N, vocab)
    target_probs: torch.Tensor,  # (batch, N + 1, vocab)
    draft_lengths: torch.Tensor | None = None,  # (batch,)
    **context: torch.Tensor | None,
) -> None:
    """Check the arguments of one verification round; raise a ValueError/TypeError naming the wrong one."""
    if not isinstance(draft_ids, torch.Tensor) or draft_ids.dim() != 2:
        got = tuple(draft_ids.shape) if isinstance(draft_ids, torch.Tensor) else type(draft_ids).__name__
        raise ValueError(f"`draft_ids` must be a tensor of shape (batch, N), got {got}.")
    if draft_ids.is_floating_point() or draft_ids.dtype == torch.bool or draft_ids.is_complex():
        raise TypeError(f"`draft_ids` must hold integer token ids (e.g. torch.long), got dtype {draft_ids.dtype}.")
    batch_size, num_draft_tokens = draft_ids.shape
    for name, value in (("draft_probs", draft_probs), ("target_probs", target_probs)):
        if not isinstance(value, torch.Tensor) or value.dim() != 3:
            got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(f"`{name}` must be a tensor of shape (batch, positions, vocab), got {got}.")
    vocab_size = draft_probs.shape[-1]
    expected = {
        "draft_probs": (batch_size, num_draft_tokens, vocab_size),
        "target_probs": (batch_size, num_draft_tokens + 1, vocab_size),
        "untempered_draft_probs": (batch_size, num_draft_tokens, vocab_size),
        "untempered_target_probs": (batch_size, num_draft_tokens + 1, vocab_size),
        "draft_hidden": (batch_size, num_draft_tokens),
        "target_hidden": (batch_size, num_draft_tokens + 1),
    }
    tensors = {"draft_probs": draft_probs, "target_probs": target_probs, **context}
    for name, value in tensors.items():
        if value is None:
            continue
        shape = expected[name]
        if not isinstance(value, torch.Tensor) or tuple(value.shape[: len(shape)]) != shape or value.dim() != 3:
            got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            what = "(batch, N, hidden)" if name == "draft_hidden" else "(batch, N + 1, hidden)" if name == "target_hidden" else ""
            raise ValueError(
                f"`{name}` must have shape {shape + (('hidden',) if 'hidden' in name else ())} {what}".rstrip()
                + f" for `draft_ids` of shape {tuple(draft_ids.shape)} and a vocabulary of {vocab_size}, got {got}."
            )
        if "probs" in name:
            _check_distribution(name, value)
    if draft_ids.numel() and (int(draft_ids.min()) < 0 or int(draft_ids.max()) >= vocab_size):
        raise ValueError(
            f"`draft_ids` must be token ids in [0, {vocab_size}) (the vocabulary of `draft_probs`), got values in "
            f"[{int(draft_ids.min())}, {int(draft_ids.max())}]."
        )
    if draft_lengths is not None:
        if not isinstance(draft_lengths, torch.Tensor) or tuple(draft_lengths.shape) != (batch_size,):
            got = tuple(draft_lengths.shape) if isinstance(draft_lengths, torch.Tensor) else type(draft_lengths).__name__
            raise ValueError(f"`draft_lengths` must be a tensor of shape (batch,) = ({batch_size},), got {got}.")
        if draft_lengths.is_floating_point() or draft_lengths.dtype == torch.bool:
            raise TypeError(f"`draft_lengths` must hold integers, got dtype {draft_lengths.dtype}.")
        if draft_lengths.numel() and (int(draft_lengths.min()) < 0 or int(draft_lengths.max()) > num_draft_tokens):
            raise ValueError(
                f"`draft_lengths` must lie in [0, N] = [0, {num_draft_tokens}], got values in "
                f"[{int(draft_lengths.min())}, {int(draft_lengths.max())}]."
            )
    if draft_ids.numel():
        drafted = draft_probs.gather(-1, draft_ids.long().unsqueeze(-1)).squeeze(-1)  # (batch, N) q_t(x_t)
        counted = torch.ones_like(drafted, dtype=torch.bool)  # (batch, N)
        if draft_lengths is not None:
            counted = torch.arange(num_draft_tokens, device=draft_ids.device) < draft_lengths[:, None].to(draft_ids.device)
        if bool(((drafted <= 0) & counted).any()):
            row, position = ((drafted <= 0) & counted).nonzero()[0].tolist()
            raise ValueError(
                f"`draft_ids[{row}, {position}]` = {int(draft_ids[row, position])} has probability 0 under `draft_probs`: "
                "drafts must be drawn from the draft distribution they are verified with."
            )


def check_finite_mass(
    probs: torch.Tensor,  # (batch, positions, vocab) or (batch, vocab)
    model: str,
    first_position: int = 0,
) -> None:
    """Raise a ValueError naming ``model`` and the position when a distribution has no finite mass.

    ``softmax`` of all ``-inf`` (every token removed by the logits processors) or of NaN logits gives
    NaN; transformers refuses such a distribution for plain sampling, and so does the loop.
    """
    sums = probs.sum(dim=-1)  # (batch, positions) or (batch,)
    bad = ~torch.isfinite(sums) | (sums <= 0)
    if bool(bad.any()):
        index = bad.nonzero()[0].tolist()
        row, position = index[0], (index[1] if len(index) > 1 else 0)
        raise ValueError(
            f"The {model}'s next-token distribution has no finite probability mass at row {row}, position "
            f"{first_position + position} of the round: its logits are NaN or infinite, or the logits processors "
            "removed every token. Check the model's weights and dtype (fp16 overflows), and the sampling arguments."
        )
