"""Sequence-level task rewards ``R(x)`` (docs/method.md §5, §7), as pure functions ``(completions, references) ->
list[float]``.

=================== ======================================================================
``exact_match``     GSM8K: the final number (after the last ``####``, else the last number;
                    commas removed) of completion and reference are equal -> 1.0, else 0.0
``rouge2``          CNN/DailyMail, XSum: ROUGE-2 F1 in [0, 1] (``rouge_score``, no stemming)
``pass_at_1``       MBPP / HumanEval style: 1.0 iff the completion's code passes every test,
                    executed in a sandboxed **separate process** (see below)
=================== ======================================================================

The testbed's ``arith`` / ``summary`` tasks are scored by these same functions, so the testbed and
GSM8K / XSum share one number extraction and one ROUGE scorer.

Programs of :func:`pass_at_1` run in the sandbox of :mod:`diversed_hf.lab.tasks.sandbox`; what it
enforces in each mode, and what it does not, is written in docs/sandbox.md.

:func:`diversed_hf.lab.tasks.reward_for_task` wraps a task's reward in TRL's reward-function convention
``f(prompts=..., completions=..., **dataset_columns) -> list[float]``.
"""

from __future__ import annotations

import functools
import os
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

__all__ = [
    "exact_match",
    "rouge2",
    "rouge_l",
    "pass_at_1",
    "run_programs",
    "extract_code",
    "extract_final_number",
    "rouge2_f1",
    "rouge_scorer",
]

_SANDBOX_NAMES = ("run_program", "sandbox_mode", "sandbox_network_mode")  # :mod:`.sandbox`'s, imported on first use


