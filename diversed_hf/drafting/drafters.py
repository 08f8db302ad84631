"""transformers' drafters without a separate draft model, in the batched loop: early exit and prompt lookup.

- **Early exit** (``generate(..., assistant_early_exit=k)``, self-speculation as LayerSkip): the target's first ``k``
  decoder layers, its final norm and its LM head draft. :class:`EarlyExitDraft` is that view of the target (no weight
  copied), an ordinary token draft with a cache of its own: drafts are sampled from its distribution (or taken
  greedily), and that distribution is what verification receives, as for any draft model. It has hidden states (the
  target's width), so heads apply.
- **Prompt lookup** (``generate(..., prompt_lookup_num_tokens=N)``): each row copies the tokens that followed the
  first earlier occurrence of its last n-gram (:class:`LookupCandidateGenerator`). A copied token was not drawn from a
  distribution: its proposal is a point mass, ``q_t = 1`` at the token. Lossless SD then accepts it with probability
  ``p_t(x_t)`` and otherwise samples ``p_t`` without it, so the target's law holds exactly; a relaxed verifier emits
  its declared ``nu_t = w p_t + (1 - w) q_t``. A lookup draft has no hidden state, so a head that reads hidden states
  cannot verify it.

Both run at any batch size, rows drafting and advancing independently (transformers runs both at batch 1 only).
``docs/drafters.md`` says which of transformers' candidate generators are reused and why these two are our own.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import GenerationConfig

from ..verifiers.checks import is_integer
from .candidates import DiversedCandidateGenerator, DraftCandidates, Realignment
from .protocol import proposes_from_rows, register_drafter

__all__ = ["EarlyExitDraft", "LookupCandidateGenerator", "PointMassCandidateGenerator", "PromptLookup"]


class EarlyExitDraft(nn.Module):
    """The target's first ``num_layers`` decoder layers, final norm and LM head, as a causal LM draft.

    It holds the target (not as a submodule: no weight is copied, moved or saved) and runs the target's own forward
    with the base model's ``config.num_hidden_layers`` set to ``num_layers`` for the call, as transformers'
    ``EarlyExitCandidateGenerator`` does; its cache (the loop's, separate from the target's) holds those layers only.
    """

    def __init__(self, target, num_layers: int):
        super().__init__()
        base = getattr(target, getattr(target, "base_model_prefix", ""), None)
        total = getattr(getattr(base, "config", None), "num_hidden_layers", None)
        if not isinstance(total, int):
            raise ValueError(
                f"`assistant_early_exit` needs a target whose base model counts its decoder layers in "
                f"`config.num_hidden_layers`; {type(target).__name__} has none. Use `assistant_model=` instead."
            )
        if getattr(base.config, "hidden_size_per_layer_input", None):
            raise ValueError(
                f"`assistant_early_exit` cannot run {type(target).__name__}: its decoder layers read per-layer "
                "inputs sized for all of them (`hidden_size_per_layer_input`), so a forward through fewer layers is "
                "not defined. Use `assistant_model=` (for Gemma 4, its assistant) or `prompt_lookup_num_tokens=`."
            )
        if not is_integer(num_layers) or not 1 <= int(num_layers) < total:
            raise ValueError(
                f"`assistant_early_exit` must be an integer in [1, {total - 1}] (the layers the draft runs, fewer than "
                f"the target's {total}), got {num_layers!r}."
            )
        self.__dict__["target"] = target  # not registered: the weights stay the target's alone
        self.__dict__["_base_config"] = base.config
        self.num_layers = int(num_layers)
        config = copy.deepcopy(target.config)
        config.get_text_config().num_hidden_layers = self.num_layers
        config._name_or_path = (
            f"{getattr(target.config, '_name_or_path', '') or type(target).__name__}:exit{num_layers}"
        )
        self.config = config
        self.generation_config = GenerationConfig()  # the call's knobs (num_assistant_tokens) come from generate
        self.fingerprint_extra = f"early exit after {self.num_layers} layers"  # its weights are the target's

    @property
    def device(self) -> torch.device:
        return self.target.device

    @property
    def dtype(self) -> torch.dtype:
        return self.target.dtype

    def get_input_embeddings(self):
        return self.target.get_input_embeddings()

    def get_output_embeddings(self):
        return self.target.get_output_embeddings()

    def forward(self, *args, **kwargs):
        config = self._base_config
        total = config.num_hidden_layers
        config.num_hidden_layers = self.num_layers
        try:
            return self.target(*args, **kwargs)
        finally:
            config.num_hidden_layers = total


class PromptLookup(nn.Module):
    """What ``prompt_lookup_num_tokens=N`` (and ``max_matching_ngram_size``) ask for: the loop's stand-in for a
    draft model. It drafts with :class:`LookupCandidateGenerator`; it has no weights, cache or hidden states. A module
    without parameters, so the trainer takes it as a draft (``DiversedTrainer(target, PromptLookup(N), head=...)``)."""

    has_hidden_states = False  # a head for it reads the target's hidden state alone (draft_hidden_size 0)

    def __init__(self, num_tokens: int, max_ngram_size: int | None = None):
        super().__init__()
        max_ngram_size = 2 if max_ngram_size is None else max_ngram_size  # transformers' default
        for name, value in (("prompt_lookup_num_tokens", num_tokens), ("max_matching_ngram_size", max_ngram_size)):
            if not is_integer(value) or int(value) < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
        self.num_tokens, self.max_ngram_size = int(num_tokens), int(max_ngram_size)
        self.generation_config = GenerationConfig(num_assistant_tokens=self.num_tokens)

    def __repr__(self) -> str:
        return f"PromptLookup(num_tokens={self.num_tokens}, max_ngram_size={self.max_ngram_size})"

    @property
    def name_or_path(self) -> str:  # what a head records as its draft
        return f"prompt-lookup:{self.max_ngram_size}"

    @property
    def fingerprint_extra(self) -> str:  # a training checkpoint's record of the drafter
        return self.name_or_path

    def get_output_embeddings(self):
        return None

    def propose(self, rows: list[torch.Tensor], limits: list[int]) -> list[torch.Tensor]:
        """Each row's copied tokens (at most its limit) after its tokens ``rows[b]`` (:func:`lookup_continuations`)."""
        return [lookup_continuations(row, self.max_ngram_size, limit) for row, limit in zip(rows, limits)]


