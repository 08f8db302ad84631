"""Argument checks for verification rounds called directly (the generation loop builds valid ones itself).

Every check raises a ``ValueError`` / ``TypeError`` that names the argument, what it holds and the fix.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch

__all__ = [
    "FiniteMassChecks",
    "check_finite_mass",
    "check_finite_mass_now_or_later",
    "check_round_inputs",
    "check_verification_output",
    "is_integer",
    "is_real",
]


def is_real(value) -> bool:
    """A real number as an argument: a Python or numpy int or float (``np.float32(0.5)``), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_integer(value) -> bool:
    """An integer as an argument: a Python or numpy int (``np.int64(5)``), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


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


# One of the two functions over 80 lines in the package, kept whole on purpose: a flat list of independent checks,
# one per argument in the order of the signature, each raising its own message; splitting it would only scatter them.
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
    if draft_lengths is not None:
        if not isinstance(draft_lengths, torch.Tensor) or tuple(draft_lengths.shape) != (batch_size,):
            got = (
                tuple(draft_lengths.shape) if isinstance(draft_lengths, torch.Tensor) else type(draft_lengths).__name__
            )
            raise ValueError(f"`draft_lengths` must be a tensor of shape (batch,) = ({batch_size},), got {got}.")
        if draft_lengths.is_floating_point() or draft_lengths.dtype == torch.bool:
            raise TypeError(f"`draft_lengths` must hold integers, got dtype {draft_lengths.dtype}.")
        if draft_lengths.numel() and (int(draft_lengths.min()) < 0 or int(draft_lengths.max()) > num_draft_tokens):
            raise ValueError(
                f"`draft_lengths` must lie in [0, N] = [0, {num_draft_tokens}], got values in "
                f"[{int(draft_lengths.min())}, {int(draft_lengths.max())}]."
            )
    # the slots that count: row b's first draft_lengths[b] drafts and the target's positions up to the bonus one;
    # the others may hold placeholders (vLLM pads them with zero rows) and are not checked
    lengths = None if draft_lengths is None else draft_lengths.to(draft_ids.device)[:, None]  # (batch, 1)
    positions = torch.arange(num_draft_tokens + 1, device=draft_ids.device)  # (N + 1,)
    counted = {
        "draft": None if lengths is None else positions[:-1] < lengths,  # (batch, N)
        "target": None if lengths is None else positions <= lengths,  # (batch, N + 1)
    }
    tensors = {"draft_probs": draft_probs, "target_probs": target_probs, **context}
    for name, value in tensors.items():
        if value is None:
            continue
        shape = expected[name]
        if not isinstance(value, torch.Tensor) or tuple(value.shape[: len(shape)]) != shape or value.dim() != 3:
            got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            what = (
                "(batch, N, hidden)"
                if name == "draft_hidden"
                else "(batch, N + 1, hidden)"
                if name == "target_hidden"
                else ""
            )
            raise ValueError(
                f"`{name}` must have shape {shape + (('hidden',) if 'hidden' in name else ())} {what}".rstrip()
                + f" for `draft_ids` of shape {tuple(draft_ids.shape)} and a vocabulary of {vocab_size}, got {got}."
            )
        if "probs" in name:
            rows = counted["draft" if "draft" in name else "target"]
            _check_distribution(name, value if rows is None else value[rows.to(value.device)])
    # ids after a row's draft_lengths are placeholders (vLLM pads them with -1): not read, not checked
    counted_ids = draft_ids if counted["draft"] is None else draft_ids[counted["draft"]]  # (batch * N,) or fewer
    if counted_ids.numel() and (int(counted_ids.min()) < 0 or int(counted_ids.max()) >= vocab_size):
        raise ValueError(
            f"`draft_ids` must be token ids in [0, {vocab_size}) (the vocabulary of `draft_probs`), got values in "
            f"[{int(counted_ids.min())}, {int(counted_ids.max())}]"
            + ("" if counted["draft"] is None else " among each row's first `draft_lengths`")
            + "."
        )
    if draft_ids.numel():
        safe_ids = draft_ids if counted["draft"] is None else draft_ids.where(counted["draft"], 0)  # (batch, N)
        drafted = draft_probs.gather(-1, safe_ids.long().unsqueeze(-1)).squeeze(-1)  # (batch, N) q_t(x_t)
        zero = drafted <= 0 if counted["draft"] is None else (drafted <= 0) & counted["draft"]  # (batch, N)
        if bool(zero.any()):
            row, position = zero.nonzero()[0].tolist()
            raise ValueError(
                f"`draft_ids[{row}, {position}]` = {int(draft_ids[row, position])} has probability 0 under "
                "`draft_probs`: drafts must be drawn from the draft distribution they are verified with."
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


class FiniteMassChecks:
    """A round's :func:`check_finite_mass` calls, deferred: each keeps its flag on the device, and the loop reads them
    all with the round's other decisions (one device read a round, not one per distribution), then raises the first
    failure's message as :func:`check_finite_mass` would."""

    def __init__(self):
        self._pending: list[tuple[torch.Tensor, str, int, torch.Tensor]] = []

    def add(self, probs: torch.Tensor, model: str, first_position: int = 0) -> None:
        """Check ``probs`` (as :func:`check_finite_mass`) when the round's decisions are read."""
        sums = probs.sum(dim=-1)
        self._pending.append((probs, model, first_position, (~torch.isfinite(sums) | (sums <= 0)).any()))

    def take(self) -> torch.Tensor | None:
        """The pending checks' flags, ``(k,)`` bool on the device (None for none); :meth:`raise_failed` with their
        values reads them back."""
        return torch.stack([flag for *_, flag in self._pending]) if self._pending else None

    def raise_failed(self, failed: list) -> None:
        """Raise :func:`check_finite_mass`'s error for the first check whose flag in ``failed`` is set; then forget
        the round's checks."""
        pending, self._pending = self._pending, []
        for (probs, model, first_position, _), bad in zip(pending, failed, strict=True):
            if bad:
                check_finite_mass(probs, model, first_position)


