"""Batched sampling from the DIVERSED mixture ``nu_theta``: the rollouts that train a head (docs/method.md §5).

Speculative decoding against ``nu`` emits tokens distributed as ``nu`` at drafted positions, so
plain autoregressive sampling from

    nu_t(x) = w_t p_t(x) + (1 - w_t) q_t(x),   w_t = head(h^q_t, h^p_t, f_t)

is an equivalent and cheaper rollout. Both frozen models run one token per step with their own
KV cache; ``p_t`` / ``q_t`` are their next-token distributions after the *same* processors
(temperature, then top-k, then top-p, as transformers orders them), ``h^p_t`` / ``h^q_t``
their last-layer hidden states at the position that produced them and ``f_t`` the head's
distribution features of ``(p_t, q_t)`` (:func:`diversed_hf.verifiers.distribution_features.distribution_features`, the
function the verifier calls on the same processed distributions) -- exactly the inputs the head
sees inside ``generate`` (see :mod:`diversed_hf.generation`). A head that reads no hidden states
gets none: the models are not asked for them and the rollout keeps zero-width tensors.

Because the models are frozen, everything the loss needs besides the head is fixed by the rollout:
``p_t(x_t)``, ``q_t(x_t)``, ``TV(p_t, q_t)``, the two hidden states and the features. :class:`Rollout`
keeps exactly those, so a loss evaluation (and every PPO inner epoch) runs only the head:

    log nu_theta(x_t) = log(w_theta,t p_t(x_t) + (1 - w_theta,t) q_t(x_t))
    acceptance_t      = 1 - TV(q_t, nu_theta,t) = 1 - w_theta,t TV(p_t, q_t)

and temperature is applied identically in rollouts and log-probabilities by construction.
Only the probability-space mixture (``mixing="probs"``, the paper's) is supported here: the
geometric pool of the official code needs whole distributions and has no such closed forms.

A draft that reads the target's features (an :class:`~diversed_hf.drafting.eagle.EagleDraft`) gets, at every step, the
target's last hidden state of the column before each token it reads, as at a round's first drafted position in
``generate``; ``h^q_t`` is its predicted feature. Inside ``generate`` the later drafted positions of a round read the
draft's own predicted features instead, so there ``q_t`` drifts a little from the rollout's: the verifier's law is
exact either way, and the rollout trains the head on the round's first-position ``q`` (docs/training.md).

Rows with the same prompt (the ``G`` samples of a group) share one prefill: each distinct prompt is read once and
its caches copied to its rows, which saves ``G - 1`` of every ``G`` prompt passes on long prompts.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from .. import compat
from ..common.pairs import draft_input_ids
from ..drafting.protocol import capabilities_of, proposes_from_rows, verification_vocab
from ..verifiers import ops
from ..verifiers.distribution_features import distribution_features

__all__ = ["Rollout", "sample_from_mixture", "mixture_logprobs", "build_logits_warpers"]


@dataclass
class Rollout:
    """Completions sampled from ``nu`` and the frozen quantities the training loss needs.

    ``T`` is the longest completion of the batch; positions after a row's end are padding
    (``completion_mask`` 0). A row ends after its first EOS token (kept, and trained on) or after
    ``max_new_tokens`` tokens.
    """

    prompt_ids: torch.Tensor  # (B, P) left-padded
    prompt_mask: torch.Tensor  # (B, P)
    completion_ids: torch.Tensor  # (B, T) pad after the end
    completion_mask: torch.Tensor  # (B, T) 1 on sampled tokens (EOS included)
    target_token_probs: torch.Tensor  # (B, T) p_t(x_t) after processors
    draft_token_probs: torch.Tensor  # (B, T) q_t(x_t) after processors
    total_variation: torch.Tensor  # (B, T) TV(p_t, q_t)
    draft_hidden: torch.Tensor  # (B, T, d_draft) h^q_t; (B, T, 0) for a head without hidden states
    target_hidden: torch.Tensor  # (B, T, d_target) h^p_t; (B, T, 0) for a head without hidden states
    features: torch.Tensor  # (B, T, F) the head's distribution features f_t; (B, T, 0) without features
    target_weight: torch.Tensor  # (B, T) w_t the head gave while sampling
    logprobs: torch.Tensor  # (B, T) log nu_t(x_t) while sampling

    def to_dict(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def build_logits_warpers(
    temperature: float = 1.0, top_k: int | None = 0, top_p: float | None = 1.0
) -> LogitsProcessorList:
    """transformers' sampling warpers in transformers' order (temperature, top-k, top-p); empty for plain sampling."""
    if temperature is None or temperature <= 0:
        raise ValueError(f"`temperature` must be > 0 for sampling, got {temperature!r}.")
    warpers = LogitsProcessorList()
    if temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(float(temperature)))
    if top_k:
        warpers.append(TopKLogitsWarper(int(top_k), min_tokens_to_keep=1))
    if top_p is not None and top_p < 1.0:
        warpers.append(TopPLogitsWarper(float(top_p), min_tokens_to_keep=1))
    return warpers


def mixture_logprobs(
    target_weight: torch.Tensor,  # (B, T)
    target_token_probs: torch.Tensor,  # (B, T)
    draft_token_probs: torch.Tensor,  # (B, T)
) -> torch.Tensor:  # (B, T)
    """log nu(x_t) = log(w p(x_t) + (1 - w) q(x_t)) at the sampled tokens (float32, floored at the smallest normal)."""
    w = target_weight.float()
    mixed = w * target_token_probs.float() + (1.0 - w) * draft_token_probs.float()  # (B, T)
    return mixed.clamp(min=torch.finfo(torch.float32).tiny).log()


def check_trainable_mixing(head) -> None:
    """Training samples from and scores ``nu = w p + (1 - w) q``: a head that mixes logits is refused."""
    if getattr(getattr(head, "config", None), "mixing", "probs") != "probs":
        raise ValueError(
            "Training supports only heads with `mixing='probs'` (the paper's mixture): the logit-space pool of the "
            "official code has no closed-form acceptance. Build the head with `mixing='probs'`."
        )


class _MixtureStep:
    """One token of :func:`sample_from_mixture` for every row: both models' pass over ``chunk`` on their caches, the
    head's ``w``, a token drawn from ``nu``, and what the rollout records of it."""

    def __init__(self, target, draft, head, caches, warpers, vocab_size, needs_hidden, feature_names, generator):
        self.target, self.draft, self.head = target, draft, head
        self.target_cache, self.draft_cache = caches
        self.warpers, self.vocab_size, self.generator = warpers, vocab_size, generator
        self.needs_hidden, self.feature_names = needs_hidden, feature_names
        capabilities = capabilities_of(draft)
        self.reads_features = capabilities.reads_target_features  # an EagleDraft
        self.reads_cache = capabilities.reads_target_cache  # a Gemma 4 assistant
        self.lookup = draft if capabilities.proposes_target_ids else None  # prompt lookup: point masses, no model
        self.last_feature = None  # (B, 1, d) the target's feature of the column before the next chunk
        parameter = next(head.parameters())
        self.head_place = dict(device=parameter.device, dtype=parameter.dtype)

    def draft_features(self, target_hidden: torch.Tensor, chunk_mask: torch.Tensor) -> torch.Tensor:
        """``(B, chunk, d)``: for each column of the chunk, the target's last hidden state of the column before it
        (zeros before the first column and after padding), as :class:`~diversed_hf.FeatureCandidateGenerator`
        builds them."""
        hidden = target_hidden * chunk_mask[:, :, None].to(target_hidden.dtype)  # (B, chunk, d)
        before = hidden.new_zeros(hidden[:, :1].shape) if self.last_feature is None else self.last_feature
        self.last_feature = hidden[:, -1:]
        return torch.cat([before, hidden[:, :-1]], dim=1)

    def lookup_logits(self, seq, mask, target_logits) -> torch.Tensor:  # (B, V)
        """The point-mass drafter's proposal for the next token of each row (prompt lookup: the token it copies), or,
        for a row it proposes nothing for (the loop drafts nothing there), the target's own logits, so that
        ``nu_t = p_t`` whatever ``w_t``."""
        logits = target_logits.clone()  # (B, V)
        proposed = self.lookup.propose([seq[b][mask[b].bool()] for b in range(seq.shape[0])], [1] * seq.shape[0])
        for b, copied in enumerate(proposed):  # the drafter's own proposal, as the loop's generator asks for it
            if copied.numel():
                logits[b] = float("-inf")
                logits[b, copied[0]] = 0.0
        return logits

    def distinct_prompts(self, chunk, mask):
        """``(chunk, mask, rows)``: at the prefill, each distinct prompt once (a group's G samples share one) and the
        prompt of each row (``rows`` (B,)); ``rows`` is None when every row is read as it is."""
        if self.target_cache.get_seq_length() != 0:
            return chunk, mask, None
        batch_size, device = chunk.shape[0], chunk.device
        distinct, rows = torch.unique(torch.cat([chunk, mask], dim=1), dim=0, return_inverse=True)  # rows: (B,)
        if distinct.shape[0] == batch_size:
            return chunk, mask, None
        first = torch.full((distinct.shape[0],), batch_size, dtype=torch.long, device=device)
        first = first.scatter_reduce(0, rows, torch.arange(batch_size, device=device), reduce="amin")
        return chunk[first], mask[first], rows

    def forward(self, chunk, mask):
        """Both models' pass over ``chunk``: ``(target_out, draft_out)`` (``draft_out`` None for prompt lookup)."""
        target_out = compat.forward_with_cache(
            self.target,
            chunk,
            mask,
            self.target_cache,
            logits_to_keep=1,
            output_hidden_states=self.needs_hidden or self.reads_features,
        )
        extra = {}
        if self.reads_features:
            chunk_mask = mask[:, -chunk.shape[1] :]  # (B, chunk)
            extra["target_hidden"] = self.draft_features(target_out.hidden_states[-1], chunk_mask)
        if self.lookup is not None:  # no draft pass: the copied token
            return target_out, None
        if self.reads_cache:  # a Gemma 4 assistant: the target's keys and values
            return target_out, self.draft.from_target_cache(chunk, mask, self.target_cache, extra["target_hidden"])
        draft_out = compat.forward_with_cache(
            self.draft,
            draft_input_ids(self.draft, chunk, self.vocab_size),
            mask,
            self.draft_cache,
            logits_to_keep=1,
            output_hidden_states=self.needs_hidden,
            **extra,
        )
        return target_out, draft_out

    def last_states(self, target_out, draft_out, rows):
        """``(target logits, draft logits or None, target hidden, draft hidden)`` at the last column, each row's
        (its prompt's after a shared prefill: the caches are spread to every row too)."""
        target_logits = target_out.logits[:, -1]  # (B, V_target)
        draft_logits = None if draft_out is None else draft_out.logits[:, -1]  # (B, V_draft)
        if self.needs_hidden:
            target_hidden = target_out.hidden_states[-1][:, -1]  # (B, d_target)
            draft_hidden = (  # (B, d_draft); width 0 for prompt lookup
                target_hidden[:, :0] if draft_out is None else draft_out.hidden_states[-1][:, -1]
            )
        else:
            target_hidden = draft_hidden = target_logits.new_zeros(target_logits.shape[0], 0)  # (B, 0)
        if rows is not None:  # every row gets its prompt's caches and outputs
            self.target_cache.batch_select_indices(rows)
            self.draft_cache.batch_select_indices(rows)
            target_logits = target_logits[rows]
            draft_logits = None if draft_logits is None else draft_logits[rows]
            target_hidden, draft_hidden = target_hidden[rows], draft_hidden[rows]
            if self.last_feature is not None:
                self.last_feature = self.last_feature[rows]
        return target_logits, draft_logits, target_hidden, draft_hidden

    def __call__(self, seq, chunk, mask, finished, pad_token_id, records) -> torch.Tensor:  # (B,) the tokens
        device, vocab_size = seq.device, self.vocab_size
        full_mask = mask  # (B, L): the prefill below may read distinct prompts only
        chunk, mask, rows = self.distinct_prompts(chunk, mask)
        target_out, draft_out = self.forward(chunk, mask)
        target_logits, draft_logits, target_hidden, draft_hidden = self.last_states(target_out, draft_out, rows)
        if self.lookup is not None:
            draft_logits = self.lookup_logits(seq, full_mask, target_logits[:, :vocab_size])  # (B, V)
        target_scores = target_logits[:, :vocab_size].float()  # (B, V)
        draft_scores = ops.fit_vocabulary(draft_logits, vocab_size).float()  # (B, V)
        if len(self.warpers):
            target_scores = self.warpers(seq, target_scores)
            draft_scores = self.warpers(seq, draft_scores)
        target_probs = target_scores.softmax(dim=-1)  # (B, V)
        draft_probs = draft_scores.softmax(dim=-1)  # (B, V)
        # (B, F), as the verifier computes them
        features = distribution_features(draft_probs, target_probs, self.feature_names)
        inputs = (draft_hidden[:, None], target_hidden[:, None], features[:, None])  # (B, 1, d_draft | d_target | F)
        w = self.head(*(x.to(**self.head_place) for x in inputs))[:, 0].to(device=device, dtype=torch.float32)  # (B,)
        mixture = ops.mix_probs(draft_probs, target_probs, w)  # (B, V)
        token = ops.sample(mixture, self.generator)  # (B,)
        token = torch.where(finished, torch.full_like(token, pad_token_id), token)

        head_device = self.head_place["device"]
        records["ids"].append(token)
        records["live"].append(~finished)
        records["p"].append(target_probs.gather(1, token[:, None])[:, 0])
        records["q"].append(draft_probs.gather(1, token[:, None])[:, 0])
        records["tv"].append(ops.total_variation(target_probs, draft_probs))
        records["hq"].append(draft_hidden.to(head_device))
        records["hp"].append(target_hidden.to(head_device))
        records["f"].append(features.to(head_device))
        records["w"].append(w)
        records["logp"].append(mixture.gather(1, token[:, None])[:, 0].clamp(min=torch.finfo(torch.float32).tiny).log())
        return token


