"""The target's cache in the batched loop, with holes: a round's rejected drafts stay where they are, masked.

After a round row ``b`` keeps ``n_b`` of the ``N_r`` drafts the target's pass cached. The compact layout
(:class:`~diversed_hf.common.realign.Realignment`) rolls each row right by ``A - n_b`` so that every row ends on its
last token: every column of every one of the target's layers is rewritten each round, a cost that grows with the
cache, not with the round (9 % of a batch-8 round on the real pair). Here the target's cache is cropped to
``C + A + 1`` columns and the ``A - n_b`` rejected columns of row ``b`` are masked in place instead: the round's edit
is ``A + 1`` columns of the mask. Positions follow the mask (``cumsum(mask) - 1``), so a token after a hole has the
position it has in the compact layout, and attention never reads a hole: the target computes what it computes on the
compact cache.

The rest of the loop keeps the compact layout: the sequence, its mask, the logits processors and stopping criteria
(which read tokens, never holes), and the draft's cache. Holes cost attention columns, so the cache is compacted (one
gather of every layer, the compact layout's own roll) when it holds more than ``max(COMPACT_AT, COMPACT_SHARE x
width)`` columns beyond the compact sequence's ``width``. A target whose attention reads columns rather than
positions keeps the compact layout every round: a sliding window (its mask counts columns), and a draft that reads
the target's cache itself (a Gemma 4 assistant).
"""

from __future__ import annotations

import torch

from .. import compat
from ..common.realign import Realignment

__all__ = ["COMPACT_AT", "COMPACT_SHARE", "TargetCache"]

#: extra columns (holes beyond the compact layout's width) the cache may hold before it is compacted ...
COMPACT_AT = 64
#: ... or this share of the compact width, when more (a long prompt's cache costs more to compact)
COMPACT_SHARE = 0.5


class TargetCache:
    """The target's ``cache`` and ``mask`` ``(B, C)``, which of its ``C`` columns are real, with each row's leading
    non-real columns kept on the host (``padding``): no round reads the device to edit it."""

    def __init__(self, *, keeps_holes: bool):
        self.cache = compat.new_cache()
        self.keeps_holes = keeps_holes
        self.mask: torch.Tensor | None = None  # (B, C)
        self.padding: list[int] = []  # [B] leading columns of each row that are not real

    def start(self, mask: torch.Tensor, padding: list[int]) -> None:
        """Before the first round: the prompt's ``mask`` ``(B, L)`` and each row's leading padding; the cache will
        hold every column but the last."""
        self.mask = mask[:, :-1]
        self.padding = [min(pad, self.mask.shape[1]) for pad in padding]

    def inputs(self, ids: torch.Tensor, mask: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """What the target's pass reads of a round's ``ids`` / ``mask`` ``(B, L + n)`` (the compact prefix of width
        ``length`` and the round's new columns): the columns its cache lacks (the last token and the new ones; all of
        them in the first round) and the attention mask over the cache and those."""
        if self.cache.get_seq_length() == 0:
            return ids, mask
        return ids[:, length - 1 :], torch.cat([self.mask, mask[:, length - 1 :]], dim=1)

    def follow(
        self,
        realignment: Realignment,
        rows: list[int] | None,  # the rows that continue (host), None when all do
        accepted: list[int],  # [kept] n_b of each continuing row (host)
        num_accepted: torch.Tensor,  # (kept,) the same on the device
        compact_mask: torch.Tensor,  # (kept, L') the compact sequence's mask after the round
        compact_padding: list[int],  # [kept] its leading padding
    ) -> None:
        """After a round's pass extended the cache by ``[last token, drafts]`` (a tree round: by its path): keep the
        continuing rows, mask each row's rejected columns, drop leading columns no row uses, compact when the holes
        make the cache too wide (module docstring)."""
        if not self.keeps_holes:
            realignment.edit_cache(self.cache, lag=1)  # the compact layout's roll; the cache lacks the last token
            self.mask, self.padding = compact_mask[:, :-1], [min(p, compact_mask.shape[1] - 1) for p in compact_padding]
            return
        if rows is not None:
            self.mask, self.padding = self.mask[realignment.kept], [self.padding[b] for b in rows]
        longest = max(accepted)  # A
        width = self.mask.shape[1] + longest + 1  # C + A + 1: the last token's column and A drafts' columns
        columns = torch.arange(longest + 1, device=self.mask.device)  # (A + 1,)
        kept = (columns[None, :] <= num_accepted[:, None]).to(self.mask.dtype)  # (kept, A + 1): rejected ones are 0
        self.mask = torch.cat([self.mask, kept], dim=1)  # (kept, C + A + 1)
        leading = min(self.padding)  # columns that are padding in every row
        self.padding = [pad - leading for pad in self.padding]
        compat.realign_cache(
            self.cache, kept=realignment.kept, length=width, move=lambda values: values[:, :, leading:]
        )
        self.mask = self.mask[:, leading:]
        compact_width = compact_mask.shape[1] - 1  # the cache's width in the compact layout
        if self.mask.shape[1] - compact_width > max(COMPACT_AT, COMPACT_SHARE * compact_width):
            self.compact(compact_mask, compact_padding)

    def compact(self, compact_mask: torch.Tensor, compact_padding: list[int]) -> None:
        """Every row's real columns moved right-aligned, in order, into the compact layout's width: the holes go."""
        width = compact_mask.shape[1] - 1
        # a stable sort of the 0/1 mask puts a row's non-real columns first and its real ones last, each in order
        order = self.mask.sort(dim=1, stable=True).indices[:, self.mask.shape[1] - width :]  # (B, width)

        def move(values: torch.Tensor) -> torch.Tensor:  # (B, heads, C, head_dim) -> (B, heads, width, head_dim)
            index = order[:, None, :, None].expand(values.shape[0], values.shape[1], width, values.shape[3])
            return values.gather(2, index)

        compat.realign_cache(self.cache, kept=None, length=self.mask.shape[1], move=move)
        self.mask = compact_mask[:, :-1]
        self.padding = [min(pad, width) for pad in compact_padding]
