"""Deprecated: rewards moved to :mod:`diversed_hf.tasks.rewards`, the task table to :mod:`diversed_hf.tasks`.

Kept for one release: ``from diversed_hf.rewards import exact_match, reward_for_task`` still works and warns.
"""

import warnings

from .tasks import get_task, reward_for_task, task_names  # noqa: F401
from .tasks.rewards import (  # noqa: F401
    exact_match,
    extract_code,
    extract_final_number,
    pass_at_1,
    rouge2,
    rouge2_f1,
    run_program,
    sandbox_network_mode,
)

warnings.warn(
    "`diversed_hf.rewards` is deprecated and will be removed in the next release; use `diversed_hf.tasks.rewards` "
    "for the reward functions and `diversed_hf.tasks.reward_for_task` / `get_task(name).reward` for a task's reward.",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name):
    if name == "TASK_REWARDS":
        return {task: get_task(task).reward for task in task_names()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
