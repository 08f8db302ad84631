"""Relaxed speculative decoding inside transformers' ``generate``: the HF boundary.

``model.generate(input_ids, assistant_model=draft, diversed_head=head)`` (or ``verifier=...``) runs
the loop of :mod:`diversed_hf.generation.loop` through transformers' ``custom_generate`` hook, so generation
config, special tokens, attention mask, length limits, logits processors and stopping criteria are
prepared exactly as for any other ``generate`` call. Without ``diversed_head`` / ``verifier`` the
call goes to transformers unchanged. This module checks the arguments (the pair, the verifier, the
batch) and turns the loop's result into transformers' output type.
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path

import torch
from transformers import GenerationConfig, GenerationMixin, StoppingCriteriaList, StopStringCriteria

from .. import compat
from ..common.pairs import (  # noqa: F401 - re-exported
    check_head_matches,
    check_tokenizer_arguments,
    shared_vocab_size,
    text_vocab_size,
    verification_vocab_size,
)
from ..drafting.candidates import DraftLengthPolicy
from ..drafting.dflash import DFlashDraft, looks_like_block_draft
from ..drafting.drafters import EarlyExitDraft, PromptLookup
from ..drafting.kv_sharing import KvSharingDraft, is_kv_sharing_assistant
from ..drafting.mtp import MtpDraft
from ..drafting.translated import TranslatedDraft
from ..drafting.tree import TREE_KNOBS, TreeSpec, check_tree_call
from ..heads.head import DiversedHead
from ..verifiers.block import BlockVerifier
from ..verifiers.rules import ExactVerifier, HeadVerifier, Verifier
from . import batch_rule
from .loop import speculative_decode
from .output_scores import TargetScoreRecorder
from .outputs import DiversedGenerateDecoderOnlyOutput
from .padding import left_align, needs_left_align

logger = logging.getLogger(__name__)

#: the Hub repository folder of the ``custom_generate`` method (``README.md``, ``custom_generate/generate.py``), shipped
#: as package data: ``model.generate(..., custom_generate=CUSTOM_GENERATE_REPO, trust_remote_code=True, ...)`` runs it
#: from this local path; ``diversed-hf push --custom-generate --repo-id ORG/NAME`` publishes it
CUSTOM_GENERATE_REPO = str(Path(__file__).resolve().parents[1] / "hub_repo")

# generation-config flags our loop cannot honour, with the value that disables them
_UNSUPPORTED_CONFIG = {
    "num_beams": 1,
    "num_beam_groups": 1,
    "penalty_alpha": None,
    "constraints": None,
    "force_words_ids": None,
    "assistant_ensemble_weight": None,
    "output_attentions": False,
    "output_hidden_states": False,
    "dola_layers": None,
}


#: transformers' ``speculation_type`` values the loop runs
_SPECULATION_TYPES = ("dflash",)


def _check_drafter(which: str, assistant_model, extra: dict, generation_config) -> None:
    """Refuse, before any forward pass, a drafter of transformers' that ``which`` (``verifier`` / ``diversed_head``)
    cannot verify, naming the argument and what to do."""
    value = extra.get("speculation_type", getattr(generation_config, "speculation_type", None))
    if value is not None and value not in _SPECULATION_TYPES:
        raise ValueError(
            f"`speculation_type={value!r}`: diversed_hf's loop runs {', '.join(map(repr, _SPECULATION_TYPES))}, so "
            f"`{which}` cannot verify this drafter's drafts. Drop `{which}` to use transformers' own lossless path."
        )
    if value == "dflash" and assistant_model is None:
        raise ValueError('`speculation_type="dflash"` drafts with a DFlash `assistant_model`: pass one.')


#: drafters whose proposals are tokens, not samples: point masses, without hidden states (diversed_hf.drafting.drafters)
_POINT_MASS_DRAFTERS = (PromptLookup, TranslatedDraft)


def _drafter(target, assistant_model, extra: dict, generation_config):
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
    if speculation_type not in (None, *_SPECULATION_TYPES):  # the target's generation config may set it too
        raise ValueError(
            f"`speculation_type={speculation_type!r}` (the target's generation config): diversed_hf's loop runs "
            f"{', '.join(map(repr, _SPECULATION_TYPES))}. Unset it, or drop `verifier`/`diversed_head`."
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


def _check_generation_config(generation_config: GenerationConfig) -> None:
    for name, neutral in _UNSUPPORTED_CONFIG.items():
        value = getattr(generation_config, name, neutral)
        if value is not None and value != neutral and not (neutral is None and value is False):
            raise ValueError(
                f"`{name}={value!r}` cannot be combined with `diversed_head`/`verifier`: relaxed speculative decoding "
                f"runs one greedy or sampled sequence per row. Remove `{name}` (or set it to {neutral!r})."
            )
    guidance_scale = getattr(generation_config, "guidance_scale", None)
    if guidance_scale is not None and guidance_scale != 1:
        raise ValueError(
            f"`guidance_scale={guidance_scale!r}` (classifier-free guidance) cannot be combined with `diversed_head`/"
            "`verifier`: transformers applies it by running the model again on the unconditional prompt, one token per "
            "call on a cache of its own, which a speculative round (several positions scored at once, rejected drafts "
            "rolled back) cannot follow. Remove `guidance_scale` (or set it to 1)."
        )
    _check_cache_options(generation_config.cache_implementation, generation_config.use_cache)


def _check_cache_options(cache_implementation, use_cache) -> None:
    """The loop keeps one ``DynamicCache`` per model and edits it per row (crop, shift, drop rows); other caches are
    refused, as is decoding without one (transformers' assisted decoding needs a cache too)."""
    if cache_implementation not in (None, "dynamic"):
        raise ValueError(
            f"`cache_implementation={cache_implementation!r}` cannot be combined with `diversed_head`/`verifier`: "
            "the speculative loop keeps a dynamic cache for each model and edits it per row after every round "
            "(rejected drafts cropped, rows shifted and dropped), which a fixed-size, paged, offloaded or quantized "
            "cache does not "
            'allow. Remove `cache_implementation` (or set it to "dynamic").'
        )
    if use_cache is False:
        raise ValueError(
            "`use_cache=False` cannot be combined with `diversed_head`/`verifier`: speculative decoding verifies each "
            "round's drafts on top of the target's cache and rolls rejected ones back. Remove `use_cache=False`."
        )


def _check_batch(
    input_ids: torch.Tensor,  # (batch, length)
    attention_mask: torch.Tensor | None,  # (batch, length)
    generator: torch.Generator | None,
) -> None:
    if input_ids.shape[0] == 0:
        raise ValueError("`input_ids` holds no prompt (batch size 0); pass at least one row.")
    if input_ids.shape[1] == 0:
        raise ValueError(
            f"`input_ids` has shape {tuple(input_ids.shape)}: the prompt is empty, and relaxed speculative decoding "
            "continues a prompt. Pass at least one token, e.g. the tokenizer's BOS token "
            "(`tokenizer(text, add_special_tokens=True)`)."
        )
    if attention_mask is not None and tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise ValueError(
            f"`attention_mask` has shape {tuple(attention_mask.shape)} but `input_ids` has shape "
            f"{tuple(input_ids.shape)}: each token needs its mask entry. Pass the mask the tokenizer returned with "
            "these ids (`tokenizer(texts, return_tensors='pt', padding=True)` gives both)."
        )
    empty = None if attention_mask is None else ~attention_mask.bool().any(dim=1)  # (B,)
    if empty is not None and bool(empty.any()):
        row = int(empty.nonzero()[0])
        raise ValueError(
            f"Row {row} of the batch is empty (its `attention_mask` is all zeros; an empty-string prompt): the models "
            "would attend to nothing. Give every prompt at least one token, e.g. tokenize with "
            "`add_special_tokens=True` so it starts with BOS, or leave the empty prompts out of the batch."
        )
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"`generator` must be a torch.Generator, got {type(generator).__name__}.")
        if torch.device(generator.device).type != input_ids.device.type:
            raise ValueError(
                f"`generator` is on {generator.device} but the prompt and the models are on {input_ids.device}: random "
                "numbers are drawn where the models run. Use `torch.Generator(device=model.device)`."
            )


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


