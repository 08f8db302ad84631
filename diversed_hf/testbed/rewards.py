"""Pure, sequence-level reward functions of the testbed tasks (SPEC §7).

* ``arith``   -- GSM8K exact match of the final number: the number after the last ``####`` if there
  is one, else the last number in the text; commas are removed; ``"27"``, ``"27.0"`` and
  ``"$27"`` all match 27.
* ``summary`` -- ROUGE-2 F1 in ``[0, 1]`` (``rouge_score`` with its default tokenizer and no
  stemming). A reference may hold several acceptable summaries, one per line; the score is then the
  best F1 over them (multi-reference ROUGE, ``RougeScorer.score_multi``). Report it x 100 to
  compare with papers.
"""

from __future__ import annotations

import re
from typing import Sequence

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


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


def _check_lengths(completions: Sequence[str], references: Sequence[str]) -> None:
    if isinstance(completions, str) or isinstance(references, str):
        raise TypeError("`completions` and `references` must be lists of strings, not a single string.")
    if len(completions) != len(references):
        raise ValueError(
            f"`completions` has {len(completions)} entries but `references` has {len(references)}; "
            "pass one reference per completion."
        )


def arith_reward(completions: Sequence[str], references: Sequence[str]) -> list[float]:
    """1.0 where the final numbers of completion and reference are equal, else 0.0."""
    _check_lengths(completions, references)
    rewards = []
    for completion, reference in zip(completions, references):
        target = extract_final_number(reference)
        if target is None:
            raise ValueError(f"reference {reference!r} contains no number; references end in '#### <answer>' (GSM8K's format).")
        rewards.append(float(extract_final_number(completion) == target))
    return rewards


_SCORER = None


def rouge2_f1(prediction: str, reference: str) -> float:
    """ROUGE-2 F1 of ``prediction``, in [0, 1]: the best over the lines of ``reference``."""
    global _SCORER
    if _SCORER is None:
        from rouge_score import rouge_scorer

        _SCORER = rouge_scorer.RougeScorer(["rouge2"], use_stemmer=False)
    alternatives = [line for line in reference.split("\n") if line.strip()] or [reference]
    return _SCORER.score_multi(alternatives, prediction)["rouge2"].fmeasure


def summary_reward(completions: Sequence[str], references: Sequence[str]) -> list[float]:
    """ROUGE-2 F1 of each completion against its reference (best over the reference's lines), in [0, 1]."""
    _check_lengths(completions, references)
    return [rouge2_f1(c, r) for c, r in zip(completions, references)]


REWARDS = {"arith": arith_reward, "summary": summary_reward}
