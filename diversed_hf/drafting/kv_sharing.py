"""A Gemma 4 assistant in the batched loop: a draft that reads the target's KV cache and features.

transformers' ``SinglePositionMultiTokenCandidateGenerator`` drives Gemma 4's assistant (``Gemma4AssistantForCausalLM``,
``Gemma4UnifiedAssistantForCausalLM``): from the round's last token ``x`` and the target's last hidden state at the
column before it, the assistant cross-attends to the target's own keys and values (``shared_kv_states``: the last
layer of each attention type) at a constant position, and drafts its tokens one after another, feeding back its own
projected hidden state. It has no cache and reads no prompt of its own.

:class:`KvSharingDraft` runs the same assistant in this project's loop, through :class:`KvSharingCandidateGenerator`:

- the target's features come as for an :class:`~diversed_hf.drafting.eagle.EagleDraft` (the verification pass's
  hidden states, kept by :class:`~diversed_hf.drafting.feature_candidates.FeatureCandidateGenerator`); the keys and
  values are read from the loop's own target cache, which between rounds holds exactly the columns before the round's
  last token, realigned per row: rows advance independently at any batch size (transformers' path is batch 1);
- each draft token is **sampled** from the assistant's distribution (or taken greedily at T = 0), and that
  distribution is what verification receives: lossless SD keeps the target's law and a relaxed verifier emits its
  declared mixture. transformers' own path takes the assistant's argmax and verifies it as if it had been sampled from
  the assistant's distribution, which is not the target's law at T > 0;
- the assistant's projected hidden state is the draft's hidden state: heads apply.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from .. import compat
from .eagle import EagleDraftOutput
from .feature_candidates import FeatureCandidateGenerator
from .protocol import register_drafter

__all__ = ["KvSharingCandidateGenerator", "KvSharingDraft", "is_kv_sharing_assistant"]

#: assistant classes that draft from the target's shared KV states (transformers' SinglePositionMultiToken generator)
KV_SHARING_ASSISTANTS = ("Gemma4AssistantForCausalLM", "Gemma4UnifiedAssistantForCausalLM")


def is_kv_sharing_assistant(model) -> bool:
    return type(model).__name__ in KV_SHARING_ASSISTANTS


class KvSharingCandidateGenerator(FeatureCandidateGenerator):
    """Drafts with a :class:`KvSharingDraft`: the round's last token and the target feature before it, then the
    assistant's own; keys and values from the loop's target cache (``target_cache``, set by the loop)."""

    reads_target_cache = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.target_cache = None  # the loop's: columns [0, L - 1) between rounds
        self.round_kv: dict | None = None
        self.round_mask: torch.Tensor | None = None  # (B, L - 1)
        self.round_positions: torch.Tensor | None = None  # (B, 1) the position of the round's last token

    def get_candidates(self, input_ids, attention_mask=None, **kwargs):
        if input_ids.shape[1] < 2 and kwargs.get("is_first_iteration") is None:
            # a one-token prompt: the target has no keys and values yet, so its first pass emits a token undrafted
            return self._no_drafts(input_ids, attention_mask)
        return super().get_candidates(input_ids, attention_mask, **kwargs)

    def draft_forward(
        self,
        chunk: torch.Tensor,  # (B, chunk): the sequence in the round's first step, then the last draft
        attention_mask: torch.Tensor,  # (B, L + step)
    ) -> tuple[torch.Tensor, torch.Tensor]:  # (B, V) logits of the next token, (B, d) the assistant's feature
        if self.step_features is None:  # the round's first step: its last token, the target's feature before it
            if self.target_cache is None:
                raise ValueError(
                    "A Gemma 4 assistant reads the target's KV cache: run it through diversed_hf's loop, "
                    "`target.generate(..., assistant_model=assistant, verifier=...)` on a model with `enable_diversed`."
                )
            length = self.round_length
            self.round_mask = attention_mask[:, : length - 1]
            self.round_kv = compat.shared_kv_states(self.target_cache, self.draft_model.producers, length - 1)
            self.round_positions = attention_mask[:, :length].long().sum(dim=-1, keepdim=True) - 1  # (B, 1)
            features = self.features[:, length - 1 : length]  # (B, 1, d) the target's feature of column L - 2
        else:
            features = self.step_features  # (B, 1, d)
        out = self.draft_model(
            chunk[:, -1:], features, self.round_mask, self.round_positions, shared_kv_states=self.round_kv
        )
        self.step_features = out.last_hidden_state[:, -1:]  # (B, 1, d)
        return out.logits[:, -1], self.step_features[:, 0]

    def edit_cache(self, input_ids, realignment) -> None:
        super().edit_cache(input_ids, realignment)  # the features buffer; the draft has no cache of its own
        self.round_kv = self.round_mask = self.round_positions = None


class KvSharingDraft(nn.Module):
    """A KV-sharing assistant (Gemma 4's) bound to its target, as the loop drafts with it.

    Built by ``generate(..., assistant_model=assistant, verifier=... | diversed_head=...)``; build it yourself to
    train a head for it: ``DiversedHead.for_pair(target, KvSharingDraft(assistant, target))``. Its hidden state (what
    a head reads) is the assistant's projected state, of the target's width.
    """

    def __init__(self, assistant, target):
        super().__init__()
        if not is_kv_sharing_assistant(assistant):
            raise ValueError(
                f"`assistant_model` must be one of {', '.join(KV_SHARING_ASSISTANTS)} for a KV-sharing draft, got "
                f"{type(assistant).__name__}."
            )
        producers = compat.kv_sharing_producers(target)
        if not producers:
            raise ValueError(
                f"`assistant_model` is a {type(assistant).__name__}, which reads the target's shared keys and values, "
                f"but the target ({type(target).__name__}) has no layer that stores them: pair it with the Gemma 4 "
                "model it was trained with."
            )
        backbone = getattr(assistant.config, "backbone_hidden_size", None)
        target_hidden = target.config.get_text_config().hidden_size
        if backbone != target_hidden:
            raise ValueError(
                f"`assistant_model` reads target features of width {backbone} (`backbone_hidden_size`), but the "
                f"target's hidden size is {target_hidden}: pair it with the Gemma 4 model it was trained with."
            )
        self.assistant = assistant
        self.__dict__["target"] = target  # not registered: the target's weights stay its own
        self.producers = producers
        config = copy.deepcopy(assistant.config.get_text_config())
        config.hidden_size = backbone  # the draft's hidden state: the assistant's projected state
        config._name_or_path = getattr(assistant.config, "_name_or_path", "")  # the assistant's id, as heads record
        self.config = config
        self.generation_config = assistant.generation_config  # its draft-length knobs (num_assistant_tokens)

    def __repr__(self) -> str:
        return f"KvSharingDraft({type(self.assistant).__name__}, {type(self.target).__name__})"

    @property
    def device(self) -> torch.device:
        return self.assistant.device

    @property
    def dtype(self) -> torch.dtype:
        return self.assistant.dtype

    def is_attached_to(self, target) -> bool:
        return target is self.target

    def attach_target(self, target) -> KvSharingDraft:
        if target is not self.target:
            raise ValueError(
                "This KvSharingDraft is bound to another target: build one for this target, "
                "`KvSharingDraft(assistant, target)`."
            )
        return self

    def get_input_embeddings(self):
        return self.target.get_input_embeddings()

    def get_output_embeddings(self):
        return self.assistant.get_output_embeddings()

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, 1) the last token
        target_hidden: torch.Tensor,  # (B, 1, d) the feature of the column before it
        attention_mask: torch.Tensor,  # (B, kv) the target cache's columns
        position_ids: torch.Tensor,  # (B, 1) the last token's position
        *,
        shared_kv_states: dict,
    ):
        """The assistant's logits of the next token and its projected state (``last_hidden_state``, also the one
        entry of ``hidden_states``: what the loop reads as the draft's hidden state)."""
        embeds = self.target.get_input_embeddings()(input_ids)  # (B, 1, d); Gemma scales its embeddings
        inputs = torch.cat([embeds.to(self.dtype), target_hidden.to(self.dtype)], dim=-1)  # (B, 1, 2d)
        out = self.assistant(
            inputs_embeds=inputs,
            attention_mask=attention_mask,
            position_ids=position_ids,
            shared_kv_states=shared_kv_states,
            use_cache=False,
        )
        state = out.last_hidden_state  # (B, 1, d)
        return EagleDraftOutput(logits=out.logits, last_hidden_state=state, hidden_states=(state,))

    def from_target_cache(
        self,
        input_ids: torch.Tensor,  # (B, chunk)
        attention_mask: torch.Tensor,  # (B, length): the target cache's columns, the chunk's included
        target_cache,
        target_hidden: torch.Tensor,  # (B, chunk, d): the feature of the column before each token
    ) -> EagleDraftOutput:
        """The draft's next-token distribution after the chunk's last column, once the target's pass has put the
        chunk in ``target_cache``: what the loop's first draft step of a round computes (the trainer's rollouts)."""
        length = target_cache.get_seq_length()
        kv = compat.shared_kv_states(target_cache, self.producers, length - 1)
        positions = attention_mask[:, :length].long().sum(dim=-1, keepdim=True) - 1  # (B, 1)
        return self(
            input_ids[:, -1:], target_hidden[:, -1:], attention_mask[:, : length - 1], positions, shared_kv_states=kv
        )


# reads the target's features and its KV cache (the trainer's rollouts call from_target_cache)
register_drafter(
    KvSharingDraft, reads_target_features=True, reads_target_cache=True, candidate_generator=KvSharingCandidateGenerator
)
