"""Drafting from the target's features: the candidate generator of an :class:`~diversed_hf.drafting.eagle.EagleDraft`.

:class:`FeatureCandidateGenerator` is a :class:`~diversed_hf.drafting.candidates.DiversedCandidateGenerator` (same
contract, draft-length knobs, policies, statistics) whose draft reads, besides each token, the feature of the column
before it (``docs/eagle.md``). Within the batched loop's layout (:mod:`diversed_hf.generation.loop`: rows left-padded
and right-aligned, ``seq`` ``(B, L)``, the target cache holding columns ``[0, L - 1)``):

- ``features`` ``(B, L, d)`` holds, at column ``j``, the target's last hidden state at column ``j - 1`` (column 0 and
  the columns after padding: zeros). The loop fills it with a target pass over the prompt minus its last token before
  the first round (the verification passes then feed only ``[last token, drafts]``, so the prompt is read once), and
  extends it after every round with the hidden states the verification pass already computed (``target_hidden`` of
  :meth:`~diversed_hf.drafting.candidates.DiversedCandidateGenerator.update_candidate_strategy`): no extra target
  forward. It lives in a buffer preallocated for the whole call: a round writes its ``N_r + 1`` columns in place, so a
  round costs O(N) here, not O(L); only a round that drops rows, shifts them or drops leading padding (batches) rebuilds
  it, as it edits the caches.
- The draft cache holds only columns computed from the **target's** features. A round's first draft pass feeds
  every column the cache lacks with its target feature (the prompt in the first round, then the accepted drafts and
  the recovered/bonus token: ``A + 1`` columns); later draft steps feed the draft's own predicted feature of the step
  before. After verification the cache is cropped back to the round's start ``L`` (before the realignment's shift),
  dropping the columns computed from the draft's own features.
- ``q_t`` is the distribution each draft token was drawn from, over the target's vocabulary (0 outside the draft's
  ids), so lossless verification keeps the target's law; a head reads ``h^q_t`` = the predicted feature ``f_t``.

transformers' own ``_assisted_decoding`` (5.24) can drive it too, at batch 1, through its contract for generators
that read the target: :attr:`~FeatureCandidateGenerator.requires_model_outputs` asks the loop for the hidden states of
each verification pass (``model_kwargs_overrides``) and to pass its outputs to ``get_candidates(...,
model_outputs=..., is_first_iteration=..., n_last_matches=...)``. The first call, before any target pass, drafts
nothing (the target reads the prompt and emits one token); each later call appends the features of the columns the
last round kept. transformers offers no public way to choose its loop's generator, so users run the draft through the
batched loop (``generate(..., assistant_model=eagle_draft)``); ``tests/test_candidate_contract.py`` drives it through
transformers' loop with :func:`diversed_hf.compat.assisted_decoding_candidates`.
"""

from __future__ import annotations

import torch

from .. import compat
from .candidates import DiversedCandidateGenerator, DraftCandidates, Realignment
from .protocol import capabilities_of

__all__ = ["FeatureCandidateGenerator"]


