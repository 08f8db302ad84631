"""Every use of transformers internals lives here. Tested with transformers 5.19 to 5.24 (:data:`TESTED_TRANSFORMERS`).

The differences between those releases are absorbed here too, each gated on the installed version with its reason
(:data:`CACHE_KWARG`, :data:`ROW_PROMPT_IGNORE_LENGTH`, :func:`activation_checkpointing`); no other module checks
the transformers version.

The speculative loop keeps each model's KV cache as a plain :class:`~transformers.DynamicCache`
(full layers, also for sliding-window models: the sliding window is applied by the attention mask,
which transformers builds from column indices, so it stays exact in our left-padded layout) and
edits it per row: crop, shift rows right, drop leading columns, select rows.
"""

from __future__ import annotations

import contextlib

import torch
import transformers
from packaging import version
from transformers import DynamicCache, RepetitionPenaltyLogitsProcessor
from transformers.cache_utils import DynamicLayer

TESTED_TRANSFORMERS = (version.parse("5.19.0"), version.parse("5.25.0"))  # [low, high)


def _check_tested(package: str, installed: str, tested: tuple, what: str) -> None:
    """Raise an ImportError naming the tested range and the pip command when ``installed`` is outside it."""
    low, high = tested
    if not low <= version.parse(installed) < high:
        raise ImportError(
            f"{what} is tested with {package} >={low},<{high}; found {installed}. Install a tested version: "
            f"pip install '{package}>={low},<{high}'."
        )


def check_transformers_version() -> None:
    """Raise an ImportError unless the installed transformers is in :data:`TESTED_TRANSFORMERS`."""
    _check_tested("transformers", transformers.__version__, TESTED_TRANSFORMERS, "diversed_hf's speculative loop")


check_transformers_version()  # every module that reaches transformers' internals comes through here


def new_cache() -> DynamicCache:
    """An empty cache whose layers all keep every position (no sliding-window eviction)."""
    return DynamicCache()


def _layers(cache: DynamicCache):
    """The cache's filled layers, each checked to be a full (non-sliding) :class:`DynamicLayer`."""
    for layer in cache.layers:
        if not isinstance(layer, DynamicLayer) or layer.is_sliding:
            raise TypeError(f"diversed_hf edits only full DynamicLayer caches, got {type(layer).__name__}.")
        if layer.get_seq_length() > 0:
            yield layer


def crop_cache(cache: DynamicCache, length: int) -> None:
    """Keep the first ``length`` positions of every row (transformers' ``Cache.crop``); no-op if shorter."""
    excess = cache.get_seq_length() - length
    if excess > 0:
        cache.crop(-excess)


def realign_cache(
    cache: DynamicCache,
    *,
    kept: torch.Tensor | None,  # (kept,) rows that continue; None keeps all
    length: int,
    move,  # (batch, heads, length, head_dim) -> the same, rolled and without the leading columns
) -> None:
    """One round's cache edit of the batched loop (``diversed_hf.common.realign.Realignment.edit_cache``): keep rows
    ``kept`` (``Cache.batch_select_indices``), crop every row to ``length`` positions (``Cache.crop``), then pass every
    layer's keys and values through ``move`` (the round's row roll and dropped leading columns)."""
    if kept is not None:
        cache.batch_select_indices(kept)
    crop_cache(cache, length)
    for layer in _layers(cache):
        layer.keys = move(layer.keys)
        layer.values = move(layer.values)


#: transformers 5.23 made ``RepetitionPenaltyLogitsProcessor.prompt_ignore_length`` a count per row (a ``(batch,)``
#: tensor; ``generate`` passes each row's left padding when it keeps an attention mask); before, one int or None.
ROW_PROMPT_IGNORE_LENGTH = version.parse(transformers.__version__) >= version.parse("5.23.0")


