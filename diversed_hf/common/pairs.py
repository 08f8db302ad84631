"""What a (target, draft) pair must share, and how a head is checked against a pair.

Verification compares the two models' probabilities of the same token ids, so the pair must share
a tokenizer; a head that reads both models' last-layer hidden states must match their sizes, while a
head on distribution features alone (``use_hidden_states=False``) fits any pair sharing the tokenizer.
Nothing here runs a model.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import torch


class _Head(Protocol):  # what check_head_matches reads of a DiversedHead (heads import this module, not the reverse)
    config: Any  # a DiversedHeadConfig


logger = logging.getLogger(__name__)

__all__ = [
    "check_head_matches",
    "draft_input_ids",
    "hidden_size_of",
    "model_id_of",
    "shared_vocab_size",
    "text_vocab_size",
    "verification_vocab_size",
]


def hidden_size_of(model) -> int:
    """Size of the last-layer hidden state of a Hugging Face causal LM; 0 for a drafter without hidden states
    (``has_hidden_states = False``: prompt lookup, a draft with another tokenizer)."""
    if not getattr(model, "has_hidden_states", True):
        return 0
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(config.hidden_size)


def model_id_of(model) -> str | None:
    """The Hub id or local path a model was loaded from, if known."""
    config = getattr(model, "config", None)
    return getattr(config, "_name_or_path", None) or getattr(model, "name_or_path", None) or None


def text_vocab_size(model) -> int:
    """Rows of a causal LM's output embedding matrix: the width of its logits."""
    embeddings = model.get_output_embeddings()
    if embeddings is not None and getattr(embeddings, "weight", None) is not None:
        return int(embeddings.weight.shape[0])
    return int(model.config.get_text_config().vocab_size)


def verification_vocab_size(target, draft, tokenizer=None, assistant_tokenizer=None) -> int:
    """The vocabulary verification runs over: the target's, after :func:`shared_vocab_size`'s checks.

    The target's distribution is never trimmed; the draft's is fitted to it (zero probability for ids
    it does not score or scores beyond the target's range, :func:`diversed_hf.verifiers.ops.fit_vocabulary`).
    """
    shared_vocab_size(target, draft, tokenizer, assistant_tokenizer)
    return text_vocab_size(target)


def shared_vocab_size(target, draft, tokenizer=None, assistant_tokenizer=None) -> int:
    """Size of the vocabulary range both models score; raises if they cannot share a tokenizer.

    Padded embedding matrices of the same tokenizer are allowed (Qwen-style 151936 vs 152064;
    verification then runs over the target's range, :func:`verification_vocab_size`), and so is a draft
    whose LM head scores only the first ids while its input embeddings read all of the target's (a
    pruned draft head, as the real pair's self-draft). Different tokenizers are not: verification
    compares probabilities of the same token ids.
    """
    target_size, draft_size = text_vocab_size(target), text_vocab_size(draft)
    check_tokenizer_arguments(tokenizer, assistant_tokenizer)
    pruned_head = draft_size < target_size and _embeds_every_id(draft, target_size)
    if target_size != draft_size and not pruned_head and (tokenizer is None or assistant_tokenizer is None):
        raise ValueError(
            f"The target scores {target_size} ids and the draft {draft_size}: padded embedding matrices of one "
            "tokenizer, or two tokenizers? Verification needs the same token ids, and the sizes cannot tell. Pass "
            "`tokenizer=` (the target's) and `assistant_tokenizer=` (the draft's) to `generate`: the same "
            "vocabulary runs as padded matrices, another one drafts through translation (as transformers asks)."
        )
    if tokenizer is not None and assistant_tokenizer is not None:
        if tokenizer.get_vocab() != assistant_tokenizer.get_vocab():
            raise ValueError(
                "`tokenizer` and `assistant_tokenizer` have different vocabularies: verification needs the draft and "
                "the target to score the same token ids. Use a draft that shares the target's tokenizer."
            )
    target_config, draft_config = target.config.get_text_config(), draft.config.get_text_config()
    for name in ("eos_token_id", "bos_token_id"):
        target_id, draft_id = getattr(target_config, name, None), getattr(draft_config, name, None)
        if target_id is not None and draft_id is not None and target_id != draft_id:
            raise ValueError(
                f"The target and the draft have different `{name}` ({target_id} vs {draft_id}): they do not share a "
                "tokenizer, and verification needs the same token ids. Use a draft from the target's model family."
            )
    smaller, larger = sorted((target_size, draft_size))
    if draft_size < target_size and _embeds_every_id(draft, target_size):
        # A draft head pruned to the first ids (FR-Spec style): it reads every id and proposes frequent ones only.
        return smaller
    if larger - smaller > max(256, 0.01 * larger):
        raise ValueError(
            f"The target scores {target_size} tokens and the draft {draft_size}: too different to be padded "
            "embedding matrices of one tokenizer. Verification needs the same token ids; use a draft that shares "
            "the target's tokenizer."
        )
    return smaller


