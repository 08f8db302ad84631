"""Sequence-level task rewards ``R(x)`` (docs/method.md §5, §7), as pure functions ``(completions, references) -> list[float]``.

=================== ======================================================================
``exact_match``     GSM8K: the final number (after the last ``####``, else the last number;
                    commas removed) of completion and reference are equal -> 1.0, else 0.0
``rouge2``          CNN/DailyMail, XSum: ROUGE-2 F1 in [0, 1] (``rouge_score``, no stemming)
``pass_at_1``       MBPP / HumanEval style: 1.0 iff the completion's code passes every test,
                    executed in a sandboxed **separate process** (see below)
=================== ======================================================================

The testbed's ``arith`` / ``summary`` tasks are scored by these same functions, so the testbed and
GSM8K / XSum share one number extraction and one ROUGE scorer.

Programs of :func:`pass_at_1` run in the sandbox of :mod:`diversed_hf.tasks.sandbox`; what it
enforces in each mode, and what it does not, is written in docs/sandbox.md.

:func:`diversed_hf.tasks.reward_for_task` wraps a task's reward in TRL's reward-function convention
``f(prompts=..., completions=..., **dataset_columns) -> list[float]``.
"""

from __future__ import annotations

import functools
import os
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from .sandbox import run_program, sandbox_mode, sandbox_network_mode


__all__ = [
    "exact_match",
    "rouge2",
    "pass_at_1",
    "run_programs",
    "extract_code",
    "extract_final_number",
    "run_program",
    "sandbox_mode",
    "sandbox_network_mode",
    "rouge2_f1",
]

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _check(completions: Sequence[str], references: Sequence, name: str = "references") -> None:
    if isinstance(completions, str) or isinstance(references, str):
        raise TypeError(f"`completions` and `{name}` must be lists of strings, not a single string.")
    if len(completions) != len(references):
        each = "test program" if name == "tests" else "reference"
        raise ValueError(
            f"`completions` has {len(completions)} entries but `{name}` has {len(references)}; pass one per completion "
            f"(one {each} per completion)."
        )


def extract_final_number(text: str) -> str | None:
    """The final number of ``text`` as a canonical string, or ``None`` when there is none.

    After the last ``####`` if present (the first number there), else the last number in the text.
    Commas are removed first (``"1,234"`` -> ``"1234"``); ``"27.0"`` -> ``"27"``; ``"-3"`` keeps its sign.
    """
    text = text.replace(",", "")
    if "####" in text:
        tail = text.rsplit("####", 1)[1]
        found = _NUMBER.search(tail)
        match = found.group(0) if found else None
    else:
        found = _NUMBER.findall(text)
        match = found[-1] if found else None
    if match is None:
        return None
    if "." in match:
        match = match.rstrip("0").rstrip(".")
    if match in ("-0", ""):
        match = "0"
    return match


_SCORER = None


def rouge2_f1(prediction: str, reference: str) -> float:
    """ROUGE-2 F1 of ``prediction``, in [0, 1]: the best over the lines of ``reference``."""
    global _SCORER
    if _SCORER is None:
        from rouge_score import rouge_scorer

        _SCORER = rouge_scorer.RougeScorer(["rouge2"], use_stemmer=False)
    alternatives = [line for line in reference.split("\n") if line.strip()] or [reference]
    return _SCORER.score_multi(alternatives, prediction)["rouge2"].fmeasure


def exact_match(completions: Sequence[str], references: Sequence[str]) -> list[float]:
    """GSM8K exact match: 1.0 where ``extract_final_number`` of completion and reference agree, else 0.0.

    A completion without any number scores 0; a reference without a number is an error (it cannot be matched).
    """
    _check(completions, references)
    rewards = []
    for completion, reference in zip(completions, references):
        target = extract_final_number(reference)
        if target is None:
            raise ValueError(f"reference {reference!r} contains no number; references end in '#### <answer>' (GSM8K's format).")
        rewards.append(float(extract_final_number(completion) == target))
    return rewards


def rouge2(completions: Sequence[str], references: Sequence[str]) -> list[float]:
    """ROUGE-2 F1 in [0, 1] of each completion against its reference (report x 100 to compare with papers).

    A reference may hold several acceptable answers, one per line: the score is the best over them.
    """
    _check(completions, references)
    return [rouge2_f1(c, r) for c, r in zip(completions, references)]


# ---------------------------------------------------------------------------------------------
# Code execution

_FENCE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)(?:```|$)", re.DOTALL)
_STOP_MARKERS = ("[DONE]", "\n[BEGIN]", "\nYou are an expert Python programmer")


def extract_code(completion: str) -> str:
    """The program in a completion: the first fenced block if any, else the text up to an MBPP stop marker."""
    fenced = _FENCE.search(completion)
    if fenced:
        return fenced.group(1)
    end = min((completion.find(m) for m in _STOP_MARKERS if m in completion), default=len(completion))
    return completion[:end]


def pass_at_1(
    completions: Sequence[str],
    tests: Sequence[str],
    *,
    timeout: float = 10.0,
    memory_mb: int = 1024,
    max_workers: int | None = None,
) -> list[float]:
    """1.0 where ``extract_code(completion) + "\\n" + tests`` runs to its end in the sandbox within ``timeout`` s.

    ``tests`` holds one test program per completion (MBPP: setup code and the ``assert`` lines of
    ``test_list``; HumanEval: the ``check`` function and a call to it). Programs run in parallel
    separate processes (``max_workers``, default the CPU count), never in this process; what a program
    does there (exit early, re-run itself, tamper with its directory) scores 0 and never raises here.
    """
    _check(completions, tests, "tests")
    programs = [extract_code(c) + "\n\n" + t for c, t in zip(completions, tests)]
    return run_programs(programs, timeout=timeout, memory_mb=memory_mb, max_workers=max_workers)


def run_programs(
    programs: Sequence[str], *, timeout: float = 10.0, memory_mb: int = 1024, max_workers: int | None = None
) -> list[float]:
    """1.0 for each program that runs to its end in the sandbox (:func:`run_program`), in parallel processes."""
    workers = max_workers or min(len(programs), os.cpu_count() or 1) or 1
    run = functools.partial(run_program, timeout=timeout, memory_mb=memory_mb)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(run, programs))
    return [float(passed) for passed, _ in results]