class FeatureCandidateGenerator(DiversedCandidateGenerator):
    """Drafts with a draft that reads the target's features (an :class:`~diversed_hf.drafting.eagle.EagleDraft`).

    Arguments as :class:`~diversed_hf.drafting.candidates.DiversedCandidateGenerator`. Before the first round the loop
    calls :meth:`set_target_features` with the target's hidden states of the prompt minus its last token; after each
    round ``update_candidate_strategy(..., target_hidden=...)`` hands over the verification pass's.
    """

    reads_target_features = True
    #: transformers' contract for a generator that reads the target's outputs (its ``_assisted_decoding``)
    requires_model_outputs = True
    model_kwargs_overrides = {"output_hidden_states": True}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.driven_by_transformers = False  # features arrive with get_candidates' model_outputs, not the loop's
        self.buffer: torch.Tensor | None = None  # (B, capacity, d): column j, the target's feature of column j - 1
        self.length = 0  # the columns of ``buffer`` in use: L
        self.round_length: int | None = None  # L of the round being drafted
        self.round_hidden: torch.Tensor | None = None  # (B, N_r + 1, d) the verification pass's features
        self.step_features: torch.Tensor | None = None  # (B, 1, d) the draft's own feature for its next step

    #: columns the draft cache lags behind the round's start L: 0 for a draft that reads each column's feature with
    #: the token after it (an EagleDraft), 1 for a block draft whose cache holds the columns before the last token
    context_lag = 0

    def target_features(self, hidden_states: tuple) -> torch.Tensor:  # (B, T, d)
        """The features this draft reads from a target pass's ``hidden_states``: the draft says which
        (``target_features``: an EAGLE-3 draft stacks several layers), else the last layer's."""
        if capabilities_of(self.draft_model).selects_features:
            return self.draft_model.target_features(hidden_states)
        return hidden_states[-1]

    @property
    def feature_size(self) -> int:
        config = self.draft_model.config
        return getattr(config, "target_feature_size", config.hidden_size)

    def set_target_features(
        self,
        hidden: torch.Tensor | None,  # (B, L - 1, d) the target's features at columns [0, L - 1); None: L = 1
        attention_mask: torch.Tensor,  # (B, L)
    ) -> None:
        """The target's features of the prompt (all but its last column), zero after padding columns."""
        if hidden is None:
            dtype = getattr(self.draft_model, "dtype", torch.float32)
            hidden = attention_mask.new_zeros(attention_mask.shape[0], 0, self.feature_size, dtype=dtype)
        real = attention_mask[:, : hidden.shape[1], None].to(hidden.dtype)  # (B, L - 1, 1)
        batch_size, length, size = hidden.shape[0], hidden.shape[1] + 1, hidden.shape[2]
        # room for every token the call may emit (a round drafts at most a row's remaining budget), without
        # reallocating in the common case; edit_cache grows it if a batch's rows outrun it
        capacity = length + int(self.remaining.max()) + 1 if batch_size else length
        self.buffer = hidden.new_zeros(batch_size, capacity, size)
        self.buffer[:, 1:length] = hidden * real
        self.length = length

    @property
    def features(self) -> torch.Tensor | None:  # (B, L, d)
        """The target's features of the sequence's columns: column ``j`` holds that of column ``j - 1``."""
        return None if self.buffer is None else self.buffer[:, : self.length]

    def get_candidates(
        self,
        input_ids: torch.Tensor,  # (B, L)
        attention_mask: torch.Tensor | None = None,  # (B, L)
        model_outputs=None,  # transformers' loop: the target's outputs of the last pass
        is_first_iteration: bool | None = None,  # transformers' loop: before any target pass
        n_last_matches=None,  # transformers' loop: drafts the last round kept
        **kwargs,
    ):
        if is_first_iteration is not None:  # transformers' loop hands the target's outputs here (its contract)
            self.driven_by_transformers = True
            if is_first_iteration:  # no features yet: the target reads the prompt first and emits one token
                return self._no_drafts(input_ids, attention_mask)
            self._take_target_outputs(input_ids, model_outputs, n_last_matches)
        if self.features is None:
            raise ValueError(
                "This draft reads the target's hidden states (an EagleDraft), which transformers' own assisted "
                "decoding does not pass to a candidate generator: run it through diversed_hf's loop, "
                "`target.generate(..., assistant_model=draft)` on a model with `enable_diversed`."
            )
        if self.features.shape[1] != input_ids.shape[1]:
            raise ValueError(
                f"The draft has the target's features of {self.features.shape[1]} columns and `input_ids` has "
                f"{input_ids.shape[1]}: pass each round's `target_hidden` to `update_candidate_strategy`."
            )
        self.round_length = input_ids.shape[1]
        self.step_features = None
        return super().get_candidates(input_ids, attention_mask, **kwargs)

    def draft_forward(
        self,
        chunk: torch.Tensor,  # (B, chunk)
        attention_mask: torch.Tensor,  # (B, cached + chunk)
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (B, V) logits of the next token, (B, d) the predicted feature
        if self.step_features is None:  # the round's first pass: every column the cache lacks, with target features
            cached = self.cache.get_seq_length()
            features = self.features[:, cached : cached + chunk.shape[1]]  # (B, chunk, d)
        else:
            features = self.step_features  # (B, 1, d)
        out = compat.forward_with_cache(
            self.draft_model,
            chunk,
            attention_mask,
            self.cache,
            logits_to_keep=1,
            output_hidden_states=False,
            target_hidden=features,
        )
        self.step_features = out.last_hidden_state[:, -1:]  # (B, 1, d)
        return out.logits[:, -1], self.step_features[:, 0]

    def _no_drafts(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> DraftCandidates:
        """A round without drafts (``candidate_logits`` ``None``), as transformers' generators return one."""
        self._check_round_start(input_ids)
        self.round_length = input_ids.shape[1]
        self.awaiting_update = True
        mask = attention_mask if attention_mask is not None else self._prompt_mask_to(input_ids)
        return DraftCandidates(input_ids, None, draft_lengths=torch.zeros_like(self.draft_lengths), attention_mask=mask)

    def _take_target_outputs(self, input_ids: torch.Tensor, model_outputs, n_last_matches) -> None:
        """transformers' loop: the features of the columns its last pass kept (the prompt after the first pass,
        then the last token and the accepted drafts of each round)."""
        hidden = getattr(model_outputs, "hidden_states", None)
        if not hidden:
            raise ValueError(
                "transformers' loop passed no target hidden states to this generator: it asks for them with "
                "`model_kwargs_overrides` (transformers >= 5.24's `requires_model_outputs` contract)."
            )
        hidden = self.target_features(hidden)  # (B, columns fed, d)
        if self.buffer is None:  # the first pass read the whole prompt
            self.set_target_features(hidden, self._prompt_mask_to(input_ids))
        else:
            self._append_features(hidden[:, : int(n_last_matches) + 1])

    def _append_features(self, hidden: torch.Tensor) -> None:  # (B, k, d)
        """Write ``k`` new columns after the buffer's last, growing it (doubling) when full."""
        end = self.length + hidden.shape[1]
        if end > self.buffer.shape[1]:
            grown = self.buffer.new_zeros(
                self.buffer.shape[0], max(end, 2 * self.buffer.shape[1]), self.buffer.shape[2]
            )
            grown[:, : self.length] = self.buffer[:, : self.length]
            self.buffer = grown
        self.buffer[:, self.length : end] = hidden
        self.length = end

    def observe_target_features(self, target_hidden, num_matches, realignment) -> None:
        if target_hidden is None and self.driven_by_transformers:
            return  # they come with the next get_candidates' model_outputs
        if target_hidden is None:
            raise ValueError(
                "`update_candidate_strategy` needs `target_hidden=` (the target's last hidden states of the round's "
                "verified columns) for a draft that reads them."
            )
        self.round_hidden = target_hidden

    def edit_cache(self, input_ids: torch.Tensor, realignment: Realignment | None) -> None:
        if realignment is None and self.driven_by_transformers:  # batch 1, no shifts: back to the round's start
            compat.crop_cache(self.cache, self.round_length - self.context_lag)
            return
        if realignment is None:
            raise ValueError(
                "A draft that reads the target's features runs in diversed_hf's batched loop, which passes "
                "`realignment=` to `update_candidate_strategy`."
            )
        # columns [0, L + N_r] of the round: the stored features, then the verification pass's, written in place
        self._append_features(self.round_hidden)  # the buffer held the round's L columns
        if realignment.only_crops:
            self.length = realignment.new_length  # O(N_r) this round
        else:  # rows dropped, shifted or trimmed: rebuilt, as the caches are
            realigned = realignment.apply(self.buffer[:, : self.length])  # (kept, L', d)
            self.buffer = realigned.new_zeros(realigned.shape[0], self.buffer.shape[1], realigned.shape[2])
            self.buffer[:, : realigned.shape[1]] = realigned
            self.length = realigned.shape[1]
        # entries up to the round's start were computed from the target's features; later ones from the draft's own
        realignment.edit_cache(self.cache, length=self.round_length - self.context_lag)
        self.round_hidden = None
