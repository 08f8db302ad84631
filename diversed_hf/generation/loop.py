"""The batched speculative loop: draft, verify, commit, realign (``docs/method.md §2``).

:mod:`diversed_hf.generation` runs it inside transformers' ``generate``; :func:`speculative_decode`
is also callable directly on a left-padded batch.

Batched layout (``B`` rows, one round drafts ``N`` tokens)
------------------------------------------------------------
Every row is kept **left-padded and right-aligned**: ``seq`` is ``(B, L)`` and each row's real
tokens end at column ``L - 1``; ``mask`` ``(B, L)`` marks real tokens, and position ids are
``cumsum(mask) - 1``. Between rounds the target cache holds columns ``[0, L - 1)`` (all but the last
token) and the draft cache ``[0, L - 2)`` (all but the last two), so a round is:

1. draft: feed ``seq[:, -2:]`` then each sampled token: ``N`` calls, ``q_1..q_N`` and ``h^q_1..h^q_N``;
2. target: feed ``[seq[:, -1], x_1..x_N]`` (``B, N + 1``) once: ``p_1..p_{N+1}`` and ``h^p``;
3. verify: row ``b`` keeps ``n_b`` drafts and one recovered/bonus token;
4. realign: with ``A = max_b n_b`` the new length is ``L + A + 1``; the sequence, its mask and the
   draft cache (cropped to ``L + A - 1`` columns) roll row ``b`` right by ``A - n_b``; what wraps
   around is the row's rejected tail, now on masked columns. Columns that are padding in every row
   are dropped, so ``L`` stays the longest row's length. The target cache is not rolled: it keeps
   its own mask, each row's ``A - n_b`` rejected columns masked in place as holes, and is compacted
   only when the holes make it too wide (:mod:`.target_cache`); its positions follow its mask.

The first round starts from empty caches and feeds each model what its cache lacks -- the whole
prompt -- with its first call, as transformers' assisted decoding does: no separate prefill pass.
The draft cache lags by two tokens so it never needs a catch-up pass, whatever a row accepted. A draft
that reads the target's features (an :class:`~diversed_hf.drafting.eagle.EagleDraft`) is the exception
(:mod:`diversed_hf.drafting.feature_candidates`): the target first reads the prompt minus its last token (``prefill``),
so the draft has its features, and the draft's cache keeps only columns computed from them.
Finished rows (EOS, length, stopping criteria) leave the batch and cost nothing after. Sliding
windows stay exact because their target keeps the compact cache (every row hole-free; the window's
mask is built from column indices).

In code a round is four named steps of ``_SpeculativeLoop``: ``draft`` (step 1, through
:class:`~diversed_hf.drafting.candidates.DiversedCandidateGenerator`, a transformers ``CandidateGenerator``),
``verify`` (steps 2-3, ``docs/method.md §2``), ``commit`` (emit, truncate at length/EOS/stopping
criteria, record statistics) and ``realign`` (step 4: sequence and target cache here, the draft cache
in the generator's ``update_candidate_strategy``). Cache edits go through :mod:`diversed_hf.compat`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from .. import compat
from ..common import round_profile
from ..common.pairs import text_vocab_size
from ..drafting.candidates import (
    DiversedCandidateGenerator,
    DraftCandidates,
    Realignment,
)
from ..drafting.length.optimal import acceptance_setting
from ..drafting.protocol import capabilities_of
from ..verifiers.checks import FiniteMassChecks
from ..verifiers.rules import VerificationResult, Verifier
from .output_scores import TargetScoreRecorder
from .outputs import RoundRecord, SpeculationStats
from .processors import per_row_processors, sync_row_lengths
from .round_state import RoundContext, RoundDecisions
from .rounds import ChainRound, TreeRound, round_strategy
from .target_cache import TargetCache

if TYPE_CHECKING:  # the request's module checks heads, which the loop never imports
    from .request import SpeculationRequest

logger = logging.getLogger(__name__)

__all__ = ["speculative_decode"]


@dataclass
class _RunState:
    """Per-call output buffers and statistics, indexed by original batch row."""

    tokens: torch.Tensor  # (batch, max_new_tokens) emitted tokens, pad after the end
    num_generated: torch.Tensor  # (batch,)
    target_weights: torch.Tensor | None  # (batch, max_new_tokens) w per emitted token, NaN for bonus
    num_rounds: torch.Tensor  # (batch,)
    num_drafted: torch.Tensor  # (batch,)
    num_accepted: torch.Tensor  # (batch,)
    drafted_per_position: torch.Tensor  # (batch, N'), N' the longest draft so far
    accepted_per_position: torch.Tensor  # (batch, N')
    rounds: list[RoundRecord]  # one per round
    recorder: TargetScoreRecorder | None = None  # the target's scores per emitted token (output_scores/logits)
    tree_nodes: torch.Tensor | None = None  # (batch,) nodes verified, when rounds draft token trees

    @classmethod
    def empty(
        cls, batch_size, max_new_tokens, num_draft, pad_token_id, output_target_weights, token_dtype, device
    ) -> _RunState:
        counts = dict(dtype=torch.long, device=device)
        return cls(
            tokens=torch.full((batch_size, max_new_tokens), pad_token_id, dtype=token_dtype, device=device),
            num_generated=torch.zeros(batch_size, **counts),
            target_weights=(
                torch.full((batch_size, max_new_tokens), float("nan"), device=device) if output_target_weights else None
            ),
            num_rounds=torch.zeros(batch_size, **counts),
            num_drafted=torch.zeros(batch_size, **counts),
            num_accepted=torch.zeros(batch_size, **counts),
            drafted_per_position=torch.zeros(batch_size, num_draft, **counts),
            accepted_per_position=torch.zeros(batch_size, num_draft, **counts),
            rounds=[],
        )

    def record(
        self,
        active: torch.Tensor,  # (B,) original row of each active row
        emitted: torch.Tensor,  # (B, N_r + 1) accepted drafts, then the recovered/bonus token
        count: torch.Tensor,  # (B,) tokens kept after truncation
        result: VerificationResult,
        draft_lengths: torch.Tensor,  # (B,) N_b
        columns: torch.Tensor,  # (N_r + 1,) arange
        target_scores: tuple | None = None,  # (B, N_r + 1, V) processed, (B, N_r + 1, V') raw: when recorded
    ) -> None:
        """Write one round's emitted tokens and statistics."""
        num_round_drafts = emitted.shape[1] - 1  # N_r
        num_accepted = result.num_accepted  # (B,)
        keep = columns < count[:, None]  # (B, N_r + 1)
        out_columns = self.num_generated[active][:, None] + columns  # (B, N_r + 1)
        out_rows = active[:, None].expand_as(out_columns)  # (B, N_r + 1)
        self.tokens[out_rows[keep], out_columns[keep]] = emitted[keep]
        if self.recorder is not None:
            self.recorder.record(out_rows[keep], out_columns[keep], target_scores[0][keep], target_scores[1][keep])
        if self.target_weights is not None and result.target_weight is not None:
            weights = torch.cat(
                [result.target_weight.float(), torch.full((active.numel(), 1), float("nan"), device=emitted.device)],
                dim=1,
            )  # (B, N_r + 1)
            weights[columns >= draft_lengths[:, None]] = float("nan")  # bonus positions have no w
            self.target_weights[out_rows[keep], out_columns[keep]] = weights[keep]
        drafted_columns = columns[:num_round_drafts]  # (N_r,)
        if num_round_drafts > self.drafted_per_position.shape[1]:  # a schedule grew past the widest round so far
            grow = num_round_drafts - self.drafted_per_position.shape[1]
            self.drafted_per_position = torch.nn.functional.pad(self.drafted_per_position, (0, grow))
            self.accepted_per_position = torch.nn.functional.pad(self.accepted_per_position, (0, grow))
        self.num_generated[active] += count
        self.num_rounds[active] += 1
        self.num_drafted[active] += draft_lengths
        self.num_accepted[active] += num_accepted
        self.drafted_per_position[active, :num_round_drafts] += (drafted_columns < draft_lengths[:, None]).long()
        self.accepted_per_position[active, :num_round_drafts] += (drafted_columns < num_accepted[:, None]).long()
        not_drafted = drafted_columns >= draft_lengths[:, None]  # (B, N_r)
        betas = result.position_acceptance.float().masked_fill(not_drafted, float("nan"))  # (B, N_r)
        drafted_acceptance = result.drafted_acceptance
        if drafted_acceptance is None:
            drafted_acceptance = torch.full_like(betas, float("nan"))
        self.rounds.append(
            RoundRecord(
                rows=active.clone(),
                position_acceptance=betas,
                drafted_acceptance=drafted_acceptance.float().masked_fill(not_drafted, float("nan")),
                draft_lengths=draft_lengths.clone(),
            )
        )


