"""Drafting as a transformers :class:`~transformers.generation.candidate_generator.CandidateGenerator`.

:class:`DiversedCandidateGenerator` is the draft side of the batched loop in :mod:`diversed_hf.generation`
(read its module docstring for the left-padded, right-aligned layout). Every round the loop calls

1. :meth:`~DiversedCandidateGenerator.get_candidates` with its sequence ``(batch, L)``: the draft model
   proposes ``N_r`` tokens per row and the generator keeps what verification needs (draft probabilities,
   last-layer hidden states, temperature-1 probabilities);
2. :meth:`~DiversedCandidateGenerator.update_candidate_strategy` after verification, with the per-row
   number of accepted drafts: the draft cache is cropped and realigned like the sequence, finished rows
   leave, and the draft-length policy picks each row's draft length for the next round.

As in transformers, ``get_candidates`` returns ``(candidate_ids, candidate_logits)``: the input sequence
extended by the drafts ``(batch, L + N_r)`` and the draft's processed scores ``(batch, N_r, vocab)``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from transformers.generation.candidate_generator import CandidateGenerator

from . import compat, ops
from .checks import check_finite_mass, is_integer, is_real
from .pairs import draft_input_ids
from .policies import (  # noqa: F401 - re-exported
    OPTIMAL_WARMUP,
    DraftCosts,
    LinearVerifyCost,
    OptimalSchedule,
    check_draft_costs,
    clear_draft_statistics,
    measured_draft_costs,
)

logger = logging.getLogger(__name__)

__all__ = [
    "DiversedCandidateGenerator",
    "DraftCosts",
    "LinearVerifyCost",
    "Realignment",
    "clear_draft_statistics",
    "measured_draft_costs",
    "next_token_scores",
]


def next_token_scores(
    logits_processor,
    prefix: torch.Tensor,  # (batch, prefix_len)
    raw_logits: torch.Tensor,  # (batch, model_vocab)
    vocab_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:  # (batch, vocab) processed scores, (batch, vocab) raw float logits
    """Processed scores of one position (logits processors applied to the shared-vocabulary logits), and
    the raw logits they came from (``softmax(raw)`` is the temperature-1 distribution)."""
    raw = ops.fit_vocabulary(raw_logits, vocab_size).float()  # (batch, vocab)
    scores = logits_processor(prefix, raw.clone()) if len(logits_processor) else raw  # (batch, vocab)
    return scores, raw


SCHEDULES = ("constant", "heuristic", "heuristic_transient", "optimal")


def check_draft_length_policy(schedule: str, confidence_threshold: float | None) -> None:
    """transformers' draft-length knobs, checked: a known schedule, a threshold in [0, 1) or None."""
    if schedule not in SCHEDULES:
        raise ValueError(
            f"`num_assistant_tokens_schedule` must be one of {SCHEDULES}, got {schedule!r}. (Set it on the assistant's "
            "`generation_config` or pass it to `generate`.)"
        )
    if confidence_threshold is not None:
        if not is_real(confidence_threshold):
            raise TypeError(
                f"`assistant_confidence_threshold` must be a number in [0, 1) or None, got {type(confidence_threshold).__name__} "
                f"{confidence_threshold!r}."
            )
        if not 0 <= confidence_threshold < 1:
            raise ValueError(
                f"`assistant_confidence_threshold` must be in [0, 1) (0 or None: off), got {confidence_threshold!r}: a "
                "threshold of 1 would stop every round after one draft."
            )


@dataclass(frozen=True)
class Realignment:
    """How one round moves the rows of the batched layout (:mod:`diversed_hf.generation`, step 4).

    With ``A = max_b n_b`` accepted drafts the sequence grows from ``L`` to ``new_length = L + A + 1``
    columns; row ``b`` rolls right by ``shifts[b] = A - n_b``; then ``leading`` columns that are padding
    in every row are dropped. A model whose cache lags ``lag`` tokens behind the sequence keeps
    ``new_length - lag`` columns before the shift.
    """

    kept: torch.Tensor | None  # (kept,) rows (of this round's batch) that continue; None when all do
    shifts: torch.Tensor | None  # (kept,) A - n_b; None when every row accepted A drafts
    new_length: int  # L + A + 1
    leading: int  # all-padding columns dropped after the shift