def lookup_continuations(
    tokens: torch.Tensor,  # (length,) one row's tokens, no padding
    max_ngram_size: int,
    limit: int,
) -> torch.Tensor:  # (at most limit,)
    """The tokens that followed the first earlier occurrence of the row's last n-gram, the longest n first
    (transformers' ``PromptLookupCandidateGenerator`` rule): empty when no n-gram recurs or ``limit`` is 0."""
    length = tokens.numel()
    if limit <= 0:
        return tokens[:0]
    for size in range(min(max_ngram_size, length - 1), 0, -1):
        windows = tokens[: length - 1].unfold(0, size, 1)  # (length - size, size): windows followed by a token
        starts = (windows == tokens[length - size :]).all(dim=1).nonzero().flatten() + size  # (matches,)
        if starts.numel():
            start = int(starts[0])
            return tokens[start : min(start + limit, length)]
    return tokens[:0]


class PointMassCandidateGenerator(DiversedCandidateGenerator):
    """The batched loop's generator for drafts that are tokens, not samples (prompt lookup, a draft translated from
    another tokenizer): each proposal is a point mass at its token. Row ``b`` drafts up to ``N_b = min(N,
    remaining_b - 1)`` tokens that :meth:`propose` returns (fewer, or none, when it has fewer).

    A proposed token the call's logits processors forbid (its processed score is ``-inf`` after the drafts before it,
    e.g. EOS under ``min_new_tokens``) ends the row's drafts there, as in transformers: the target would never emit it,
    and a relaxed verifier must not either. Arguments as
    :class:`~diversed_hf.drafting.candidates.DiversedCandidateGenerator`.
    """

    #: what the messages call the drafter
    drafter_name = "this drafter"
    #: the schedules it follows (no draft confidence: no threshold, no "optimal")
    schedules = ("constant",)

    def __init__(self, input_ids, assistant_model, *args, **kwargs):
        policy = kwargs.get("policy")
        if policy is not None and (policy.schedule not in self.schedules or policy.confidence_threshold is not None):
            raise ValueError(
                f"{self.drafter_name} proposes tokens without a confidence: `num_assistant_tokens_schedule="
                f"{policy.schedule!r}` and `assistant_confidence_threshold={policy.confidence_threshold!r}` do not "
                f"apply (it follows {' / '.join(map(repr, self.schedules))}, without a threshold). Remove them."
            )
        super().__init__(input_ids, assistant_model, *args, **kwargs)  # output_hidden_states: zero-width states

    def propose(self, rows: list[torch.Tensor], limits: list[int]) -> list[torch.Tensor]:
        """Each row's proposed tokens (at most its limit) after its tokens ``rows[b]`` (no padding): the drafter's own
        ``propose(rows, limits)``, so a new point-mass drafter is one class with that method, registered with this
        generator (:func:`~diversed_hf.drafting.protocol.register_drafter`)."""
        if not proposes_from_rows(self.draft_model):
            raise TypeError(
                f"{type(self.draft_model).__name__} is registered with a point-mass generator but has no "
                "`propose(rows, limits)` method returning each row's proposed token ids: add it."
            )
        return self.draft_model.propose(rows, limits)

    def edit_cache(self, input_ids: torch.Tensor, realignment: Realignment | None) -> None:
        """No cache kept across rounds: the next round reads the sequence as it is."""

    def get_candidates(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs):
        self._check_round_start(input_ids)
        if attention_mask is None:
            attention_mask = self._prompt_mask_to(input_ids)
        batch_size, length = input_ids.shape
        rows = [input_ids[b][attention_mask[b].bool()] for b in range(batch_size)]
        proposed = self.propose(rows, self.draft_lengths.tolist())  # at most N_b each
        width = max((row.numel() for row in proposed), default=0)  # N_r
        lengths = torch.tensor([row.numel() for row in proposed], dtype=torch.long, device=input_ids.device)
        drafts = input_ids.new_zeros(batch_size, width)  # filler after a row's own drafts: verified, never counted
        for b, row in enumerate(proposed):
            drafts[b, : row.numel()] = row
            drafts[b, row.numel() :] = input_ids[b, -1]
        candidate_ids = torch.cat([input_ids, drafts], dim=1)  # (batch, L + N_r)
        candidate_mask = torch.cat([attention_mask, torch.ones_like(drafts)], dim=1)
        lengths = self._allowed_lengths(candidate_ids, length, lengths)
        width = int(lengths.max()) if batch_size else 0  # a forbidden token may have shortened every row
        candidate_ids, candidate_mask, drafts = (
            candidate_ids[:, : length + width],
            candidate_mask[:, : length + width],
            drafts[:, :width],
        )
        self.draft_lengths = lengths
        self.awaiting_update = True
        logits = None
        if width:  # point masses: 0 at the proposed token, -inf elsewhere (softmax is one-hot)
            logits = torch.full((batch_size, width, self.vocab_size), float("-inf"), device=input_ids.device)
            logits.scatter_(2, drafts[:, :, None], 0.0)
        probs = None if logits is None or not self.output_untempered_probs else logits.softmax(dim=-1)
        # no hidden state: a head for this drafter reads the target's alone (draft_hidden_size 0)
        hidden = input_ids.new_zeros(batch_size, width, 0, dtype=torch.float32) if self.output_hidden_states else None
        return DraftCandidates(
            candidate_ids,
            logits,
            draft_lengths=lengths,
            attention_mask=candidate_mask,
            draft_hidden=hidden,
            untempered_draft_probs=probs,
        )

    def _allowed_lengths(self, candidate_ids: torch.Tensor, length: int, lengths: torch.Tensor) -> torch.Tensor:
        """Each row's draft count cut before its first copied token the logits processors forbid."""
        if not len(self.logits_processor) or candidate_ids.shape[1] == length:
            return lengths
        ones = torch.zeros(candidate_ids.shape[0], self.vocab_size, device=candidate_ids.device)  # (batch, vocab)
        allowed = lengths.clone()
        for step in range(candidate_ids.shape[1] - length):
            scores = self.logits_processor(candidate_ids[:, : length + step], ones.clone())  # (batch, vocab)
            token = candidate_ids[:, length + step]  # (batch,)
            score = scores.gather(1, token[:, None]).squeeze(1)  # (batch,)
            forbidden = (score <= torch.finfo(score.dtype).min) & (allowed > step)  # -inf, or the dtype's lowest
            allowed = torch.where(forbidden, torch.full_like(allowed, step), allowed)
        return allowed


class LookupCandidateGenerator(PointMassCandidateGenerator):
    """Prompt-lookup drafting for the batched loop: each row copies the tokens that followed the first earlier
    occurrence of its last n-gram (:func:`lookup_continuations`), none without a match. Arguments as
    :class:`PointMassCandidateGenerator`, with a :class:`PromptLookup` as ``assistant_model`` (its ``propose``)."""

    drafter_name = "prompt lookup (`prompt_lookup_num_tokens`)"


# copies of the sequence's own ids: no vocabulary to check, no hidden state; a fixed length (its `num_tokens`)
register_drafter(
    PromptLookup,
    proposes_target_ids=True,
    drafts_fixed_length=True,
    candidate_generator=LookupCandidateGenerator,
    described_as="prompt lookup",
    built_as="PromptLookup(N)",
)
register_drafter(EarlyExitDraft)  # the target's first layers: a draft model for every purpose
