"""The one table of tasks: every part of the project that needs to know a task reads it here.

A :class:`TaskSpec` says everything the library needs about one task: how to load its prompts and
references, its sequence reward, the quality metric the reward measures (and how tables label it),
its Hub datasets (for model cards) and its default generation length. Data loading, rewards, model
cards, the bench and the training scripts all go through :func:`get_task`.

Tasks come from three places:

- the paper's tasks (GSM8K, CNN/DailyMail, XSum, MBPP), registered by :mod:`diversed_hf.lab.tasks.paper`;
- the CPU testbed's ``arith`` and ``summary``, registered by :mod:`diversed_hf.testbed` when it is
  imported; the library never imports the testbed, so :func:`get_task` finds them through the
  ``diversed_hf.tasks`` entry-point group the package declares (``diversed_hf.testbed:register_tasks``);
- your own: ``register_task(TaskSpec(...))``, or an entry point of your package in the same group.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ...heads.metrics import METRIC_ALIASES, METRIC_LABELS, canonical_metric, metric_label  # noqa: F401 - re-exported
from ...verifiers.checks import check_columns

logger = logging.getLogger(__name__)

__all__ = [
    "METRIC_LABELS",
    "TaskSpec",
    "check_columns",
    "get_task",
    "load_task_dataset",
    "metric_label",
    "register_task",
    "reward_for_task",
    "task_card",
    "task_names",
]

ENTRY_POINT_GROUP = "diversed_hf.tasks"  # the plugin group keeps its name (tasks of other packages register in it)
#: the built-in tasks, registered when their module is first imported: each name (aliases included) -> its module
BUILTIN_TASKS: dict[str, str] = {
    "gsm8k": "paper",
    "cnn_dailymail": "paper",
    "cnndm": "paper",
    "xsum": "paper",
    "mbpp": "paper",
    "humaneval": "humaneval",
    "synopsis": "synopsis",
}

Reward = Callable[[Sequence[str], Sequence[str]], list]


@dataclass(frozen=True)
class TaskSpec:
    """One task: data, reward, metric, generation length.

    ``load(split=..., num_examples=..., seed=..., **options)`` returns a ``datasets.Dataset`` with at
    least the columns ``prompt`` (text ending where the model continues) and ``reference`` (what
    ``reward`` compares a completion with). ``reward(completions, references) -> list[float]`` is a
    pure sequence reward in [0, 1].
    """

    name: str
    description: str  # one sentence for model cards: what the task is and what quality means
    load: Callable[..., Any]
    reward: Reward
    metric: str  # a key of METRIC_LABELS, or your own metric's name
    max_new_tokens: int = 128  # default generation length for evaluation
    hub_datasets: tuple[str, ...] = ()  # Hub dataset ids (model-card metadata)
    aliases: tuple[str, ...] = ()  # other names that resolve to this task
    prompt_format: Any = None  # how rows become prompts (e.g. a PromptFormat), when the task has one
    options: tuple[str, ...] = field(default=())  # extra keyword options ``load`` accepts

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"`name` must be a non-empty string, got {self.name!r}.")
        for attribute in ("load", "reward"):
            if not callable(getattr(self, attribute)):
                raise TypeError(
                    f"TaskSpec {self.name!r}: `{attribute}` must be callable, got {getattr(self, attribute)!r}."
                )
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(
                f"TaskSpec {self.name!r}: `max_new_tokens` must be a positive integer, got {self.max_new_tokens!r}."
            )

    @property
    def metric_label(self) -> str:
        return metric_label(self.metric)

    def load_dataset(self, split: str = "test", num_examples: int | None = None, seed: int = 0, **options):
        """The task's ``datasets.Dataset`` (``prompt``, ``reference`` and the source's own columns)."""
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            accepted = ", ".join(self.options) or "none"
            raise ValueError(f"Task {self.name!r} does not take the options {unknown}; it accepts: {accepted}.")
        if num_examples is not None and (
            isinstance(num_examples, bool) or not isinstance(num_examples, int) or num_examples < 1
        ):
            raise ValueError(f"`num_examples` must be a positive integer or None, got {num_examples!r}.")
        return self.load(split=split, num_examples=num_examples, seed=seed, **options)


_REGISTRY: dict[str, TaskSpec] = {}
_ALIASES: dict[str, str] = {}
_entry_points_loaded = False
_builtins_loading: set[str] = set()  # modules being imported now (their register_task calls must not recurse)


def _load_builtin(module: str) -> None:
    """Import the built-in task module ``module`` (its tasks register themselves), once."""
    import importlib
    import sys

    qualified = f"{__package__}.{module}"
    if qualified in sys.modules or module in _builtins_loading:
        return
    _builtins_loading.add(module)
    try:
        importlib.import_module(qualified)
    finally:
        _builtins_loading.discard(module)


def _load_builtins() -> None:
    """Every built-in task registered (listing them, or before a task of yours claims one of their names)."""
    for module in sorted(set(BUILTIN_TASKS.values())):
        _load_builtin(module)


#: the packages of the ``tasks`` extra, which task data and rewards import on first use
TASK_PACKAGES = {"datasets": "datasets", "rouge_score": "rouge-score"}


def require(module: str):
    """Import ``module`` of the ``tasks`` extra (``datasets``, ``rouge_score``), or say how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as error:
        package = TASK_PACKAGES.get(module.split(".")[0], module)
        raise ImportError(
            f"`{package}` is needed for task data and rewards and is not installed: "
            '`pip install "diversed_hf[tasks]"` (the train, bench and dev extras include it).'
        ) from error


