"""DFlash block drafts (``generate(..., assistant_model=dflash, speculation_type="dflash")``) in the batched loop.

A DFlash draft (transformers' ``DFlashTokenCandidateGenerator``; e.g. ``MuseGlimmerAssistantModel``) drafts a whole
block in one forward: its cache holds the target's hidden states of several layers (``config.target_layer_ids``,
concatenated and projected) for every column before the round's last token, and a block of ``block_size`` queries,
the last token followed by ``block_size - 1`` mask tokens, attends to that cache and to itself bidirectionally. The
target's LM head scores the block's last ``block_size - 1`` outputs: one distribution per draft position.

:class:`DFlashDraft` runs it through :class:`BlockCandidateGenerator`, a
:class:`~diversed_hf.drafting.feature_candidates.FeatureCandidateGenerator` whose features are those layers' hidden
states (each verification pass already computes them) and whose cache lags one column (the last token is the block's
anchor):

- each draft position's token is sampled from that position's distribution (or taken greedily at T = 0). The block
  is drawn in one pass, so position ``t``'s token is drawn from ``q_t`` whatever the earlier drafts are, and ``q_t``
  is what verification receives: lossless SD keeps the target's law, a relaxed verifier emits its declared mixture;
- a round drafts at most ``block_size - 1`` tokens (the default, as transformers); ``num_assistant_tokens`` may ask
  for fewer, never more;
- the block's outputs are the draft's hidden states (of the target's width: its LM head reads them), so heads apply;
- rows advance independently at any batch size (transformers' path is batch 1), the block's masks carrying each row's
  padding.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import GenerationConfig

from .. import compat
from ..verifiers.checks import is_integer
from .feature_candidates import FeatureCandidateGenerator
from .protocol import register_drafter

__all__ = ["BlockCandidateGenerator", "DFlashDraft", "looks_like_block_draft"]


def looks_like_block_draft(model) -> bool:
    """Whether ``model``'s config is a DFlash block draft's (a block size, a mask token, the target layers it reads):
    such a draft runs only as ``speculation_type="dflash"``."""
    config = getattr(model, "config", None)
    return all(getattr(config, name, None) is not None for name in ("block_size", "mask_token_id", "target_layer_ids"))


class BlockCandidateGenerator(FeatureCandidateGenerator):
    """Drafts a :class:`DFlashDraft`'s block in the round's first step, then hands out its positions one by one."""

    context_lag = 1  # the draft cache holds the columns before the round's last token

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cache = compat.new_block_draft_cache()
        self.block: tuple[torch.Tensor, torch.Tensor] | None = None  # (B, block - 1, V) logits, (B, block - 1, d)
        self.block_step = 0

    def target_features(self, hidden_states: tuple) -> torch.Tensor:  # (B, T, k d)
        return torch.cat([hidden_states[index + 1] for index in self.draft_model.target_layer_ids], dim=-1)

    @property
    def feature_size(self) -> int:
        return len(self.draft_model.target_layer_ids) * self.draft_model.config.hidden_size

    def get_candidates(self, input_ids, attention_mask=None, **kwargs):
        self.draft_lengths = self.draft_lengths.clamp(max=self.draft_model.block_size - 1)  # a schedule may grow N
        self.block = None
        return super().get_candidates(input_ids, attention_mask, **kwargs)

    def draft_forward(
        self,
        chunk: torch.Tensor,  # (B, chunk): the columns the cache lacks in the first step, then the last draft
        attention_mask: torch.Tensor,  # (B, L + step)
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (B, V) logits of the step's position, (B, d) its block output
        if self.block is None:  # the round's first step: the whole block
            length = self.round_length  # L
            cached = self.cache.get_seq_length()
            context = self.features[:, cached + 1 : length]  # (B, L - 1 - cached, k d): columns [cached, L - 1)
            self.block = self.draft_model(chunk[:, -1:], context, attention_mask[:, :length], self.cache)
            self.block_step = 0
            self.step_features = self.block[1]  # not None: later steps of the round read the block
        logits, hidden = self.block
        step, self.block_step = self.block_step, self.block_step + 1
        return logits[:, step], hidden[:, step]


class DFlashDraft(nn.Module):
    """A DFlash block draft bound to its target, as the loop drafts with it.

    Built by ``generate(..., assistant_model=dflash, speculation_type="dflash", verifier=... | diversed_head=...)``;
    build it yourself to train a head for it: ``DiversedHead.for_pair(target, DFlashDraft(dflash, target))``.
    """

    def __init__(self, assistant, target):
        super().__init__()
        config = assistant.config
        target_config = target.config.get_text_config()
        block_size, mask_token_id = getattr(config, "block_size", None), getattr(config, "mask_token_id", None)
        layer_ids = getattr(config, "target_layer_ids", None)
        if not is_integer(block_size) or int(block_size) < 2 or not is_integer(mask_token_id) or not layer_ids:
            raise ValueError(
                f'`speculation_type="dflash"` needs a DFlash `assistant_model` whose config sets `block_size` (>= 2), '
                f"`mask_token_id` and `target_layer_ids`; {type(assistant).__name__} has block_size={block_size!r}, "
                f"mask_token_id={mask_token_id!r}, target_layer_ids={layer_ids!r}."
            )
        if config.hidden_size != target_config.hidden_size:
            raise ValueError(
                f"The DFlash draft's hidden size ({config.hidden_size}) is not the target's "
                f"({target_config.hidden_size}): the target's LM head scores its outputs. Pair it with the model it "
                "was trained for."
            )
        if not all(0 <= int(i) < target_config.num_hidden_layers for i in layer_ids):
            raise ValueError(
                f"The DFlash draft reads the target's layers {list(layer_ids)}, but the target has "
                f"{target_config.num_hidden_layers}: pair it with the model it was trained for."
            )
        if not 0 <= int(mask_token_id) < target_config.vocab_size:
            raise ValueError(
                f"The DFlash draft's `mask_token_id` ({mask_token_id}) is outside the target's vocabulary "
                f"({target_config.vocab_size} ids): pair it with the model it was trained for."
            )
        self.assistant = assistant
        self.__dict__["target"] = target  # not registered: the embeddings and LM head are the target's
        self.block_size, self.mask_token_id = int(block_size), int(mask_token_id)
        self.target_layer_ids = [int(i) for i in layer_ids]
        self.config = copy.deepcopy(target_config)  # the vocabulary and width its outputs are scored in
        self.generation_config = GenerationConfig(num_assistant_tokens=self.block_size - 1)
        self.fingerprint_extra = "DFlash block draft"

    def __repr__(self) -> str:
        return f"DFlashDraft({type(self.assistant).__name__}, block_size={self.block_size})"

    @property
    def device(self) -> torch.device:
        return next(self.assistant.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.assistant.parameters()).dtype

    def is_attached_to(self, target) -> bool:
        return target is self.target

    def attach_target(self, target) -> DFlashDraft:
        if target is not self.target:
            raise ValueError(
                "This DFlashDraft is bound to another target: build one for this target, `DFlashDraft(dflash, target)`."
            )
        return self

    def get_input_embeddings(self):
        return self.target.get_input_embeddings()

    def get_output_embeddings(self):
        return None  # the LM head is the target's

    def forward(
        self,
        anchor_ids: torch.Tensor,  # (B, 1) the round's last token
        context: torch.Tensor,  # (B, c, k d) the target's features of the c columns the cache lacks, before it
        attention_mask: torch.Tensor,  # (B, L): the cache's columns, the context's and the anchor's
        cache,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (B, block - 1, V) logits, (B, block - 1, d) block outputs
        """The block's distributions, one per draft position. The cache gains the context columns and is cropped back
        to them (the block's own keys and values are dropped)."""
        batch_size, length = attention_mask.shape
        mask_ids = anchor_ids.new_full((batch_size, self.block_size - 1), self.mask_token_id)
        noise = compat.embeddings_without_norm(self.get_input_embeddings(), torch.cat([anchor_ids, mask_ids], dim=1))
        positions = (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)  # (B, L)
        offsets = torch.arange(self.block_size, device=positions.device)  # (block,)
        position_ids = torch.cat(
            [positions[:, length - 1 - context.shape[1] : length - 1], positions[:, -1:] + offsets], dim=1
        )  # (B, c + block)
        block_mask = torch.cat([attention_mask[:, :-1], attention_mask.new_ones(batch_size, self.block_size)], dim=1)
        kept = cache.get_seq_length() + context.shape[1]
        hidden = compat.block_draft_forward(
            self.assistant,
            cache,
            noise_embeds=noise.to(self.dtype),
            context=context.to(self.dtype),
            attention_mask=block_mask,
            position_ids=position_ids,
        )[:, 1:]  # (B, block - 1, d)
        compat.crop_cache(cache, kept)
        logits = self.target.get_output_embeddings()(hidden.to(self.target.dtype))  # (B, block - 1, V)
        return logits, hidden


# a block per round from the target's layers; the trainer's rollouts, which score one token at a time, refuse it
register_drafter(
    DFlashDraft, reads_target_features=True, drafts_blocks=True, candidate_generator=BlockCandidateGenerator
)