class DiversedGenerationMixin:
    """Adds ``diversed_head=`` and ``verifier=`` to ``generate``; put it before the model class::

        class MyLlama(DiversedGenerationMixin, LlamaForCausalLM): ...

    or call :func:`enable_diversed` on a loaded model.

    Extra ``generate`` arguments (all keyword-only; used only with a head or verifier):

    - ``diversed_head`` (:class:`DiversedHead`): DIVERSED verification, ``w_t`` from the head.
    - ``verifier`` (:class:`~diversed_hf.verifiers.Verifier`): any verification method.
    - ``block_verification`` (bool): judge each drafted block as a whole against the verifier's (or head's)
      distribution, :class:`~diversed_hf.verifiers.BlockVerifier`: same law, at least as many accepted drafts.
    - ``num_assistant_tokens`` (int), ``num_assistant_tokens_schedule`` (``"constant"``, ``"heuristic"``,
      ``"heuristic_transient"``, ``"optimal"``), ``assistant_confidence_threshold`` (float): transformers'
      draft-length knobs, honoured per row; read from ``generate``, else the assistant's ``generation_config``
      (:meth:`~diversed_hf.drafting.candidates.DraftLengthPolicy.resolve`; semantics in
      :class:`~diversed_hf.drafting.candidates.DiversedCandidateGenerator`).
    - ``assistant_costs`` (:class:`~diversed_hf.drafting.length.costs.DraftCosts`): the round costs the
      ``"optimal"`` schedule uses instead of measuring them (:mod:`diversed_hf.drafting.length.optimal`).
    - ``assistant_tree_top_k`` (int K), ``assistant_tree_size`` (int M), ``assistant_tree`` (paths of child ranks):
      draft a token tree of ``num_assistant_tokens`` levels each round, all its nodes verified in one target pass
      (:mod:`diversed_hf.drafting.tree`, docs/method.md §8); read from ``generate``, else a ``generation_config``.
    - ``assistant_disable_by_batch_size`` (int): lossless batches above it run the target alone (``batch_rule``).
    - ``output_target_weights`` (bool): record the ``w`` used at each emitted token.
    - ``generator`` (``torch.Generator``): random source for drafting and verification.

    With ``return_dict_in_generate=True`` the output has ``speculation`` (:class:`SpeculationStats`).
    """

    def generate(self, *args, **kwargs):
        return _generate(self, super().generate, args, kwargs)


