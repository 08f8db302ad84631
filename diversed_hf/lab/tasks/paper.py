"""The paper's tasks (docs/method.md §7): GSM8K, CNN/DailyMail, XSum and MBPP, with their prompt formats.

Each is registered in :mod:`diversed_hf.lab.tasks.registry` as a :class:`~diversed_hf.lab.tasks.TaskSpec`. Every loader
returns a ``datasets.Dataset`` with the task's original columns plus

* ``prompt``    -- plain text ending where the model should continue (zero- or ``num_shots``-shot),
* ``reference`` -- what the task's reward (:mod:`diversed_hf.lab.tasks.rewards`) compares with.

========================== =================================== =============================================
task                       source columns (Hub id)             prompt / reference
========================== =================================== =============================================
``gsm8k``                  question, answer                    ``Question: {question}\\nAnswer:`` / answer
                           (``openai/gsm8k``, ``main``)        (worked solution ending ``#### n``)
``cnn_dailymail``          article, highlights                 ``Article: {article}\\nSummary:`` / highlights
                           (``abisee/cnn_dailymail``, 3.0.0)
``xsum``                   document, summary                   ``Article: {document}\\nSummary:`` / summary
                           (``EdinburghNLP/xsum``)
``mbpp``                   text, code, test_list               Austin et al. (2021): task, tests, ``[BEGIN]``;
                           (``google-research-datasets/mbpp``) reference = setup code + the ``assert`` lines
========================== =================================== =============================================

(The CPU testbed's ``arith`` and ``summary`` are registered by :mod:`diversed_hf.testbed`.)

Few-shot exemplars are the first ``num_shots`` rows of the task's exemplar split (GSM8K, CNN/DM,
XSum: ``train``; MBPP: ``prompt``, the split its authors set aside for this), each written as a
prompt followed by its reference and a blank line. Pass ``data_files`` (json/jsonl/parquet/csv
files in the same schema as the Hub dataset) to work offline; few-shot prompts then need
``shots_data_files``.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from . import rewards
from .registry import TaskSpec, check_columns, register_task, require

logger = logging.getLogger(__name__)

__all__ = ["PROMPT_FORMATS", "PromptFormat", "format_prompt"]

_CALCULATOR = re.compile(r"<<[^>]*>>")


def _gsm8k_prompt(example: dict) -> str:
    return f"Question: {example['question']}\nAnswer:"


def _gsm8k_shot(example: dict) -> str:
    return f"{_gsm8k_prompt(example)} {_CALCULATOR.sub('', example['answer'])}"


def _summary_prompt(source: str) -> Callable[[dict], str]:
    def prompt(example: dict) -> str:
        return f"Article: {example[source]}\nSummary:"

    return prompt


def _summary_shot(source: str, target: str) -> Callable[[dict], str]:
    def shot(example: dict) -> str:
        return f"Article: {example[source]}\nSummary: {example[target]}"

    return shot


def _mbpp_tests(example: dict) -> str:
    setup = example.get("test_setup_code") or ""
    return (setup + "\n" if setup.strip() else "") + "\n".join(example["test_list"])


def _mbpp_prompt(example: dict) -> str:
    tests = "\n".join(example["test_list"])
    return (
        f"You are an expert Python programmer, and here is your task: {example['text']} "
        f"Your code should pass these tests:\n\n{tests}\n[BEGIN]\n"
    )


def _mbpp_shot(example: dict) -> str:
    return f"{_mbpp_prompt(example)}{example['code']}\n[DONE]"


@dataclass(frozen=True)
class PromptFormat:
    """How one task's rows become ``prompt`` and ``reference``."""

    hub_path: str
    hub_name: str | None
    columns: tuple[str, ...]  # required source columns
    shots_split: str
    prompt: Callable[[dict], str]
    shot: Callable[[dict], str]  # a solved exemplar: prompt followed by its answer
    reference: Callable[[dict], str]
    shot_separator: str = "\n\n"


PROMPT_FORMATS: dict[str, PromptFormat] = {
    "gsm8k": PromptFormat(
        "openai/gsm8k", "main", ("question", "answer"), "train", _gsm8k_prompt, _gsm8k_shot, lambda e: e["answer"]
    ),
    "cnn_dailymail": PromptFormat(
        "abisee/cnn_dailymail",
        "3.0.0",
        ("article", "highlights"),
        "train",
        _summary_prompt("article"),
        _summary_shot("article", "highlights"),
        lambda e: e["highlights"],
    ),
    "xsum": PromptFormat(
        "EdinburghNLP/xsum",
        None,
        ("document", "summary"),
        "train",
        _summary_prompt("document"),
        _summary_shot("document", "summary"),
        lambda e: e["summary"],
    ),
    "mbpp": PromptFormat(
        "google-research-datasets/mbpp",
        "full",
        ("text", "code", "test_list"),
        "prompt",
        _mbpp_prompt,
        _mbpp_shot,
        _mbpp_tests,
    ),
}
_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def _load_files(data_files) -> "datasets.Dataset":  # noqa: F821
    load_dataset = require("datasets").load_dataset

    files = [data_files] if isinstance(data_files, (str, Path)) else list(data_files)
    if not files:
        raise ValueError("`data_files` is empty; pass a path or a list of paths.")
    suffixes = {Path(f).suffix.lower() for f in files}
    if len(suffixes) != 1 or next(iter(suffixes)) not in _BUILDERS:
        raise ValueError(f"`data_files` {files} must all be one of {sorted(_BUILDERS)} files.")
    for f in files:
        if not Path(f).is_file():
            raise FileNotFoundError(f"data file {f} does not exist.")
    return load_dataset(_BUILDERS[suffixes.pop()], data_files=[str(f) for f in files], split="train")


