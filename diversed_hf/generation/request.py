"""One ``generate`` call, resolved once: the drafter, the verifier, the draft-length policy, the tree and the rest
of what the speculative loop needs, as one :class:`SpeculationRequest` (the mixin's, :mod:`.mixin`).

:func:`resolve_request` reads the call's arguments (consuming the keywords transformers must not see), checks them
before any forward pass and returns the request; :func:`settle_tree` then decides, once the batch rule has let the
call speculate, whether a tree read from a generation config can be drafted (else the call drafts a chain).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch
from transformers import GenerationConfig, StoppingCriteriaList, StopStringCriteria

from ..common.pairs import check_head_matches, check_tokenizer_arguments
from ..drafting.candidates import DraftLengthPolicy
from ..drafting.protocol import DrafterCapabilities, capabilities_of, is_registered, verification_vocab
from ..drafting.resolve import check_drafter, resolve_drafter
from ..drafting.tree import TREE_KNOBS, TreeSpec, check_tree_call
from ..heads.head import DiversedHead
from ..verifiers.block import BlockVerifier
from ..verifiers.rules import HeadVerifier, Verifier

logger = logging.getLogger(__name__)

__all__ = ["SpeculationRequest", "resolve_request", "settle_tree"]


@dataclass(frozen=True)
class SpeculationRequest:
    """What one ``generate`` call asks of the speculative loop."""

    drafter: object  # the draft model or drafter (diversed_hf.drafting.resolve.resolve_drafter)
    capabilities: DrafterCapabilities  # what it can do (diversed_hf.drafting.protocol)
    verifier: Verifier
    policy: DraftLengthPolicy  # the draft-length knobs, resolved once
    vocab_size: int  # the ids both models score (the target's for point-mass drafts)
    tree: TreeSpec | None  # a token tree per round, or None: a chain
    tree_given: bool  # the tree knobs came from the call (not from a generation config)
    threshold_given: bool  # assistant_confidence_threshold came from the call
    streamer: object
    generator: torch.Generator | None
    output_target_weights: bool


def resolve_request(
    target, arguments: dict, extra: dict, *, diversed_head, verifier, output_target_weights, generator,
    block_verification,
) -> SpeculationRequest:  # fmt: skip
    """The call's :class:`SpeculationRequest`; ``arguments`` (``generate``'s named parameters) and ``extra`` (its
    other keywords) lose what only the loop reads."""
    drafter = _call_drafter(target, arguments, extra, "diversed_head" if diversed_head is not None else "verifier")
    capabilities = capabilities_of(drafter)
    verifier = _call_verifier(target, drafter, capabilities, diversed_head, verifier, block_verification)
    tokenizer = extra.pop("tokenizer", None)
    assistant_tokenizer = extra.pop("assistant_tokenizer", None)
    check_tokenizer_arguments(tokenizer, assistant_tokenizer)
    vocab_size = verification_vocab(target, drafter, tokenizer, assistant_tokenizer)
    _stop_strings_with_tokenizer(arguments, extra, tokenizer, target.generation_config)
    policy, threshold_given = _draft_length(drafter, capabilities, arguments, extra)
    tree_given = {name: extra.pop(name, None) for name in TREE_KNOBS}
    tree = TreeSpec.resolve(  # a token tree per round (docs/method.md §8), or None: today's chain
        drafter, arguments.get("generation_config"), policy.num_assistant_tokens, **tree_given
    )
    return SpeculationRequest(
        drafter=drafter,
        capabilities=capabilities,
        verifier=verifier,
        policy=policy,
        vocab_size=vocab_size,
        tree=tree,
        tree_given=any(value is not None for value in tree_given.values()),
        threshold_given=threshold_given,
        streamer=arguments.pop("streamer", None),
        generator=generator,
        output_target_weights=output_target_weights,
    )


def _call_drafter(target, arguments: dict, extra: dict, which: str):
    """The call's drafter (``assistant_model`` or what a keyword asks for), checked with the call's inputs."""
    assistant_model = arguments.pop("assistant_model", None)
    check_drafter(which, assistant_model, extra, arguments.get("generation_config"))
    if (
        assistant_model is not None
        and not is_registered(assistant_model)
        and (not isinstance(assistant_model, torch.nn.Module) or not hasattr(assistant_model, "config"))
    ):
        raise TypeError(
            f"`assistant_model` must be a transformers causal LM (the draft, e.g. "
            f"`AutoModelForCausalLM.from_pretrained(...)`) or a registered drafter "
            f"(diversed_hf.drafting.protocol.register_drafter), got {type(assistant_model).__name__}."
        )
    drafter = resolve_drafter(target, assistant_model, extra, arguments.get("generation_config"))
    if drafter is None:
        raise ValueError(
            f"`{which}` needs a drafter: call `model.generate(..., assistant_model=draft, {which}=...)`, or draft "
            f"without a model: `prompt_lookup_num_tokens=N` or `assistant_early_exit=k` (docs/drafters.md)."
        )
    if arguments.get("inputs") is None and extra.get("input_ids") is None and extra.get("inputs_embeds") is not None:
        raise ValueError(
            f"`{which}` needs `input_ids`: the draft and the target verify token ids, so `inputs_embeds` alone cannot "
            "be used. Pass the prompt's `input_ids` instead."
        )
    if arguments.get("custom_generate") is not None:
        raise ValueError("`custom_generate` cannot be combined with `diversed_head`/`verifier`; remove one of them.")
    return drafter


def _draft_length(drafter, capabilities: DrafterCapabilities, arguments: dict, extra: dict):
    """``(policy, threshold given)``: the draft-length knobs of the call, checked against the drafter."""
    threshold = extra.pop("assistant_confidence_threshold", None)
    if capabilities.drafts_fixed_length and extra.get("num_assistant_tokens") is not None:
        raise ValueError(
            f"`num_assistant_tokens={extra['num_assistant_tokens']!r}` does not apply to {type(drafter).__name__}, "
            f"which drafts a fixed {drafter.num_tokens} tokens a round (build it with another count): remove it."
        )
    policy = DraftLengthPolicy.resolve(  # the draft-length knobs, resolved once for the call
        drafter,
        arguments.get("generation_config"),
        num_assistant_tokens=drafter.num_tokens
        if capabilities.drafts_fixed_length
        else extra.pop("num_assistant_tokens", None),
        schedule=extra.pop("num_assistant_tokens_schedule", None),
        confidence_threshold=threshold,
        costs=extra.pop("assistant_costs", None),  # a `generate` keyword only
    )
    if policy.costs is not None:
        policy.costs.verify_curve(policy.num_assistant_tokens)  # checked before generating
    if capabilities.drafts_blocks and policy.num_assistant_tokens > drafter.block_size - 1:
        raise ValueError(
            f"`num_assistant_tokens={policy.num_assistant_tokens}`: this block draft ({type(drafter).__name__}) "
            f"drafts at most {drafter.block_size - 1} tokens a round (its block_size {drafter.block_size} minus the "
            "anchor). Ask for fewer, or leave it unset."
        )
    return policy, threshold is not None


def settle_tree(target, request: SpeculationRequest, arguments: dict, extra: dict) -> SpeculationRequest:
    """``request`` with its tree checked against the call (:func:`~diversed_hf.drafting.tree.check_tree_call`): a
    tree the call asked for is refused by name when it cannot run; one read from a generation config (a shipped
    draft's best shape) gives way to a chain, with a warning."""
    if request.tree is None:
        return request
    config = arguments.get("generation_config") or target.generation_config
    try:
        check_tree_call(
            target,
            request.drafter,
            request.verifier,
            request.policy,
            tree=request.tree,
            vocab_size=request.vocab_size,
            threshold_given=request.threshold_given,
            num_return_sequences=extra.get("num_return_sequences", getattr(config, "num_return_sequences", None)),
        )
    except ValueError as error:
        if request.tree_given:
            raise
        logger.warning(
            "A generation config asks for a token tree, which this call cannot draft (%s); it drafts a chain of %d "
            "instead.",
            error,
            request.policy.num_assistant_tokens,
        )
        return replace(request, tree=None)
    return request


def _call_verifier(
    target, drafter, capabilities: DrafterCapabilities, diversed_head, verifier, block_verification: bool
) -> Verifier:
    """The call's verifier (``diversed_head=head`` is ``HeadVerifier(head)``), wrapped for block verification when
    asked, its head checked against the pair."""
    if diversed_head is not None and verifier is not None:
        raise ValueError(
            "Pass either `diversed_head` or `verifier`, not both: `diversed_head=head` is shorthand for "
            "`verifier=HeadVerifier(head)`."
        )
    if diversed_head is not None:
        if not isinstance(diversed_head, DiversedHead):
            raise TypeError(f"`diversed_head` must be a DiversedHead, got {type(diversed_head).__name__}.")
        verifier = HeadVerifier(diversed_head)
    if not isinstance(verifier, Verifier):
        raise TypeError(
            "`verifier` must be a diversed_hf.verifiers.Verifier (e.g. ExactVerifier()), got "
            f"{type(verifier).__name__}."
        )
    if block_verification and not isinstance(verifier, BlockVerifier):
        verifier = BlockVerifier(verifier)
    checked = verifier.base if isinstance(verifier, BlockVerifier) else verifier
    point_mass = capabilities.proposes_target_ids
    target_only = isinstance(checked, HeadVerifier) and checked.head.config.draft_hidden_size == 0
    if point_mass and checked.requires_hidden_states and not target_only:
        name = capabilities.described_as or type(drafter).__name__
        pair = capabilities.built_as or type(drafter).__name__
        raise ValueError(
            f"`{'diversed_head' if diversed_head is not None else 'verifier'}` reads the draft's hidden states, and "
            f"{name} proposes target tokens without any: use a head that reads the target's hidden state alone, "
            f"built for this pair by `DiversedHead.for_pair(target, {pair})` (both from diversed_hf.drafting; "
            "draft_hidden_size 0), or one that reads none (`use_hidden_states=False`), another verifier, or a draft "
            "model of the target's tokenizer."
        )
    if target_only and not point_mass:
        raise ValueError(
            "`diversed_head` reads the target's hidden state alone (draft_hidden_size 0, built for a drafter without "
            f"hidden states), but the drafter is {type(drafter).__name__}: use it with "
            "`prompt_lookup_num_tokens=N`, or a head built for this draft (`DiversedHead.for_pair(target, draft)`)."
        )
    if isinstance(checked, HeadVerifier) and not point_mass:
        check_head_matches(checked.head, target, drafter)
    if hasattr(checked, "check_models"):  # a rule that reads one model's states checks them (JudgeVerifier)
        checked.check_models(target, drafter)
    return verifier


def _stop_strings_with_tokenizer(arguments: dict, extra: dict, tokenizer, model_config: GenerationConfig) -> None:
    """``stop_strings`` with ``tokenizer=``: build transformers' ``StopStringCriteria`` here, as a stopping criterion.

    transformers (5.24) does not hand ``tokenizer`` on to a ``custom_generate`` function's preparation, so it would
    report that no tokenizer was given. ``stop_strings`` is read where transformers reads it (a ``generate`` keyword,
    else the ``generation_config`` passed, else the model's) and cleared for transformers.
    """
    if tokenizer is None:
        return
    if "stop_strings" in extra:
        stop_strings = extra["stop_strings"]
    else:
        given = arguments.get("generation_config")
        stop_strings = None if given is None else given.stop_strings
        stop_strings = model_config.stop_strings if stop_strings is None else stop_strings
    if stop_strings is None:
        return
    criteria = StoppingCriteriaList(arguments.get("stopping_criteria") or [])
    criteria.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=stop_strings))
    arguments["stopping_criteria"] = criteria
    extra["stop_strings"] = None