def diversed_generate(model, *args, **kwargs):
    """``model.generate(*args, **kwargs)`` with ``diversed_head=`` / ``verifier=`` on any transformers model, left
    unmodified (no :func:`enable_diversed`): what the Hub ``custom_generate`` folder calls
    (``diversed_hf/hub_repo/custom_generate/generate.py``). Arguments as :class:`DiversedGenerationMixin`'s
    ``generate``; without a head or verifier it is the model's own ``generate``.
    """
    if isinstance(model, DiversedGenerationMixin):
        return _generate(model, super(DiversedGenerationMixin, model).generate, args, kwargs)
    if not isinstance(model, GenerationMixin):
        raise TypeError(f"`model` must be a transformers model with `generate`, got {type(model).__name__}.")
    # the class's method: `from_pretrained(..., trust_remote_code=True)` may have put a custom one on the instance
    return _generate(model, type(model).generate.__get__(model, type(model)), args, kwargs)


def _generate(model, base_generate, args: tuple, kwargs: dict):
    """``generate`` on ``model``: the loop with a head or verifier, else ``base_generate`` (transformers' own, bound
    to ``model``) unchanged."""
    diversed_head = kwargs.pop("diversed_head", None)
    verifier = kwargs.pop("verifier", None)
    block_verification = kwargs.pop("block_verification", None)
    output_target_weights = kwargs.pop("output_target_weights", None)
    generator = kwargs.pop("generator", None)
    if block_verification is not None and not isinstance(block_verification, bool):
        raise TypeError(
            f"`block_verification` must be True or False, got {block_verification!r}: True verifies each drafted "
            "block as a whole (BlockVerifier)."
        )
    if (
        diversed_head is None
        and verifier is None
        and getattr(kwargs.get("assistant_model"), "reads_target_features", False)
    ):
        verifier = ExactVerifier()  # a feature draft (EagleDraft) drafts only in this loop: lossless SD by default
    if diversed_head is None and verifier is None:
        ours = {
            "output_target_weights": output_target_weights,
            "generator": generator,
            "block_verification": block_verification or None,
            "assistant_costs": kwargs.get("assistant_costs"),
            batch_rule.KNOB: kwargs.get(batch_rule.KNOB),
        }
        for name, value in ours.items():
            if value is not None:
                raise ValueError(
                    f"`{name}` only applies to relaxed speculative decoding: pass `assistant_model=draft` and "
                    "`diversed_head=head` or `verifier=...` as well, or remove it."
                )
        return base_generate(*args, **kwargs)
    return _diversed_generate(
        model,
        base_generate,
        args,
        kwargs,
        diversed_head,
        verifier,
        bool(output_target_weights),
        generator,
        bool(block_verification),
    )