class _RowRepetitionPenalty(RepetitionPenaltyLogitsProcessor):
    """transformers 5.23's per-row ``prompt_ignore_length`` for 5.19-5.22: ignored columns become id ``vocab``,
    which the processor's 2-D path (the one the loop calls) clamps into a spare slot and drops."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:  # (batch, L), (batch, vocab)
        ignored = self.prompt_ignore_length.to(input_ids.device)  # (batch,)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # (L,)
        input_ids = input_ids.masked_fill(positions[None, :] < ignored[:, None], scores.shape[-1])  # (batch, L)
        return RepetitionPenaltyLogitsProcessor(self.penalty)(input_ids, scores)


def realign_logits_processors(
    logits_processor,
    *,
    kept: torch.Tensor | None,  # (kept,) rows that continue; None keeps all
    shifts: torch.Tensor | None,  # (kept,) non-negative; None: no row moves
    leading: int,
) -> None:
    """The same edit for the processors that hold per-row positions: transformers'
    ``RepetitionPenaltyLogitsProcessor.prompt_ignore_length`` (generate sets it to each row's left padding; a
    user may set each row's prompt length): keep rows ``kept``, add ``shifts[b]``, subtract ``leading``.

    An int or None (transformers before 5.23; 5.23+ when ``generate`` dropped an all-ones attention mask) becomes a
    count per row once rows move: the columns a shift brings in hold rejected drafts, which must not be penalised.
    Before 5.23 the processor is replaced, in ``logits_processor``, by one that reads such a count."""
    for i, processor in enumerate(logits_processor):
        if not isinstance(processor, RepetitionPenaltyLogitsProcessor):
            continue
        ignored = processor.prompt_ignore_length  # (batch,), an int for every row, or None
        if not isinstance(ignored, torch.Tensor):
            if shifts is None:  # every row moves alike
                if ignored is not None:
                    processor.prompt_ignore_length = max(int(ignored) - leading, 0)
                continue
            ignored = torch.full_like(shifts, int(ignored or 0))  # (kept,) already the continuing rows
            if not ROW_PROMPT_IGNORE_LENGTH:
                processor = logits_processor[i] = _RowRepetitionPenalty(processor.penalty)
        elif kept is not None:
            ignored = ignored.to(kept.device)[kept]
        if shifts is not None:
            ignored = ignored + shifts.to(ignored.device)
        processor.prompt_ignore_length = (ignored - leading).clamp(min=0)


def prefix_allowed_tokens_fn(processor):
    """The caller's ``prefix_allowed_tokens_fn`` held by transformers' ``PrefixConstrainedLogitsProcessor`` (its
    private ``_prefix_allowed_tokens_fn``)."""
    return processor._prefix_allowed_tokens_fn


def render_chat_template(source: str, messages: list[dict], *, add_generation_prompt: bool, **template_kwargs) -> str:
    """``messages`` rendered with the chat template ``source`` by the function behind transformers'
    ``apply_chat_template`` (``transformers.utils.chat_template_utils.render_jinja_template``, not exported at the
    top level): its Jinja environment and globals; ``template_kwargs`` are the tokenizer's special tokens."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        conversations=[messages], chat_template=source, add_generation_prompt=add_generation_prompt, **template_kwargs
    )
    return rendered[0]


def special_token_ids(
    generation_config,
    device: torch.device,
) -> tuple[int, torch.Tensor | None]:  # pad id, (num_eos,) or None
    """The pad token id (falling back to the first EOS id, then 0) and the EOS ids that ``generate``
    prepared on ``generation_config`` (its private ``_pad_token_tensor`` / ``_eos_token_tensor``)."""
    pad = generation_config._pad_token_tensor
    eos = generation_config._eos_token_tensor
    pad_token_id = int(pad) if pad is not None else (int(eos.flatten()[0]) if eos is not None else 0)
    return pad_token_id, None if eos is None else eos.flatten().to(device)


#: The forward keyword that takes the KV cache. transformers 5.24 renamed ``past_key_values`` to ``cache`` (the old
#: name still works there, with a deprecation warning); before 5.24 a model takes ``cache=`` into ``**kwargs``,
#: ignores it and builds a fresh cache, so every call would silently run without the past.
CACHE_KWARG = "cache" if version.parse(transformers.__version__) >= version.parse("5.24.0") else "past_key_values"


def standalone_generation_config(config):
    """A copy of the GenerationConfig ``config`` whose saved file keeps every key. Why a private: a config made from
    the model's (``GenerationConfig.from_model_config``, what ``PreTrainedModel`` starts with) is marked
    ``_from_model_config``, is saved with the mark, and a file with the mark loads without the keys GenerationConfig
    does not know, among them the drafting knobs a draft carries (``assistant_tree_top_k``, ``assistant_tree_size``)."""
    import copy

    config = copy.deepcopy(config)
    config._from_model_config = False
    return config


