"""``synopsis``: write the one-line summary of a real document; quality is ROUGE-2 F1 against the human one.

The documents are the bodies of the Python standard library's docstrings (after the object's name and
signature), the summaries their PEP 257 summary lines, written by the library's authors: 2,364 deduplicated pairs
shipped with the package (``data/synopsis.jsonl.gz``, PSF License; provenance in ``data/synopsis.md``, the
builder :mod:`diversed_hf.lab.tasks.synopsis_build`). Splits are fixed (train 1,904, validation 246, test 214) and
group the pairs by top-level module, so no document, nor a near-copy of it, is in two splits.

Prompt: one user turn (``chat_template``, see :mod:`.chat`) asking for a one-line summary of the document.
Reward: ROUGE-2 F1 of the completion against the summary (``rouge-score``, no stemming, as the paper's
summarization reward); :func:`rougeL` reports ROUGE-L F1 beside it. See docs/synopsis.md.
"""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path
from typing import Sequence

from ...verifiers.checks import is_integer
from .chat import chat_prompt
from .registry import TaskSpec, register_task, require
from .rewards import _check, rouge2, rouge_scorer

__all__ = ["DATA_FILE", "INSTRUCTION", "SPLITS", "SYNOPSIS", "load_synopsis", "rougeL", "synopsis_rows"]

DATA_FILE = Path(__file__).resolve().parent / "data" / "synopsis.jsonl.gz"
SPLITS = ("train", "validation", "test")
INSTRUCTION = "Read this Python documentation:\n\n{document}\n\nIn one short sentence, what does it do?"


@functools.lru_cache(maxsize=1)
def synopsis_rows() -> tuple[dict, ...]:
    """Every pair of the shipped data file, in its order."""
    with gzip.open(DATA_FILE, "rt", encoding="utf-8") as handle:
        return tuple(json.loads(line) for line in handle if line.strip())


def load_synopsis(split: str = "test", num_examples: int | None = None, seed: int = 0, chat_template: str = "smollm2"):
    """A ``datasets.Dataset`` of ``split``: ``prompt``, ``reference`` (the human summary), ``document``, ``id``.
    ``num_examples`` picks rows by a ``seed``-ed shuffle."""
    Dataset = require("datasets").Dataset

    if split not in SPLITS:
        raise ValueError(f"`split` is {split!r}; synopsis has {list(SPLITS)}.")
    if num_examples is not None and not is_integer(num_examples):
        raise ValueError(f"`num_examples` must be a positive integer or None (every pair), got {num_examples!r}.")
    rows = [row for row in synopsis_rows() if row["split"] == split]
    dataset = Dataset.from_dict(
        {
            "prompt": [chat_prompt(INSTRUCTION.format(document=r["document"]), chat_template) for r in rows],
            "reference": [r["summary"] for r in rows],
            "document": [r["document"] for r in rows],
            "id": [r["id"] for r in rows],
        }
    )
    if num_examples is not None:
        if not 0 < num_examples <= len(dataset):
            raise ValueError(f"`num_examples`={num_examples} but synopsis's {split!r} split has {len(dataset)} pairs.")
        dataset = dataset.shuffle(seed=seed).select(range(num_examples))
    return dataset


def rougeL(completions: Sequence[str], references: Sequence[str]) -> list[float]:
    """ROUGE-L F1 in [0, 1] of each completion against its reference (``rouge-score``, no stemming)."""
    completions, references = _check(completions, references)
    scorer = rouge_scorer("rougeL")
    return [scorer.score(r, c)["rougeL"].fmeasure for c, r in zip(completions, references)]


SYNOPSIS = register_task(
    TaskSpec(
        name="synopsis",
        description="One-line summaries of Python standard-library documentation (the docstring's body -> its "
        "human-written summary line), asked in chat form; quality is ROUGE-2 F1 against the summary line.",
        load=load_synopsis,
        reward=rouge2,
        metric="rouge2_f1",
        max_new_tokens=48,
        options=("chat_template",),
    )
)