def register_task(spec: TaskSpec, *, overwrite: bool = False) -> TaskSpec:
    """Add ``spec`` to the registry (under its name and aliases); returns it."""
    if not isinstance(spec, TaskSpec):
        raise TypeError(f"`spec` must be a TaskSpec, got {type(spec).__name__}.")
    if not _builtins_loading:  # a name of a built-in task stays taken, whichever registers first
        _load_builtins()
    for key in (spec.name, *spec.aliases):
        owner = _ALIASES.get(key)
        if owner is not None and owner != spec.name and not overwrite:
            raise ValueError(
                f"Task name {key!r} is already taken by task {owner!r}; pass `overwrite=True` to replace it, or pick "
                "another name."
            )
    if spec.name in _REGISTRY and _REGISTRY[spec.name] is not spec and not overwrite:
        raise ValueError(f"Task {spec.name!r} is already registered; pass `overwrite=True` to replace it.")
    _REGISTRY[spec.name] = spec
    for key in (spec.name, *spec.aliases):
        _ALIASES[key] = spec.name
    return spec


def _load_entry_points() -> None:
    """Register the tasks of installed plugins (the ``diversed_hf.tasks`` entry-point group), once."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    from importlib.metadata import entry_points

    for entry_point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            register = entry_point.load()
            register()
        except Exception as error:  # noqa: BLE001 - one broken plugin must not hide the other tasks
            logger.warning("could not register the tasks of entry point %r: %s", entry_point.value, error)


def task_names() -> list[str]:
    """Names of every registered task (plugins included), sorted."""
    _load_builtins()
    _load_entry_points()
    return sorted(_REGISTRY)


def get_task(name: str) -> TaskSpec:
    """The :class:`TaskSpec` registered as ``name`` (or an alias of it, such as ``"testbed_arith"``)."""
    if isinstance(name, TaskSpec):
        return name
    if not isinstance(name, str):
        raise TypeError(f"`task` must be a task name (str), got {type(name).__name__} {name!r}.")
    if name not in _ALIASES and name in BUILTIN_TASKS:
        _load_builtin(BUILTIN_TASKS[name])
    if name not in _ALIASES:
        _load_builtins()  # an alias of a built-in task, or a plugin's task
        _load_entry_points()
    if name not in _ALIASES:
        raise ValueError(
            f"Unknown task {name!r}; registered tasks are {sorted(_REGISTRY)}. The testbed's tasks register when "
            "`diversed_hf.testbed` is imported; register your own with "
            "`diversed_hf.lab.tasks.register_task(TaskSpec(...))`."
        )
    return _REGISTRY[_ALIASES[name]]


def task_card(task: str | None) -> dict | None:
    """What a head's card says of ``task`` (``training_config.json``'s ``task_card``, :mod:`diversed_hf.heads.cards`):
    its name, aliases, description, metric and Hub datasets; None for no task or a task not registered."""
    if not task:
        return None
    try:
        spec = get_task(task)
    except (TypeError, ValueError):
        return None
    return {
        "name": spec.name,
        "aliases": list(spec.aliases),
        "description": spec.description,
        "metric": spec.metric,
        "hub_datasets": list(spec.hub_datasets),
    }


def load_task_dataset(task: str, split: str = "test", num_examples: int | None = None, seed: int = 0, **options):
    """A ``datasets.Dataset`` of ``task`` with ``prompt`` and ``reference`` columns (see
    :meth:`TaskSpec.load_dataset`)."""
    return get_task(task).load_dataset(split=split, num_examples=num_examples, seed=seed, **options)


def reward_for_task(task: str) -> Callable[..., list[float]]:
    """The task's reward in TRL's convention: ``f(prompts=..., completions=..., reference=..., **columns)``.

    It reads the dataset column ``reference`` that every task's loader produces.
    """
    spec = get_task(task)
    score = spec.reward

    def reward(prompts=None, completions=None, reference=None, **columns) -> list[float]:
        if reference is None:
            raise ValueError(
                f"the {spec.name!r} reward reads the dataset column 'reference', which the batch lacks; load the data "
                "with `diversed_hf.lab.tasks.load_task_dataset` (it adds 'reference') or add the column yourself."
            )
        if completions is None:
            raise ValueError(f"the {spec.name!r} reward needs `completions` (TRL passes them); got None.")
        return score(completions, reference)

    reward.__name__ = spec.name
    return reward