def _call_verifier(target, assistant_model, diversed_head, verifier, block_verification: bool) -> Verifier:
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
    point_mass = isinstance(assistant_model, _POINT_MASS_DRAFTERS)
    target_only = isinstance(checked, HeadVerifier) and checked.head.config.draft_hidden_size == 0
    if point_mass and checked.requires_hidden_states and not target_only:
        lookup = isinstance(assistant_model, PromptLookup)
        drafter = "prompt lookup" if lookup else "a draft with another tokenizer"
        pair = "PromptLookup(N)" if lookup else "TranslatedDraft(assistant_model, tokenizer, assistant_tokenizer)"
        raise ValueError(
            f"`{'diversed_head' if diversed_head is not None else 'verifier'}` reads the draft's hidden states, and "
            f"{drafter} proposes target tokens without any: use a head that reads the target's hidden state alone, "
            f"built for this pair by `DiversedHead.for_pair(target, {pair})` (both from diversed_hf.drafting; "
            "draft_hidden_size 0), or one that reads none (`use_hidden_states=False`), another verifier, or a draft "
            "model of the target's tokenizer."
        )
    if target_only and not point_mass:
        raise ValueError(
            "`diversed_head` reads the target's hidden state alone (draft_hidden_size 0, built for a drafter without "
            f"hidden states), but the drafter is {type(assistant_model).__name__}: use it with "
            "`prompt_lookup_num_tokens=N`, or a head built for this draft (`DiversedHead.for_pair(target, draft)`)."
        )
    if isinstance(checked, HeadVerifier) and not point_mass:
        check_head_matches(checked.head, target, assistant_model)
    if hasattr(checked, "check_models"):  # a rule that reads one model's states checks them (JudgeVerifier)
        checked.check_models(target, assistant_model)
    return verifier


def _check_loop_options(arguments: dict, extra: dict) -> None:
    """Options of ``generate`` the speculative loop cannot honour, refused with the fix."""
    for name in ("cache", "past_key_values"):
        if extra.get(name) is not None:
            raise ValueError(
                f"`{name}=` cannot be combined with `diversed_head`/`verifier`: the speculative loop builds and edits "
                f"its own cache for each model. Remove `{name}`."
            )
    _check_cache_options(extra.get("cache_implementation"), extra.get("use_cache"))  # before transformers acts on them
    if arguments.get("synced_gpus"):
        raise ValueError(
            "`synced_gpus=True` cannot be combined with `diversed_head`/`verifier`: the speculative loop does not keep "
            "processes in step (rows end after different numbers of rounds). Remove `synced_gpus`, and generate with a "
            "full copy of both models in each process."
        )