def format_prompt(task: str, example: dict, shots: Sequence[dict] = ()) -> str:
    """The prompt of one ``example`` of ``task``, preceded by the solved ``shots``."""
    fmt = PROMPT_FORMATS[task]
    return "".join(fmt.shot(s) + fmt.shot_separator for s in shots) + fmt.prompt(example)


def _load(
    task: str,
    split: str = "test",
    num_examples: int | None = None,
    seed: int = 0,
    num_shots: int = 0,
    data_files=None,
    shots_data_files=None,
    max_source_words: int | None = None,
):
    """Rows of a paper task with ``prompt`` and ``reference`` columns (see the module docstring).

    Args:
        split: Hub split to load (ignored when ``data_files`` is given).
        num_examples: keep this many rows, chosen by a ``seed``-ed shuffle (``None``: all, in order).
        num_shots: solved exemplars before each prompt (0: zero-shot).
        data_files: local file(s) in the Hub dataset's schema, loaded instead of the Hub.
        shots_data_files: local file(s) of exemplars (needed for ``num_shots > 0`` with ``data_files``).
        max_source_words: truncate articles / documents to this many words (summaries only).
    """
    if isinstance(num_shots, bool) or not isinstance(num_shots, int) or num_shots < 0:
        raise ValueError(f"`num_shots` must be a non-negative integer, got {num_shots!r}.")
    fmt = PROMPT_FORMATS[task]
    if data_files is not None:
        dataset = _load_files(data_files)
        what = f"the {task} data in {data_files}"
    else:
        load_dataset = require("datasets").load_dataset

        dataset = load_dataset(fmt.hub_path, fmt.hub_name, split=split)
        what = f"{fmt.hub_path} split {split!r}"
    check_columns(dataset, fmt.columns, what)
    if num_examples is not None:
        if num_examples > len(dataset):
            raise ValueError(f"`num_examples`={num_examples} but {what} has only {len(dataset)} rows.")
        dataset = dataset.shuffle(seed=seed).select(range(num_examples))

    shots: list[dict] = []
    if num_shots:
        if shots_data_files is not None:
            shot_data = _load_files(shots_data_files)
        elif data_files is not None:
            raise ValueError(
                f"`num_shots`={num_shots} with local `data_files` needs `shots_data_files` (exemplars in the same "
                "schema)."
            )
        else:
            load_dataset = require("datasets").load_dataset

            shot_data = load_dataset(fmt.hub_path, fmt.hub_name, split=fmt.shots_split)
        check_columns(shot_data, fmt.columns, "the few-shot exemplars")
        if len(shot_data) < num_shots:
            raise ValueError(f"`num_shots`={num_shots} but only {len(shot_data)} exemplars are available.")
        shots = [shot_data[i] for i in range(num_shots)]

    source = {"cnn_dailymail": "article", "xsum": "document"}.get(task)

    def truncate(example: dict) -> dict:
        if source and max_source_words:
            example = dict(example)
            example[source] = " ".join(example[source].split()[:max_source_words])
        return example

    shots = [truncate(s) for s in shots]

    def add_columns(example: dict) -> dict:
        return {"prompt": format_prompt(task, truncate(example), shots), "reference": fmt.reference(example)}

    return dataset.map(add_columns, desc=f"formatting {task} prompts")


def _loader(task: str):
    def load(split: str = "test", num_examples: int | None = None, seed: int = 0, **options):
        return _load(task, split=split, num_examples=num_examples, seed=seed, **options)

    load.__name__ = f"load_{task}"
    return load


_OPTIONS = ("num_shots", "data_files", "shots_data_files", "max_source_words")

GSM8K = register_task(
    TaskSpec(
        name="gsm8k",
        description="GSM8K grade-school math word problems; quality is exact match of the final number.",
        load=_loader("gsm8k"),
        reward=rewards.exact_match,
        metric="exact_match",
        max_new_tokens=256,
        hub_datasets=("openai/gsm8k",),
        prompt_format=PROMPT_FORMATS["gsm8k"],
        options=_OPTIONS,
    )
)
CNN_DAILYMAIL = register_task(
    TaskSpec(
        name="cnn_dailymail",
        description="CNN/DailyMail news summaries; quality is ROUGE-2 F1.",
        load=_loader("cnn_dailymail"),
        reward=rewards.rouge2,
        metric="rouge2_f1",
        max_new_tokens=128,
        hub_datasets=("abisee/cnn_dailymail",),
        aliases=("cnndm",),
        prompt_format=PROMPT_FORMATS["cnn_dailymail"],
        options=_OPTIONS,
    )
)
XSUM = register_task(
    TaskSpec(
        name="xsum",
        description="XSum one-sentence news summaries; quality is ROUGE-2 F1.",
        load=_loader("xsum"),
        reward=rewards.rouge2,
        metric="rouge2_f1",
        max_new_tokens=64,
        hub_datasets=("EdinburghNLP/xsum",),
        prompt_format=PROMPT_FORMATS["xsum"],
        options=_OPTIONS,
    )
)
MBPP = register_task(
    TaskSpec(
        name="mbpp",
        description="MBPP Python programming problems; quality is pass@1 of the unit tests.",
        load=_loader("mbpp"),
        reward=rewards.pass_at_1,
        metric="pass@1",
        max_new_tokens=256,
        hub_datasets=("google-research-datasets/mbpp",),
        prompt_format=PROMPT_FORMATS["mbpp"],
        options=_OPTIONS,
    )
)
