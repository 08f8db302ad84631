"""Multi-token prediction (``generate(..., use_mtp=True)``) in the batched loop: the checkpoint's MTP layer drafts.

DeepSeek-V3, GLM-4-MoE, Qwen3-Next, Mellum and other families ship, beside the model, a multi-token-prediction layer:
``fc([norm(embed(x_j)), norm(h_{j-1})])`` -> one decoder block of the model's architecture -> the model's LM head,
where ``h_{j-1}`` is the model's last hidden state at the column before ``x_j``. That is an EAGLE draft's layout
(``docs/eagle.md``), trained with the model. :class:`MtpDraft` wraps transformers' ``MtpModel`` (loaded from the
target's own checkpoint as ``use_mtp=True`` loads it) behind the interface the loop gives an
:class:`~diversed_hf.drafting.eagle.EagleDraft`, so it drafts through
:class:`~diversed_hf.drafting.feature_candidates.FeatureCandidateGenerator`:

- the round's first draft step reads the target's features of the columns its cache lacks (the verification pass
  already computed them: no extra target forward);
- later steps feed the layer its own output feature of the step before: drafting more tokens than the checkpoint has
  MTP layers reuses the layer, as vLLM and SGLang do for DeepSeek-V3. transformers drafts exactly ``num_mtp_layers``
  tokens a round, which is the default here too (``generation_config.num_assistant_tokens``);
- a draft token is sampled from the layer's distribution (or taken greedily), and that distribution is what
  verification receives, so lossless verification keeps the target's law and a relaxed verifier emits its declared
  mixture. The layer's output feature is the draft's hidden state: heads apply as to an EagleDraft.

Rows advance independently at any batch size; transformers' ``MTPCandidateGenerator`` runs at batch 1 only.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import GenerationConfig

from .. import compat
from .eagle import EagleDraftOutput
from .protocol import register_drafter

__all__ = ["MtpDraft"]


class MtpDraft(nn.Module):
    """The target checkpoint's multi-token-prediction layer as a draft that reads the target's features.

    Built by ``generate(..., use_mtp=True, verifier=... | diversed_head=...)``; build it yourself to train a head for
    it (``DiversedHead.for_pair(target, MtpDraft(target))``). ``mtp_model``: an already loaded transformers
    ``MtpModel`` of this target (default: loaded from the target's checkpoint, ``target.config.name_or_path``).
    """

    def __init__(self, target, mtp_model=None):
        super().__init__()
        text_config = target.config.get_text_config()
        num_layers = getattr(text_config, "num_mtp_layers", None)
        if not num_layers:
            raise ValueError(
                f"`use_mtp=True` needs a checkpoint with multi-token-prediction layers; {type(target).__name__}'s "
                f"config has `num_mtp_layers={num_layers!r}`. Draft with `assistant_model=` instead."
            )
        if num_layers != 1:
            raise ValueError(
                f"`use_mtp=True`: this checkpoint has `num_mtp_layers={num_layers}`; diversed_hf's loop drafts with "
                "one MTP layer (as DeepSeek-V3, GLM-4-MoE and Qwen3-Next ship). Drop `verifier`/`diversed_head` to "
                "use transformers' own lossless MTP path."
            )
        self.__dict__["target"] = target  # not registered: the embeddings and LM head are the target's
        self.mtp = mtp_model if mtp_model is not None else compat.load_mtp_model(target)
        self.config = self.mtp.config
        # transformers drafts num_mtp_layers tokens a round; more reuse the layer (num_assistant_tokens=N)
        self.generation_config = GenerationConfig(num_assistant_tokens=num_layers)
        self.fingerprint_extra = "multi-token prediction"

    def __repr__(self) -> str:
        return f"MtpDraft({type(self.target).__name__}, {self.config.num_mtp_layers} MTP layer)"

    @property
    def device(self) -> torch.device:
        return self.mtp.device

    @property
    def dtype(self) -> torch.dtype:
        return self.mtp.layers[0].eh_proj.weight.dtype

    def is_attached_to(self, target) -> bool:
        return target is self.target

    def attach_target(self, target) -> MtpDraft:
        if target is not self.target:
            raise ValueError(
                "This MtpDraft holds the multi-token-prediction layer of another model: an MTP layer drafts only for "
                "the checkpoint it was trained with. Build one for this target: `MtpDraft(target)`."
            )
        return self

    def get_input_embeddings(self):
        return self.target.get_input_embeddings()

    def get_output_embeddings(self):
        return None  # the LM head is the target's; logits span its vocabulary

    def forward(
        self,
        input_ids: torch.Tensor,  # (batch, chunk)
        target_hidden: torch.Tensor | None = None,  # (batch, chunk, d)
        attention_mask: torch.Tensor | None = None,  # (batch, cached + chunk)
        position_ids: torch.Tensor | None = None,  # (batch, chunk)
        cache=None,
        past_key_values=None,
        use_cache: bool | None = None,
        logits_to_keep: int = 0,
        **kwargs,
    ) -> EagleDraftOutput:
        """The layer's output features of the chunk and the logits of its last ``logits_to_keep`` columns (0: all).

        ``target_hidden[:, t]`` is the feature of the column before ``input_ids[:, t]``: the target's last hidden state
        there, or this layer's own output while drafting."""
        if target_hidden is None:
            raise ValueError(
                "An MtpDraft reads the target's hidden states (`target_hidden`): run it through diversed_hf's loop, "
                "`target.generate(..., use_mtp=True, verifier=...)` on a model with `enable_diversed`."
            )
        cache = cache if cache is not None else past_key_values
        if cache is None:
            cache = compat.new_cache()
        if attention_mask is None:
            attention_mask = input_ids.new_ones(input_ids.shape[0], cache.get_seq_length() + input_ids.shape[1])
        if position_ids is None:
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -input_ids.shape[1] :]
        features = compat.mtp_layer_forward(
            self.mtp, 0, input_ids, target_hidden.to(self.dtype), attention_mask, position_ids, cache
        )
        kept = features if not logits_to_keep else features[:, -logits_to_keep:]
        return EagleDraftOutput(
            logits=compat.mtp_logits(self.mtp, kept), last_hidden_state=features, hidden_states=(features,), cache=cache
        )


register_drafter(
    MtpDraft, reads_target_features=True, no_trees="drafts one token per step from the checkpoint's MTP layer"
)
