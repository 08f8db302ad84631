"""Logits processors per row: transformers' processors that count a row's length, for the batched loop.

transformers' processors read a row's length as the width of ``input_ids``: right in transformers' own loop, where
every row gains one token per step, wrong in this project's, where rows accept different numbers of drafts, are
right-aligned and lose shared leading padding (a row kept its EOS suppressed past ``min_new_tokens``).
:func:`per_row_processors` swaps them for per-row versions:

- ``min_length`` / ``min_new_tokens`` become :class:`RowMinLength`, which counts each row's own new tokens.
  ``min_length`` counts the prompt as transformers counts it in a batch, its padded width: it becomes
  ``min_length - width`` new tokens (so the ``min_length`` that transformers derives from ``min_new_tokens``,
  ``width + min_new_tokens``, agrees with it);
- the processors that read nothing but the width -- ``forced_bos_token_id``, ``forced_eos_token_id``,
  ``begin_suppress_tokens``, ``exponential_decay_length_penalty`` -- are wrapped in :class:`RowWidth`, which runs
  them on each row at the width transformers' loop would give it: the padded prompt's width plus the row's tokens.

The repetition penalty's per-row padding (``prompt_ignore_length``) is copied here, so the realignment
(:func:`diversed_hf.compat.realign_logits_processors`) never edits a processor the caller passed. Classifier-free
guidance keeps a cache of its own, one token per call, which speculative rounds cannot keep: it is refused.
"""

from __future__ import annotations

import copy

import torch
from transformers import (
    ClassifierFreeGuidanceLogitsProcessor,
    ExponentialDecayLengthPenalty,
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    LogitsProcessor,
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
    UnbatchedClassifierFreeGuidanceLogitsProcessor,
)

__all__ = ["RowMinLength", "RowWidth", "WIDTH_PROCESSORS", "per_row_processors", "sync_row_lengths"]

#: transformers' processors that read only the width of ``input_ids`` (the position being scored), not its tokens
WIDTH_PROCESSORS = (
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
    ExponentialDecayLengthPenalty,
)
_GUIDANCE = (UnbatchedClassifierFreeGuidanceLogitsProcessor, ClassifierFreeGuidanceLogitsProcessor)


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


class RowWidth(LogitsProcessor):
    """Runs ``processor`` (one of :data:`WIDTH_PROCESSORS`) on each row at the width transformers would give it.

    In transformers' loop every row of a batch has width ``prompt_width + generated`` (the padded prompt's width
    plus the tokens generated so far). The loop tells this wrapper each row's ``generated`` at the round's width
    (:meth:`sync`); a prefix ``k`` tokens longer is row ``b``'s width ``prompt_width + generated[b] + k``. Rows of
    one width are scored in one call, on the last columns of ``input_ids`` (left-filled with zeros when the row's
    width is the larger: the wrapped processors read only the width).
    """

    def __init__(self, processor: LogitsProcessor, prompt_width: int):
        self.processor = processor
        self.prompt_width = prompt_width
        self.generated: list[int] | None = None  # tokens each row generated, at width ``self.width``
        self.width = 0

    def sync(self, generated: torch.Tensor, width: int) -> None:
        """``generated`` (batch,): each active row's new tokens so far, at sequence width ``width``."""
        self.generated, self.width = generated.tolist(), width

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:  # (batch, vocab)
        if self.generated is None:
            raise RuntimeError("RowWidth: call `sync` with the rows' counts before scoring.")
        offset = self.prompt_width + input_ids.shape[-1] - self.width
        widths = [offset + count for count in self.generated]  # the width transformers gives each row
        if len(set(widths)) == 1:
            return self.processor(_at_width(input_ids, widths[0]), scores)
        processed = scores.clone()  # (batch, vocab)
        for width in sorted(set(widths)):
            rows = torch.tensor([b for b, w in enumerate(widths) if w == width], device=scores.device)  # (rows,)
            processed[rows] = self.processor(_at_width(input_ids[rows], width), scores[rows])
        return processed


def _at_width(
    input_ids: torch.Tensor,  # (batch, length)
    width: int,
) -> torch.Tensor:  # (batch, width)
    """The last ``width`` columns of ``input_ids``, left-filled with zeros if it is narrower."""
    length = input_ids.shape[-1]
    if width <= length:
        return input_ids[:, length - width :]
    return torch.cat([input_ids.new_zeros(input_ids.shape[0], width - length), input_ids], dim=1)


def per_row_processors(logits_processor, prompt_width: int) -> LogitsProcessorList:
    """``logits_processor`` with the processors that count a row's length made per row (module docstring);
    ``prompt_width``: the padded prompt's width. Raises for classifier-free guidance."""
    processors = LogitsProcessorList()
    for processor in logits_processor:
        if isinstance(processor, _GUIDANCE):
            raise ValueError(
                f"`{type(processor).__name__}` (classifier-free guidance, `guidance_scale`) cannot be combined with "
                "`diversed_head`/`verifier`: it runs the model on its own cache one token per call, while a speculative "
                "round scores several positions at once. Remove `guidance_scale` (or set it to 1) and the processor."
            )
        if isinstance(processor, MinNewTokensLengthLogitsProcessor):
            processor = RowMinLength(processor.min_new_tokens, processor.eos_token_id)
        elif isinstance(processor, MinLengthLogitsProcessor):
            processor = RowMinLength(processor.min_length - prompt_width, processor.eos_token_id)
        elif isinstance(processor, WIDTH_PROCESSORS):
            processor = RowWidth(processor, prompt_width)
        elif isinstance(processor, RepetitionPenaltyLogitsProcessor):
            processor = copy.copy(processor)  # the realignment edits its per-row padding
        processors.append(processor)
    return processors


def sync_row_lengths(logits_processor, remaining: torch.Tensor, max_new_tokens: int, width: int) -> None:
    """Tell every :class:`RowMinLength` / :class:`RowWidth` of ``logits_processor`` the active rows' counts (start of
    a round): ``remaining`` (batch,) tokens each row may still emit out of ``max_new_tokens``."""
    generated = None
    for processor in logits_processor:
        if isinstance(processor, (RowMinLength, RowWidth)):
            generated = max_new_tokens - remaining if generated is None else generated  # (batch,)
            processor.sync(generated, width)
