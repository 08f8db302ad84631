"""Length processors per row: transformers' ``min_length`` / ``min_new_tokens`` for the batched loop.

transformers' ``MinLengthLogitsProcessor`` and ``MinNewTokensLengthLogitsProcessor`` count a row's tokens as the
width of ``input_ids``: right in transformers' own loop, where every row gains one token per step, wrong in this
project's, where rows accept different numbers of drafts, are right-aligned and lose shared leading padding (a row
kept its EOS suppressed past ``min_new_tokens``). :func:`per_row_length_processors` swaps them for
:class:`RowMinLength`, which counts each row's own new tokens. ``min_length`` counts the prompt as transformers
counts it in a batch, its padded width: it becomes ``min_length - width`` new tokens (so the ``min_length`` that
transformers derives from ``min_new_tokens``, ``width + min_new_tokens``, agrees with it).
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor, LogitsProcessorList, MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor

__all__ = ["RowMinLength", "per_row_length_processors", "sync_row_lengths"]


class RowMinLength(LogitsProcessor):
    """EOS gets probability 0 in a row until it has generated ``min_new_tokens`` tokens.

    The loop tells it, each round, every row's count at the round's width (:meth:`sync`); a prefix ``k`` tokens
    longer than that width (the ``k``-th draft step, or the target's ``k``-th position) has ``count + k`` tokens.
    """

    def __init__(self, min_new_tokens: int, eos_token_id: torch.Tensor):
        self.min_new_tokens = min_new_tokens
        self.eos_token_id = torch.as_tensor(eos_token_id).reshape(-1)  # (num_eos,)
        self.generated: torch.Tensor | None = None  # (batch,) tokens each row generated, at width ``self.width``
        self.width = 0

    def sync(self, generated: torch.Tensor, width: int) -> None:
        """``generated`` (batch,): each active row's new tokens so far, at sequence width ``width``."""
        self.generated, self.width = generated, width

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:  # (batch, vocab)
        if self.generated is None:
            raise RuntimeError("RowMinLength: call `sync` with the rows' counts before scoring.")
        counts = self.generated.to(scores.device) + (input_ids.shape[-1] - self.width)  # (batch,)
        short = counts < self.min_new_tokens  # (batch,)
        if not bool(short.any()):
            return scores
        eos = self.eos_token_id.to(scores.device)
        is_eos = torch.zeros(scores.shape[-1], dtype=torch.bool, device=scores.device)  # (vocab,)
        is_eos[eos[eos < scores.shape[-1]]] = True
        return scores.masked_fill(short[:, None] & is_eos[None, :], float("-inf"))


def per_row_length_processors(logits_processor, prompt_width: int) -> LogitsProcessorList:
    """``logits_processor`` with transformers' min-length processors replaced by :class:`RowMinLength`;
    ``min_length`` becomes ``min_length - prompt_width`` new tokens (``prompt_width``: the padded prompt's)."""
    processors = LogitsProcessorList()
    for processor in logits_processor:
        if isinstance(processor, MinNewTokensLengthLogitsProcessor):
            processor = RowMinLength(processor.min_new_tokens, processor.eos_token_id)
        elif isinstance(processor, MinLengthLogitsProcessor):
            processor = RowMinLength(processor.min_length - prompt_width, processor.eos_token_id)
        processors.append(processor)
    return processors


def sync_row_lengths(logits_processor, remaining: torch.Tensor, max_new_tokens: int, width: int) -> None:
    """Tell every :class:`RowMinLength` of ``logits_processor`` the active rows' counts (start of a round):
    ``remaining`` (batch,) tokens each row may still emit out of ``max_new_tokens``."""
    generated = None
    for processor in logits_processor:
        if isinstance(processor, RowMinLength):
            generated = max_new_tokens - remaining if generated is None else generated  # (batch,)
            processor.sync(generated, width)
