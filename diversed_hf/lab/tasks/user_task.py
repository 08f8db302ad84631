"""A task from a user's own data and reward (``training/train_head.py --dataset ... --reward ...``; docs/your_task.md).

:func:`dataset_task` registers a :class:`~diversed_hf.lab.tasks.registry.TaskSpec` named ``dataset:<name>`` whose
loader reads the prompts (``prompt_column``) and, when given, the answers (``answer_column``, the ``reference``
column) from

- a ``.jsonl`` / ``.json``, ``.csv`` or ``.parquet`` file, a directory ``datasets.Dataset.save_to_disk`` wrote, or a
  dataset name ``datasets.load_dataset`` knows;
- its ``train`` / ``test`` splits when it has them, else a fixed split of its rows: 90 % ``train``, 10 % ``test``
  (at least one row each), chosen by a seed-0 permutation, so the held-out prompts never train the head.

The reward is a built-in name or any importable function (``package.module:function``) with TRL's reward signature,
``f(prompts=..., completions=..., **columns) -> list[float]`` (``columns`` holds the dataset's columns, ``reference``
among them): TRL passes it every column while training; the held-out evaluation calls it with ``completions`` and
``reference`` (``prompts`` is then ``None``).

============================ =========================================================================================
``exact_match``              the final number of the completion equals the answer's (GSM8K's extractor)
``rouge2`` / ``rougeL``      ROUGE-2 / ROUGE-L F1 against the answer
``target_agreement``         agreement with the target's own greedy answer (ROUGE-2; exact match for numbers): any
                             text task, free-form chat included, needs no answers at all
``target_likelihood``        the target's own per-token log-likelihood of the text: any text task, no answers
============================ =========================================================================================
"""

from __future__ import annotations

import importlib
import math
import numbers
import sys
from pathlib import Path

from .registry import TaskSpec, get_task, register_task, require
from .rewards import exact_match, rouge2, rouge_l

__all__ = ["BUILTIN_REWARDS", "dataset_task", "trl_reward", "resolve_reward"]

#: the built-in rewards by name: (sequence reward, metric)
BUILTIN_REWARDS = {
    "exact_match": (exact_match, "exact_match"),
    "rouge2": (rouge2, "rouge2_f1"),
    "rougeL": (rouge_l, "rougeL_f1"),
}
#: rewards that compare with the target's own answers (train_head.py's reward modes), not with an answer column
AGREEMENT_REWARDS = ("target_agreement", "target_likelihood")
_TRL_REWARDS: dict[str, object] = {}  # task name -> the user's function, as TRL calls it
FILE_KINDS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def resolve_reward(reward: str):
    """``(sequence reward, metric, the user's TRL function or None)`` of a built-in name or ``module:function``."""
    if reward in BUILTIN_REWARDS:
        score, metric = BUILTIN_REWARDS[reward]
        return score, metric, None
    module_name, _, function_name = reward.partition(":")
    if not module_name or not function_name:
        raise ValueError(
            f"`--reward {reward}`: use a built-in reward ({', '.join([*BUILTIN_REWARDS, *AGREEMENT_REWARDS])}) or an "
            "importable function written `package.module:function` (TRL's reward signature)."
        )
    try:
        function = getattr(_import_user_module(module_name), function_name)
    except (ImportError, AttributeError) as error:
        raise ValueError(
            f"`--reward {reward}`: cannot import {function_name!r} from {module_name!r} ({error}); the module must be "
            "importable (on PYTHONPATH, or installed) and define the function."
        ) from None
    if not callable(function):
        raise ValueError(f"`--reward {reward}`: {reward!r} is not a function.")

    def score(completions, references):  # the held-out evaluation's call
        values = function(prompts=None, completions=list(completions), reference=references)
        return [_held_out_reward(reward, value, i) for i, value in enumerate(values)]

    return score, function_name, function


def _import_user_module(name: str):
    """``importlib.import_module(name)``, also from the working directory (where ``my_rewards.py`` sits when a user
    runs ``train_head.py --reward my_rewards:fn`` beside it; ``python script.py`` puts only the script's folder on
    ``sys.path``)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        top = name.split(".")[0]
        here = Path.cwd()
        if error.name != top or not ((here / f"{top}.py").is_file() or (here / top / "__init__.py").is_file()):
            raise
        sys.path.insert(0, str(here))
        return importlib.import_module(name)


def _held_out_reward(reward: str, value, index: int) -> float:
    """One held-out score as a float; anything else (None, a string, NaN) refused as training refuses it."""
    if not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise ValueError(
            f"`--reward {reward}` returned {value!r} for held-out completion {index}: the held-out quality needs a "
            "finite number for every completion (give failed or unscorable ones a low reward)."
        )
    return float(value)


def trl_reward(task: str):
    """The user's own function for a task :func:`dataset_task` registered (None for built-in rewards)."""
    return _TRL_REWARDS.get(get_task(task).name)