class DiversedCandidateGenerator(CandidateGenerator):
    """Drafts ``N_b`` tokens per row with ``assistant_model`` on a left-padded, right-aligned batch.

    Between rounds the draft cache holds every column of the sequence but the last two (so it never
    needs a catch-up pass): a round feeds what the cache lacks (the whole prompt in the first round,
    then ``seq[:, -2:]``) and then each drafted token, ``N_r = max_b N_b`` calls.

    After :meth:`get_candidates`, the object holds for that round:

    - ``draft_probs`` ``(batch, N_r, vocab)``: ``q_t = softmax(processed scores)``;
    - ``draft_hidden`` ``(batch, N_r, d_draft)``: the draft's last-layer hidden state that produced
      ``q_t`` (when ``output_hidden_states``; else ``None``);
    - ``untempered_draft_probs`` ``(batch, N_r, vocab)``: ``softmax(raw logits)`` (when
      ``output_untempered_probs``; else ``None``);
    - ``draft_lengths`` ``(batch,)``: drafts that count per row (``N_b <= N_r``);
    - ``candidate_attention_mask`` ``(batch, L + N_r)``: the mask of ``candidate_ids``.

    Args:
        assistant_model: the draft model (shares the target's tokenizer).
        num_assistant_tokens: drafts per round ``N``.
        vocab_size: the target's vocabulary size: the draft's logits are fitted to it
            (:func:`diversed_hf.ops.fit_vocabulary`).
        logits_processor: transformers' prepared logits processors (same as the target's).
        do_sample: sample the drafts (else greedy).
        generator: random source for sampling.
        output_hidden_states: keep ``draft_hidden`` (the verifier reads hidden states).
        output_untempered_probs: keep ``untempered_draft_probs``.
        schedule: transformers' ``num_assistant_tokens_schedule``, per row: ``"constant"``;
            ``"heuristic"`` (+2 after a round in which the row accepted every draft, -1 otherwise, never
            below 1; the value is written back to the assistant's ``generation_config`` at the end of the
            call, the mean over rows in a batch); ``"heuristic_transient"`` (the same, not written back).
            ``"optimal"`` (this project's, not transformers'): the most expected tokens per second. Once the pair
            and setting have statistics, a row drafts again only while the next draft is worth its cost at the
            pair's rate, judged from the draft's confidence in the tokens it drew (acceptance calibrated per
            confidence bin on earlier rounds); until then each round each row drafts the ``n`` in ``1..N``
            maximising ``E[T_n] / (n c + c_verify(n))`` from its per-position estimates. Costs are
            ``assistant_costs`` or measured on the pair (cached across calls; only a call that finds none warms
            up, :data:`OPTIMAL_WARMUP`). Details: :mod:`diversed_hf.policies`.
        confidence_threshold: transformers' ``assistant_confidence_threshold``: a row stops drafting
            after a token whose draft probability is below it (that token is still verified); ``None``
            or 0 turns it off. The batch drafts while any row does.
        costs: ``"optimal"`` only: :class:`~diversed_hf.policies.DraftCosts` to use instead of measured ones.
        target: ``"optimal"`` only: the target model, the other half of the key of the cross-call statistics.
        setting: ``"optimal"`` only: the rest of the acceptance prior's key
            (:func:`~diversed_hf.policies.acceptance_setting`).
    """

    def __init__(
        self,
        assistant_model,
        *,
        num_assistant_tokens: int,
        vocab_size: int,
        logits_processor=(),
        do_sample: bool = True,
        generator: torch.Generator | None = None,
        output_hidden_states: bool = False,
        output_untempered_probs: bool = False,
        schedule: str = "constant",
        confidence_threshold: float | None = None,
        costs: DraftCosts | None = None,
        target=None,
        setting=None,
    ):
        if not is_integer(num_assistant_tokens) or num_assistant_tokens < 1:
            raise ValueError(f"`num_assistant_tokens` must be a positive integer, got {num_assistant_tokens!r}.")
        num_assistant_tokens = int(num_assistant_tokens)  # a numpy integer too
        check_draft_length_policy(schedule, confidence_threshold)
        confidence_threshold = None if confidence_threshold is None else float(confidence_threshold)
        check_draft_costs(costs, schedule)
        self.schedule = schedule
        self.confidence_threshold = confidence_threshold or None
        self.row_num_tokens: torch.Tensor | None = None  # (batch,) each row's current schedule value
        self.optimal = (  # "optimal": per-row estimates, costs, the cross-call statistics
            OptimalSchedule(assistant_model, num_assistant_tokens, target=target, setting=setting, costs=costs)
            if schedule == "optimal" else None
        )
        self._finished_num_tokens: list[torch.Tensor] = []  # schedule values of rows that left the batch
        self.draft_model = assistant_model
        self.num_draft_tokens = num_assistant_tokens  # N
        self.vocab_size = vocab_size
        self.logits_processor = logits_processor
        self.do_sample = do_sample
        self.generator = generator
        self.output_hidden_states = output_hidden_states
        self.output_untempered_probs = output_untempered_probs
        self.cache = compat.new_cache()
        self.draft_lengths: torch.Tensor | None = None  # (batch,)
        self.draft_probs: torch.Tensor | None = None  # (batch, N_r, vocab)
        self.draft_hidden: torch.Tensor | None = None  # (batch, N_r, d_draft)
        self.untempered_draft_probs: torch.Tensor | None = None  # (batch, N_r, vocab)
        self.candidate_attention_mask: torch.Tensor | None = None  # (batch, L + N_r)

    # Batched layout -----------------------------------------------------------------------------
    def prefill(
        self,
        input_ids: torch.Tensor,  # (batch, L) left-padded, right-aligned
        attention_mask: torch.Tensor,  # (batch, L)
        remaining: torch.Tensor,  # (batch,) tokens each row may still emit
    ) -> None:
        """Start a generation: an empty cache (the first :meth:`get_candidates` feeds the whole prompt with its
        first draft step, as transformers does) and the first round's draft lengths."""
        self.cache = compat.new_cache()
        self.row_num_tokens = torch.full_like(remaining, self.num_draft_tokens)  # (batch,)
        self._finished_num_tokens = []
        if self.optimal is not None:
            first = self.optimal.start(remaining.shape[0], remaining.device)  # (batch,) or None
            if first is not None:
                self.row_num_tokens = first.to(remaining.dtype)
        self.draft_lengths = self.plan_draft_lengths(remaining)

    def plan_draft_lengths(
        self,
        remaining: torch.Tensor,  # (batch,)
    ) -> torch.Tensor:  # (batch,)
        """The draft-length policy: ``N_b = min(n_b, remaining_b - 1)`` with ``n_b`` the row's schedule value.

        Row ``b`` drafts exactly what it would alone (the round's bonus/recovered token uses the last
        slot of its budget); the confidence threshold may stop it earlier (:meth:`get_candidates`).
        """
        return torch.minimum(self.row_num_tokens, remaining - 1).clamp(min=0)

    # CandidateGenerator -------------------------------------------------------------------------
    def get_candidates(
        self,
        input_ids: torch.Tensor,  # (batch, L) our left-padded sequence
        attention_mask: torch.Tensor | None = None,  # (batch, L)
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (batch, L + N_r), (batch, N_r, vocab)
        """Draft ``N_r = max_b N_b`` tokens per row; returns ``(candidate_ids, candidate_logits)``.

        ``candidate_ids`` is ``input_ids`` followed by the drafts and ``candidate_logits`` the draft's
        processed scores; row ``b`` counts only its first ``draft_lengths[b]`` drafts.
        """
        if self.draft_lengths is None:
            raise ValueError("Call `prefill(input_ids, attention_mask, remaining)` before `get_candidates`.")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        batch_size = input_ids.shape[0]
        num_round_drafts = int(self.draft_lengths.max()) if batch_size else 0  # N_r
        candidate_ids, candidate_mask = input_ids, attention_mask  # grow to (batch, L + N_r)
        scores, probs, hidden, untempered = [], [], [], []
        # What the cache lacks: the whole prompt in the first round, then the last two columns.
        chunk = input_ids[:, self.cache.get_seq_length() :]  # (batch, L - cached)
        lengths = self.draft_lengths.clone()  # (batch,) shortened by the confidence threshold or the stopping rule
        rule = None if self.optimal is None else self.optimal.rule  # "optimal": stops rows within the round
        # one row without a threshold: the rule on Python floats (no tensor operations per draft step)
        scalar_rule = rule is not None and batch_size == 1 and self.confidence_threshold is None
        row_length = int(lengths[0]) if scalar_rule else 0
        reach = 1.0 if scalar_rule else torch.ones(batch_size, device=input_ids.device)  # the rule's P(all pass)
        for step in range(num_round_drafts):
            out = compat.forward_with_cache(
                self.draft_model, draft_input_ids(self.draft_model, chunk, self.vocab_size), candidate_mask, self.cache,
                logits_to_keep=1, output_hidden_states=self.output_hidden_states,
            )
            step_scores, raw = next_token_scores(self.logits_processor, candidate_ids, out.logits[:, -1], self.vocab_size)
            step_probs = step_scores.softmax(dim=-1)  # (batch, vocab)
            check_finite_mass(step_probs, "draft", first_position=len(probs))
            # (batch,); the mass was checked just above
            token = ops.sample(step_probs, self.generator, check=False) if self.do_sample else step_probs.argmax(dim=-1)
            scores.append(step_scores)
            probs.append(step_probs)
            if self.output_untempered_probs:  # without logits processors the scores are the raw logits
                untempered.append(raw.softmax(dim=-1) if len(self.logits_processor) else step_probs)
            if self.output_hidden_states:
                hidden.append(out.hidden_states[-1][:, -1])  # (batch, d_draft)
            candidate_ids = torch.cat([candidate_ids, token[:, None]], dim=1)
            candidate_mask = torch.cat([candidate_mask, torch.ones_like(token[:, None])], dim=1)
            chunk = token[:, None]  # (batch, 1)
            if scalar_rule:
                reach = rule.update_reach_scalar(reach, float(step_probs[0, token[0]]))
                if step + 1 < row_length and not rule.keep_drafting_scalar(reach, step):
                    lengths = torch.full_like(lengths, step + 1)
                    break
            elif self.confidence_threshold is not None or rule is not None:
                confidence = step_probs.gather(1, token[:, None]).squeeze(1)  # (batch,) q_t(x_t)
                unsure = torch.zeros_like(confidence, dtype=torch.bool)  # (batch,)
                if self.confidence_threshold is not None:
                    unsure |= confidence < self.confidence_threshold
                drafting = lengths > step + 1  # (batch,) rows whose length goes further
                if rule is not None:  # the batch decides: the step is computed for every row, so all or none go on
                    reach = rule.update_reach(reach, confidence)
                    unsure |= ~rule.keep_drafting_batch(reach, drafting, step)
                unsure &= drafting
                lengths = torch.where(unsure, torch.full_like(lengths, step + 1), lengths)
                if not bool((lengths > step + 1).any()):  # no row drafts further
                    break
        self.draft_lengths = lengths
        self.candidate_attention_mask = candidate_mask
        if num_round_drafts:
            candidate_logits = torch.stack(scores, dim=1)  # (batch, N_r, vocab)
            self.draft_probs = torch.stack(probs, dim=1)  # (batch, N_r, vocab)
        else:
            candidate_logits = torch.zeros(batch_size, 0, self.vocab_size, device=input_ids.device)
            self.draft_probs = candidate_logits
        self.draft_confidence = None  # (batch, N_r) q_t(x_t) of the drafts: what the "optimal" schedule calibrates on
        if self.optimal is not None and probs:
            drafted = candidate_ids[:, candidate_ids.shape[1] - len(probs) :, None]  # (batch, N_r, 1)
            self.draft_confidence = self.draft_probs.gather(2, drafted).squeeze(2)
        self.draft_hidden = torch.stack(hidden, dim=1) if hidden else None  # (batch, N_r, d_draft)
        self.untempered_draft_probs = torch.stack(untempered, dim=1) if untempered else None  # (batch, N_r, vocab)
        return candidate_ids, candidate_logits

    def update_candidate_strategy(
        self,
        input_ids: torch.Tensor,  # (kept, L') the realigned sequence
        scores: torch.Tensor | None,  # (batch, N_r + 1, vocab) the target's processed distributions
        num_matches: torch.Tensor | int,  # (batch,) accepted drafts per row; an int applies to every row
        *,
        realignment: Realignment | None = None,
        remaining: torch.Tensor | None = None,  # (kept,) tokens each continuing row may still emit
        position_acceptance: torch.Tensor | None = None,  # (batch, N_r) beta_t of the round ("optimal")
        drafted_acceptance: torch.Tensor | None = None,  # (batch, N_r) a_t(x_t) of the round ("optimal")
        seconds: tuple[float, float] | None = None,  # (drafting, rest of the round) time of the round ("optimal")
    ) -> None:
        """Bookkeeping after verification: realign the draft cache and plan the next draft lengths.

        ``scores`` and ``num_matches`` describe the round just verified, one row per row of its batch:
        in the batched loop ``num_matches`` is a per-row tensor ``(batch,)`` of accepted drafts ``n_b``
        (transformers passes one int for its single row). The loop turns them into ``realignment``
        (continuing rows, shifts ``A - n_b``, dropped leading columns), the same edit it applies to the
        target cache; the draft cache, which lags two tokens, keeps ``realignment.new_length - 2``
        columns before the shift. ``remaining`` (continuing rows) feeds :meth:`plan_draft_lengths`;
        without it the continuing rows keep their lengths. The constant policy reads neither
        ``scores`` nor ``num_matches``; an adaptive one would.
        """
        self.update_schedule(num_matches)
        if self.optimal is not None:
            if position_acceptance is None or drafted_acceptance is None:
                raise ValueError("the 'optimal' schedule needs the round's `position_acceptance` and `drafted_acceptance`.")
            self.optimal.observe(
                position_acceptance, drafted_acceptance, self.draft_lengths, seconds,
                confidence=self.draft_confidence, num_matches=num_matches,
            )
        kept = realignment.kept if realignment is not None else None
        if kept is not None:
            gone = torch.ones_like(self.row_num_tokens, dtype=torch.bool)  # (batch,)
            gone[kept] = False
            self._finished_num_tokens.append(self.row_num_tokens[gone])
            self.row_num_tokens = self.row_num_tokens[kept]
            if self.optimal is not None:
                self.optimal.drop(kept)
        if self.optimal is not None:
            chosen = self.optimal.lengths()  # (kept,) or None: keep the current lengths
            if chosen is not None:
                self.row_num_tokens = chosen.to(self.row_num_tokens.dtype)
        if realignment is not None:
            compat.realign_cache(
                self.cache, kept=kept, length=realignment.new_length - 2,
                shifts=realignment.shifts, leading=realignment.leading,
            )
        if remaining is not None:
            self.draft_lengths = self.plan_draft_lengths(remaining)
        elif kept is not None:
            self.draft_lengths = self.draft_lengths[kept]

    def update_schedule(
        self,
        num_matches: torch.Tensor | int,  # (batch,) accepted drafts of the round just verified
    ) -> None:
        """transformers' heuristic, per row: +2 after a round that kept every draft, else -1 (at least 1)."""
        if self.schedule not in ("heuristic", "heuristic_transient"):
            return
        all_kept = torch.as_tensor(num_matches, device=self.draft_lengths.device) >= self.draft_lengths  # (batch,)
        self.row_num_tokens = torch.where(all_kept, self.row_num_tokens + 2, (self.row_num_tokens - 1).clamp(min=1))

    def finish(
        self,
        num_matches: torch.Tensor | int,  # (batch,) accepted drafts of the last round
    ) -> None:
        """End of the call: the last round's schedule update and, for ``"heuristic"``, the value kept on the
        assistant's ``generation_config`` (transformers' semantics at batch 1; the mean over rows in a batch);
        ``"optimal"`` pools the call's acceptance into the pair's prior."""
        self.update_schedule(num_matches)
        if self.optimal is not None:
            self.optimal.finish()
        if self.schedule != "heuristic":
            return
        final = torch.cat([*self._finished_num_tokens, self.row_num_tokens]).double()  # (rows,)
        if final.numel():
            self.draft_model.generation_config.num_assistant_tokens = max(1, int(round(float(final.mean()))))
