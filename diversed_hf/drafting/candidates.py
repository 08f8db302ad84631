"""Drafting as a transformers :class:`~transformers.generation.candidate_generator.CandidateGenerator`.

:class:`DiversedCandidateGenerator` is the draft side of the batched loop in :mod:`diversed_hf.generation.loop` (read
its module docstring for the left-padded, right-aligned layout). It keeps transformers' contract, so transformers'
own ``_assisted_decoding`` can drive it too (at batch 1; ``tests/test_candidate_contract.py``):

1. it is built with the arguments transformers passes to ``AssistedCandidateGenerator`` (``input_ids,
   assistant_model, generation_config, model_kwargs, inputs_tensor, logits_processor``), plus keywords of its
   own with defaults; the first round needs nothing else (the cache starts empty and the first
   :meth:`~DiversedCandidateGenerator.get_candidates` feeds it the whole prompt);
2. :meth:`~DiversedCandidateGenerator.get_candidates` returns ``(candidate_ids, candidate_logits)``: the input
   sequence extended by the drafts ``(batch, L + N_r)`` and the draft's processed scores ``(batch, N_r, vocab)``
   (``q_t = softmax(candidate_logits[:, t])``). The returned pair is a :class:`DraftCandidates`, a 2-tuple that
   also carries what the batched loop's verifier reads besides (per-row draft lengths, the candidates' mask, the
   draft's hidden states and temperature-1 probabilities);
3. :meth:`~DiversedCandidateGenerator.update_candidate_strategy` ``(input_ids, scores, num_matches)`` after
   verification: the schedule learns from ``num_matches`` (accepted drafts, one int or one per row), each row's
   budget shrinks by the ``num_matches + 1`` tokens it emitted, and the draft cache is cropped to ``input_ids``
   (minus the two tokens it lags), as transformers' generator crops its own. The batched loop also passes
   ``realignment=`` (finished rows, per-row shifts) and, for the ``"optimal"`` schedule, the round's acceptance
   and timings.
"""

from __future__ import annotations

import logging

import torch
from transformers.generation.candidate_generator import CandidateGenerator

from .. import compat
from ..common import round_profile
from ..common.pairs import draft_input_ids, text_vocab_size
from ..common.realign import Realignment  # noqa: F401 - re-exported: the generators' argument
from ..verifiers import ops
from ..verifiers.checks import check_finite_mass_now_or_later
from .length.costs import DraftCosts
from .length.optimal import OptimalSchedule
from .length.policy import (  # noqa: F401 - re-exported: the generator's knobs
    DRAFT_LENGTH_DEFAULTS,
    SCHEDULES,
    DraftLengthPolicy,
    check_draft_length_policy,
)

logger = logging.getLogger(__name__)