def _loop_decoder(assistant_model, verifier, policy, vocab_size, streamer, generator, output_target_weights, tree):
    """The ``custom_generate`` function ``generate`` runs once it has prepared the call: the speculative loop."""

    def decode(model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs):
        _check_generation_config(generation_config)
        attention_mask = model_kwargs.get("attention_mask")  # (B, L) or None (all ones)
        _check_batch(input_ids, attention_mask, generator)
        if streamer is not None and input_ids.shape[0] > 1:
            raise ValueError(f"`streamer` supports batch size 1 only; got a batch of {input_ids.shape[0]} prompts.")
        pad_token_id, _ = compat.special_token_ids(generation_config, input_ids.device)
        # the length limit and EOS ids of the prepared criteria (a caller's MaxLengthCriteria / EosTokenCriteria
        # replace generate's, as in transformers' own loop); the other criteria run in the loop
        max_length, eos_token_id, other_criteria = compat.split_stopping_criteria(stopping_criteria)
        max_length = generation_config.max_length if max_length is None else max_length
        eos_token_id = None if eos_token_id is None else eos_token_id.to(input_ids.device)
        # right-padded rows run left-padded; the output keeps the caller's layout (docs: diversed_hf.generation.padding)
        loop_ids, loop_mask = (
            left_align(input_ids, attention_mask) if needs_left_align(attention_mask) else (input_ids, attention_mask)
        )
        wants = dict(scores=bool(generation_config.output_scores), logits=bool(generation_config.output_logits))
        recorder = (
            TargetScoreRecorder(**wants) if generation_config.return_dict_in_generate and any(wants.values()) else None
        )
        new_tokens, stats = speculative_decode(
            model,
            assistant_model,
            verifier,
            loop_ids,
            loop_mask,
            num_draft_tokens=policy.num_assistant_tokens,
            max_new_tokens=max_length - input_ids.shape[1],
            logits_processor=logits_processor,
            stopping_criteria=other_criteria,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            do_sample=bool(generation_config.do_sample),
            generator=generator,
            streamer=streamer,
            output_target_weights=output_target_weights,
            vocab_size=vocab_size,
            num_assistant_tokens_schedule=policy.schedule,
            assistant_confidence_threshold=policy.confidence_threshold,
            assistant_costs=policy.costs,
            score_recorder=recorder,
            tree=tree,
        )
        sequences = torch.cat([input_ids, new_tokens], dim=1)
        if generation_config.return_dict_in_generate:
            scores, logits = recorder.assemble(*new_tokens.shape) if recorder is not None else (None, None)
            return DiversedGenerateDecoderOnlyOutput(
                sequences=sequences, scores=scores, logits=logits, speculation=stats
            )
        return sequences

    return decode


