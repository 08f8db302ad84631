"""Length processors per row: transformers' ``min_length`` / ``min_new_tokens`` for the batched loop.

transformers' ``MinLengthLogitsProcessor`` and ``MinNewTokensLengthLogitsProcessor`` count a row's tokens as the
width of ``input_ids``: right in transformers' own loop, where every row gains one token per step, wrong in this
project's, where rows accept different numbers of drafts, are right-aligned and lose shared leading padding (a row
kept its EOS suppressed past ``min_new_tokens``). :func:`per_row_length_processors` swaps them for
:class:`RowMinLength`, which counts each row's own tokens: ``min_new_tokens`` what the row generated, ``min_length``
the prompt as transformers counts it in a batch (its padded width, so ``min_length = width + min_new_tokens``, the
value transformers derives, agrees with ``min_new_tokens``) plus what the row generated.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor, LogitsProcessorList, MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor

__all__ = ["RowMinLength", "per_row_length_processors", "sync_row_lengths"]


class RowMinLength(LogitsProcessor):
    """EOS gets probability 0 in a row until it holds ``min_count`` tokens (prompt included or not).

    The loop tells it, each round, every row's count at the round's width (:meth:`sync`); a prefix ``k`` tokens
    longer than that width (the ``k``-th draft step, or the target's ``k``-th position) has ``count + k`` tokens.
    """

    def __init__(self, min_count: int, eos_token_id: torch.Tensor, *, counts_prompt: bool):
        self.min_count = min_count
        self.eos_token_id = torch.as_tensor(eos_token_id).reshape(-1)  # (num_eos,)
        self.counts_prompt = counts_prompt  # min_length: the prompt counts; min_new_tokens: only what was generated
        self.counts: torch.Tensor | None = None  # (batch,) tokens of each row at width ``self.width``
        self.width = 0

    def sync(self, prompt_lengths: torch.Tensor, generated: torch.Tensor, width: int) -> None:
        """``prompt_lengths`` / ``generated`` (batch,): what each active row's prompt counts for and its new tokens
        so far, at sequence width ``width``."""
        self.counts = generated + prompt_lengths if self.counts_prompt else generated.clone()
        self.width = width

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:  # (batch, vocab)
        if self.counts is None:
            raise RuntimeError("RowMinLength: call `sync` with the rows' counts before scoring.")
        counts = self.counts.to(scores.device) + (input_ids.shape[-1] - self.width)  # (batch,)
        short = counts < self.min_count  # (batch,)
        if not bool(short.any()):
            return scores
        eos = self.eos_token_id.to(scores.device)
        is_eos = torch.zeros(scores.shape[-1], dtype=torch.bool, device=scores.device)  # (vocab,)
        is_eos[eos[eos < scores.shape[-1]]] = True
        return scores.masked_fill(short[:, None] & is_eos[None, :], float("-inf"))


def per_row_length_processors(logits_processor) -> LogitsProcessorList:
    """``logits_processor`` with transformers' min-length processors replaced by :class:`RowMinLength`."""
    processors = LogitsProcessorList()
    for processor in logits_processor:
        if isinstance(processor, MinNewTokensLengthLogitsProcessor):
            processor = RowMinLength(processor.min_new_tokens, processor.eos_token_id, counts_prompt=False)
        elif isinstance(processor, MinLengthLogitsProcessor):
            processor = RowMinLength(processor.min_length, processor.eos_token_id, counts_prompt=True)
        processors.append(processor)
    return processors


def sync_row_lengths(logits_processor, prompt_lengths: torch.Tensor, generated: torch.Tensor, width: int) -> None:
    """Tell every :class:`RowMinLength` of ``logits_processor`` the active rows' counts (start of a round)."""
    for processor in logits_processor:
        if isinstance(processor, RowMinLength):
            processor.sync(prompt_lengths, generated, width)
