"""Tasks: one registry of :class:`TaskSpec` (data, prompt format, reward, metric, generation length).

    from diversed_hf.lab.tasks import get_task, load_task_dataset, reward_for_task

    spec = get_task("gsm8k")                     # or "arith" / "summary" from the CPU testbed
    data = load_task_dataset("gsm8k", split="test", num_examples=200)   # prompt, reference, ...
    scores = spec.reward(completions, data["reference"])                 # one float in [0, 1] each

The paper's tasks live in :mod:`.paper`, HumanEval in :mod:`.humaneval`, real-text one-line summaries in
:mod:`.synopsis` (chat prompts: :mod:`.chat`), the pure reward functions in :mod:`.rewards`. Each is imported on
first use (a task lookup imports its own module only), so reading the registry costs nothing of the others.
"""

import importlib

from .registry import (
    METRIC_LABELS,
    TaskSpec,
    canonical_metric,
    check_columns,
    get_task,
    load_task_dataset,
    metric_label,
    register_task,
    reward_for_task,
    task_card,
    task_names,
)

__all__ = [
    "METRIC_LABELS",
    "PROMPT_FORMATS",
    "PromptFormat",
    "TaskSpec",
    "canonical_metric",
    "chat",
    "check_columns",
    "format_prompt",
    "get_task",
    "humaneval",
    "load_task_dataset",
    "metric_label",
    "paper",
    "register_task",
    "reward_for_task",
    "rewards",
    "synopsis",
    "task_card",
    "task_names",
]

#: submodules, and names defined in one, imported on first use: looking up a task loads only its own module
_SUBMODULES = ("chat", "humaneval", "paper", "rewards", "synopsis")
_FROM_PAPER = ("PROMPT_FORMATS", "PromptFormat", "format_prompt")


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _FROM_PAPER:
        return getattr(importlib.import_module(f"{__name__}.paper"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
