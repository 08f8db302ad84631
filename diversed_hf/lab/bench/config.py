"""What a bench run decodes and how: :class:`BenchConfig`, and the task as a :class:`BenchTask`.

Tasks, rewards and quality metrics come from the one task registry, :mod:`diversed_hf.lab.tasks`
(:func:`load_task`); for other data build a :class:`BenchTask` yourself.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ...drafting.length.policy import DEFAULT_DRAFT_TOKENS, draft_length_of
from ..tasks import get_task
from .methods import DEFAULT_METHODS, parse_schedules

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_DRAFT_TOKENS",
    "DEFAULT_TIMING_PROMPTS",
    "SAMPLE_SEED_STRIDE",
    "BenchConfig",
    "BenchTask",
    "draft_length_of",
    "load_task",
]

DEFAULT_TIMING_PROMPTS = 8  # timed prompts unless `num_timing_prompts` says otherwise (never more than scored)
SAMPLE_SEED_STRIDE = 1_000_003  # seed offset between the quality pass's samples of one prompt


@dataclass
class BenchConfig:
    """What to run and how to time it (also the ``diversed-hf bench`` flags: ``num_prompts`` is ``--num-prompts``)."""

    methods: list[str] = field(
        default_factory=lambda: list(DEFAULT_METHODS), metadata={"help": "Method specs (listed above)."}
    )
    schedules: list[str] = field(
        default_factory=lambda: ["constant"],
        metadata={
            "help": "Draft-length policies, each speculative method runs once per policy: constant[:N,...], "
            "heuristic[:N0], heuristic_transient[:N0], confidence:T,..., optimal[:N] (listed above)."
        },
    )
    num_prompts: int = field(default=64, metadata={"help": "Prompts scored for quality and acceptance."})
    num_baseline_prompts: int | None = field(
        default=None,
        metadata={
            "help": "Prompts for the methods other than target-only, SD and DIVERSED with the task's head (the "
            "first of the scored ones; default: all). The quality comparison needs most prompts for those three."
        },
    )
    num_samples: int = field(
        default=1,
        metadata={"help": "Samples per prompt in the quality pass (seeds differ); more shrinks quality's noise."},
    )
    num_timing_prompts: int | None = field(
        default=None, metadata={"help": "Of those, how many (the first) are timed (default: 8, at most num_prompts)."}
    )
    max_new_tokens: int = field(default=96, metadata={"help": "Generation budget per prompt."})
    num_draft_tokens: int | None = field(
        default=None,
        metadata={
            "help": "Drafted tokens per round, N (default: the draft's own, num_assistant_tokens in its "
            "generation_config.json, else 5)."
        },
    )
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature; 0 means greedy."})
    top_k: int = field(default=0, metadata={"help": "top-k filtering (0: off)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus filtering (1: off)."})
    batch_size: int = field(default=16, metadata={"help": "Batch size of the (untimed) quality pass."})
    timing_batch_size: int = field(default=1, metadata={"help": "Batch size of the timed runs (1: latency)."})
    repeats: int = field(default=2, metadata={"help": "Timed runs per method; the median is kept."})
    profile: bool = field(
        default=False,
        metadata={
            "help": "After the timed runs, one more run of each speculative method with its rounds profiled: where a "
            "round's time goes (docs/profile.md)."
        },
    )
    seed: int = field(default=0, metadata={"help": "Seed of the prompts (for testbed tasks) and of sampling."})
    cost_tokens: int = field(
        default=32, metadata={"help": "Single-token forwards timed per model to measure the cost ratio."}
    )
    num_html_examples: int = field(default=4, metadata={"help": "Completions kept per method for the weight view."})
    num_bootstrap: int = field(
        default=2000, metadata={"help": "Bootstrap resamples (over prompts) of the paired quality intervals."}
    )

    def __post_init__(self):
        if isinstance(self.methods, str):
            raise TypeError(
                f"`methods` must be a list of method specs, got the string {self.methods!r}; pass [{self.methods!r}]."
            )
        self.methods = list(self.methods)
        if isinstance(self.schedules, str):
            raise TypeError(
                f"`schedules` must be a list of schedule specs, got the string {self.schedules!r}; pass "
                f"[{self.schedules!r}]."
            )
        self.schedules = list(self.schedules)
        parse_schedules(self.schedules)  # a wrong spec fails here, before any model loads
        for name in (
            "num_prompts",
            "num_samples",
            "max_new_tokens",
            "batch_size",
            "timing_batch_size",
            "repeats",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
        if self.num_draft_tokens is not None and (
            isinstance(self.num_draft_tokens, bool)
            or not isinstance(self.num_draft_tokens, int)
            or self.num_draft_tokens < 1
        ):
            raise ValueError(
                f"`num_draft_tokens` must be a positive integer (or None: the draft's own), got "
                f"{self.num_draft_tokens!r}."
            )
        if self.num_timing_prompts is None:
            self.num_timing_prompts = min(DEFAULT_TIMING_PROMPTS, self.num_prompts)
        if self.num_baseline_prompts is None:
            self.num_baseline_prompts = self.num_prompts
        for name in (
            "num_timing_prompts",
            "cost_tokens",
            "num_html_examples",
            "top_k",
            "num_baseline_prompts",
            "num_bootstrap",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"`{name}` must be a non-negative integer, got {value!r}.")
        if self.num_timing_prompts > self.num_prompts:
            raise ValueError(
                f"`num_timing_prompts` ({self.num_timing_prompts}) is more than `num_prompts` ({self.num_prompts}); "
                "the timed prompts are the first of the scored ones. Lower it or raise `num_prompts`."
            )
        if not self.num_timing_prompts <= self.num_baseline_prompts <= self.num_prompts:
            raise ValueError(
                f"`num_baseline_prompts` ({self.num_baseline_prompts}) must be between `num_timing_prompts` "
                f"({self.num_timing_prompts}) and `num_prompts` ({self.num_prompts}): the baselines are scored on "
                "the first prompts and timed on the first of those."
            )
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"`temperature` must be >= 0 (0 = greedy), got {self.temperature!r}.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"`top_p` must be in (0, 1], got {self.top_p!r}.")


@dataclass
class BenchTask:
    """Prompts, references and a sequence reward ``reward(completions, references) -> list[float]`` in [0, 1].

    Rows report ``quality`` as the mean reward (a fraction, as ``diversed_hf.heads.cards`` reads it); tables show it x
    100.
    """

    name: str
    prompts: list[str]
    references: list[str]
    reward: Callable[[Sequence[str], Sequence[str]], list[float]]
    quality_metric: str  # "exact_match", "rouge2_f1", "pass@1" or your own name

    def __post_init__(self):
        if len(self.prompts) != len(self.references):
            raise ValueError(
                f"`prompts` has {len(self.prompts)} entries but `references` {len(self.references)}; pass one each."
            )


def load_task(
    name: str, num_examples: int, seed: int = 0, split: str = "test", num_shots: int = 0, data_files=None
) -> BenchTask:
    """A registered task of :mod:`diversed_hf.lab.tasks` as a :class:`BenchTask`: the testbed's ``arith`` /
    ``summary`` (also spelled ``testbed_arith`` / ``testbed_summary``), ``gsm8k``, ``cnn_dailymail``,
    ``xsum`` and ``mbpp`` (from the Hub, or from local ``data_files`` in the Hub schema), or your own.

    ``num_shots`` and ``data_files`` go to tasks that take them (the paper's; the testbed's tasks are
    generated and take neither). For anything else build a :class:`BenchTask` from your own prompts,
    references and reward.
    """
    try:
        spec = get_task(name)
    except ValueError as error:
        raise ValueError(
            f"`task` is {name!r}, which the bench does not know: {error} For other data build a `BenchTask(prompts, "
            "references, reward, quality_metric)` and call `run_bench` from Python."
        ) from error
    options = {}
    if num_shots:
        options["num_shots"] = num_shots
    if data_files is not None:
        options["data_files"] = data_files
    refused = sorted(set(options) - set(spec.options))
    if refused:
        raise ValueError(
            f"Task {name!r} takes no {refused} (it accepts {list(spec.options) or 'no options'}); the testbed's tasks "
            "are generated, so drop `num_shots` / `data_files` for them."
        )
    dataset = spec.load_dataset(split=split, num_examples=num_examples, seed=seed, **options)
    logger.info("task %s: %d prompts from split %r", spec.name, len(dataset), split)
    return BenchTask(
        name=spec.name,
        prompts=list(dataset["prompt"]),
        references=list(dataset["reference"]),
        reward=spec.reward,
        quality_metric=spec.metric,
    )