def check_tokenizer_arguments(tokenizer, assistant_tokenizer) -> None:
    """Refuse ``assistant_tokenizer`` without ``tokenizer``: the draft's ids could not be translated and would be
    verified as the target's."""
    if assistant_tokenizer is not None and tokenizer is None:
        raise ValueError(
            "`assistant_tokenizer` was passed without `tokenizer`: a draft of another tokenizer is translated "
            "through both, and without the target's its ids would be verified as the target's. Pass `tokenizer=` (the "
            "target's) as well, or drop `assistant_tokenizer` when the draft shares the target's tokenizer."
        )


def _embeds_every_id(draft, vocab_size: int) -> bool:
    """Whether ``draft``'s input embeddings cover ids ``0 .. vocab_size - 1`` (a draft with a pruned LM head does)."""
    embeddings = draft.get_input_embeddings()
    return getattr(embeddings, "num_embeddings", 0) >= vocab_size


def check_head_matches(head: _Head, target, draft) -> None:
    """Hidden sizes must match (error); recorded model ids differing from the models' give a warning.

    A head that reads no hidden states (``config.use_hidden_states=False``) is pair-agnostic: its sizes are not
    checked, and other models than the recorded ones are only logged. The vocabulary the pair must share is
    checked by :func:`shared_vocab_size`, as for every verifier.
    """
    target_size, draft_size = hidden_size_of(target), hidden_size_of(draft)
    config = head.config
    reads_hidden = getattr(config, "use_hidden_states", True)
    if reads_hidden and (config.draft_hidden_size, config.target_hidden_size) != (draft_size, target_size):
        raise ValueError(
            f"`diversed_head` was built for hidden sizes (draft {config.draft_hidden_size}, target "
            f"{config.target_hidden_size}) but the models have (draft {draft_size}, target {target_size}). Use a head "
            "trained for this pair, or build one with `DiversedHead.for_pair(target, draft)`."
        )
    for role, recorded, actual in (
        ("target", config.target_model_id, model_id_of(target)),
        ("draft", config.draft_model_id, model_id_of(draft)),
    ):
        if recorded and actual and recorded != actual:
            logger.log(
                logging.WARNING if reads_hidden else logging.INFO,
                "This head was trained with %s model %r but is used with %r; its weights may not transfer.",
                role,
                recorded,
                actual,
            )


def draft_input_ids(
    draft,
    input_ids: torch.Tensor,  # (batch, length)
    vocab_size: int | None = None,
) -> torch.Tensor:  # (batch, length)
    """``input_ids`` as the draft can embed them: ids beyond its embedding matrix become its pad token.

    A target with a larger (padded) vocabulary can emit ids the draft does not have as recovered or
    bonus tokens. The draft only proposes; any proposal distribution keeps the emitted law exact, so it
    is shown a stand-in for them. With ``vocab_size`` (the ids that can occur), nothing is checked when
    the draft embeds all of them.
    """
    embeddings = draft.get_input_embeddings()
    size = getattr(embeddings, "num_embeddings", None)
    if size is None or (vocab_size is not None and vocab_size <= size):
        return input_ids
    if input_ids.numel() == 0 or int(input_ids.max()) < size:
        return input_ids
    stand_in = getattr(draft.config.get_text_config(), "pad_token_id", None) or 0
    return input_ids.masked_fill(input_ids >= size, stand_in)
