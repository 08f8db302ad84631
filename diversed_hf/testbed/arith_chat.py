"""``arith_chat``: one-step arithmetic word problems asked in chat form, for the real pair (SmolLM2-135M-Instruct).

The testbed's ``arith`` problems take three to five steps; the 135M instruct model solves almost none
of them. These take one addition or subtraction of numbers up to 30, which it solves often enough to
measure (about a third of the time, greedy). The question is the user turn of a chat
(:func:`diversed_hf.lab.tasks.chat.chat_prompt`, SmolLM2's template by default); the reference is
``"#### <answer>"`` and the reward is the testbed's exact match on the final number.

Split: a problem's canonical key is its operation and operands (names and objects left out); it is a
test problem iff ``sha256(key) % 5 == 0`` (:func:`diversed_hf.testbed.tasks.split_of`), so the splits
are disjoint for any seed.
"""

from __future__ import annotations

import random

from ..lab.tasks.chat import chat_prompt
from .tasks import NAMES, OBJECTS, split_of

__all__ = ["MAX_OPERAND", "generate", "load_arith_chat"]

MAX_OPERAND = 30
QUESTIONS = {
    "+": (
        "{N} has {a} {obj}. {Pc} buys {b} more {obj}. How many {obj} does {N} have now?",
        "{N} has {a} {obj}. {F} gives {Po} {b} more {obj}. How many {obj} does {N} have now?",
        "There are {a} {obj} in a box. {N} puts {b} more {obj} in the box. How many {obj} are in the box now?",
    ),
    "-": (
        "{N} has {a} {obj}. {Pc} gives {b} {obj} to {F}. How many {obj} does {N} have left?",
        "{N} has {a} {obj}. {Pc} loses {b} of them. How many {obj} does {N} have left?",
        "There are {a} {obj} in a box. {N} takes {b} {obj} out of the box. How many {obj} are in the box now?",
    ),
}
_OBJECT = {"he": "him", "she": "her"}


def generate(split: str = "test", num_examples: int = 200, seed: int = 0) -> list[tuple[str, int, str]]:
    """``num_examples`` problems of ``split`` as ``(question, answer, key)``, deterministic in ``seed``."""
    if split not in ("train", "test"):
        raise ValueError(f"`split` is {split!r}; use 'train' or 'test'.")
    rng = random.Random(f"arith_chat/{split}/{seed}")
    problems = []
    for _ in range(1000 * num_examples):
        if len(problems) == num_examples:
            break
        op = rng.choice("+-")
        a = rng.randint(2, MAX_OPERAND)
        b = rng.randint(1, MAX_OPERAND) if op == "+" else rng.randint(1, a - 1)
        key = f"{a}{op}{b}"
        if split_of(key) != split:
            continue
        name, pronoun = rng.choice(NAMES)
        friend = rng.choice([n for n, _ in NAMES if n != name])
        question = rng.choice(QUESTIONS[op]).format(
            N=name, Pc=pronoun.capitalize(), Po=_OBJECT[pronoun], F=friend, a=a, b=b, obj=rng.choice(OBJECTS)
        )
        problems.append((question, a + b if op == "+" else a - b, key))
    return problems


def load_arith_chat(
    split: str = "test", num_examples: int | None = None, seed: int = 0, chat_template: str = "smollm2"
):
    """A ``datasets.Dataset``: ``prompt`` (the chat-formatted question), ``reference`` (``"#### <answer>"``),
    ``question`` and ``answer``."""
    from ..lab.tasks.registry import require

    Dataset = require("datasets").Dataset

    problems = generate(split, 200 if num_examples is None else num_examples, seed)
    return Dataset.from_dict(
        {
            "prompt": [chat_prompt(question, chat_template) for question, _, _ in problems],
            "reference": [f"#### {answer}" for _, answer, _ in problems],
            "question": [question for question, _, _ in problems],
            "answer": [str(answer) for _, answer, _ in problems],
        }
    )
