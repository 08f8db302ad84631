"""Speculation that turns itself off for the batches it would slow down (vLLM's ``disable_by_batch_size``).

A round's target pass verifies every row's drafts at once and ends when the slowest row's do; the more rows, the
more the pass costs on hardware that is already busy with the batch, and past some batch size a round costs more than
the tokens it gains (on this project's CPU: RESULTS.md, "Batched rounds"). A draft's ``generation_config`` carries
the largest batch at which its drafting still pays as ``assistant_disable_by_batch_size`` (measured by
``diversed-hf throughput``); a lossless call with more rows than that decodes with the target alone, as plain
``generate`` does.

The rule applies only where it changes nothing but speed:

- the verifier is lossless (:class:`~diversed_hf.verifiers.rules.ExactVerifier`, alone or in a
  :class:`~diversed_hf.verifiers.block.BlockVerifier`): target-only decoding samples the same law; a relaxed rule's
  law is the call's choice, so it always speculates;
- the call leaves the drafting to the draft: no draft-length or tree keyword (``num_assistant_tokens``, the
  schedule, ``assistant_confidence_threshold``, ``assistant_costs``, the tree knobs), and no
  ``output_target_weights``. A call that passes ``assistant_disable_by_batch_size`` itself gets its rule whatever
  else it passes.

The output keeps its shape: ``output.speculation`` counts one round per emitted token with nothing drafted, and says
why in ``disabled_by_batch_size`` (the limit that turned it off).
"""

from __future__ import annotations

import contextlib
import logging

import torch

from ..verifiers.block import BlockVerifier
from ..verifiers.checks import is_integer
from ..verifiers.rules import ExactVerifier
from .outputs import DiversedGenerateDecoderOnlyOutput, SpeculationStats, lengths_to_end

logger = logging.getLogger(__name__)

__all__ = [
    "KNOB",
    "EXPLICIT_DRAFTING",
    "applies",
    "batch_limit",
    "batch_size_of",
    "generate_without_speculation",
    "rule_value",
    "turns_off",
]

#: the generation-config field and ``generate`` keyword: speculation off for batches of more rows than this
KNOB = "assistant_disable_by_batch_size"
#: ``generate`` keywords that take the drafting into the call's hands (the rule then applies only if passed itself)
EXPLICIT_DRAFTING = (
    "num_assistant_tokens",
    "num_assistant_tokens_schedule",
    "assistant_confidence_threshold",
    "assistant_costs",
    "assistant_tree_top_k",
    "assistant_tree_size",
    "assistant_tree",
)


def rule_value(knob: str, assistant_model, generation_config, given) -> tuple[object, str]:
    """A batch rule's value and where it came from (for messages): ``given`` (the keyword), else the call's
    ``generation_config``, else the assistant's; ``None`` for none."""
    value, source = given, f"`{knob}`"
    for config, name in (
        (generation_config, "the call's"),
        (getattr(assistant_model, "generation_config", None), "the draft's"),
    ):
        if value is None and config is not None:
            value, source = getattr(config, knob, None), f"{name} generation_config's `{knob}`"
    return value, source


def batch_limit(assistant_model, generation_config, given) -> int | None:
    """The call's limit (:func:`rule_value`); ``None``: no limit."""
    value, source = rule_value(KNOB, assistant_model, generation_config, given)
    if value is None:
        return None
    if not is_integer(value) or value < 1:
        raise ValueError(
            f"{source} is {value!r}; use a batch size >= 1 (speculation runs up to that many rows, the target alone "
            "beyond), or None for no limit."
        )
    return int(value)


def _prompt_ids(arguments: dict, extra: dict) -> torch.Tensor | None:
    ids = arguments.get("inputs")
    ids = extra.get("input_ids") if ids is None else ids
    return ids if isinstance(ids, torch.Tensor) else None


def batch_size_of(arguments: dict, extra: dict) -> int | None:
    """The rows the call decodes (prompts x ``num_return_sequences``), or ``None`` where ``generate`` was given no
    ``input_ids`` to count."""
    ids = _prompt_ids(arguments, extra)
    if ids is None:
        return None
    rows = ids.shape[0] if ids.dim() > 1 else 1
    config = arguments.get("generation_config")
    copies = extra.get("num_return_sequences") or getattr(config, "num_return_sequences", None) or 1
    return int(rows) * int(copies)


def applies(verifier, *, explicit: bool, given: bool) -> bool:
    """Whether a rule read from a generation config (this limit, or :mod:`.batch_plan`'s plan) may change this call's
    drafting: a lossless verifier, and drafting left to the draft unless the call passed the rule itself."""
    if explicit and not given:
        return False
    base = verifier.base if isinstance(verifier, BlockVerifier) else verifier
    return type(base) is ExactVerifier


def turns_off(verifier, limit: int | None, rows: int | None, *, explicit: bool, limit_given: bool) -> bool:
    """Whether this call decodes with the target alone (the module docstring's rule)."""
    if limit is None or rows is None or rows <= limit:
        return False
    return applies(verifier, explicit=explicit, given=limit_given)


def generate_without_speculation(base_generate, arguments: dict, extra: dict, *, limit: int, rows: int, generator=None):
    """Plain ``generate`` (``base_generate``) for a call of ``rows`` rows the rule turned off; with
    ``return_dict_in_generate`` the output carries ``speculation`` (one round per token, nothing drafted,
    ``disabled_by_batch_size=limit``). A ``generator`` seeds the sampling (in a forked RNG state: the global one is
    left as it was)."""
    logger.info("%d rows > %s=%d: decoding with the target alone.", rows, KNOB, limit)
    prompt = _prompt_ids(arguments, extra)
    cuda = [prompt.device] if prompt is not None and prompt.device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda) if generator else contextlib.nullcontext():
        if generator is not None:
            torch.manual_seed(int(torch.randint(2**62, (1,), generator=generator, device=generator.device)))
        output = base_generate(**arguments, **extra)
    if not isinstance(output, dict):  # a tensor of sequences: nothing to attach
        return output
    lengths = lengths_to_end(output.sequences[:, prompt.shape[-1] :], _eos_id(arguments, extra, base_generate))
    return DiversedGenerateDecoderOnlyOutput(**dict(output.items()), speculation=_target_only_stats(lengths, limit))


def _eos_id(arguments: dict, extra: dict, base_generate):
    """The call's end-of-sequence id(s): its keyword, else its ``generation_config``'s, else the model's."""
    eos = extra.get("eos_token_id")
    for config in (arguments.get("generation_config"), getattr(base_generate, "__self__", None)):
        config = getattr(config, "generation_config", config)
        if eos is None and config is not None:
            eos = getattr(config, "eos_token_id", None)
    return eos


def _target_only_stats(generated: torch.Tensor, limit: int) -> SpeculationStats:
    """Statistics of target-only decoding: ``generated`` ``(batch,)`` tokens per row, one round each."""
    zeros = torch.zeros_like(generated)
    counts = generated.tolist()
    return SpeculationStats(
        num_draft_tokens=0,
        num_rounds=generated.clone(),
        num_drafted=zeros,
        num_accepted=zeros.clone(),
        num_generated=generated,
        drafted_per_position=torch.zeros(len(counts), 0, dtype=torch.long),
        accepted_per_position=torch.zeros(len(counts), 0, dtype=torch.long),
        position_acceptance=[torch.zeros(n, 0) for n in counts],
        disabled_by_batch_size=limit,
    )