def forward_with_cache(
    model,
    input_ids: torch.Tensor,  # (batch, chunk)
    attention_mask: torch.Tensor,  # (batch, cached + chunk)
    cache: DynamicCache,
    *,
    logits_to_keep: int,
    output_hidden_states: bool,
    position_ids: torch.Tensor | None = None,  # (batch, chunk); default: from the attention mask
    **model_inputs,
):
    """One forward pass of ``chunk`` new tokens on top of ``cache``; positions follow the attention mask unless
    given (a token tree's). ``model_inputs`` go to the model as they are (an EagleDraft's ``target_hidden``)."""
    if position_ids is None:
        position_ids = (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)[:, -input_ids.shape[1] :]
    cached = cache.get_seq_length()
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=True,
        logits_to_keep=logits_to_keep,
        output_hidden_states=output_hidden_states,
        **{CACHE_KWARG: cache},
        **model_inputs,
    )
    # A model that does not know the keyword takes it into **kwargs and runs on a fresh cache of its own.
    assert cache.get_seq_length() == cached + input_ids.shape[1], (
        f"{type(model).__name__} did not extend the cache passed as `{CACHE_KWARG}=` ({cached} + {input_ids.shape[1]} "
        f"positions expected, {cache.get_seq_length()} found)"
    )
    return out


def split_stopping_criteria(criteria):
    """Split transformers' prepared criteria into what the loop handles natively and the rest:
    ``(max_length or None, EOS ids (num_eos,) or None, the other criteria)``.

    The length limit and the EOS ids are read from the ``MaxLengthCriteria`` / ``EosTokenCriteria`` in the list:
    ``generate``'s own, or a caller's passed in ``stopping_criteria``, which replace ``generate``'s (transformers'
    ``_merge_criteria_processor_list``), so a caller's limit and stop ids hold as they do in transformers' loop. The
    loop counts the limit per row (prompt width plus the row's own new tokens, as transformers' width) and stops each
    row at its first EOS; the other criteria run per row on each candidate length.
    """
    from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList

    lengths = [int(c.max_length) for c in criteria if isinstance(c, MaxLengthCriteria)]
    eos = [c.eos_token_id.flatten() for c in criteria if isinstance(c, EosTokenCriteria)]
    rest = StoppingCriteriaList([c for c in criteria if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))])
    return min(lengths) if lengths else None, torch.cat(eos).unique() if eos else None, rest


#: transformers 5.23 renamed ``TrainingArguments.gradient_checkpointing`` to ``activation_checkpointing`` (the old name
#: became a deprecated alias of it); before 5.23 only ``gradient_checkpointing`` exists.
_ACTIVATION_CHECKPOINTING = version.parse(transformers.__version__) >= version.parse("5.23.0")


def activation_checkpointing(args) -> bool:
    """Whether ``args`` (``TrainingArguments``) ask for activation (gradient) checkpointing, under either name."""
    name = "activation_checkpointing" if _ACTIVATION_CHECKPOINTING else "gradient_checkpointing"
    return bool(getattr(args, name))


@contextlib.contextmanager
def assisted_decoding_candidates(model, build):
    """Within the block, transformers' own assisted decoding on ``model`` (``model.generate(..., assistant_model=...)``,
    which runs ``GenerationMixin._assisted_decoding``) drafts with the candidate generator that ``build(**arguments)``
    returns; ``arguments`` are those transformers passes to its ``AssistedCandidateGenerator`` (``input_ids,
    assistant_model, generation_config, model_kwargs, inputs_tensor, logits_processor``).

    Why a private: transformers (5.24) offers no public way to choose the candidate generator of its assisted loop;
    it builds one in ``GenerationMixin._get_candidate_generator``, which is shadowed on the instance for the block.
    ``tests/test_candidate_contract.py`` uses it to drive
    :class:`~diversed_hf.drafting.candidates.DiversedCandidateGenerator`
    through transformers' loop.
    """

    def get_candidate_generator(
        *,
        generation_config,
        input_ids,
        inputs_tensor,
        logits_processor,
        model_kwargs,
        assistant_model=None,
        target_tokenizer=None,
        assistant_tokenizer=None,
    ):
        return build(
            input_ids=input_ids,
            assistant_model=assistant_model,
            generation_config=generation_config,
            model_kwargs=model_kwargs,
            inputs_tensor=inputs_tensor,
            logits_processor=logits_processor,
        )

    model._get_candidate_generator = get_candidate_generator
    try:
        yield model
    finally:
        del model._get_candidate_generator