@torch.no_grad()
def sample_from_mixture(
    target,
    draft,
    head,
    input_ids: torch.Tensor,  # (B, P) left-padded
    attention_mask: torch.Tensor | None = None,  # (B, P)
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = 0,
    top_p: float | None = 1.0,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int = 0,
    vocab_size: int | None = None,
    generator: torch.Generator | None = None,
) -> Rollout:
    """Sample ``max_new_tokens`` (or up to EOS) from ``nu_theta`` for every row; see :class:`Rollout`.

    ``head`` (a :class:`~diversed_hf.heads.head.DiversedHead`) maps ``(draft_hidden, target_hidden, features)`` of
    shapes ``(B, 1, d)`` to ``w`` ``(B, 1)``; it is called in no-grad mode on its own device and dtype. The
    models may live on another device.
    """
    if max_new_tokens < 1:
        raise ValueError(f"`max_new_tokens` must be >= 1, got {max_new_tokens}.")
    check_trainable_mixing(head)
    capabilities = capabilities_of(draft)
    if capabilities.proposes_target_ids and not proposes_from_rows(draft):
        raise ValueError(
            f"`draft` is a {type(draft).__name__}, which proposes the target's ids through its own candidate "
            "generator: the trainer's rollouts run point-mass drafters that propose from the rows (`propose(rows, "
            "limits)`, as PromptLookup does). Train a head for a draft model of the target's tokenizer instead."
        )
    if capabilities.drafts_blocks:
        raise ValueError(
            f"`draft` is a {type(draft).__name__}, a block draft: the trainer's rollouts score one token at a time "
            "and do not run block drafts yet. A head verifies its drafts in `generate`; train it with a token draft."
        )
    device = input_ids.device
    batch_size = input_ids.shape[0]
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if vocab_size is None:
        vocab_size = verification_vocab(target, draft)  # raises if the two models do not share token ids
    eos = torch.tensor(
        [] if eos_token_id is None else ([eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)),
        device=device,
        dtype=torch.long,
    )
    warpers = build_logits_warpers(temperature, top_k, top_p)
    needs_hidden = bool(getattr(head.config, "use_hidden_states", True))
    feature_names = list(getattr(head.config, "features", []))

    seq, mask = input_ids, attention_mask.to(input_ids.dtype)  # (B, L), growing
    caches = (compat.new_cache(), compat.new_cache())  # target's, draft's
    chunk = input_ids  # the prefill feeds the whole prompt
    finished = torch.zeros(batch_size, dtype=torch.bool, device=device)  # (B,)
    records: dict[str, list[torch.Tensor]] = {
        k: [] for k in ("ids", "live", "p", "q", "tv", "hq", "hp", "f", "w", "logp")
    }
    step = _MixtureStep(target, draft, head, caches, warpers, vocab_size, needs_hidden, feature_names, generator)
    for _ in range(max_new_tokens):
        token = step(seq, chunk, mask, finished, pad_token_id, records)  # (B,)
        finished = finished | torch.isin(token, eos)
        if bool(finished.all()):
            break
        seq = torch.cat([seq, token[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        chunk = token[:, None]  # (B, 1)

    live = torch.stack(records["live"], dim=1)  # (B, T)
    return Rollout(
        prompt_ids=input_ids,
        prompt_mask=attention_mask,
        completion_ids=torch.stack(records["ids"], dim=1),
        completion_mask=live.long(),
        target_token_probs=torch.stack(records["p"], dim=1),
        draft_token_probs=torch.stack(records["q"], dim=1),
        total_variation=torch.stack(records["tv"], dim=1),
        draft_hidden=torch.stack(records["hq"], dim=1),
        target_hidden=torch.stack(records["hp"], dim=1),
        features=torch.stack(records["f"], dim=1),
        target_weight=torch.stack(records["w"], dim=1),
        logprobs=torch.stack(records["logp"], dim=1),
    )
