"""The one factory of drafters: what ``generate`` was given turned into the drafter the loop runs.

``generate`` drafts with ``assistant_model`` (any causal LM, or one of the package's drafters), or with the drafter a
keyword asks for: ``prompt_lookup_num_tokens`` (:class:`~diversed_hf.drafting.drafters.PromptLookup`),
``assistant_early_exit`` (:class:`~diversed_hf.drafting.drafters.EarlyExitDraft`), ``use_mtp``
(:class:`~diversed_hf.drafting.mtp.MtpDraft`), ``speculation_type="dflash"``
(:class:`~diversed_hf.drafting.dflash.DFlashDraft`); a Gemma 4 assistant becomes a
:class:`~diversed_hf.drafting.kv_sharing.KvSharingDraft`, and a draft with another tokenizer a
:class:`~diversed_hf.drafting.translated.TranslatedDraft`. What the drafter can do is then read from its
registration (:func:`diversed_hf.drafting.protocol.capabilities_of`).
"""

from __future__ import annotations

from .dflash import DFlashDraft, looks_like_block_draft
from .drafters import EarlyExitDraft, PromptLookup
from .kv_sharing import KvSharingDraft, is_kv_sharing_assistant
from .mtp import MtpDraft
from .translated import TranslatedDraft

__all__ = ["SPECULATION_TYPES", "check_drafter", "resolve_drafter"]


#: transformers' ``speculation_type`` values the loop runs
SPECULATION_TYPES = ("dflash",)


def check_drafter(which: str, assistant_model, extra: dict, generation_config) -> None:
    """Refuse, before any forward pass, a drafter of transformers' that ``which`` (``verifier`` / ``diversed_head``)
    cannot verify, naming the argument and what to do."""
    value = extra.get("speculation_type", getattr(generation_config, "speculation_type", None))
    if value is not None and value not in SPECULATION_TYPES:
        raise ValueError(
            f"`speculation_type={value!r}`: diversed_hf's loop runs {', '.join(map(repr, SPECULATION_TYPES))}, so "
            f"`{which}` cannot verify this drafter's drafts. Drop `{which}` to use transformers' own lossless path."
        )
    if value == "dflash" and assistant_model is None:
        raise ValueError('`speculation_type="dflash"` drafts with a DFlash `assistant_model`: pass one.')


def resolve_drafter(target, assistant_model, extra: dict, generation_config):
    """``assistant_model`` (a :class:`~diversed_hf.drafting.translated.TranslatedDraft` when ``tokenizer`` and
    ``assistant_tokenizer`` have different vocabularies), or the drafter ``prompt_lookup_num_tokens`` /
    ``assistant_early_exit`` / ``use_mtp`` ask for (read from the keywords, else the call's ``generation_config``,
    else the target's, as transformers merges them; those keywords are consumed)."""
    asked = {}
    for name in ("prompt_lookup_num_tokens", "max_matching_ngram_size", "assistant_early_exit", "use_mtp"):
        value = extra.pop(name, None)
        for config in (generation_config, target.generation_config):
            if value is None and config is not None:
                value = getattr(config, name, None)
        asked[name] = value
    lookup, early_exit, use_mtp = asked["prompt_lookup_num_tokens"], asked["assistant_early_exit"], asked["use_mtp"]
    if use_mtp not in (None, False, True):
        raise ValueError(f"`use_mtp` must be True or False, got {use_mtp!r}.")
    given = [
        text
        for text, on in (
            (f"`prompt_lookup_num_tokens={lookup!r}`", lookup is not None),
            (f"`assistant_early_exit={early_exit!r}`", early_exit is not None),
            ("`use_mtp=True`", bool(use_mtp)),
            ("`assistant_model`", assistant_model is not None),
        )
        if on
    ]
    if len(given) > 1:
        raise ValueError(f"{' and '.join(given)} each choose the drafter: pass one of them.")
    if lookup is not None:
        if extra.get("num_assistant_tokens") is not None:
            raise ValueError(
                f"`num_assistant_tokens={extra['num_assistant_tokens']!r}` does not apply to prompt lookup, which "
                f"drafts `prompt_lookup_num_tokens={lookup!r}` tokens a round: remove it."
            )
        return PromptLookup(lookup, asked["max_matching_ngram_size"])
    if early_exit is not None:
        return EarlyExitDraft(target, early_exit)
    if use_mtp:
        return MtpDraft(target)
    speculation_type = extra.pop("speculation_type", None)
    for config in (generation_config, target.generation_config):
        if speculation_type is None and config is not None:
            speculation_type = getattr(config, "speculation_type", None)
    if speculation_type not in (None, *SPECULATION_TYPES):  # the target's generation config may set it too
        raise ValueError(
            f"`speculation_type={speculation_type!r}` (the target's generation config): diversed_hf's loop runs "
            f"{', '.join(map(repr, SPECULATION_TYPES))}. Unset it, or drop `verifier`/`diversed_head`."
        )
    if speculation_type == "dflash":  # a block draft reading several of the target's layers
        return DFlashDraft(assistant_model, target)
    if looks_like_block_draft(assistant_model):
        raise ValueError(
            f"`assistant_model` ({type(assistant_model).__name__}) is a DFlash block draft (its config has block_size, "
            "mask_token_id and target_layer_ids), and `speculation_type` is not 'dflash': pass "
            '`speculation_type="dflash"` so it drafts a block from the target\'s layers.'
        )
    if is_kv_sharing_assistant(assistant_model):  # Gemma 4's: it reads the target's KV cache and features
        return KvSharingDraft(assistant_model, target)
    tokenizer, assistant_tokenizer = extra.get("tokenizer"), extra.get("assistant_tokenizer")
    if assistant_model is not None and tokenizer is not None and assistant_tokenizer is not None:
        if tokenizer.get_vocab() != assistant_tokenizer.get_vocab():  # universal assisted decoding
            return TranslatedDraft(assistant_model, tokenizer, assistant_tokenizer)
    return assistant_model