def _clock(device: torch.device) -> float:
    """Seconds now, after the device's queued work (the "optimal" schedule times rounds)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@torch.no_grad()
def speculative_decode(
    target,
    request: SpeculationRequest,
    input_ids: torch.Tensor,  # (batch, prompt_len), left-padded
    attention_mask: torch.Tensor | None,  # (batch, prompt_len)
    *,
    max_new_tokens: int,
    logits_processor=(),
    stopping_criteria=(),
    eos_token_id: torch.Tensor | None = None,  # (num_eos,)
    pad_token_id: int = 0,
    do_sample: bool = True,
    score_recorder: TargetScoreRecorder | None = None,
) -> tuple[torch.Tensor, SpeculationStats]:  # (batch, num_new_tokens), stats
    """Decode with what ``request`` (:class:`~diversed_hf.generation.request.SpeculationRequest`, the call resolved
    once) asks for: its drafter drafts ``request.policy`` tokens a round (a chain, or ``request.tree``), its verifier
    verifies (``docs/method.md §2``); returns the new tokens (pad after end) and stats.

    Drafting runs through a :class:`~diversed_hf.drafting.candidates.DiversedCandidateGenerator`; the policy's costs
    (``"optimal"`` schedule only) replace the measured round costs. ``score_recorder``
    (:class:`~diversed_hf.generation.output_scores.TargetScoreRecorder`) receives the target's scores of every emitted
    token (``output_scores`` / ``output_logits``).
    """
    draft, verifier, policy, generator = request.drafter, request.verifier, request.policy, request.generator
    vocab_size = request.vocab_size or text_vocab_size(target)  # the draft's logits are fitted to it
    optimal = policy.schedule == "optimal"
    logits_processor = per_row_processors(logits_processor, input_ids.shape[1], input_ids.shape[0], pad_token_id)
    capabilities = capabilities_of(draft)
    reads_features = capabilities.reads_target_features  # an EagleDraft: the target's features too
    if reads_features and not draft.is_attached_to(target):
        draft.attach_target(target)  # its embeddings and LM head are the target's
    strategy = round_strategy(request.tree, input_ids.shape[0])  # a chain or a token tree, once for the call
    generator_class, strategy_kwargs = strategy.generator(capabilities)
    candidate_generator = generator_class(
        input_ids,
        draft,
        model_kwargs={"attention_mask": attention_mask},
        logits_processor=logits_processor,
        policy=policy,  # resolved by the caller: the generator reads no config
        vocab_size=vocab_size,
        do_sample=do_sample,
        max_new_tokens=max_new_tokens,
        generator=generator,
        output_hidden_states=verifier.requires_hidden_states,
        output_untempered_probs=verifier.requires_untempered_probs,
        target=target if optimal else None,
        setting=acceptance_setting(verifier, do_sample, logits_processor) if optimal else None,
        **strategy_kwargs,
    )
    loop = _SpeculativeLoop(
        target,
        candidate_generator,
        verifier,
        strategy,
        logits_processor=logits_processor,
        stopping_criteria=stopping_criteria,
        eos_token_id=eos_token_id,
        do_sample=do_sample,
        generator=generator,
        streamer=request.streamer,
        vocab_size=vocab_size,
    )
    return loop.run(
        input_ids,
        attention_mask,
        max_new_tokens=max_new_tokens,
        pad_token_id=pad_token_id,
        output_target_weights=request.output_target_weights,
        score_recorder=score_recorder,
    )


class _SpeculativeLoop:
    """One call of the batched loop: draft, verify, commit, realign (module docstring, steps 1-4).

    Holds the layout's state: ``seq`` / ``mask`` ``(B, L)``, ``active`` ``(B,)`` (original row of each
    active row), ``remaining`` ``(B,)`` (tokens each row may still emit) and the target cache.
    """

    def __init__(
        self,
        target,
        candidate_generator: DiversedCandidateGenerator,
        verifier: Verifier,
        strategy: ChainRound | TreeRound,
        *,
        logits_processor,
        stopping_criteria,
        eos_token_id,
        do_sample,
        generator,
        streamer,
        vocab_size,
    ):
        self.target = target
        self.candidates = candidate_generator
        self.verifier = verifier
        self.round = strategy  # steps 2-3 of a round: a chain, or a token tree (.rounds)
        self.logits_processor = logits_processor
        self.stopping_criteria = stopping_criteria
        self.eos_token_id = eos_token_id  # (num_eos,) or None
        self.do_sample = do_sample
        self.generator = generator
        self.streamer = streamer
        self.vocab_size = vocab_size
        self.target_cache = TargetCache(keeps_holes=False)
        self._aranges: dict[int, torch.Tensor] = {}
        self.round_clock: tuple[float, float] | None = None  # (start, end of drafting) of the round, when timed
        self.round_target_hidden: torch.Tensor | None = (
            None  # (B, N_r + 1, d) for a draft reading the target's features
        )

    def run(
        self, input_ids, attention_mask, *, max_new_tokens, pad_token_id, output_target_weights, score_recorder=None
    ):
        device = input_ids.device
        batch_size = input_ids.shape[0]
        # A row drafts at most remaining - 1 <= max_new_tokens - 1 tokens a round: per-position buffers start at
        # that width (never N itself, which may be huge) and grow only when a schedule drafts longer.
        num_draft = max(1, min(self.candidates.num_draft_tokens, max_new_tokens - 1))
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        self.state = _RunState.empty(
            batch_size, max_new_tokens, num_draft, pad_token_id, output_target_weights, input_ids.dtype, device
        )
        self.state.recorder = score_recorder
        if self.round.counts_nodes:
            self.state.tree_nodes = torch.zeros(batch_size, dtype=torch.long, device=device)
        if max_new_tokens <= 0:
            return self.state.tokens[:, :0], SpeculationStats.of_run(self.state, num_draft)
        if input_ids.shape[1] == 0:
            raise ValueError(
                f"`input_ids` has shape {tuple(input_ids.shape)}: pass a prompt of at least one token (e.g. BOS)."
            )
        # The prompt as it is: logits processors and stopping criteria see transformers' widths in the first round.
        self.seq = input_ids  # (B, L)
        self.mask = attention_mask.to(input_ids.dtype)  # (B, L)
        self.active = torch.arange(batch_size, device=device)  # (B,)
        self.remaining = torch.full((batch_size,), max_new_tokens, dtype=torch.long, device=device)  # (B,)
        self.max_new_tokens = max_new_tokens
        # empty: the first round feeds the whole prompt; rejected drafts become holes in it (.target_cache)
        self.target_cache = TargetCache(keeps_holes=self.keeps_holes())
        # the host's copy of what the rounds decide: each row's leading padding columns (one read, before any round)
        self.row_padding = (self.mask.cumsum(dim=1) == 0).sum(dim=1).tolist()  # [B]
        self.target_cache.start(self.mask, self.row_padding)
        self.checks = FiniteMassChecks()  # the round's distributions, checked with its decisions (one read a round)
        self.candidates.deferred_checks = self.checks
        if self.candidates.reads_target_cache:  # a Gemma 4 assistant: the target's keys, values
            self.candidates.target_cache = self.target_cache.cache
        profile = round_profile.active()  # a profile (docs/profile.md) or None
        began = round_profile.clock(profile.device) if profile is not None else 0.0
        if self.candidates.reads_target_features:
            with round_profile.phase("prefill"):
                self.prefill()
        timed = self.candidates.schedule == "optimal"  # the schedule reads the measured round costs
        while self.active.numel() > 0:
            started = _clock(device) if timed else 0.0
            with round_profile.phase("drafting"):
                candidates = self.draft()  # (candidate_ids (B, L + N_r), candidate_logits (B, N_r, V)) and extras
            self.round_clock = (started, _clock(device)) if timed else None  # realign reads the rest of the round
            result, target_probs, target_scores, candidates = self.verify(candidates)
            with round_profile.phase("commit"):
                emitted, count, finished = self.commit(candidates, result, target_scores)
                decisions = self.decide(result, emitted, count, finished)
            with round_profile.phase("realign"):
                self.realign(candidates, emitted, decisions, result, target_probs)
            if profile is not None:
                profile.rounds += 1
        if profile is not None:
            profile.wall += round_profile.clock(profile.device) - began
        if self.streamer is not None:
            self.streamer.end()
        num_new = int(self.state.num_generated.max()) if batch_size else 0
        return self.state.tokens[:, :num_new], SpeculationStats.of_run(self.state, num_draft)

    def prefill(self) -> None:
        """For a draft that reads the target's features (an EagleDraft): the target reads the prompt but its last
        token, and hands the draft its hidden states there; the first verification then feeds ``[last token,
        drafts]`` as every later one does."""
        if self.seq.shape[1] > 1:
            out = compat.forward_with_cache(
                self.target,
                self.seq[:, :-1],
                self.mask[:, :-1],
                self.target_cache.cache,
                logits_to_keep=1,
                output_hidden_states=True,
            )
            hidden = self.candidates.target_features(out.hidden_states)  # (B, L - 1, d)
        else:
            hidden = None  # a one-token prompt: no column before the last
        self.candidates.set_target_features(hidden, self.mask)

    def keeps_holes(self) -> bool:
        """Whether the target's cache may keep rejected drafts as masked holes (:mod:`.target_cache`): not when its
        attention counts columns (a sliding window) or a draft reads the cache's columns (a Gemma 4 assistant)."""
        return not (self.candidates.reads_target_cache or compat.has_sliding_window(self.target))

    def _columns(self, width: int) -> torch.Tensor:  # (width,)
        if width not in self._aranges:
            self._aranges[width] = torch.arange(width, device=self.seq.device)
        return self._aranges[width]

    def draft(self) -> DraftCandidates:
        """Step 1: the candidate generator drafts ``N_r = max_b N_b`` tokens after ``seq``."""
        sync_row_lengths(self.logits_processor, self.remaining, self.max_new_tokens, self.seq.shape[1], self.active)
        return self.candidates.get_candidates(self.seq, attention_mask=self.mask)

    def verify(self, candidates):  # result, (B, N_r + 1, V), scores when recorded, the round's chain
        """Steps 2-3: the target's one pass and the verifier, as the call's round strategy runs them
        (:mod:`.rounds`: a chain, or a token tree handed on as the chain of its accepted path)."""
        context = RoundContext(
            self.target,
            self.target_cache,
            self.verifier,
            self.candidates,
            self.logits_processor,
            self.vocab_size,
            self.do_sample,
            self.generator,
            recording=self.state.recorder is not None,
            length=self.seq.shape[1],
            checks=self.checks,
        )
        outcome = self.round.verify(context, candidates)
        if outcome.target_hidden is not None:
            self.round_target_hidden = outcome.target_hidden
        if outcome.nodes is not None and self.state.tree_nodes is not None:
            self.state.tree_nodes[self.active] += outcome.nodes
        return outcome.result, outcome.target_probs, outcome.target_scores, outcome.chain

    def commit(
        self,
        candidates: DraftCandidates,
        result: VerificationResult,
        target_scores: tuple | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # (B, N_r + 1), (B,), (B,)
        """Commit: emit ``n_b`` drafts and the recovered/bonus token, truncate, record: the emitted tokens, how many
        each row keeps and whether it is done, all on the device."""
        length = self.seq.shape[1]  # L
        draft_ids = candidates.candidate_ids[:, length:]  # (B, N_r)
        num_accepted = result.num_accepted  # (B,)
        columns = self._columns(draft_ids.shape[1] + 1)  # (N_r + 1,)
        emitted = torch.cat([draft_ids, draft_ids.new_zeros(draft_ids.shape[0], 1)], dim=1)  # (B, N_r + 1)
        emitted.scatter_(1, num_accepted[:, None], result.next_tokens[:, None])
        count, finished = self._truncate(emitted, num_accepted, columns)
        self.state.record(self.active, emitted, count, result, candidates.draft_lengths, columns, target_scores)
        self.remaining = self.remaining - count
        return emitted, count, finished

    def decide(self, result: VerificationResult, emitted, count, finished) -> RoundDecisions:
        """The round's one read of the device: each row's accepted drafts, kept tokens and whether it is done, with
        the round's deferred distribution checks (raised here); the realignment then runs on the host's copy."""
        flags = self.checks.take()  # (k,) or None
        parts = [result.num_accepted, count, finished.long()] + ([flags.long()] if flags is not None else [])
        host = torch.cat(parts).tolist()
        rows = count.shape[0]
        self.checks.raise_failed(host[3 * rows :])
        decisions = RoundDecisions(host[:rows], host[rows : 2 * rows], [bool(x) for x in host[2 * rows : 3 * rows]])
        if self.streamer is not None:
            self.streamer.put(emitted[:, : decisions.count[0]].cpu())
        return decisions

    def _truncate(
        self,
        emitted: torch.Tensor,  # (B, N_r + 1)
        num_accepted: torch.Tensor,  # (B,)
        columns: torch.Tensor,  # (N_r + 1,)
    ) -> tuple[torch.Tensor, torch.Tensor]:  # count (B,), finished (B,)
        """Tokens each row keeps under the length budget, EOS and stopping criteria, and whether it is done."""
        count = torch.minimum(num_accepted + 1, self.remaining)  # (B,)
        finished = count >= self.remaining  # (B,)
        if self.eos_token_id is not None:
            is_eos = torch.isin(emitted, self.eos_token_id) & (columns < count[:, None])  # (B, N_r + 1)
            has_eos = is_eos.any(dim=1)  # (B,)
            first_eos = torch.where(has_eos, is_eos.long().argmax(dim=1), count - 1)  # (B,)
            count = torch.where(has_eos, first_eos + 1, count)
            finished |= has_eos
        if len(self.stopping_criteria):
            stopped = torch.zeros_like(finished)  # (B,)
            for j in range(1, int(count.max()) + 1):
                candidate = torch.cat([self.seq, emitted[:, :j]], dim=1)  # (B, L + j)
                hit = self.stopping_criteria(candidate, None).to(emitted.device) & (j <= count) & ~stopped  # (B,)
                count = torch.where(hit, torch.full_like(count, j), count)
                stopped |= hit
            finished |= stopped
        return count, finished

    def realign(
        self,
        candidates: DraftCandidates,
        emitted: torch.Tensor,  # (B, N_r + 1)
        decisions: RoundDecisions,
        result: VerificationResult,
        target_probs: torch.Tensor,  # (B, N_r + 1, V)
    ) -> None:
        """Step 4: drop finished rows, append each row's tokens right-aligned, edit both caches to match; then the
        candidate generator's ``update_candidate_strategy`` (also after the last round, when no row continues).
        Every choice is made on the host's copy of the round's decisions (:meth:`decide`): no device read."""
        num_accepted = result.num_accepted  # (B,)
        length = self.seq.shape[1]  # L
        candidate_ids, candidate_mask = candidates.candidate_ids, candidates.attention_mask  # (B, L + N_r) each
        round_num_accepted = num_accepted
        accepted, padding = decisions.num_accepted, self.row_padding  # [B] each
        kept = rows = None
        if all(decisions.finished):  # the call is over: the generator's last schedule update
            self.active = self.active[:0]
            done = Realignment(kept=self.active, shifts=None, new_length=0, leading=0)
            self.candidates.update_candidate_strategy(
                candidate_ids[:0],
                target_probs,
                num_accepted,
                realignment=done,
                target_hidden=self.round_target_hidden,
            )
            return
        if any(decisions.finished):
            rows = [b for b, done in enumerate(decisions.finished) if not done]
            accepted, padding = [accepted[b] for b in rows], [padding[b] for b in rows]
            kept = torch.tensor(rows, device=self.active.device)  # (kept,)
            self.active, self.remaining, num_accepted = self.active[kept], self.remaining[kept], num_accepted[kept]
            emitted, candidate_ids, candidate_mask = emitted[kept], candidate_ids[kept], candidate_mask[kept]
        longest = max(accepted)  # A
        shifted = [longest - n for n in accepted]  # each row's roll right
        new_length = length + longest + 1
        seq = torch.cat([candidate_ids, emitted[:, -1:]], dim=1)  # (B, L + N_r + 1), last column overwritten below
        seq.scatter_(1, (length + num_accepted)[:, None], emitted.gather(1, num_accepted[:, None]))
        seq = seq[:, :new_length]  # (B, L + A + 1)
        mask = torch.cat([candidate_mask, torch.ones_like(candidate_mask[:, :1])], dim=1)[
            :, :new_length
        ]  # (B, L + A + 1)
        shifts = torch.tensor(shifted, device=seq.device) if any(shifted) else None  # (B,)
        realignment = Realignment(kept=kept, shifts=shifts, new_length=new_length, leading=0)
        mask = realignment.move(mask)  # the one row roll, as the caches and the features
        if shifts is not None:  # the columns that wrapped around become padding
            mask = mask * (torch.arange(new_length, device=seq.device) >= shifts[:, None]).to(mask.dtype)
        padding = [pad + shift for pad, shift in zip(padding, shifted, strict=True)]
        leading = min(min(padding), new_length - 2)  # columns that are padding in every row
        self.row_padding = [pad - leading for pad in padding]
        realignment = replace(realignment, leading=leading)
        self.seq, self.mask = realignment.move(seq), mask[:, realignment.leading :]
        self.target_cache.follow(realignment, rows, accepted, num_accepted, self.mask, self.row_padding)
        realignment.edit_processors(self.logits_processor)
        seconds = None
        if self.round_clock is not None:  # (drafting, the rest of the round: verification, commit, realignment)
            started, drafted = self.round_clock
            seconds = (drafted - started, _clock(self.seq.device) - drafted)
        self.candidates.update_candidate_strategy(
            self.seq,
            target_probs,
            round_num_accepted,
            realignment=realignment,
            position_acceptance=result.position_acceptance,
            drafted_acceptance=result.drafted_acceptance,
            seconds=seconds,
            target_hidden=self.round_target_hidden,
        )