def _diversed_generate(
    self,
    base_generate,
    args,
    kwargs,
    diversed_head,
    verifier,
    output_target_weights,
    generator,
    block_verification=False,
):
    """``generate`` with a head or verifier on ``self`` (the target); ``base_generate`` prepares the call and runs
    the loop as its ``custom_generate``."""
    bound = inspect.signature(GenerationMixin.generate).bind(self, *args, **kwargs)
    arguments = dict(bound.arguments)
    arguments.pop("self")
    extra = arguments.pop("kwargs", {})
    assistant_model = arguments.pop("assistant_model", None)
    which = "diversed_head" if diversed_head is not None else "verifier"
    _check_drafter(which, assistant_model, extra, arguments.get("generation_config"))
    if assistant_model is not None and (
        not isinstance(assistant_model, torch.nn.Module) or not hasattr(assistant_model, "config")
    ):
        raise TypeError(
            f"`assistant_model` must be a transformers causal LM (the draft, e.g. "
            f"`AutoModelForCausalLM.from_pretrained(...)`), got {type(assistant_model).__name__}."
        )
    assistant_model = _drafter(self, assistant_model, extra, arguments.get("generation_config"))
    if assistant_model is None:
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
    verifier = _call_verifier(self, assistant_model, diversed_head, verifier, block_verification)
    tokenizer = extra.pop("tokenizer", None)
    assistant_tokenizer = extra.pop("assistant_tokenizer", None)
    check_tokenizer_arguments(tokenizer, assistant_tokenizer)
    # point-mass drafts are the target's own token ids: nothing to compare
    vocab_size = (
        text_vocab_size(self)
        if isinstance(assistant_model, _POINT_MASS_DRAFTERS)
        else verification_vocab_size(self, assistant_model, tokenizer, assistant_tokenizer)
    )
    _stop_strings_with_tokenizer(arguments, extra, tokenizer, self.generation_config)
    explicit = output_target_weights or any(extra.get(name) is not None for name in batch_rule.EXPLICIT_DRAFTING)
    limit_given = extra.pop(batch_rule.KNOB, None)
    limit = batch_rule.batch_limit(assistant_model, arguments.get("generation_config"), limit_given)
    threshold = extra.pop("assistant_confidence_threshold", None)
    policy = DraftLengthPolicy.resolve(  # the draft-length knobs, resolved once for the call
        assistant_model,
        arguments.get("generation_config"),
        num_assistant_tokens=assistant_model.num_tokens
        if isinstance(assistant_model, PromptLookup)
        else extra.pop("num_assistant_tokens", None),
        schedule=extra.pop("num_assistant_tokens_schedule", None),
        confidence_threshold=threshold,
        costs=extra.pop("assistant_costs", None),  # a `generate` keyword only
    )
    tree_given = {name: extra.pop(name, None) for name in TREE_KNOBS}
    tree = TreeSpec.resolve(  # a token tree per round (docs/method.md §8), or None: today's chain
        assistant_model, arguments.get("generation_config"), policy.num_assistant_tokens, **tree_given
    )
    if policy.costs is not None:
        policy.costs.verify_curve(policy.num_assistant_tokens)  # checked before generating
    if isinstance(assistant_model, DFlashDraft) and policy.num_assistant_tokens > assistant_model.block_size - 1:
        raise ValueError(
            f"`num_assistant_tokens={policy.num_assistant_tokens}`: this DFlash draft drafts at most "
            f"{assistant_model.block_size - 1} tokens a round (its block_size {assistant_model.block_size} minus the "
            "anchor). Ask for fewer, or leave it unset."
        )
    streamer = arguments.pop("streamer", None)
    _check_loop_options(arguments, extra)
    rows = batch_rule.batch_size_of(arguments, extra)
    if batch_rule.turns_off(verifier, limit, rows, explicit=explicit, limit_given=limit_given is not None):
        return batch_rule.generate_without_speculation(
            base_generate, dict(arguments, streamer=streamer), extra, limit=limit, rows=rows, generator=generator
        )
    if tree is not None:
        config = arguments.get("generation_config") or self.generation_config
        try:
            check_tree_call(
                self,
                assistant_model,
                verifier,
                policy,
                tree=tree,
                vocab_size=vocab_size,
                threshold_given=threshold is not None,
                num_return_sequences=extra.get("num_return_sequences", getattr(config, "num_return_sequences", None)),
            )
        except ValueError as error:
            if any(value is not None for value in tree_given.values()):
                raise
            # the tree came from a generation config (a shipped draft's best shape): this call drafts a chain
            logger.warning(
                "A generation config asks for a token tree, which this call cannot draft (%s); it drafts a chain of "
                "%d instead.",
                error,
                policy.num_assistant_tokens,
            )
            tree = None
    decode = _loop_decoder(
        assistant_model, verifier, policy, vocab_size, streamer, generator, output_target_weights, tree
    )
    # transformers' assisted path puts the prompt on the streamer; so do we. The draft is not passed on: the loop
    # holds it, and transformers' checks for its own assisted decoding (one sequence per prompt) do not apply, so
    # `num_return_sequences` repeats the prompts as for sampling (transformers refuses it under greedy decoding).
    return base_generate(**arguments, streamer=streamer, custom_generate=decode, **extra)


_ENABLED_CLASSES: dict[type, type] = {}


def enable_diversed(model):
    """Add :class:`DiversedGenerationMixin` to a loaded model, in place; returns the same object.

    The new class keeps the original's name and module, so ``save_pretrained`` records the original
    architecture; calling this twice is a no-op.
    """
    if isinstance(model, DiversedGenerationMixin):
        return model
    if not isinstance(model, GenerationMixin):
        raise TypeError(f"`model` must be a transformers model with `generate`, got {type(model).__name__}.")
    cls = type(model)
    if cls not in _ENABLED_CLASSES:
        _ENABLED_CLASSES[cls] = type(
            cls.__name__,
            (DiversedGenerationMixin, cls),
            {"__module__": cls.__module__, "__qualname__": cls.__qualname__},
        )
    model.__class__ = _ENABLED_CLASSES[cls]
    return model