def check_finite_mass_now_or_later(
    probs: torch.Tensor, model: str, checks: FiniteMassChecks | None, first_position: int = 0
) -> None:
    """:func:`check_finite_mass` at once, or with the round's decisions when the loop defers its checks."""
    if checks is None:
        check_finite_mass(probs, model, first_position)
    else:
        checks.add(probs, model, first_position)


def check_verification_output(
    verifier: str,
    output,
    shape: tuple[int, int, int],  # (batch, N, vocab)
) -> None:
    """``verifier``'s :meth:`~diversed_hf.verifiers.Verifier.verification_probs` must return ``(pi, w)``: ``pi``
    ``(batch, N, vocab)`` distributions (finite, non-negative, summing to 1), ``w`` ``(batch, N)`` or None.

    Cheap on the happy path: one sum, one minimum and one host sync; the diagnosis runs only on failure.
    """
    where = f"`{verifier}.verification_probs`"
    if not isinstance(output, tuple) or len(output) != 2:
        got = f"a tuple of {len(output)}" if isinstance(output, tuple) else type(output).__name__
        raise TypeError(
            f"{where} must return a pair `(verify_probs, target_weight)` (`target_weight` may be None), got {got}."
        )
    verify_probs, target_weight = output
    if not isinstance(verify_probs, torch.Tensor) or tuple(verify_probs.shape) != tuple(shape):
        got = tuple(verify_probs.shape) if isinstance(verify_probs, torch.Tensor) else type(verify_probs).__name__
        raise ValueError(
            f"{where} must return `verify_probs` of shape (batch, N, vocab) = {tuple(shape)}, the shape of "
            f"`draft_probs`, got {got}."
        )
    if not verify_probs.is_floating_point():
        raise TypeError(
            f"{where} returned `verify_probs` of dtype {verify_probs.dtype}; return floating-point probabilities."
        )
    if target_weight is not None and (
        not isinstance(target_weight, torch.Tensor) or tuple(target_weight.shape) != tuple(shape[:2])
    ):
        got = tuple(target_weight.shape) if isinstance(target_weight, torch.Tensor) else type(target_weight).__name__
        raise ValueError(
            f"{where} must return `target_weight` of shape (batch, N) = {tuple(shape[:2])} or None, got {got}."
        )
    if not verify_probs.numel():
        return
    tolerance = _probability_tolerance(verify_probs)
    sums = verify_probs.sum(dim=-1)  # (batch, N)
    if bool(((sums - 1).abs().amax() <= tolerance) & (verify_probs.amin() >= 0)):  # False for NaN too
        return
    finite = torch.isfinite(verify_probs).all(dim=-1)  # (batch, N)
    negative = (verify_probs < 0).any(dim=-1)  # (batch, N)
    if not bool(finite.all()):
        row, position = (~finite).nonzero()[0].tolist()
        what = "NaN or infinite values"
    elif bool(negative.any()):
        row, position = negative.nonzero()[0].tolist()
        what = f"negative values (down to {float(verify_probs[row, position].min()):.3g})"
    else:
        row, position = ((sums - 1).abs() > tolerance).nonzero()[0].tolist()
        what = f"values summing to {float(sums[row, position]):.6g}, not 1"
    raise ValueError(
        f"{where} returned {what} at row {row}, drafted position {position}: a verifier must return, at every drafted "
        "position, a distribution over the vocabulary (finite, non-negative, summing to 1) to verify the drafts "
        f"against. Fix {verifier} (e.g. build "
        "`verify_probs` as a mixture of `draft_probs` and `target_probs` with weights in [0, 1], or normalise it: "
        "`probs / probs.sum(-1, keepdim=True)`)."
    )


def check_columns(dataset, required: Sequence[str], what: str) -> None:
    """Raise a ValueError naming the columns of ``required`` that ``dataset`` (a ``datasets.Dataset``) lacks."""
    missing = [c for c in required if c not in dataset.column_names]
    if missing:
        raise ValueError(
            f"{what} lacks the columns {missing} (it has {dataset.column_names}); it needs {list(required)}. Use files "
            "in the same schema as the Hub dataset, or rename the columns with `dataset.rename_column(old, new)`."
        )
