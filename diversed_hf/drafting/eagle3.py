"""The EAGLE-3 draft layer (Li et al., 2025) for :class:`~diversed_hf.drafting.eagle.EagleDraft` (docs/eagle.md,
"EAGLE-3 drafts").

An EAGLE-3 draft differs from an EAGLE-1 one in three places:

- its input feature fuses **several** of the target's layers: ``fc`` maps the concatenation of the target's hidden
  states at ``aux_layer_ids`` (by default a low, a middle and a high one: ``(2, L // 2, L - 3)`` of ``L`` layers,
  each the input of that layer, ``hidden_states[i]`` in transformers' numbering) to the draft's width; while drafting,
  later columns read the draft's own output instead, which is already of that width (no ``fc``);
- its one decoder layer (``midlayer``) attends over ``[input_layernorm(embed(x_j)), hidden_norm(h_{j-1})]``, twice the
  width, so its ``q/k/v`` projections read ``2 H``, and its residual stream starts from ``h_{j-1}`` itself;
- it scores its own reduced vocabulary with its own ``lm_head`` after a final ``norm``: draft id ``i`` is target id
  ``i + d2t[i]``. The feature handed to the next step is the layer's output **before** that norm.

This module builds the layer on transformers' Llama decoder layer (attention, rotary embedding, MLP and caches as
transformers runs them) with the wider projections; the format readers and writers are in
:mod:`diversed_hf.drafting.eagle_formats`.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm

__all__ = ["Eagle3Layer", "check_aux_layer_ids", "default_aux_layer_ids", "eagle3_layers_config"]

#: the Llama config fields an EAGLE-3 draft's layer copies from its target's (text) config
_LAYER_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "rms_norm_eps",
    "max_position_embeddings",
    "rope_parameters",
    "rope_theta",
    "rope_scaling",
    "attention_bias",
    "vocab_size",
)


_SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def default_aux_layer_ids(num_target_layers: int) -> list[int]:
    """The target layers an EAGLE-3 draft fuses when its checkpoint names none: a low, a middle and a high one, as
    the EAGLE-3 reference code and vLLM choose them."""
    if num_target_layers < 4:
        raise ValueError(
            f"An EAGLE-3 draft fuses three of the target's layers (2, L // 2, L - 3) and the target has "
            f"{num_target_layers}: pass `aux_layer_ids` naming layers in [0, {num_target_layers - 1}]."
        )
    return [2, num_target_layers // 2, num_target_layers - 3]


def check_aux_layer_ids(ids, num_target_layers: int | None = None) -> list[int]:
    """``ids`` as a list, refused unless they are layers ``0 .. L - 1`` of the target's ``L`` (the input of each
    layer, ``hidden_states[i]``; ``hidden_states[L]`` is the state after the final norm, which no EAGLE-3 draft
    reads). Without ``num_target_layers`` only negative or non-integer ids are refused."""
    from ..verifiers.checks import is_integer

    ids = list(ids)
    bad = [i for i in ids if not is_integer(i) or i < 0 or (num_target_layers is not None and i >= num_target_layers)]
    if bad or not ids:
        where = "" if num_target_layers is None else f" and `target` has {num_target_layers} layers"
        last = "L - 1" if num_target_layers is None else str(num_target_layers - 1)
        raise ValueError(
            f"An EAGLE-3 draft fuses the target's layers {ids}{where}: the ids must be layers 0 .. {last} (the input "
            f"of each; the state after the final norm is not one), and {bad or 'none'} is not. Use the target the "
            "draft was trained for, or fix `eagle_aux_hidden_state_layer_ids` in the checkpoint's config.json."
        )
    return [int(i) for i in ids]


def eagle3_layers_config(target_text_config, num_layers: int = 1) -> dict:
    """A Llama config (as a dict) of ``num_layers`` layers for an EAGLE-3 draft of a target with
    ``target_text_config``: its width, heads, MLP size, norm epsilon and rotary embedding are the target's, whatever
    the target's architecture. The first layer becomes the :class:`Eagle3Layer` (EAGLE-3's ``midlayer``); the others,
    when ``num_layers > 1``, stay plain Llama decoder layers over its output (a deeper draft, this project's knob)."""
    values = {
        name: getattr(target_text_config, name)
        for name in _LAYER_FIELDS
        if getattr(target_text_config, name, None) is not None
    }
    values.setdefault("hidden_act", "silu")
    values["num_hidden_layers"] = num_layers
    # the target's special ids, None included: LlamaConfig's defaults (bos 1, eos 2) are another tokenizer's
    values.update({name: getattr(target_text_config, name, None) for name in _SPECIAL_IDS})
    return LlamaConfig(**values).to_dict()


class Eagle3Layer(LlamaDecoderLayer):
    """EAGLE-3's ``midlayer``: a Llama decoder layer that reads ``[embeddings, feature]`` (``2 H``) stacked along
    the last dimension, normalises each half with its own norm (``input_layernorm``, ``hidden_norm``), attends over
    both, and keeps the feature as its residual stream. Its output, ``(batch, T, H)``, is the pre-norm feature."""

    def __init__(self, config: LlamaConfig, layer_idx: int = 0):
        super().__init__(config, layer_idx)
        width, bias = config.hidden_size, bool(getattr(config, "attention_bias", False))
        attention = self.self_attn
        for name in ("q_proj", "k_proj", "v_proj"):
            projection = getattr(attention, name)
            setattr(attention, name, nn.Linear(2 * width, projection.out_features, bias=bias))
        self.hidden_norm = LlamaRMSNorm(width, eps=config.rms_norm_eps)
        self.width = width

    def forward(self, hidden_states: torch.Tensor, **kwargs) -> torch.Tensor:  # (B, T, 2 H) -> (B, T, H)
        embeds, feature = hidden_states.split(self.width, dim=-1)
        stacked = torch.cat([self.input_layernorm(embeds), self.hidden_norm(feature)], dim=-1)  # (B, T, 2 H)
        attended, _ = self.self_attn(hidden_states=stacked, **kwargs)
        hidden = feature + attended
        return hidden + self.mlp(self.post_attention_layernorm(hidden))
