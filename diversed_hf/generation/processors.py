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

Rows leave the batch as they finish, so the batch a processor sees shrinks. transformers' processors that treat
each row alone (:data:`ROW_PROCESSORS`) run on the active rows as they are; two kinds need the caller's row index:

- ``prefix_allowed_tokens_fn(batch_id, sent)`` becomes :class:`RowPrefixConstrained`, which passes each active row's
  own index in the caller's batch;
- any other processor (a caller's own, which may hold a tensor per row) is wrapped in :class:`FullBatch`, which
  runs it on the caller's full batch: finished rows are filled with the pad token (their scores are discarded).

The repetition penalty's per-row padding (``prompt_ignore_length``) is copied here, so the realignment
(:func:`diversed_hf.compat.realign_logits_processors`) never edits a processor the caller passed. Classifier-free
guidance keeps a cache of its own, one token per call, which speculative rounds cannot keep: it is refused.
"""

from __future__ import annotations

import copy

import torch
import transformers.generation.logits_process
from transformers import (
    ClassifierFreeGuidanceLogitsProcessor,
    ExponentialDecayLengthPenalty,
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    LogitsProcessor,
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    PrefixConstrainedLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
    UnbatchedClassifierFreeGuidanceLogitsProcessor,
)

from .. import compat

__all__ = [
    "FullBatch",
    "ROW_PROCESSORS",
    "RowMinLength",
    "RowPrefixConstrained",
    "RowWidth",
    "WIDTH_PROCESSORS",
    "per_row_processors",
    "sync_row_lengths",
]

#: transformers' processors that read only the width of ``input_ids`` (the position being scored), not its tokens
WIDTH_PROCESSORS = (
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
    ExponentialDecayLengthPenalty,
)
#: transformers' processors that score each row from that row alone: they run on the active rows as they are
ROW_PROCESSORS = tuple(
    getattr(transformers.generation.logits_process, name)
    for name in (
        "EncoderNoRepeatNGramLogitsProcessor",
        "EncoderRepetitionPenaltyLogitsProcessor",
        "EpsilonLogitsWarper",
        "EtaLogitsWarper",
        "InfNanRemoveLogitsProcessor",
        "LogitNormalization",
        "MinPLogitsWarper",
        "NoBadWordsLogitsProcessor",
        "NoRepeatNGramLogitsProcessor",
        "RepetitionPenaltyLogitsProcessor",
        "SequenceBiasLogitsProcessor",
        "SuppressTokensLogitsProcessor",
        "TemperatureLogitsWarper",
        "TopHLogitsWarper",
        "TopKLogitsWarper",
        "TopPLogitsWarper",
        "TypicalLogitsWarper",
        "WatermarkLogitsProcessor",
    )
    if hasattr(transformers.generation.logits_process, name)  # TopH is newer than the oldest transformers supported
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


class _RowIndexed(LogitsProcessor):
    """A processor told, each round, the caller's index of every active row (:meth:`sync_rows`)."""

    rows: torch.Tensor | None = None  # (active,) each active row's index in the caller's batch; None: all, in order

    def sync_rows(self, rows: torch.Tensor) -> None:
        self.rows = rows


class RowPrefixConstrained(_RowIndexed):
    """transformers' ``PrefixConstrainedLogitsProcessor`` with each active row's index in the caller's batch: row
    ``b`` may emit only ``prefix_allowed_tokens_fn(rows[b], sent)`` (every token of it at ``-inf`` gets score 0)."""

    def __init__(self, prefix_allowed_tokens_fn):
        self.prefix_allowed_tokens_fn = prefix_allowed_tokens_fn

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:  # (batch, vocab)
        rows = range(input_ids.shape[0]) if self.rows is None else self.rows.tolist()
        mask = torch.full_like(scores, float("-inf"))  # (batch, vocab)
        for b, batch_id in enumerate(rows):
            allowed = self.prefix_allowed_tokens_fn(batch_id, input_ids[b])
            if len(allowed) == 0:
                raise ValueError(
                    f"`prefix_allowed_tokens_fn` returned an empty list for batch ID {batch_id}: the constraint is "
                    "unsatisfiable. Return at least one allowed token id for every prefix."
                )
            mask[b, allowed] = 0
        processed = scores + mask
        unsatisfiable = processed.amax(dim=-1, keepdim=True).isneginf()  # (batch, 1): force the allowed set
        return torch.where(unsatisfiable, mask, processed)


class FullBatch(_RowIndexed):
    """Runs ``processor`` on the caller's whole batch of ``batch_size`` rows, so a processor that holds something
    per row (a bias tensor, a constraint per row) sees each row at its own index however many rows have finished.
    Finished rows read ``pad_token_id`` tokens and zero scores; their output is discarded."""

    def __init__(self, processor: LogitsProcessor, batch_size: int, pad_token_id: int):
        self.processor = processor
        self.batch_size = batch_size
        self.pad_token_id = pad_token_id

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:  # (batch, vocab)
        if self.rows is None or self.rows.numel() == self.batch_size:  # every row, in the caller's order
            return self.processor(input_ids, scores)
        rows = self.rows.to(scores.device)  # (active,)
        full_ids = input_ids.new_full((self.batch_size, input_ids.shape[1]), self.pad_token_id)  # (batch_size, L)
        full_ids[rows] = input_ids
        full_scores = scores.new_zeros(self.batch_size, scores.shape[-1])  # (batch_size, vocab)
        full_scores[rows] = scores
        return self.processor(full_ids, full_scores)[rows]


def _at_width(
    input_ids: torch.Tensor,  # (batch, length)
    width: int,
) -> torch.Tensor:  # (batch, width)
    """The last ``width`` columns of ``input_ids``, left-filled with zeros if it is narrower."""
    length = input_ids.shape[-1]
    if width <= length:
        return input_ids[:, length - width :]
    return torch.cat([input_ids.new_zeros(input_ids.shape[0], width - length), input_ids], dim=1)


def per_row_processors(
    logits_processor, prompt_width: int, batch_size: int | None = None, pad_token_id: int = 0
) -> LogitsProcessorList:
    """``logits_processor`` with the processors that count a row's length made per row and those that read the
    caller's row index given it (module docstring); ``prompt_width``: the padded prompt's width; ``batch_size``: the
    caller's (None: rows never leave, processors of unknown kind run as they are). Raises for classifier-free
    guidance."""
    processors = LogitsProcessorList()
    for processor in logits_processor:
        if isinstance(processor, _GUIDANCE):
            raise ValueError(
                f"`{type(processor).__name__}` (classifier-free guidance, `guidance_scale`) cannot be combined with "
                "`diversed_head`/`verifier`: it runs the model on its own cache one token per call, while a "
                "speculative round scores several positions at once. Remove `guidance_scale` (or set it to 1) and "
                "the processor."
            )
        if isinstance(processor, MinNewTokensLengthLogitsProcessor):
            processor = RowMinLength(processor.min_new_tokens, processor.eos_token_id)
        elif isinstance(processor, MinLengthLogitsProcessor):
            processor = RowMinLength(processor.min_length - prompt_width, processor.eos_token_id)
        elif isinstance(processor, WIDTH_PROCESSORS):
            processor = RowWidth(processor, prompt_width)
        elif isinstance(processor, RepetitionPenaltyLogitsProcessor):
            processor = copy.copy(processor)  # the realignment edits its per-row padding
        elif isinstance(processor, PrefixConstrainedLogitsProcessor):
            processor = RowPrefixConstrained(compat.prefix_allowed_tokens_fn(processor))
        elif batch_size is not None and not isinstance(processor, ROW_PROCESSORS + (_RowIndexed,)):
            processor = FullBatch(processor, batch_size, pad_token_id)
        processors.append(processor)
    return processors


def sync_row_lengths(
    logits_processor, remaining: torch.Tensor, max_new_tokens: int, width: int, rows: torch.Tensor | None = None
) -> None:
    """Tell every :class:`RowMinLength` / :class:`RowWidth` of ``logits_processor`` the active rows' counts (start of
    a round): ``remaining`` (batch,) tokens each row may still emit out of ``max_new_tokens``; and every processor
    that reads the caller's row index, ``rows`` (batch,), the caller's index of each active row."""
    generated = None
    for processor in logits_processor:
        if isinstance(processor, _RowIndexed) and rows is not None:
            processor.sync_rows(rows)
        if isinstance(processor, (RowMinLength, RowWidth)):
            generated = max_new_tokens - remaining if generated is None else generated  # (batch,)
            processor.sync(generated, width)
