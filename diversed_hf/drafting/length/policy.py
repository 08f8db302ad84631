"""The draft-length policy of a call: transformers' knobs (``num_assistant_tokens``, ``num_assistant_tokens_schedule``,
``assistant_confidence_threshold``) and ``assistant_costs``, resolved once where transformers reads them and checked
(:class:`DraftLengthPolicy`). The schedules themselves run in :mod:`diversed_hf.drafting.candidates` and
:mod:`diversed_hf.drafting.length.optimal`."""

from __future__ import annotations

from dataclasses import dataclass

from ...verifiers.checks import is_integer, is_real
from .costs import DraftCosts, check_draft_costs

__all__ = [
    "DEFAULT_DRAFT_TOKENS",
    "DRAFT_LENGTH_DEFAULTS",
    "SCHEDULES",
    "DraftLengthPolicy",
    "check_draft_length_policy",
    "draft_length_of",
]

#: transformers' draft-length knobs and the values used when neither ``generate`` nor a generation config sets them
DRAFT_LENGTH_DEFAULTS = {
    "num_assistant_tokens": 20,
    "num_assistant_tokens_schedule": "constant",
    "assistant_confidence_threshold": None,
}
#: drafts per round the bench and the demo use for a draft whose generation config names no length of its own
DEFAULT_DRAFT_TOKENS = 5

SCHEDULES = ("constant", "heuristic", "heuristic_transient", "optimal")


def draft_length_of(draft) -> int:
    """The draft length a draft ships with: the ``num_assistant_tokens`` its ``generation_config.json`` sets (the
    EagleDraft's measured best), else :data:`DEFAULT_DRAFT_TOKENS` (transformers' default, 20, measures nothing about
    this draft)."""
    config = getattr(draft, "generation_config", None)
    if config is not None and "num_assistant_tokens" in config.to_diff_dict():
        return int(config.num_assistant_tokens)
    return DEFAULT_DRAFT_TOKENS


def check_draft_length_policy(schedule: str, confidence_threshold: float | None) -> None:
    """transformers' draft-length knobs, checked: a known schedule, a threshold in [0, 1) or None."""
    if schedule not in SCHEDULES:
        raise ValueError(
            f"`num_assistant_tokens_schedule` must be one of {SCHEDULES}, got {schedule!r}. (Set it on the assistant's "
            "`generation_config` or pass it to `generate`.)"
        )
    if confidence_threshold is not None:
        if not is_real(confidence_threshold):
            raise TypeError(
                "`assistant_confidence_threshold` must be a number in [0, 1) or None, got "
                f"{type(confidence_threshold).__name__} "
                f"{confidence_threshold!r}."
            )
        if not 0 <= confidence_threshold < 1:
            raise ValueError(
                f"`assistant_confidence_threshold` must be in [0, 1) (0 or None: off), got {confidence_threshold!r}: a "
                "threshold of 1 would stop every round after one draft."
            )


@dataclass(frozen=True)
class DraftLengthPolicy:
    """How many tokens each row drafts: transformers' draft-length knobs, resolved once per call and checked.

    ``num_assistant_tokens`` (``N``), ``schedule`` (``num_assistant_tokens_schedule``), ``confidence_threshold``
    (``assistant_confidence_threshold``; ``None`` is off) and ``costs`` (``assistant_costs``, the ``"optimal"``
    schedule's). :meth:`resolve` finds each where transformers does. ``generate`` resolves them once per call and passes
    the four values to :func:`~diversed_hf.generation.loop.speculative_decode` (keywords, so a direct call needs no
    policy object), which builds the policy again for the candidate generator; the generator reads nothing else.
    """

    num_assistant_tokens: int = DRAFT_LENGTH_DEFAULTS["num_assistant_tokens"]
    schedule: str = DRAFT_LENGTH_DEFAULTS["num_assistant_tokens_schedule"]
    confidence_threshold: float | None = DRAFT_LENGTH_DEFAULTS["assistant_confidence_threshold"]
    costs: DraftCosts | None = None

    def __post_init__(self):
        count = self.num_assistant_tokens
        if not is_integer(count) or count < 1:
            raise ValueError(f"`num_assistant_tokens` must be a positive integer, got {count!r}.")
        object.__setattr__(self, "num_assistant_tokens", int(count))  # a numpy integer too
        check_draft_length_policy(self.schedule, self.confidence_threshold)
        threshold = self.confidence_threshold
        object.__setattr__(self, "confidence_threshold", float(threshold) if threshold else None)  # 0 is off too
        check_draft_costs(self.costs, self.schedule)

    @classmethod
    def resolve(
        cls,
        assistant_model,
        generation_config=None,
        *,
        num_assistant_tokens: int | None = None,
        schedule: str | None = None,
        confidence_threshold: float | None = None,
        costs: DraftCosts | None = None,
    ) -> "DraftLengthPolicy":
        """Each knob from its keyword, else ``generation_config`` (the one passed to ``generate``), else the
        assistant's ``generation_config`` (where transformers reads them), else :data:`DRAFT_LENGTH_DEFAULTS`.
        (transformers also applies a confidence threshold of 0.4 by default, adapted from ROC statistics when
        scikit-learn is installed; here a threshold applies only when set.)"""
        given = {
            "num_assistant_tokens": num_assistant_tokens,
            "num_assistant_tokens_schedule": schedule,
            "assistant_confidence_threshold": confidence_threshold,
        }
        for name, value in given.items():
            for config in (generation_config, getattr(assistant_model, "generation_config", None)):
                if value is None and config is not None:
                    value = getattr(config, name, None)
            given[name] = DRAFT_LENGTH_DEFAULTS[name] if value is None else value
        return cls(*given.values(), costs=costs)