# =================================================================================================
# TRL (the ``train`` extra). DiversedTrainer is a ``transformers.Trainer`` built on its public hooks
# only, configured by TRL's public ``GRPOConfig`` (docs/architecture.md, "Why DiversedTrainer is a
# transformers Trainer"): no TRL or transformers private is set, read or overridden, and no module of
# the package imports a TRL name that ``trl`` does not export (tests/test_architecture.py checks both).
# What remains here is the range of TRL releases the training suite passes with, at both ends
# (.ci/constraints-lowest.txt holds the lower end). Nothing here imports TRL at module level:
# ``import diversed_hf`` (which imports this module) never imports TRL.
# =================================================================================================

TESTED_TRL = (version.parse("1.0.0"), version.parse("1.17.0"))  # [low, high)


def set_hub_mixin_config(model, config) -> None:
    """Give a ``huggingface_hub.ModelHubMixin`` model the config it saves as ``config.json``: the mixin keeps it in
    the private ``_hub_mixin_config`` (it fills it itself only from ``__init__`` arguments, and a head built from a
    config object is given its dataclass whole)."""
    model._hub_mixin_config = config


def hub_mixin_config(model):
    """The config a ``ModelHubMixin`` model saves (:func:`set_hub_mixin_config`)."""
    return model._hub_mixin_config


def check_trl_version() -> None:
    """Raise an ImportError unless TRL is installed and in :data:`TESTED_TRL` (``diversed_hf.training.config``, whose
    ``DiversedConfig`` is a TRL ``GRPOConfig``, calls it before importing TRL)."""
    try:
        import trl
    except ImportError as error:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "DiversedConfig and DiversedTrainer need TRL: install the training extra, "
            '`pip install "diversed_hf[train]"`.'
        ) from error

    _check_tested("trl", trl.__version__, TESTED_TRL, "diversed_hf.training (its DiversedConfig is a GRPOConfig)")


@contextlib.contextmanager
def quiet_loading():
    """transformers' progress bars and deprecation notices off while a shipped model loads (``testbed.load_pair``):
    its own switch (``disable_progress_bar``), the GGUF reader's bar, which ignores that switch (a module-level
    ``tqdm``), and the ``is_gradient_checkpointing`` FutureWarning peft triggers when it wraps a model."""
    import functools
    import warnings

    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    reader_bar = getattr(gguf_utils, "tqdm", None)
    hf_logging.disable_progress_bar()
    if reader_bar is not None:
        gguf_utils.tqdm = functools.partial(reader_bar, disable=True)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            yield
    finally:
        if reader_bar is not None:
            gguf_utils.tqdm = reader_bar
        if enabled:
            hf_logging.enable_progress_bar()


def load_mtp_model(target):
    """The checkpoint's multi-token-prediction layers as transformers' ``MtpModel`` (what ``use_mtp=True`` loads in
    its ``MTPCandidateGenerator``), on the device of the target's last decoder layer, tied to the target's embeddings
    and LM head."""
    from transformers.modeling_layers import MtpModel

    device = next(target.get_decoder().layers[-1].parameters()).device
    try:
        return MtpModel.from_pretrained(target, device_map={"": device})
    except (ValueError, RuntimeError, OSError) as error:
        raise ValueError(
            f"`use_mtp=True`: transformers {transformers.__version__} cannot load the multi-token-prediction layers "
            f"of {type(target).__name__} from {target.config.name_or_path!r} ({error}). Load the target from its "
            "checkpoint directory or Hub id, with a transformers release that ships MTP for this family."
        ) from error


