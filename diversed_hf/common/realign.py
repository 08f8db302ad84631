"""How one round of the batched loop moves the batch's rows, written once for everything that follows it.

After verification row ``b`` accepted ``n_b`` drafts. With ``A = max_b n_b`` the sequence grows from ``L`` to
``new_length = L + A + 1`` columns; row ``b`` rolls right by ``shifts[b] = A - n_b`` (what wraps around lands on
columns that become padding), so every row ends on its last token; then ``leading`` columns that are padding in every
row are dropped. Finished rows leave first (``kept``).

:class:`Realignment` applies that edit to a per-column tensor (:meth:`Realignment.apply`: the sequence, its mask, the
target's features a draft reads), to a model's cache (:meth:`Realignment.edit_cache`, through the cache's own
``batch_select_indices`` and ``crop``) and to the logits processors that hold row positions
(:meth:`Realignment.edit_processors`). The one row roll is :func:`roll_rows_right`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import compat

__all__ = ["Realignment", "roll_rows_right"]


def roll_rows_right(values: torch.Tensor, shifts: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """Each row ``b`` of ``values`` (rows on dim 0) rolled right along ``dim`` by ``shifts[b]`` positions, what wraps
    around landing on the first columns (``dim=2`` of a cache layer's ``(batch, heads, length, head_dim)``)."""
    length = values.shape[dim]
    positions = torch.arange(length, device=values.device)  # (length,)
    index = (positions[None, :] - shifts.to(values.device)[:, None]) % length  # (batch, length)
    shape = [index.shape[0]] + [1] * (values.dim() - 1)
    shape[dim] = length
    return values.gather(dim, index.reshape(shape).expand_as(values))


@dataclass(frozen=True)
class Realignment:
    """One round's move of the batch's rows (the module docstring): keep rows ``kept``, crop to ``new_length``
    columns (fewer for a model whose cache lags the sequence), roll row ``b`` right by ``shifts[b]``, drop
    ``leading`` columns."""

    kept: torch.Tensor | None  # (kept,) rows (of this round's batch) that continue; None when all do
    shifts: torch.Tensor | None  # (kept,) A - n_b; None when every row accepted A drafts
    new_length: int  # L + A + 1
    leading: int  # all-padding columns dropped after the shift

    @property
    def only_crops(self) -> bool:
        """Whether the round keeps every row in place: then following it costs a crop, nothing per column."""
        return self.kept is None and self.shifts is None and self.leading == 0

    def move(self, values: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """The roll and the dropped leading columns alone, for values already cut to the kept rows and length."""
        if self.shifts is not None:
            values = roll_rows_right(values, self.shifts, dim=dim)
        return values.narrow(dim, self.leading, values.shape[dim] - self.leading)

    def apply(self, values: torch.Tensor, *, length: int | None = None) -> torch.Tensor:
        """A per-column tensor ``(batch, T, ...)`` realigned: rows kept, cropped to ``length`` columns (default
        ``new_length``), rolled, leading columns dropped: ``(kept, length - leading, ...)``."""
        if self.kept is not None:
            values = values[self.kept]
        return self.move(values[:, : self.new_length if length is None else length])

    def edit_cache(self, cache, *, lag: int | None = None, length: int | None = None) -> None:
        """The same edit on a model's cache: the one place a cache follows the round (the target's in the loop, a
        draft's in its candidate generator). The cache keeps ``new_length - lag`` columns before the shift
        (``length`` columns, when given: a draft whose cache stops at the round's start)."""
        length = self.new_length - (lag or 0) if length is None else length
        compat.realign_cache(cache, kept=self.kept, length=length, move=lambda values: self.move(values, dim=2))

    def edit_processors(self, logits_processor) -> None:
        """The same edit on the logits processors that hold row positions (``compat.realign_logits_processors``)."""
        compat.realign_logits_processors(logits_processor, kept=self.kept, shifts=self.shifts, leading=self.leading)
