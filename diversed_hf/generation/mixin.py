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
from dataclasses import replace
from pathlib import Path

import torch
from transformers import GenerationConfig, GenerationMixin

from .. import compat
from ..common.pairs import (  # noqa: F401 - re-exported
    check_head_matches,
    check_tokenizer_arguments,
    shared_vocab_size,
    text_vocab_size,
    verification_vocab_size,
)
from ..drafting.protocol import capabilities_of
from ..verifiers.rules import ExactVerifier
from . import batch_plan, batch_rule
from .loop import speculative_decode
from .output_scores import TargetScoreRecorder
from .outputs import DiversedGenerateDecoderOnlyOutput
from .padding import left_align, needs_left_align
from .request import SpeculationRequest, resolve_request, settle_tree

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
    - ``assistant_batch_plan`` (``[[max_rows, choice], ...]``): per batch size, the draft's own shape, a chain of N
      or the target alone, for lossless calls that leave the drafting to the draft (``batch_plan``).
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
        and capabilities_of(kwargs.get("assistant_model")).reads_target_features
    ):
        verifier = ExactVerifier()  # a feature draft (EagleDraft) drafts only in this loop: lossless SD by default
    if diversed_head is None and verifier is None:
        ours = {
            "output_target_weights": output_target_weights,
            "generator": generator,
            "block_verification": block_verification or None,
            "assistant_costs": kwargs.get("assistant_costs"),
            batch_rule.KNOB: kwargs.get(batch_rule.KNOB),
            batch_plan.PLAN: kwargs.get(batch_plan.PLAN),
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


def _loop_decoder(request: SpeculationRequest):
    """The ``custom_generate`` function ``generate`` runs once it has prepared the call: the speculative loop."""

    def decode(model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs):
        _check_generation_config(generation_config)
        attention_mask = model_kwargs.get("attention_mask")  # (B, L) or None (all ones)
        _check_batch(input_ids, attention_mask, request.generator)
        if request.streamer is not None and input_ids.shape[0] > 1:
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
            request,
            loop_ids,
            loop_mask,
            max_new_tokens=max_length - input_ids.shape[1],
            logits_processor=logits_processor,
            stopping_criteria=other_criteria,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            do_sample=bool(generation_config.do_sample),
            score_recorder=recorder,
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
    self, base_generate, args, kwargs, diversed_head, verifier, output_target_weights, generator, block
):
    """``generate`` with a head or verifier on ``self`` (the target); ``base_generate`` prepares the call and runs
    the loop as its ``custom_generate``."""
    bound = inspect.signature(GenerationMixin.generate).bind(self, *args, **kwargs)
    arguments = dict(bound.arguments)
    arguments.pop("self")
    extra = arguments.pop("kwargs", {})
    explicit = output_target_weights or any(extra.get(name) is not None for name in batch_rule.EXPLICIT_DRAFTING)
    limit_given = extra.pop(batch_rule.KNOB, None)
    plan_given = extra.pop(batch_plan.PLAN, None)
    request = resolve_request(
        self,
        arguments,
        extra,
        diversed_head=diversed_head,
        verifier=verifier,
        output_target_weights=output_target_weights,
        generator=generator,
        block_verification=block,
    )
    _check_loop_options(arguments, extra)
    limit = batch_rule.batch_limit(request.drafter, arguments.get("generation_config"), limit_given)
    rows = batch_rule.batch_size_of(arguments, extra)
    request, limit = _apply_batch_plan(request, arguments, plan_given, limit, rows, explicit)
    rule_given = limit_given is not None or plan_given is not None
    if batch_rule.turns_off(request.verifier, limit, rows, explicit=explicit, limit_given=rule_given):
        return batch_rule.generate_without_speculation(
            base_generate,
            dict(arguments, streamer=request.streamer),
            extra,
            limit=limit,
            rows=rows,
            generator=generator,
        )
    # transformers' assisted path puts the prompt on the streamer; so do we. The draft is not passed on: the loop
    # holds it, and transformers' checks for its own assisted decoding (one sequence per prompt) do not apply, so
    # `num_return_sequences` repeats the prompts as for sampling (transformers refuses it under greedy decoding).
    request = settle_tree(self, request, arguments, extra)
    return base_generate(**arguments, streamer=request.streamer, custom_generate=_loop_decoder(request), **extra)


def _apply_batch_plan(request, arguments, plan_given, limit, rows, explicit) -> tuple[SpeculationRequest, int | None]:
    """The call's request under the draft's per-batch plan (:mod:`.batch_plan`), and the batch limit that turns it
    off: a chain of the plan's length, the request as it is, or a limit below ``rows`` when the plan says "target
    alone"."""
    plan = batch_plan.plan_of(request.drafter, arguments.get("generation_config"), plan_given)
    if plan is None:
        return request, limit
    if limit is not None:
        raise ValueError(
            f"This call has both `{batch_rule.KNOB}` ({limit}) and `{batch_plan.PLAN}` ({plan.to_list()}): keep one "
            f"(the plan generalises the limit K as [[K, null], [K + 1, 0]])."
        )
    if rows is None or not batch_rule.applies(request.verifier, explicit=explicit, given=plan_given is not None):
        return request, None
    choice = plan.choose(rows)
    if choice == 0:  # the target alone: as if the limit were the largest batch the plan speculates at
        return request, plan.speculates_up_to(rows)
    if choice is not None:  # a chain of the plan's length, whatever tree or length the draft's config names
        policy = replace(request.policy, num_assistant_tokens=choice)
        return replace(request, policy=policy, tree=None), None
    return request, None


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