def mtp_layer_forward(
    mtp,
    layer_idx: int,
    input_ids: torch.Tensor,  # (batch, chunk)
    previous_hidden: torch.Tensor,  # (batch, chunk, d): the feature of the column before each token
    attention_mask: torch.Tensor,  # (batch, cached + chunk) 1 for real columns, 0 for left padding
    position_ids: torch.Tensor,  # (batch, chunk)
    cache: DynamicCache,
) -> torch.Tensor:  # (batch, chunk, d) the layer's output features
    """One pass of ``MtpModel``'s layer ``layer_idx`` over ``chunk`` new columns on top of ``cache``, as its
    ``forward_layer`` runs it, but with the padding mask of a left-padded batch: transformers builds the MTP masks
    without one (its assisted decoding is batch 1)."""
    from transformers.masking_utils import LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING, create_causal_mask

    config = mtp.config.per_layer_config[layer_idx] if getattr(mtp.config, "is_heterogeneous", False) else mtp.config
    layer_types = getattr(mtp.config, "layer_types", None)
    layer_type = layer_types[layer_idx] if layer_types is not None else "full_attention"
    mask_function = LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING.get(layer_type, create_causal_mask)
    if isinstance(mask_function, dict) or layer_type == "linear_attention":
        raise ValueError(
            f"This checkpoint's MTP layer is of type {layer_type!r}; diversed_hf's loop drafts with attention MTP "
            "layers only. Drop `verifier`/`diversed_head` to use transformers' own `use_mtp=True` path."
        )
    embeds = mtp.embed_tokens(input_ids).to(previous_hidden.device)  # (batch, chunk, d)
    mask = mask_function(
        config=config,
        inputs_embeds=embeds,
        attention_mask=attention_mask,
        position_ids=position_ids,
        layer_idx=layer_idx,
        **{CACHE_KWARG: cache},
    )
    position_embeddings = None
    if mtp.rotary_emb is not None:
        rope_kwargs = {"layer_type": layer_types[layer_idx]} if getattr(mtp, "has_per_layer_rope", False) else {}
        position_embeddings = mtp.rotary_emb(embeds, position_ids=position_ids, **rope_kwargs)
    hidden = mtp.layers[layer_idx](
        embeds,
        previous_hidden,
        position_embeddings=position_embeddings,
        attention_mask=mask,
        position_ids=position_ids,
        **{CACHE_KWARG: cache},
    )
    if mtp.use_shared_post_norm:
        hidden = mtp.shared_post_norm(hidden)
    return hidden


def mtp_logits(mtp, hidden: torch.Tensor) -> torch.Tensor:  # (..., vocab)
    """The target's LM head applied to MTP features as ``MtpModel`` applies it (muP scaling, unpadded vocabulary)."""
    return mtp._project_to_logits(hidden)


def kv_sharing_producers(target) -> dict[str, int]:
    """``{layer type: decoder layer index}`` of the layers whose keys and values a KV-sharing assistant (Gemma 4's)
    reads: the last layer of each attention type that stores its full-length KV (``store_full_length_kv``)."""
    producers = {}
    for layer in target.get_decoder().layers:
        attention = getattr(layer, "self_attn", None)
        if getattr(attention, "store_full_length_kv", False):
            producers[attention.layer_type] = attention.layer_idx
    return producers


def shared_kv_states(cache: DynamicCache, producers: dict[str, int], length: int) -> dict:
    """The ``shared_kv_states`` a Gemma 4 target hands its assistant, read from the loop's own target cache: each
    producer layer's keys and values of the first ``length`` columns (the cache is full-length, sliding layers too)."""
    return {
        layer_type: (cache.layers[index].keys[:, :, :length], cache.layers[index].values[:, :, :length])
        for layer_type, index in producers.items()
    }


def new_block_draft_cache():
    """An empty cache for a DFlash block draft: transformers' ``DFlashCache`` (a :class:`~transformers.DynamicCache`
    whose mask sizes count the context columns a forward adds beside its queries), with full layers."""
    from transformers.cache_utils import DFlashCache

    return DFlashCache()


def block_draft_forward(assistant, cache, *, noise_embeds, context, attention_mask, position_ids):
    """One DFlash pass: the ``context`` columns' features (``(B, c, k d)``) join the cache and the noise block
    attends to the cache bidirectionally. The cache is told how many context columns come (transformers'
    ``set_previous_accepted_tokens``), as ``DFlashTokenCandidateGenerator`` does."""
    cache.set_previous_accepted_tokens(context.shape[1])
    try:
        return assistant(
            noise_embeds=noise_embeds,
            context_hidden_states=context,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **{CACHE_KWARG: cache},
        ).last_hidden_state
    finally:
        cache.set_previous_accepted_tokens(0)


def embeddings_without_norm(embeddings, ids: torch.Tensor) -> torch.Tensor:
    """The target's embeddings of ``ids`` without the optional ``embed_norm`` some embedding modules apply (DFlash's
    noise tokens are embedded without it, as transformers' ``DFlashTokenCandidateGenerator._get_noise_embeds``)."""
    norm = getattr(embeddings, "embed_norm", None)
    if norm is None:
        return embeddings(ids)
    embeddings.embed_norm = torch.nn.Identity()
    try:
        return embeddings(ids)
    finally:
        embeddings.embed_norm = norm


