"""Deprecated: task data moved to :mod:`diversed_hf.tasks` (one registry for every task).

Kept for one release: ``from diversed_hf.data import load_task_dataset`` still works and warns.
"""

import warnings

from .tasks import PROMPT_FORMATS as TASKS  # noqa: F401
from .tasks import check_columns, format_prompt, load_task_dataset  # noqa: F401

warnings.warn(
    "`diversed_hf.data` is deprecated and will be removed in the next release; use `diversed_hf.tasks` "
    "(`load_task_dataset`, `format_prompt`, `check_columns`, `get_task`).",
    DeprecationWarning,
    stacklevel=2,
)
