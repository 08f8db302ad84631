"""Relaxed speculative decoding inside transformers' ``generate``.

``model.generate(input_ids, assistant_model=draft, diversed_head=head)`` (or ``verifier=...``) runs
the loop below through transformers' ``custom_generate`` hook, so generation config, special tokens,
attention mask, length limits, logits processors and stopping criteria are prepared exactly as for
any other ``generate`` call. Without ``diversed_head`` / ``verifier`` the call goes to transformers
unchanged.

Batched layout (``B`` rows, one round drafts ``N`` tokens)
------------------------------------------------------------
Every row is kept **left-padded and right-aligned**: ``seq`` is ``(B, L)`` and each row's real
tokens end at column ``L - 1``; ``mask`` ``(B, L)`` marks real tokens, and position ids are
``cumsum(mask) - 1``. The target cache holds columns ``[0, L - 1)`` (all but the last token) and the
draft cache ``[0, L - 2)`` (all but the last two), so a round is:

1. draft: feed ``seq[:, -2:]`` then each sampled token: ``N`` calls, ``q_1..q_N`` and ``h^q_1..h^q_N``;
2. target: feed ``[seq[:, -1], x_1..x_N]`` (``B, N + 1``) once: ``p_1..p_{N+1}`` and ``h^p``;
3. verify: row ``b`` keeps ``n_b`` drafts and one recovered/bonus token;
4. realign: with ``A = max_b n_b`` the new length is ``L + A + 1``; caches are cropped to
   ``L + A`` (target) and ``L + A - 1`` (draft) columns and row ``b`` is rolled right by
   ``A - n_b``; what wraps around is the row's rejected tail, now on masked columns. Columns
   that are padding in every row are dropped, so ``L`` stays the longest row's length.

The draft cache lags by two tokens so it never needs a catch-up pass, whatever a row accepted.
Finished rows (EOS, length, stopping criteria) leave the batch and cost nothing after. Sliding
windows stay exact because every row is hole-free and the mask is built from column indices.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, GenerationMixin

from . import compat, ops
from .head import DiversedHead
from .pairs import _text_vocab_size, check_head_matches, shared_vocab_size  # noqa: F401 - re-exported
from .outputs import DiversedGenerateDecoderOnlyOutput, SpeculationStats
from .verifiers import HeadVerifier, Verifier

logger = logging.getLogger(__name__)

_OUR_KWARGS = ("diversed_head", "verifier", "output_target_weights", "generator")
# generation-config flags our loop cannot honour, with the value that disables them
_UNSUPPORTED_CONFIG = {
    "num_beams": 1,
    "num_beam_groups": 1,
    "penalty_alpha": None,
    "constraints": None,
    "force_words_ids": None,
    "prompt_lookup_num_tokens": None,
    "assistant_early_exit": None,
    "assistant_ensemble_weight": None,
    "output_scores": False,
    "output_logits": False,
    "output_attentions": False,
    "output_hidden_states": False,
    "use_mtp": None,
}


@dataclass
class _RunState:
    """Per-call buffers indexed by original batch row."""

    tokens: torch.Tensor  # (batch, max_new_tokens) emitted tokens, pad after the end
    num_generated: torch.Tensor  # (batch,)
    target_weights: torch.Tensor | None  # (batch, max_new_tokens) w per emitted token, NaN for bonus
    num_rounds: torch.Tensor  # (batch,)
    num_drafted: torch.Tensor  # (batch,)
    num_accepted: torch.Tensor  # (batch,)
    drafted_per_position: torch.Tensor  # (batch, N)
    accepted_per_position: torch.Tensor  # (batch, N)
    acceptance_probs: list  # per round: (rows (active,), beta (active, N_r), a_t(x_t) (active, N_r))


def _next_token_probs(logits_processor, prefix, raw_logits, vocab_size):
    """Processed and temperature-1 distributions of one position: (batch, vocab) each."""
    raw = raw_logits[:, :vocab_size].float()  # (batch, vocab)
    scores = logits_processor(prefix, raw.clone()) if len(logits_processor) else raw  # (batch, vocab)
    return scores.softmax(dim=-1), raw.softmax(dim=-1)


@torch.no_grad()
def speculative_decode(
    target,
    draft,
    verifier: Verifier,
    input_ids: torch.Tensor,  # (batch, prompt_len), left-padded
    attention_mask: torch.Tensor | None,  # (batch, prompt_len)
    *,
    num_draft_tokens: int,
    max_new_tokens: int,
    logits_processor=(),
    stopping_criteria=(),
    eos_token_id: torch.Tensor | None = None,  # (num_eos,)
    pad_token_id: int = 0,
    do_sample: bool = True,
    generator: torch.Generator | None = None,
    streamer=None,
    output_target_weights: bool = False,
    vocab_size: int | None = None,
) -> tuple[torch.Tensor, SpeculationStats]:  # (batch, num_new_tokens), stats
    """Draft ``num_draft_tokens`` per round, verify with ``verifier``; returns new tokens (pad after end) and stats."""
    device = input_ids.device
    batch_size, prompt_len = input_ids.shape
    vocab_size = vocab_size or min(_text_vocab_size(target), _text_vocab_size(draft))
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    needs_hidden = verifier.requires_hidden_states
    needs_untempered = verifier.requires_untempered_probs
    num_draft = num_draft_tokens

    # One extra padding column in front: the draft always has two tokens to feed.
    pad_column = torch.full((batch_size, 1), pad_token_id, dtype=input_ids.dtype, device=device)
    seq = torch.cat([pad_column, input_ids], dim=1)  # (B, L)
    mask = torch.cat([torch.zeros_like(pad_column), attention_mask.to(input_ids.dtype)], dim=1)  # (B, L)

    state = _RunState(
        tokens=torch.full((batch_size, max_new_tokens), pad_token_id, dtype=input_ids.dtype, device=device),
        num_generated=torch.zeros(batch_size, dtype=torch.long, device=device),
        target_weights=(
            torch.full((batch_size, max_new_tokens), float("nan"), device=device) if output_target_weights else None
        ),
        num_rounds=torch.zeros(batch_size, dtype=torch.long, device=device),
        num_drafted=torch.zeros(batch_size, dtype=torch.long, device=device),
        num_accepted=torch.zeros(batch_size, dtype=torch.long, device=device),
        drafted_per_position=torch.zeros(batch_size, num_draft, dtype=torch.long, device=device),
        accepted_per_position=torch.zeros(batch_size, num_draft, dtype=torch.long, device=device),
        acceptance_probs=[],
    )
    active = torch.arange(batch_size, device=device)  # (B,) original row of each active row
    remaining = torch.full((batch_size,), max_new_tokens, dtype=torch.long, device=device)  # (B,)
    if max_new_tokens <= 0:
        return state.tokens[:, :0], _stats(state, num_draft)

    # Prefill: target caches all but the last token, draft all but the last two.
    target_cache, draft_cache = compat.new_cache(), compat.new_cache()
    length = seq.shape[1]
    compat.forward_with_cache(target, seq[:, :-1], mask[:, :-1], target_cache, logits_to_keep=1, output_hidden_states=False)
    if length > 2:
        compat.forward_with_cache(draft, seq[:, :-2], mask[:, :-2], draft_cache, logits_to_keep=1, output_hidden_states=False)

    arange_cache = {}
    while active.numel() > 0:
        rows_now = active.numel()
        length = seq.shape[1]
        # Row b drafts N_b = min(N, remaining_b - 1) tokens, exactly as it would alone; the batch drafts
        # N_r = max_b N_b and each row verifies only its own N_b.
        draft_lengths = (remaining - 1).clamp(min=0, max=num_draft)  # (B,)
        num_round_drafts = int(draft_lengths.max())  # N_r

        # 1. Draft N_r tokens.
        ext_seq, ext_mask = seq, mask  # grow to (B, L + N_r)
        draft_ids, draft_probs, draft_hidden, draft_untempered = [], [], [], []
        chunk = seq[:, -2:]  # (B, 2)
        for _ in range(num_round_drafts):
            out = compat.forward_with_cache(
                draft, chunk, ext_mask, draft_cache, logits_to_keep=1, output_hidden_states=needs_hidden
            )
            probs, untempered = _next_token_probs(logits_processor, ext_seq, out.logits[:, -1], vocab_size)  # (B, V)
            token = ops.sample(probs, generator) if do_sample else probs.argmax(dim=-1)  # (B,)
            draft_ids.append(token)
            draft_probs.append(probs)
            if needs_untempered:
                draft_untempered.append(untempered)
            if needs_hidden:
                draft_hidden.append(out.hidden_states[-1][:, -1])  # (B, d_draft)
            ext_seq = torch.cat([ext_seq, token[:, None]], dim=1)
            ext_mask = torch.cat([ext_mask, torch.ones_like(token[:, None])], dim=1)
            chunk = token[:, None]  # (B, 1)
        draft_ids = torch.stack(draft_ids, dim=1) if draft_ids else seq.new_zeros(rows_now, 0)  # (B, N_r)
        draft_probs = (
            torch.stack(draft_probs, dim=1) if draft_probs else torch.zeros(rows_now, 0, vocab_size, device=device)
        )  # (B, N_r, V)

        # 2. One target pass over [last token, x_1..x_N_r].
        out = compat.forward_with_cache(
            target,
            ext_seq[:, -(num_round_drafts + 1) :],
            ext_mask,
            target_cache,
            logits_to_keep=num_round_drafts + 1,
            output_hidden_states=needs_hidden,
        )
        target_probs, target_untempered = [], []
        for i in range(num_round_drafts + 1):
            probs, untempered = _next_token_probs(logits_processor, ext_seq[:, : length + i], out.logits[:, i], vocab_size)
            target_probs.append(probs)
            target_untempered.append(untempered)
        target_probs = torch.stack(target_probs, dim=1)  # (B, N_r + 1, V)

        # 3. Verify.
        result = verifier(
            draft_ids,
            draft_probs,
            target_probs,
            draft_hidden=torch.stack(draft_hidden, dim=1) if needs_hidden and draft_hidden else None,  # (B, N_r, d)
            target_hidden=out.hidden_states[-1] if needs_hidden else None,  # (B, N_r + 1, d_target)
            untempered_draft_probs=torch.stack(draft_untempered, dim=1) if needs_untempered and draft_untempered else None,
            untempered_target_probs=torch.stack(target_untempered, dim=1) if needs_untempered else None,
            draft_lengths=draft_lengths,
            do_sample=do_sample,
            generator=generator,
        )
        num_accepted = result.num_accepted  # (B,)
        width = num_round_drafts + 1
        if width not in arange_cache:
            arange_cache[width] = torch.arange(width, device=device)
        columns = arange_cache[width]  # (N_r + 1,)
        emitted = torch.cat([draft_ids, draft_ids.new_zeros(rows_now, 1)], dim=1)  # (B, N_r + 1)
        emitted.scatter_(1, num_accepted[:, None], result.next_tokens[:, None])

        # 4. Truncate at the length budget, EOS and stopping criteria.
        count = torch.minimum(num_accepted + 1, remaining)  # (B,)
        finished = count >= remaining  # (B,)
        if eos_token_id is not None:
            is_eos = torch.isin(emitted, eos_token_id) & (columns < count[:, None])  # (B, N_r + 1)
            has_eos = is_eos.any(dim=1)
            first_eos = torch.where(has_eos, is_eos.long().argmax(dim=1), count - 1)  # (B,)
            count = torch.where(has_eos, first_eos + 1, count)
            finished |= has_eos
        if len(stopping_criteria):
            stopped = torch.zeros_like(finished)
            for j in range(1, int(count.max()) + 1):
                candidate = torch.cat([seq, emitted[:, :j]], dim=1)  # (B, L + j)
                hit = stopping_criteria(candidate, None).to(device) & (j <= count) & ~stopped  # (B,)
                count = torch.where(hit, torch.full_like(count, j), count)
                stopped |= hit
            finished |= stopped

        # Record outputs and statistics.
        keep = columns < count[:, None]  # (B, N_r + 1)
        out_columns = state.num_generated[active][:, None] + columns  # (B, N_r + 1)
        out_rows = active[:, None].expand_as(out_columns)
        state.tokens[out_rows[keep], out_columns[keep]] = emitted[keep]
        if state.target_weights is not None and result.target_weight is not None:
            weights = torch.cat(
                [result.target_weight.float(), torch.full((rows_now, 1), float("nan"), device=device)], dim=1
            )  # (B, N_r + 1)
            weights[columns >= draft_lengths[:, None]] = float("nan")  # bonus positions have no w
            state.target_weights[out_rows[keep], out_columns[keep]] = weights[keep]
        state.num_generated[active] += count
        state.num_rounds[active] += 1
        state.num_drafted[active] += draft_lengths
        state.num_accepted[active] += num_accepted
        state.drafted_per_position[active, :num_round_drafts] += (columns[:num_round_drafts] < draft_lengths[:, None]).long()
        state.accepted_per_position[active, :num_round_drafts] += (columns[:num_round_drafts] < num_accepted[:, None]).long()
        not_drafted = columns[:num_round_drafts] >= draft_lengths[:, None]  # (B, N_r)
        betas = result.acceptance_probs.float().masked_fill(not_drafted, float("nan"))
        drafted_acceptance = result.drafted_acceptance
        if drafted_acceptance is None:
            drafted_acceptance = torch.full_like(betas, float("nan"))
        state.acceptance_probs.append((active.clone(), betas, drafted_acceptance.float().masked_fill(not_drafted, float("nan"))))
        if streamer is not None:
            streamer.put(emitted[:, : int(count[0])].cpu())
        remaining = remaining - count

        # 5. Drop finished rows, then realign the rest.
        if finished.all():
            break
        if finished.any():
            kept = (~finished).nonzero().squeeze(1)  # (kept,)
            active, remaining, num_accepted = active[kept], remaining[kept], num_accepted[kept]
            emitted, ext_seq, ext_mask = emitted[kept], ext_seq[kept], ext_mask[kept]
            compat.select_rows(target_cache, kept)
            compat.select_rows(draft_cache, kept)
        longest = int(num_accepted.max())  # A
        shifts = longest - num_accepted  # (B,)
        new_length = length + longest + 1
        seq = torch.cat([ext_seq, emitted[:, -1:]], dim=1)  # (B, L + N_r + 1), last column overwritten below
        seq.scatter_(1, (length + num_accepted)[:, None], emitted.gather(1, num_accepted[:, None]))
        seq = seq[:, :new_length]
        mask = torch.cat([ext_mask, torch.ones_like(ext_mask[:, :1])], dim=1)[:, :new_length]
        compat.crop_cache(target_cache, new_length - 1)
        compat.crop_cache(draft_cache, new_length - 2)
        if bool((shifts > 0).any()):
            index = (torch.arange(new_length, device=device) - shifts[:, None]) % new_length  # (B, L')
            seq = seq.gather(1, index)
            mask = mask.gather(1, index) * (torch.arange(new_length, device=device) >= shifts[:, None]).to(mask.dtype)
            compat.shift_rows_right(target_cache, shifts)
            compat.shift_rows_right(draft_cache, shifts)
        leading = int((mask.sum(dim=0) > 0).long().argmax())  # columns that are padding in every row
        leading = min(leading, seq.shape[1] - 2)
        if leading > 0:
            seq, mask = seq[:, leading:], mask[:, leading:]
            compat.drop_leading_positions(target_cache, leading)
            compat.drop_leading_positions(draft_cache, leading)

    if streamer is not None:
        streamer.end()
    num_new = int(state.num_generated.max()) if batch_size else 0
    return state.tokens[:, :num_new], _stats(state, num_draft)


def _stats(state: _RunState, num_draft: int) -> SpeculationStats:
    batch_size = state.num_rounds.numel()
    per_row = [[] for _ in range(batch_size)]
    per_row_drafted = [[] for _ in range(batch_size)]
    for rows, betas, drafted in state.acceptance_probs:  # (active, N_r) each
        padded = torch.full((2, rows.numel(), num_draft), float("nan"))
        padded[0, :, : betas.shape[1]] = betas.cpu()
        padded[1, :, : drafted.shape[1]] = drafted.cpu()
        for i, row in enumerate(rows.tolist()):
            per_row[row].append(padded[0, i])
            per_row_drafted[row].append(padded[1, i])
    acceptance_probs = [torch.stack(r) if r else torch.zeros(0, num_draft) for r in per_row]
    drafted_acceptance_probs = [torch.stack(r) if r else torch.zeros(0, num_draft) for r in per_row_drafted]
    target_weights = None
    if state.target_weights is not None:
        target_weights = [state.target_weights[b, : int(state.num_generated[b])].cpu() for b in range(batch_size)]
    return SpeculationStats(
        num_draft_tokens=num_draft,
        num_rounds=state.num_rounds.cpu(),
        num_drafted=state.num_drafted.cpu(),
        num_accepted=state.num_accepted.cpu(),
        num_generated=state.num_generated.cpu(),
        drafted_per_position=state.drafted_per_position.cpu(),
        accepted_per_position=state.accepted_per_position.cpu(),
        acceptance_probs=acceptance_probs,
        target_weights=target_weights,
        drafted_acceptance_probs=drafted_acceptance_probs,
    )


def _check_generation_config(generation_config: GenerationConfig) -> None:
    for name, neutral in _UNSUPPORTED_CONFIG.items():
        value = getattr(generation_config, name, neutral)
        if value is not None and value != neutral and not (neutral is None and value is False):
            raise ValueError(
                f"`{name}={value!r}` cannot be combined with `diversed_head`/`verifier`: relaxed speculative decoding "
                f"runs one greedy or sampled sequence per row. Remove `{name}` (or set it to {neutral!r})."
            )
    if generation_config.num_return_sequences not in (None, 1):
        raise ValueError(
            f"`num_return_sequences={generation_config.num_return_sequences}` cannot be combined with `diversed_head`/"
            "`verifier`. Repeat the prompt in the batch instead: `input_ids.repeat_interleave(k, dim=0)`."
        )


class DiversedGenerationMixin:
    """Adds ``diversed_head=`` and ``verifier=`` to ``generate``; put it before the model class::

        class MyLlama(DiversedGenerationMixin, LlamaForCausalLM): ...

    or call :func:`enable_diversed` on a loaded model.

    Extra ``generate`` arguments (all keyword-only; used only with a head or verifier):

    - ``diversed_head`` (:class:`DiversedHead`): DIVERSED verification, ``w_t`` from the head.
    - ``verifier`` (:class:`~diversed_hf.verifiers.Verifier`): any verification method.
    - ``num_assistant_tokens`` (int): drafts per round ``N`` (default: the assistant's
      ``generation_config.num_assistant_tokens``); the schedule is always constant.
    - ``output_target_weights`` (bool): record the ``w`` used at each emitted token.
    - ``generator`` (``torch.Generator``): random source for drafting and verification.

    With ``return_dict_in_generate=True`` the output has ``speculation`` (:class:`SpeculationStats`).
    """

    def generate(self, *args, **kwargs):
        diversed_head = kwargs.pop("diversed_head", None)
        verifier = kwargs.pop("verifier", None)
        output_target_weights = kwargs.pop("output_target_weights", None)
        generator = kwargs.pop("generator", None)
        if diversed_head is None and verifier is None:
            for name, value in (("output_target_weights", output_target_weights), ("generator", generator)):
                if value is not None:
                    raise ValueError(
                        f"`{name}` only applies to relaxed speculative decoding: pass `assistant_model=draft` and "
                        "`diversed_head=head` or `verifier=...` as well, or remove it."
                    )
            return super().generate(*args, **kwargs)
        return self._diversed_generate(
            args, kwargs, diversed_head, verifier, bool(output_target_weights), generator
        )

    def _diversed_generate(self, args, kwargs, diversed_head, verifier, output_target_weights, generator):
        bound = inspect.signature(GenerationMixin.generate).bind(self, *args, **kwargs)
        arguments = dict(bound.arguments)
        arguments.pop("self")
        extra = arguments.pop("kwargs", {})
        assistant_model = arguments.pop("assistant_model", None)
        if assistant_model is None:
            which = "diversed_head" if diversed_head is not None else "verifier"
            raise ValueError(
                f"`{which}` needs a draft model: call `model.generate(..., assistant_model=draft, {which}=...)`."
            )
        if diversed_head is not None and verifier is not None:
            raise ValueError(
                "Pass either `diversed_head` or `verifier`, not both: `diversed_head=head` is shorthand for "
                "`verifier=HeadVerifier(head)`."
            )
        if arguments.get("custom_generate") is not None:
            raise ValueError("`custom_generate` cannot be combined with `diversed_head`/`verifier`; remove one of them.")
        if diversed_head is not None:
            if not isinstance(diversed_head, DiversedHead):
                raise TypeError(f"`diversed_head` must be a DiversedHead, got {type(diversed_head).__name__}.")
            verifier = HeadVerifier(diversed_head)
        if not isinstance(verifier, Verifier):
            raise TypeError(
                f"`verifier` must be a diversed_hf.verifiers.Verifier (e.g. ExactVerifier()), got {type(verifier).__name__}."
            )
        if isinstance(verifier, HeadVerifier):
            check_head_matches(verifier.head, self, assistant_model)
        vocab_size = shared_vocab_size(
            self, assistant_model, extra.pop("tokenizer", None), extra.pop("assistant_tokenizer", None)
        )
        num_draft_tokens = extra.pop("num_assistant_tokens", None)
        generation_config = arguments.get("generation_config")
        if num_draft_tokens is None and generation_config is not None:
            num_draft_tokens = generation_config.num_assistant_tokens
        if num_draft_tokens is None:
            num_draft_tokens = assistant_model.generation_config.num_assistant_tokens or 20
        if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) or num_draft_tokens < 1:
            raise ValueError(f"`num_assistant_tokens` must be a positive integer, got {num_draft_tokens!r}.")
        streamer = arguments.pop("streamer", None)

        def decode(model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs):
            _check_generation_config(generation_config)
            if streamer is not None and input_ids.shape[0] > 1:
                raise ValueError(f"`streamer` supports batch size 1 only; got a batch of {input_ids.shape[0]} prompts.")
            pad = generation_config._pad_token_tensor
            eos = generation_config._eos_token_tensor
            pad_token_id = int(pad) if pad is not None else (int(eos.flatten()[0]) if eos is not None else 0)
            new_tokens, stats = speculative_decode(
                model,
                assistant_model,
                verifier,
                input_ids,
                model_kwargs.get("attention_mask"),
                num_draft_tokens=num_draft_tokens,
                max_new_tokens=generation_config.max_length - input_ids.shape[1],
                logits_processor=logits_processor,
                stopping_criteria=compat.split_stopping_criteria(stopping_criteria),
                eos_token_id=None if eos is None else eos.flatten().to(input_ids.device),
                pad_token_id=pad_token_id,
                do_sample=bool(generation_config.do_sample),
                generator=generator,
                streamer=streamer,
                output_target_weights=output_target_weights,
                vocab_size=vocab_size,
            )
            sequences = torch.cat([input_ids, new_tokens], dim=1)
            if generation_config.return_dict_in_generate:
                return DiversedGenerateDecoderOnlyOutput(sequences=sequences, speculation=stats)
            return sequences

        # transformers' assisted path puts the prompt on the streamer; so do we.
        return super().generate(
            **arguments, assistant_model=assistant_model, streamer=streamer, custom_generate=decode, **extra
        )


_ENABLED_CLASSES: dict[type, type] = {}


def enable_diversed(model):
    """Add :class:`DiversedGenerationMixin` to a loaded model, in place; returns the same object.

    The new class keeps the original's name and module, so ``save_pretrained`` records the original
    architecture; calling this twice is a no-op.
    """
    if isinstance(model, DiversedGenerationMixin):
        return model
    if not isinstance(model, GenerationMixin):
        raise TypeError(f"`model` must be a transformers model with `generate`, got {type(model).__name__}.")
    cls = type(model)
    if cls not in _ENABLED_CLASSES:
        _ENABLED_CLASSES[cls] = type(
            cls.__name__, (DiversedGenerationMixin, cls), {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
        )
    model.__class__ = _ENABLED_CLASSES[cls]
    return model