__all__ = [
    "DRAFT_LENGTH_DEFAULTS",
    "DiversedCandidateGenerator",
    "DraftCandidates",
    "DraftLengthPolicy",
    "Realignment",
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


class DraftCandidates(tuple):
    """What :meth:`DiversedCandidateGenerator.get_candidates` returns: transformers' pair
    ``(candidate_ids, candidate_logits)`` (it unpacks like one), with what the batched loop reads besides.

    - ``candidate_ids`` ``(batch, L + N_r)``: the input sequence followed by ``N_r = max_b N_b`` drafts;
    - ``candidate_logits`` ``(batch, N_r, vocab)``: the draft's processed scores, ``q_t = softmax(scores_t)``; ``None``
      when the round drafts nothing (``N_r = 0``), as transformers' ``AssistedCandidateGenerator`` returns;
    - ``draft_lengths`` ``(batch,)``: drafts that count per row (``N_b <= N_r``; later columns are filler);
    - ``attention_mask`` ``(batch, L + N_r)``: the mask of ``candidate_ids``;
    - ``draft_hidden`` ``(batch, N_r, d_draft)``: the draft's last-layer hidden state that produced ``q_t`` (when
      the generator was built with ``output_hidden_states=True``; else ``None``);
    - ``untempered_draft_probs`` ``(batch, N_r, vocab)``: ``softmax(raw logits)`` (``output_untempered_probs``).
    """

    def __new__(
        cls,
        candidate_ids,
        candidate_logits,
        *,
        draft_lengths,
        attention_mask,
        draft_hidden=None,
        untempered_draft_probs=None,
    ):
        candidates = super().__new__(cls, (candidate_ids, candidate_logits))
        candidates.draft_lengths = draft_lengths  # (batch,)
        candidates.attention_mask = attention_mask  # (batch, L + N_r)
        candidates.draft_hidden = draft_hidden  # (batch, N_r, d_draft) or None
        candidates.untempered_draft_probs = untempered_draft_probs  # (batch, N_r, vocab) or None
        return candidates

    @property
    def candidate_ids(self) -> torch.Tensor:  # (batch, L + N_r)
        return self[0]

    @property
    def candidate_logits(self) -> torch.Tensor | None:  # (batch, N_r, vocab), None without drafts
        return self[1]


def _generator_policy(policy, assistant_model, num_assistant_tokens, schedule, confidence_threshold, costs):
    """The generator's :class:`DraftLengthPolicy`: the one passed (the batched loop's, resolved once per call), else
    resolved from the keywords or the assistant's config (transformers' own loop)."""
    if policy is None:
        return DraftLengthPolicy.resolve(
            assistant_model,
            num_assistant_tokens=num_assistant_tokens,
            schedule=schedule,
            confidence_threshold=confidence_threshold,
            costs=costs,
        )
    if any(value is not None for value in (num_assistant_tokens, schedule, confidence_threshold, costs)):
        raise TypeError(
            "Pass the draft-length knobs either as `policy` or as `num_assistant_tokens` / `schedule` / "
            "`confidence_threshold` / `costs`, not both."
        )
    return policy


class DiversedCandidateGenerator(CandidateGenerator):
    """Drafts ``N_b`` tokens per row with ``assistant_model`` on a left-padded, right-aligned batch.

    Between rounds the draft cache holds every column of the sequence but the last two (so it never
    needs a catch-up pass): a round feeds what the cache lacks (the whole prompt in the first round,
    then ``seq[:, -2:]``) and then each drafted token, ``N_r = max_b N_b`` calls. Row ``b`` drafts
    ``N_b = min(n_b, remaining_b - 1)``: ``n_b`` its schedule value, ``remaining_b`` the tokens it may still emit
    (``max_new_tokens`` at the start, less ``num_matches_b + 1`` after each round).

    Args (transformers' ``AssistedCandidateGenerator`` arguments first):
        input_ids: ``(batch, L)`` the prompt (left-padded); fixes the batch size and, with
            ``generation_config.max_length``, each row's budget.
        assistant_model: the draft model (shares the target's tokenizer).
        generation_config: the call's prepared generation config: ``max_length`` and ``do_sample`` are read from
            it when the keywords below are not given.
        model_kwargs: the target's model keywords; their ``attention_mask`` ``(batch, L)`` is the prompt's mask
            (all ones when absent). Nothing else is read.
        inputs_tensor: unused (encoder-decoder drafts are not supported); accepted for the contract.
        logits_processor: the prepared logits processors (the target's): drafts are scored as the target's tokens.

    Keywords (the batched loop passes them; each has a default):
        num_assistant_tokens, schedule, confidence_threshold: transformers' ``num_assistant_tokens``,
            ``num_assistant_tokens_schedule`` and ``assistant_confidence_threshold``, per row; when not given, read
            from the assistant's ``generation_config`` as transformers does, else :data:`DRAFT_LENGTH_DEFAULTS`.
            ``schedule``: ``"constant"``; ``"heuristic"`` (+2 after a round in which the row accepted every draft,
            -1 otherwise, never below 1; the value is written to the assistant's ``generation_config`` after every
            round, the mean over the call's rows in a batch, so it persists across calls as in transformers);
            ``"heuristic_transient"`` (the same, not written back). ``"optimal"`` (this project's, batched loop
            only: it reads the verifier's acceptance): the most expected tokens per second. Once the pair and
            setting have statistics, a row drafts again only while the next draft is worth its cost at the pair's
            rate, judged from the draft's confidence in the tokens it drew; until then each round each row drafts
            the ``n`` in ``1..N`` maximising ``E[T_n] / (n c + c_verify(n))`` from its per-position estimates
            (:mod:`diversed_hf.drafting.length.optimal`). ``confidence_threshold``: a row stops drafting after a token
            whose draft probability is below it (that token is still verified); ``None`` or 0 turns it off. The batch
            drafts while any row does.
        vocab_size: the vocabulary verification runs over (the target's): the draft's logits are fitted to it
            (:func:`diversed_hf.verifiers.ops.fit_vocabulary`). Default: the draft's own logit width.
        do_sample: sample the drafts (else greedy). Default: ``generation_config.do_sample``.
        max_new_tokens: tokens each row may emit. Default: ``generation_config.max_length - L``.
        generator: random source for sampling.
        output_hidden_states: return ``draft_hidden`` with the candidates (the verifier reads hidden states).
        output_untempered_probs: return ``untempered_draft_probs`` with the candidates.
        costs: ``"optimal"`` only: :class:`~diversed_hf.drafting.length.costs.DraftCosts` to use instead of measured
        ones. policy: the four knobs above already resolved (:class:`DraftLengthPolicy`; the batched loop passes it), in
            place of them.
        target: ``"optimal"`` only: the target model, the other half of the key of the cross-call statistics.
        setting: ``"optimal"`` only: the rest of the acceptance prior's key
            (:func:`~diversed_hf.drafting.length.optimal.acceptance_setting`).
    """

    def __init__(
        self,
        input_ids: torch.Tensor,  # (batch, L)
        assistant_model,
        generation_config=None,
        model_kwargs: dict | None = None,
        inputs_tensor: torch.Tensor | None = None,
        logits_processor=None,
        *,
        num_assistant_tokens: int | None = None,
        schedule: str | None = None,
        confidence_threshold: float | None = None,
        vocab_size: int | None = None,
        do_sample: bool | None = None,
        max_new_tokens: int | None = None,
        generator: torch.Generator | None = None,
        output_hidden_states: bool = False,
        output_untempered_probs: bool = False,
        costs: DraftCosts | None = None,
        target=None,
        setting=None,
        policy: DraftLengthPolicy | None = None,
    ):
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else ""
            raise TypeError(
                "`input_ids` must be the prompt as a (batch, length) tensor, the first argument as transformers passes "
                f"it; got {type(input_ids).__name__}{shape}."
            )
        policy = _generator_policy(policy, assistant_model, num_assistant_tokens, schedule, confidence_threshold, costs)
        num_assistant_tokens, schedule = policy.num_assistant_tokens, policy.schedule
        self.policy = policy
        if max_new_tokens is None:
            max_length = getattr(generation_config, "max_length", None)
            if max_length is None:
                raise ValueError(
                    "`DiversedCandidateGenerator` needs each row's token budget: pass `max_new_tokens=` or a "
                    "`generation_config` whose `max_length` is set."
                )
            max_new_tokens = max_length - input_ids.shape[1]
        if do_sample is None:
            do_sample = bool(getattr(generation_config, "do_sample", False))
        batch_size, device = input_ids.shape[0], input_ids.device
        self.schedule = schedule
        self.confidence_threshold = policy.confidence_threshold
        self.draft_model = assistant_model
        self.num_draft_tokens = num_assistant_tokens  # N
        self.vocab_size = vocab_size or text_vocab_size(assistant_model)
        self.logits_processor = logits_processor if logits_processor is not None else ()
        self.do_sample = do_sample
        self.generator = generator
        self.output_hidden_states = output_hidden_states
        self.output_untempered_probs = output_untempered_probs
        prompt_mask = (model_kwargs or {}).get("attention_mask")
        self.prompt_mask = None if prompt_mask is None else prompt_mask.to(device)  # (batch, L) or None: all ones
        self.cache = compat.new_cache()  # empty: the first get_candidates feeds the whole prompt, as transformers does
        self.remaining = torch.full((batch_size,), int(max_new_tokens), dtype=torch.long, device=device)  # (batch,)
        self.row_num_tokens = torch.full_like(self.remaining, num_assistant_tokens)  # (batch,) schedule values
        self._finished_num_tokens: list[torch.Tensor] = []  # schedule values of rows that left the batch
        self.optimal = (  # "optimal": per-row estimates, costs, the cross-call statistics
            OptimalSchedule(assistant_model, num_assistant_tokens, target=target, setting=setting, costs=policy.costs)
            if schedule == "optimal"
            else None
        )
        if self.optimal is not None:
            first = self.optimal.start(batch_size, device)  # (batch,) or None
            if first is not None:
                self.row_num_tokens = first.to(self.remaining.dtype)
        self.draft_lengths = self.plan_draft_lengths(self.remaining)  # (batch,) N_b of the next round
        self.draft_confidence: torch.Tensor | None = None  # (batch, N_r) q_t(x_t) of the round ("optimal")
        self.awaiting_update = False  # True between get_candidates and update_candidate_strategy
        # the loop's FiniteMassChecks: the draft's distributions checked with the round's decisions (None: at once)
        self.deferred_checks = None

    #: whether the draft reads the target's hidden states (:mod:`diversed_hf.drafting.feature_candidates`): the loop
    #: then prefills the target before the first round and passes ``target_hidden`` to :meth:`update_candidate_strategy`
    reads_target_features = False  # a generator that hands the draft the target's features sets it
    reads_target_cache = False  # one that hands it the target's KV cache (the Gemma 4 assistant's)

    def observe_target_features(self, target_hidden, num_matches, realignment) -> None:
        """The target's features of a round; a token-only draft reads none."""

    # Batched layout -----------------------------------------------------------------------------
    def plan_draft_lengths(
        self,
        remaining: torch.Tensor,  # (batch,)
    ) -> torch.Tensor:  # (batch,)
        """The draft-length policy: ``N_b = min(n_b, remaining_b - 1)`` with ``n_b`` the row's schedule value.

        Row ``b`` drafts exactly what it would alone (the round's bonus/recovered token uses the last
        slot of its budget); the confidence threshold may stop it earlier (:meth:`get_candidates`).
        """
        return torch.minimum(self.row_num_tokens, remaining - 1).clamp(min=0)

    def _prompt_mask_to(self, input_ids: torch.Tensor) -> torch.Tensor:  # (batch, L)
        """Without a mask from the caller (transformers' loop): the prompt's mask, then ones for every token after
        it."""
        if self.prompt_mask is None:
            return torch.ones_like(input_ids)
        extra = input_ids.shape[1] - self.prompt_mask.shape[1]
        return torch.nn.functional.pad(self.prompt_mask, (0, extra), value=1) if extra > 0 else self.prompt_mask

    def draft_forward(
        self,
        chunk: torch.Tensor,  # (batch, chunk) what the draft cache lacks
        attention_mask: torch.Tensor,  # (batch, cached + chunk)
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # (batch, V') logits of the next token, (batch, d_draft) or None
        """One draft pass over ``chunk`` on top of the draft cache: the last column's logits and, when the verifier
        reads them, its last hidden state."""
        out = compat.forward_with_cache(
            self.draft_model,
            draft_input_ids(self.draft_model, chunk, self.vocab_size),
            attention_mask,
            self.cache,
            logits_to_keep=1,
            output_hidden_states=self.output_hidden_states,
        )
        return out.logits[:, -1], out.hidden_states[-1][:, -1] if self.output_hidden_states else None

    def edit_cache(self, input_ids: torch.Tensor, realignment: Realignment | None) -> None:
        """The draft cache after a round: it keeps every column but the last two of the new sequence (before the
        realignment's shift), or of ``input_ids`` in transformers' loop."""
        if realignment is not None:
            realignment.edit_cache(self.cache, lag=2)
        else:
            compat.crop_cache(self.cache, input_ids.shape[1] - 2)

    def _check_round_start(self, input_ids: torch.Tensor) -> None:
        if self.awaiting_update:
            raise RuntimeError(
                "`get_candidates` was called again before `update_candidate_strategy`: the draft's cache still holds "
                "the last round's drafts. The contract (transformers' CandidateGenerator) is one "
                "`get_candidates(input_ids)`, then one `update_candidate_strategy(input_ids, scores, num_matches)` "
                "with the verified round, per round."
            )
        if input_ids.shape[0] != self.draft_lengths.shape[0]:
            raise ValueError(
                f"`input_ids` has {input_ids.shape[0]} rows but the generator drafts for "
                f"{self.draft_lengths.shape[0]}: rows leave the batch only through "
                "`update_candidate_strategy(..., realignment=Realignment(kept=...))`."
            )

    def _shorten(self, step, step_probs, token, lengths, reach, rule, scalar_rule: bool, row_length: int):
        """After draft ``step``: each row's draft length cut to ``step + 1`` where the confidence threshold or the
        ``"optimal"`` stopping rule stops it; returns ``(lengths (batch,), reach)``."""
        if scalar_rule:  # one row, no threshold: the rule on Python floats (no tensor operations per draft step)
            reach = rule.update_reach_scalar(reach, float(step_probs[0, token[0]]))
            if step + 1 < row_length and not rule.keep_drafting_scalar(reach, step):
                lengths = torch.full_like(lengths, step + 1)
            return lengths, reach
        confidence = step_probs.gather(1, token[:, None]).squeeze(1)  # (batch,) q_t(x_t)
        unsure = torch.zeros_like(confidence, dtype=torch.bool)  # (batch,)
        if self.confidence_threshold is not None:
            unsure |= confidence < self.confidence_threshold
        drafting = lengths > step + 1  # (batch,) rows whose length goes further
        if rule is not None:  # the batch decides: the step is computed for every row, so all or none go on
            reach = rule.update_reach(reach, confidence)
            unsure |= ~rule.keep_drafting_batch(reach, drafting, step)
        unsure &= drafting
        return torch.where(unsure, torch.full_like(lengths, step + 1), lengths), reach

    # CandidateGenerator -------------------------------------------------------------------------
    def get_candidates(
        self,
        input_ids: torch.Tensor,  # (batch, L) the left-padded sequence
        attention_mask: torch.Tensor | None = None,  # (batch, L); default: the prompt's mask, ones after it
        **kwargs,
    ) -> DraftCandidates:  # unpacks as (candidate_ids (batch, L + N_r), candidate_logits (batch, N_r, vocab))
        """Draft ``N_r = max_b N_b`` tokens per row; returns ``(candidate_ids, candidate_logits)`` as a
        :class:`DraftCandidates`.

        ``candidate_ids`` is ``input_ids`` followed by the drafts and ``candidate_logits`` the draft's
        processed scores; row ``b`` counts only its first ``draft_lengths[b]`` drafts.
        """
        self._check_round_start(input_ids)
        if attention_mask is None:
            attention_mask = self._prompt_mask_to(input_ids)
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
            with round_profile.phase("draft forward"):
                step_logits, step_hidden = self.draft_forward(chunk, candidate_mask)  # (batch, V'), (batch, d) or None
            step_scores, raw = next_token_scores(self.logits_processor, candidate_ids, step_logits, self.vocab_size)
            step_probs = step_scores.softmax(dim=-1)  # (batch, vocab)
            check_finite_mass_now_or_later(step_probs, "draft", self.deferred_checks, first_position=len(probs))
            # (batch,); the mass was checked just above
            token = ops.sample(step_probs, self.generator, check=False) if self.do_sample else step_probs.argmax(dim=-1)
            scores.append(step_scores)
            probs.append(step_probs)
            if self.output_untempered_probs:  # without logits processors the scores are the raw logits
                untempered.append(raw.softmax(dim=-1) if len(self.logits_processor) else step_probs)
            if self.output_hidden_states:
                hidden.append(step_hidden)  # (batch, d_draft)
            candidate_ids = torch.cat([candidate_ids, token[:, None]], dim=1)
            candidate_mask = torch.cat([candidate_mask, torch.ones_like(token[:, None])], dim=1)
            chunk = token[:, None]  # (batch, 1)
            if scalar_rule or self.confidence_threshold is not None or rule is not None:
                lengths, reach = self._shorten(step, step_probs, token, lengths, reach, rule, scalar_rule, row_length)
                if not bool((lengths > step + 1).any()):  # no row drafts further
                    break
        self.draft_lengths = lengths
        # No draft this round (every row's budget is down to its last token): ``None``, as transformers'
        # AssistedCandidateGenerator returns, so its sampling loop takes the target's token instead of verifying.
        candidate_logits = torch.stack(scores, dim=1) if scores else None  # (batch, N_r, vocab) or None
        self.awaiting_update = True  # the draft cache holds this round's drafts until update_candidate_strategy
        self.draft_confidence = None  # (batch, N_r) q_t(x_t) of the drafts: what the "optimal" schedule calibrates on
        if self.optimal is not None and probs:
            drafted = candidate_ids[:, candidate_ids.shape[1] - len(probs) :, None]  # (batch, N_r, 1)
            self.draft_confidence = torch.stack(probs, dim=1).gather(2, drafted).squeeze(2)
        return DraftCandidates(
            candidate_ids,
            candidate_logits,
            draft_lengths=lengths,
            attention_mask=candidate_mask,
            draft_hidden=torch.stack(hidden, dim=1) if hidden else None,  # (batch, N_r, d_draft)
            untempered_draft_probs=torch.stack(untempered, dim=1) if untempered else None,  # (batch, N_r, vocab)
        )

    def update_candidate_strategy(
        self,
        input_ids: torch.Tensor,  # (kept, L') the sequence after the round
        scores: torch.Tensor | None,  # (batch, N_r + 1, vocab) the target's scores of the round (unread here)
        num_matches: torch.Tensor | int,  # (batch,) accepted drafts per row; an int applies to every row
        *,
        realignment: Realignment | None = None,
        position_acceptance: torch.Tensor | None = None,  # (batch, N_r) beta_t of the round ("optimal")
        drafted_acceptance: torch.Tensor | None = None,  # (batch, N_r) a_t(x_t) of the round ("optimal")
        seconds: tuple[float, float] | None = None,  # (drafting, rest of the round) time of the round ("optimal")
        target_hidden: torch.Tensor | None = None,  # (batch, N_r + 1, d) the target's features of the round
    ) -> None:
        """Bookkeeping after verification: the schedule, each row's budget, the draft cache, the next draft lengths.

        ``scores`` and ``num_matches`` describe the round just verified, one row per row of its batch (transformers
        passes the target's processed logits and one int for its single row; the batched loop the target's
        probabilities and a tensor ``(batch,)`` of accepted drafts ``n_b``). Each continuing row emitted
        ``n_b + 1`` tokens, so its budget shrinks by that much.

        Without ``realignment`` (transformers' loop) the rows stay and ``input_ids`` extends each row's sequence:
        the draft cache, which lags two tokens, is cropped to ``input_ids.shape[1] - 2`` columns. The batched loop
        passes ``realignment`` (continuing rows, shifts ``A - n_b``, dropped leading columns), the edit it applies
        to the target cache; the draft cache keeps ``realignment.new_length - 2`` columns before the shift. When no
        row continues the call is over (the ``"optimal"`` schedule pools its statistics). ``position_acceptance``,
        ``drafted_acceptance`` and ``seconds`` feed the ``"optimal"`` schedule, which needs them. ``target_hidden``
        (the target's last hidden states at the round's ``N_r + 1`` verified columns) is read only by generators whose
        draft reads the target's features (:attr:`reads_target_features`).
        """
        self.awaiting_update = False
        self.observe_target_features(target_hidden, num_matches, realignment)
        num_matches = torch.as_tensor(num_matches, device=self.remaining.device)  # (batch,) or ()
        kept = realignment.kept if realignment is not None else None
        self.update_schedule(num_matches)
        if self.optimal is not None and (kept is None or kept.numel() > 0):  # a call's last round is not observed
            if position_acceptance is None or drafted_acceptance is None:
                raise ValueError(
                    "the 'optimal' schedule needs the round's `position_acceptance` and `drafted_acceptance` (the "
                    "verifier's): it runs in diversed_hf's loop (`generate(..., verifier=...)`), not in transformers' "
                    "`_assisted_decoding`. Use another `num_assistant_tokens_schedule` there."
                )
            self.optimal.observe(
                position_acceptance,
                drafted_acceptance,
                self.draft_lengths,
                seconds,
                confidence=self.draft_confidence,
                num_matches=num_matches,
            )
        self.remaining = self.remaining - (num_matches + 1)  # (batch,) what each row may still emit
        if kept is None and input_ids.shape[0] != self.remaining.shape[0]:
            raise ValueError(
                f"`input_ids` has {input_ids.shape[0]} rows after a round of {self.remaining.shape[0]}: pass "
                "`realignment=Realignment(kept=...)` to say which rows continue."
            )
        if kept is not None:
            gone = torch.ones_like(self.row_num_tokens, dtype=torch.bool)  # (batch,)
            gone[kept] = False
            self._finished_num_tokens.append(self.row_num_tokens[gone])
            self.row_num_tokens, self.remaining = self.row_num_tokens[kept], self.remaining[kept]
            if self.optimal is not None:
                self.optimal.drop(kept)
        if self.schedule == "heuristic":  # transformers keeps the value on the assistant; the mean over rows here
            final = torch.cat([*self._finished_num_tokens, self.row_num_tokens]).double()  # (rows,)
            self.draft_model.generation_config.num_assistant_tokens = max(1, int(round(float(final.mean()))))
        if self.remaining.numel() == 0:  # every row finished: the call is over
            if self.optimal is not None:
                self.optimal.finish()
            self.draft_lengths = self.remaining
            return
        if self.optimal is not None:
            chosen = self.optimal.lengths()  # (kept,) or None: keep the current lengths
            if chosen is not None:
                self.row_num_tokens = chosen.to(self.row_num_tokens.dtype)
        self.edit_cache(input_ids, realignment)
        self.draft_lengths = self.plan_draft_lengths(self.remaining)

    def update_schedule(
        self,
        num_matches: torch.Tensor,  # (batch,) or () accepted drafts of the round just verified
    ) -> None:
        """transformers' heuristic, per row: +2 after a round that kept every draft, else -1 (at least 1)."""
        if self.schedule not in ("heuristic", "heuristic_transient"):
            return
        all_kept = num_matches >= self.draft_lengths  # (batch,)
        self.row_num_tokens = torch.where(all_kept, self.row_num_tokens + 2, (self.row_num_tokens - 1).clamp(min=1))
