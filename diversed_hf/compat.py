"""Every use of transformers internals lives here. Tested with transformers 5.24.

The speculative loop keeps each model's KV cache as a plain :class:`~transformers.DynamicCache`
(full layers, also for sliding-window models: the sliding window is applied by the attention mask,
which transformers builds from column indices, so it stays exact in our left-padded layout) and
edits it per row: crop, shift rows right, drop leading columns, select rows.
"""

from __future__ import annotations

import torch
import transformers
from packaging import version
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

TESTED_TRANSFORMERS = (version.parse("5.24.0"), version.parse("5.25.0"))  # [low, high)


def check_transformers_version() -> None:
    current = version.parse(transformers.__version__)
    low, high = TESTED_TRANSFORMERS
    if not low <= current < high:
        raise ImportError(
            f"diversed_hf's speculative loop is tested with transformers >={low},<{high}; found "
            f"{transformers.__version__}. Install a tested version: pip install 'transformers>={low},<{high}'."
        )


def new_cache() -> DynamicCache:
    """An empty cache whose layers all keep every position (no sliding-window eviction)."""
    return DynamicCache()


def _layers(cache: DynamicCache):
    for layer in cache.layers:
        if not isinstance(layer, DynamicLayer) or getattr(layer, "is_sliding", False):
            raise TypeError(f"diversed_hf edits only full DynamicLayer caches, got {type(layer).__name__}.")
        if layer.is_initialized and layer.keys is not None and layer.keys.numel() > 0:
            yield layer


def cache_length(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def crop_cache(cache: DynamicCache, length: int) -> None:
    """Keep the first ``length`` positions of every row."""
    for layer in _layers(cache):
        layer.keys = layer.keys[..., :length, :]  # (batch, heads, length, head_dim)
        layer.values = layer.values[..., :length, :]


def drop_leading_positions(cache: DynamicCache, count: int) -> None:
    """Remove the first ``count`` positions (columns that are padding in every row)."""
    if count <= 0:
        return
    for layer in _layers(cache):
        layer.keys = layer.keys[..., count:, :]
        layer.values = layer.values[..., count:, :]


def shift_rows_right(
    cache: DynamicCache,
    shifts: torch.Tensor,  # (batch,) non-negative
) -> None:
    """Roll each row right by ``shifts[b]`` positions; what wraps around lands on padding columns."""
    for layer in _layers(cache):
        batch, heads, length, head_dim = layer.keys.shape
        index = (torch.arange(length, device=shifts.device) - shifts.unsqueeze(-1)) % length  # (batch, length)
        index = index.to(layer.keys.device)[:, None, :, None].expand(batch, heads, length, head_dim)
        layer.keys = layer.keys.gather(2, index)
        layer.values = layer.values.gather(2, index.expand(*layer.values.shape[:3], layer.values.shape[-1]))


def select_rows(cache: DynamicCache, rows: torch.Tensor) -> None:  # rows: (kept,)
    for layer in _layers(cache):
        layer.keys = layer.keys[rows.to(layer.keys.device)]
        layer.values = layer.values[rows.to(layer.values.device)]


def forward_with_cache(
    model,
    input_ids: torch.Tensor,  # (batch, chunk)
    attention_mask: torch.Tensor,  # (batch, cached + chunk)
    cache: DynamicCache,
    *,
    logits_to_keep: int,
    output_hidden_states: bool,
):
    """One forward pass of ``chunk`` new tokens on top of ``cache``; positions follow the attention mask."""
    position_ids = (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)[:, -input_ids.shape[1] :]  # (batch, chunk)
    return model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        cache=cache,
        use_cache=True,
        logits_to_keep=logits_to_keep,
        output_hidden_states=output_hidden_states,
    )


def split_stopping_criteria(criteria):
    """Split transformers' prepared criteria into (handled natively: length and EOS, the rest)."""
    from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList

    rest = StoppingCriteriaList([c for c in criteria if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))])
    return rest