# Token trees ----------------------------------------------------------------------------------------------------------
#: attention implementations that read a custom 4-D mask as it is (transformers' masking_utils returns a 4-D mask
#: unchanged; sdpa and eager add it to the scores); flash attention and flex attention take no such mask
TREE_ATTENTION = ("sdpa", "eager")


def has_sliding_window(model) -> bool:
    """Whether some of ``model``'s layers attend through a sliding window (whose mask counts cache columns)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    layer_types = getattr(config, "layer_types", None)
    # no layer_types with a window set (Mistral, Phi-3): every layer is windowed (their mask functions say so)
    windowed = layer_types is None or any("sliding" in str(kind) for kind in layer_types)
    return bool(getattr(config, "sliding_window", None)) and windowed


def check_tree_attention(model, which: str) -> None:
    """Refuse, before any forward, a model whose attention cannot take a token tree's 4-D mask."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    implementation = getattr(config, "_attn_implementation", None) or "eager"  # why a private: no public accessor
    if implementation not in TREE_ATTENTION:
        raise ValueError(
            f"Token trees need the {which}'s attention to take a 4-D mask, but it runs {implementation!r}: load it "
            f'with `attn_implementation="sdpa"` (or "eager"), or draft a chain (leave `assistant_tree_top_k` '
            "unset)."
        )
    if has_sliding_window(model):
        raise ValueError(
            f"Token trees give the {which}'s layers one 4-D mask, which has no sliding window; this model has "
            "sliding-window layers. Draft a chain with it (leave `assistant_tree_top_k` unset)."
        )


def forward_tree(
    model,
    input_ids: torch.Tensor,  # (batch, chunk)
    allowed: torch.Tensor,  # (batch, chunk, cached + chunk) bool: which key columns each new token attends to
    position_ids: torch.Tensor,  # (batch, chunk)
    cache: DynamicCache,
    *,
    logits_to_keep: int,
    output_hidden_states: bool,
    **model_inputs,
):
    """One forward pass of ``chunk`` new tokens on top of ``cache`` with a tree's attention: a 4-D additive mask
    (0 where ``allowed``, the dtype's minimum elsewhere), which transformers' mask functions pass through unchanged
    (``masking_utils``: "If the mask is already 4D, simply return as-is"). ``model_inputs`` go to the model as they
    are (an EagleDraft's ``target_hidden``)."""
    dtype = model.dtype if model.dtype.is_floating_point else torch.float32
    return forward_with_cache(
        model,
        input_ids,
        additive_mask(allowed, dtype),  # (batch, 1, chunk, keys)
        cache,
        logits_to_keep=logits_to_keep,
        output_hidden_states=output_hidden_states,
        position_ids=position_ids,
        **model_inputs,
    )


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:  # (batch, 1, chunk, keys)
    """A 4-D attention mask that transformers' mask functions pass through unchanged (``masking_utils``: "If the mask
    is already 4D, simply return as-is") and every attention implementation that takes a mask adds to its scores: 0
    where ``allowed`` ``(batch, chunk, keys)``, ``dtype``'s minimum elsewhere."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


def compact_cache(
    cache: DynamicCache,
    start: int,
    source: torch.Tensor,  # (batch, n) columns to move, per row
) -> None:
    """Keep a tree round's accepted path: columns ``start .. start + n - 1`` of row ``b`` become its columns
    ``source[b]``, and the cache is cropped to ``start + n`` columns."""
    for layer in _layers(cache):
        batch, heads, _, head_dim = layer.keys.shape
        index = source.to(layer.keys.device)[:, None, :, None].expand(batch, heads, source.shape[1], head_dim)
        keys = layer.keys.gather(2, index)  # (batch, heads, n, head_dim)
        values = layer.values.gather(2, index.expand(*index.shape[:3], layer.values.shape[-1]))
        layer.keys = torch.cat([layer.keys[..., :start, :], keys], dim=2)
        layer.values = torch.cat([layer.values[..., :start, :], values], dim=2)


def length_grouped_indices(lengths: list[int], batch_size: int, generator: torch.Generator) -> list[int]:
    """A shuffled order of ``range(len(lengths))`` whose consecutive ``batch_size`` slices hold like lengths (the
    order of the Trainer's ``group_by_length``: sorted within mega-batches of up to 50 batches, the longest first)."""
    from transformers.trainer_pt_utils import get_length_grouped_indices

    return get_length_grouped_indices(lengths, batch_size, generator=generator)
