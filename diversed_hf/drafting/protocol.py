"""What a drafter can do, declared once per class: the one protocol every user of a drafter reads.

A drafter is what proposes tokens for the target to verify: any Hugging Face causal LM (a draft model), or one of the
package's drafters (an :class:`~diversed_hf.drafting.eagle.EagleDraft`, prompt lookup, early exit, an MTP layer, a
DFlash block draft, the Gemma 4 assistant, a draft with another tokenizer). A drafter class registers what it can do
with :func:`register_drafter`; :func:`capabilities_of` answers for any drafter (an unregistered class is a plain draft
model). The loop, the tree checks, the pair checks, the mixin's verifier choice, the trainer's rollouts, judge mining
and the bench read :class:`DrafterCapabilities`, never the drafter's attributes.

A new drafter is one class and one registration::

    class MyDraft(torch.nn.Module):
        ...


    register_drafter(MyDraft, reads_target_features=True, candidate_generator=MyCandidateGenerator)

:func:`diversed_hf.drafting.resolve.resolve_drafter` turns what ``generate`` was given (``assistant_model``,
``prompt_lookup_num_tokens``, ``assistant_early_exit``, ``use_mtp``, ``speculation_type``, two tokenizers) into the
drafter.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..common.pairs import text_vocab_size, verification_vocab_size

__all__ = [
    "DrafterCapabilities",
    "capabilities_of",
    "is_registered",
    "proposes_from_rows",
    "register_drafter",
    "registered_drafters",
    "verification_vocab",
]


@dataclass(frozen=True)
class DrafterCapabilities:
    """What a drafter class can do (all off for a plain draft model)."""

    #: it reads the target's hidden states (an EagleDraft, an MTP layer, DFlash, the Gemma 4 assistant): the loop
    #: attaches the target and hands it each verification pass's features
    reads_target_features: bool = False
    #: it picks the features it reads from a target pass's hidden states, ``target_features(hidden_states)`` (an
    #: EagleDraft: an EAGLE-3 draft stacks several layers); else a feature drafter reads the last layer's
    selects_features: bool = False
    #: it reads the target's KV cache (the Gemma 4 assistant)
    reads_target_cache: bool = False
    #: its drafts are the target's own token ids, as point masses with no hidden state (prompt lookup, a draft with
    #: another tokenizer): no vocabulary to compare, and no head that reads the draft's hidden state
    proposes_target_ids: bool = False
    #: it drafts a block in one pass (DFlash): the trainer's rollouts, which score one token at a time, refuse it
    drafts_blocks: bool = False
    #: it drafts a fixed number of tokens a round, its ``num_tokens`` (prompt lookup): no draft-length knob applies
    drafts_fixed_length: bool = False
    #: why it cannot draft a token tree, or None when it can
    no_trees: str | None = None
    #: the candidate generator that drives it in the loop (None: the draft-model generator)
    candidate_generator: type | None = None
    #: how messages name it ("prompt lookup"), and how a user builds it ("PromptLookup(N)"); default its class name
    described_as: str | None = None
    built_as: str | None = None


_REGISTRY: dict[type, DrafterCapabilities] = {}
_PLAIN = DrafterCapabilities()


def register_drafter(cls: type, **capabilities) -> type:
    """Declare what drafter class ``cls`` (and its subclasses) can do (the fields of :class:`DrafterCapabilities`);
    returns ``cls``. A drafter with its own candidate generator drafts no trees unless it says otherwise."""
    if not isinstance(cls, type):
        raise TypeError(f"`cls` must be a drafter class, got {cls!r}.")
    if capabilities.get("candidate_generator") is not None:
        capabilities.setdefault("no_trees", "has its own candidate generator")
    _REGISTRY[cls] = DrafterCapabilities(**capabilities)
    return cls


def _registration(drafter) -> DrafterCapabilities | None:
    """The registration of ``drafter``'s class (an instance or a class), or of its nearest registered base."""
    cls = drafter if isinstance(drafter, type) else type(drafter)
    return next((_REGISTRY[base] for base in cls.__mro__ if base in _REGISTRY), None)


def capabilities_of(drafter) -> DrafterCapabilities:
    """What ``drafter`` (an instance or a class) can do: its registration; a plain draft model's when none is
    registered (or for ``None``)."""
    return _registration(drafter) or _PLAIN


def is_registered(drafter) -> bool:
    """Whether ``drafter``'s class (or a base) was registered with :func:`register_drafter`."""
    return _registration(drafter) is not None


def registered_drafters() -> dict[type, DrafterCapabilities]:
    """Every registered drafter class and its capabilities (the package's register when their modules load)."""
    return dict(_REGISTRY)


def proposes_from_rows(drafter) -> bool:
    """Whether a point-mass drafter proposes from the rows' tokens itself (``propose(rows, limits)`` -> each row's
    proposed ids): what the loop's point-mass generator and the trainer's rollouts both call."""
    return callable(getattr(type(drafter), "propose", None))


def verification_vocab(target, drafter, tokenizer=None, assistant_tokenizer=None) -> int:
    """The vocabulary verification runs over with ``drafter``: the target's, once the pair is checked to share token
    ids (:func:`~diversed_hf.common.pairs.verification_vocab_size`); a drafter that proposes the target's own ids has
    nothing to compare."""
    if capabilities_of(drafter).proposes_target_ids:
        return text_vocab_size(target)
    return verification_vocab_size(target, drafter, tokenizer, assistant_tokenizer)