def dataset_task(
    source: str,
    prompt_column: str = "prompt",
    answer_column: str | None = None,
    reward: str = "target_agreement",
    chat_template: str | None = None,
    max_new_tokens: int = 128,
) -> str:
    """Register the task of ``source`` (module docstring) and return its name, ``dataset:<name>``; a missing file
    or column and a reward that needs answers without ``answer_column`` are refused naming the flag."""
    local = Path(source).expanduser()
    if local.suffix in FILE_KINDS and not local.is_file():
        raise FileNotFoundError(f"`--dataset {source}`: no such file.")
    if reward in AGREEMENT_REWARDS:
        score, metric, function = rouge2, "rouge2_f1", None  # the target's answers become the references
    else:
        score, metric, function = resolve_reward(reward)
        if function is None and answer_column is None:
            raise ValueError(
                f"`--reward {reward}` compares completions with answers: name their column with --answer_column, or "
                "use --reward target_agreement (agreement with the target's own answers needs none)."
            )
    name = f"dataset:{local.stem if local.exists() else source}"

    def check_columns(rows) -> None:
        missing = [c for c in (prompt_column, answer_column) if c is not None and c not in rows.column_names]
        if missing:
            flag = "--prompt_column" if missing[0] == prompt_column else "--answer_column"
            raise ValueError(f"`{flag} {missing[0]}`: {source} has the columns {rows.column_names}.")
        bad = [(i, v) for i, v in enumerate(rows[prompt_column]) if not isinstance(v, str) or not v.strip()]
        if bad:
            row, value = bad[0]
            raise ValueError(
                f"`--prompt_column {prompt_column}`: {len(bad)} row(s) of {source} hold no prompt text (row {row}: "
                f"{value!r}); every prompt must be a non-empty string."
            )

    def load(split: str = "train", num_examples: int | None = None, seed: int = 0):
        rows = _read(source, split)
        check_columns(rows)
        if num_examples is not None:
            rows = rows.shuffle(seed=seed).select(range(min(num_examples, len(rows))))

        def prompt_of(row):
            text = str(row[prompt_column])
            if chat_template:
                from .chat import chat_prompt

                text = chat_prompt(text, chat_template)
            answer = "" if answer_column is None else str(row[answer_column])
            return {"prompt": text, "reference": answer}

        return rows.map(prompt_of)

    check_columns(_read(source, "train"))  # now, before any model loads
    description = f"prompts of {source} ({prompt_column}), scored by {reward}"
    spec = TaskSpec(name=name, description=description, load=load, reward=score, metric=metric)
    register_task(spec, overwrite=True)
    if function is not None:
        _TRL_REWARDS[name] = function
    return name


def _read(source: str, split: str):
    """The rows of ``split``: the source's own split, or the fixed 90/10 split of a single table."""
    datasets = require("datasets")
    local = Path(source).expanduser()
    if local.is_file():
        if local.suffix not in FILE_KINDS:
            raise ValueError(
                f"`--dataset {source}`: read .jsonl, .json, .csv or .parquet files, or a datasets directory."
            )
        if local.stat().st_size == 0:
            raise ValueError(f"`--dataset {source}` is empty: a head needs training and held-out prompts.")
        try:
            table = datasets.load_dataset(FILE_KINDS[local.suffix], data_files=str(local), split="train")
        except Exception as error:  # datasets' DatasetGenerationError (a malformed line), StopIteration (no rows)
            cause = error.__cause__ or error
            raise ValueError(
                f"`--dataset {source}` could not be read as {local.suffix} ({type(cause).__name__}: {cause}): check "
                'the file\'s format (JSON lines: one object per line, e.g. {"prompt": "...", "answer": "..."}).'
            ) from None
    elif local.is_dir():
        table = datasets.load_from_disk(str(local))
    else:
        table = datasets.load_dataset(source)
    if isinstance(table, datasets.DatasetDict):
        if split in table:
            return table[split]
        if "train" not in table:
            raise ValueError(f"`--dataset {source}`: no split {split!r} or 'train' (it has {sorted(table)}).")
        table = table["train"]
    if len(table) < 2:
        raise ValueError(f"`--dataset {source}` holds {len(table)} row(s): a head needs training and held-out prompts.")
    order = table.shuffle(seed=0)
    held_out = max(1, len(table) // 10)
    return order.select(range(held_out, len(table))) if split == "train" else order.select(range(held_out))