def __getattr__(name: str):
    if name in _SANDBOX_NAMES:
        from . import sandbox

        return getattr(sandbox, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _check(completions: Sequence, references: Sequence, name: str = "references") -> tuple[list[str], list[str]]:
    """``completions`` and ``references`` as lists of strings, checked: one reference per completion. A completion
    may be TRL's conversational form (a list of messages): its last message's content is scored."""
    for argument, value in (("completions", completions), (name, references)):
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise TypeError(
                f"`completions` and `{name}` must be lists of strings, got `{argument}` of type {type(value).__name__}."
            )
    if len(completions) != len(references):
        each = "test program" if name == "tests" else "reference"
        raise ValueError(
            f"`completions` has {len(completions)} entries but `{name}` has {len(references)}; pass one per completion "
            f"(one {each} per completion)."
        )
    texts = [_completion_text(c, i) for i, c in enumerate(completions)]
    for i, reference in enumerate(references):
        if not isinstance(reference, str):
            raise TypeError(f"`{name}[{i}]` is {_describe(reference)}; pass a string (decode bytes first).")
    return texts, list(references)


def _completion_text(completion, index: int) -> str:
    """A completion's text: a string as is; TRL's conversational form ``[{"role": "assistant", "content": ...}]``
    gives its last message's content (a string, or a list of ``{"type": "text", "text": ...}`` parts)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)) and completion and all(isinstance(m, dict) for m in completion):
        content = completion[-1].get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list) and all(isinstance(p, dict) for p in content):
            return "".join(p.get("text", "") for p in content if p.get("type", "text") == "text")
    raise TypeError(
        f"`completions[{index}]` is {_describe(completion)}; pass the completion's text (a string), or TRL's "
        "conversational form, a list of messages ending with {'role': 'assistant', 'content': '...'}."
    )


def _describe(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def extract_final_number(text: str) -> str | None:
    """The final number of ``text`` as a canonical string, or ``None`` when there is none.

    After the last ``####`` if present (the first number there), else the last number in the text.
    Commas are removed first (``"1,234"`` -> ``"1234"``); a Unicode minus (``"−7"``, U+2212, and its small and
    full-width forms) is a minus; ``"27.0"`` -> ``"27"``, ``"07"`` -> ``"7"``; ``"-3"`` keeps its sign.
    """
    text = text.replace(",", "").translate(_MINUS_SIGNS)
    if "####" in text:
        tail = text.rsplit("####", 1)[1]
        found = _NUMBER.search(tail)
        match = found.group(0) if found else None
    else:
        found = _NUMBER.findall(text)
        match = found[-1] if found else None
    if match is None:
        return None
    sign, digits = ("-", match[1:]) if match.startswith("-") else ("", match)
    whole, _, fraction = digits.partition(".")
    whole, fraction = whole.lstrip("0") or "0", fraction.rstrip("0")
    canonical = whole + (f".{fraction}" if fraction else "")
    return canonical if canonical == "0" else sign + canonical


_MINUS_SIGNS = str.maketrans({"\u2212": "-", "\ufe63": "-", "\uff0d": "-"})


@functools.lru_cache(maxsize=None)
def rouge_scorer(kind: str):
    """``rouge_score``'s scorer of ``kind`` (``"rouge2"``, ``"rougeL"``), without stemming, built once."""
    from .registry import require

    scorers = require("rouge_score.rouge_scorer")

    return scorers.RougeScorer([kind], use_stemmer=False)


def rouge2_f1(prediction: str, reference: str) -> float:
    """ROUGE-2 F1 of ``prediction``, in [0, 1]: the best over the lines of ``reference``."""
    alternatives = [line for line in reference.split("\n") if line.strip()] or [reference]
    return rouge_scorer("rouge2").score_multi(alternatives, prediction)["rouge2"].fmeasure


def rouge_l(completions: Sequence[str], references: Sequence[str]) -> list[float]:
    """ROUGE-L F1 in [0, 1] of each completion against its reference (the best over the reference's lines): the
    longest common subsequence, so wording may differ and order still counts (agreement between free-form answers)."""
    completions, references = _check(completions, references)
    scores = []
    for completion, reference in zip(completions, references):
        alternatives = [line for line in reference.split("\n") if line.strip()] or [reference]
        scores.append(rouge_scorer("rougeL").score_multi(alternatives, completion)["rougeL"].fmeasure)
    return scores


def exact_match(completions: Sequence[str], references: Sequence[str]) -> list[float]:
    """GSM8K exact match: 1.0 where ``extract_final_number`` of completion and reference agree, else 0.0.

    A completion without any number scores 0; a reference without a number is an error (it cannot be matched).
    """
    completions, references = _check(completions, references)
    rewards = []
    for completion, reference in zip(completions, references):
        target = extract_final_number(reference)
        if target is None:
            raise ValueError(
                f"reference {reference!r} contains no number; references end in '#### <answer>' (GSM8K's format)."
            )
        rewards.append(float(extract_final_number(completion) == target))
    return rewards


def rouge2(completions: Sequence[str], references: Sequence[str]) -> list[float]:
    """ROUGE-2 F1 in [0, 1] of each completion against its reference (report x 100 to compare with papers).

    A reference may hold several acceptable answers, one per line: the score is the best over them.
    """
    completions, references = _check(completions, references)
    return [rouge2_f1(c, r) for c, r in zip(completions, references)]


# ---------------------------------------------------------------------------------------------
# Code execution

_FENCE_LINE = re.compile(r"^[ \t]*```[ \t]*([\w+.-]*)[ \t]*$")  # a line that is a fence, with its info string
_STOP_MARKERS = ("[DONE]", "\n[BEGIN]", "\nYou are an expert Python programmer")


def extract_code(completion: str) -> str:
    """The program in a completion: the first fenced Python block if any, else the text up to an MBPP stop marker.

    Fences are lines of their own, paired in order: the first block tagged ``python`` / ``py`` / ``python3`` /
    ... (any case, ```` ``` python ```` too) or untagged is taken, blocks tagged another language are skipped
    (with only those, the first one is taken). A lone
    untagged fence after text closes unfenced code (the text before it is the program); an unclosed block runs to
    the end; a closing fence written at the end of a code line ends the block there.
    """
    lines = completion.split("\n")
    fences = [(i, m.group(1).lower()) for i, line in enumerate(lines) if (m := _FENCE_LINE.match(line))]
    if len(fences) == 1 and not fences[0][1] and "\n".join(lines[: fences[0][0]]).strip():
        return "\n".join(lines[: fences[0][0]]) + "\n"
    for k in range(0, len(fences), 2):
        start, tag = fences[k]
        end = fences[k + 1][0] if k + 1 < len(fences) else len(lines)
        if not tag or tag.startswith("py"):  # python, py, python3, python3.11, ...
            block = "\n".join(lines[start + 1 : end]) + ("\n" if end < len(lines) else "")
            return block.split("```", 1)[0]
    if fences:  # only blocks of other languages: the first of them
        start = fences[0][0]
        end = fences[1][0] if len(fences) > 1 else len(lines)
        return "\n".join(lines[start + 1 : end]) + ("\n" if end < len(lines) else "")
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
    completions, tests = _check(completions, tests, "tests")
    programs = [extract_code(c) + "\n\n" + t for c, t in zip(completions, tests)]
    return run_programs(programs, timeout=timeout, memory_mb=memory_mb, max_workers=max_workers)


def run_programs(
    programs: Sequence[str], *, timeout: float = 10.0, memory_mb: int = 1024, max_workers: int | None = None
) -> list[float]:
    """1.0 for each program that runs to its end in the sandbox (:func:`run_program`), in parallel processes."""
    from .sandbox import run_program  # the sandbox loads only when programs run

    workers = max_workers or min(len(programs), os.cpu_count() or 1) or 1
    run = functools.partial(run_program, timeout=timeout, memory_mb=memory_mb)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(run, programs))
    return [float(passed) for passed, _ in results]
