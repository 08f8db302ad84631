"""Right-padded (or holed) batches, re-laid left-padded for the loop; the output keeps the caller's layout.

The batched loop (:mod:`diversed_hf.generation.loop`) needs every row's real tokens to end at the last column. A
tokenizer with ``padding_side="right"`` gives rows whose ``attention_mask`` has zeros after ones; transformers accepts
them (with a warning: its own output for them is not the left-padded batch's). :func:`left_align` moves each row's
masked columns in front of its real tokens, keeping their order. Nothing the models compute changes: masked columns are
never attended to, and position ids count only real tokens (``cumsum(mask) - 1``), so each row is scored exactly as its
prompt alone. ``generate`` returns ``cat([input_ids as given, new tokens])``, as transformers does for any layout.
"""

from __future__ import annotations

import torch

__all__ = ["left_align", "needs_left_align"]


def needs_left_align(
    attention_mask: torch.Tensor | None,  # (batch, length)
) -> bool:
    """Whether some row has a masked column after a real one (right padding, or a hole)."""
    return attention_mask is not None and bool((attention_mask[:, :-1] > attention_mask[:, 1:]).any())


def left_align(
    input_ids: torch.Tensor,  # (batch, length)
    attention_mask: torch.Tensor,  # (batch, length), 1 = real token
) -> tuple[torch.Tensor, torch.Tensor]:  # (batch, length) each
    """Each row's masked columns moved in front of its real tokens, both kept in order (a stable sort on the mask)."""
    order = torch.sort(attention_mask.ne(0).to(torch.int8), dim=1, stable=True).indices  # (batch, length)
    return input_ids.gather(1, order), attention_mask.gather(1, order)
