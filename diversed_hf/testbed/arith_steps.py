"""``arith_steps``: arithmetic word problems of 2 to 4 steps in chat form, with GSM8K-style worked solutions.

The task the real pair's tuned target is trained on (docs/real_pair.md, "The task-tuned target"). A problem starts
with a count of objects and changes it 2 to 4 times: buying or finding more (``+``), giving away or losing some
(``-``), buying containers of several (``k * m``, then ``+``), doubling or tripling (``*``), sharing equally into
containers and keeping one (``/``, exact). The question is the user turn of a chat
(:func:`diversed_hf.lab.tasks.chat.chat_prompt`, SmolLM2's template by default); the reference is the worked solution,
one line per step, ending in ``#### <answer>`` (GSM8K's format), and the reward is the testbed's exact match on the
final number (:func:`diversed_hf.lab.tasks.rewards.exact_match`).

Every value along the way is an integer in ``[1, MAX_VALUE]``: no negatives, no remainders.

Split: a problem's canonical key is its start value and operations (names, objects and wording left out); it is a
test problem iff ``sha256(key) % 5 == 0`` (:func:`diversed_hf.testbed.tasks.split_of`), so the splits are disjoint
for any seed. Within one call no key repeats.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ..lab.tasks.chat import chat_prompt
from .tasks import CONTAINERS, NAMES, OBJECTS, split_of

__all__ = ["MAX_NEW_TOKENS", "MAX_STEPS", "MAX_VALUE", "MIN_STEPS", "Problem", "generate", "load_arith_steps"]

MIN_STEPS, MAX_STEPS = 2, 4
MAX_VALUE = 200  # every value of a problem, start and intermediate, lies in [1, MAX_VALUE]
#: default generation length: a worked solution is at most about 140 SmolLM2 tokens; room for a wordier answer
MAX_NEW_TOKENS = 192

START = (
    "{N} has {s} {obj}.",
    "{N} starts the day with {s} {obj}.",
    "There are {s} {obj} in {N}'s collection.",
)
QUESTIONS = {
    "add": ("{Pc} buys {k} more {obj}.", "{Pc} finds {k} more {obj}.", "{F} gives {Po} {k} {obj}."),
    "sub": ("{Pc} gives {k} {obj} to {F}.", "{Pc} loses {k} {obj}.", "{Pc} uses {k} of the {obj}."),
    "group": ("{Pc} buys {k} {cs} with {m} {obj} in each {c}.", "{F} gives {Po} {k} {cs} of {m} {obj} each."),
    "mul": {2: ("Then the number of {obj} {P} has doubles.",), 3: ("Then the number of {obj} {P} has triples.",)},
    "div": (
        "{Pc} puts the {obj} into {k} {cs} with the same number in each {c} and gives away all the {cs} but one.",
        "{Pc} shares the {obj} equally with {friends}, keeping one share for {Pr}.",
    ),
}
END = ("How many {obj} does {N} have now?", "How many {obj} does {N} have at the end?")
SOLUTION = {
    "start": "{N} starts with {s} {obj}.",
    "add": "After getting {k} more, {P} has {v} + {k} = {r} {obj}.",
    "sub": "After {k} are gone, {P} has {v} - {k} = {r} {obj}.",
    "group": "The {k} {cs} hold {k} * {m} = {km} {obj}, so {P} has {v} + {km} = {r} {obj}.",
    "mul": "The number is multiplied by {k}: {v} * {k} = {r} {obj}.",
    "div": "{Pc} keeps one of {k} equal parts: {v} / {k} = {r} {obj}.",
}
_OBJECT = {"he": "him", "she": "her"}
_REFLEXIVE = {"he": "himself", "she": "herself"}


@dataclass(frozen=True)
class Problem:
    """One problem: ``question`` (plain text), ``solution`` (worked, ends in ``#### <answer>``), ``answer``, the
    number of ``steps`` and the canonical ``key`` the split is decided on."""

    question: str
    solution: str
    answer: int
    steps: int
    key: str


def _skeleton(rng: random.Random) -> tuple[int, list[tuple[int, ...]]] | None:
    """A start value and 2-4 operations ``(kind, k)`` / ``("group", k, m)`` keeping every value in [1, MAX_VALUE];
    ``None`` when a drawn operation cannot apply (the caller draws again)."""
    start = rng.randint(4, 60)
    value, ops = start, []
    for _ in range(rng.randint(MIN_STEPS, MAX_STEPS)):
        kind = rng.choice(("add", "add", "sub", "sub", "group", "mul", "div"))
        if kind == "add" and value + 2 <= MAX_VALUE:
            k = rng.randint(2, min(40, MAX_VALUE - value))
            ops.append(("add", k))
            value += k
        elif kind == "sub" and value >= 4:
            k = rng.randint(2, min(40, value - 2))
            ops.append(("sub", k))
            value -= k
        elif kind == "group" and value + 4 <= MAX_VALUE:
            k, m = rng.choice([(k, m) for k in range(2, 7) for m in range(2, 13) if value + k * m <= MAX_VALUE])
            ops.append(("group", k, m))
            value += k * m
        elif kind == "mul" and value * 2 <= MAX_VALUE:
            k = 3 if value * 3 <= MAX_VALUE and rng.random() < 0.4 else 2
            ops.append(("mul", k))
            value *= k
        elif kind == "div" and any(value % k == 0 and value // k >= 2 for k in range(2, 6)):
            k = rng.choice([k for k in range(2, 6) if value % k == 0 and value // k >= 2])
            ops.append(("div", k))
            value //= k
        else:
            return None
    return start, ops


def _key(start: int, ops: list[tuple[int, ...]]) -> str:
    return "arith_steps|" + str(start) + "|" + ";".join(",".join(map(str, op)) for op in ops)


def _apply(value: int, op: tuple) -> int:
    """The value after one operation (the arithmetic the solution writes out; tests recompute with it)."""
    if op[0] == "add":
        return value + op[1]
    if op[0] == "sub":
        return value - op[1]
    if op[0] == "group":
        return value + op[1] * op[2]
    if op[0] == "mul":
        return value * op[1]
    if op[0] == "div":
        return value // op[1]
    raise ValueError(f"unknown operation {op!r}")


def _problem(rng: random.Random, start: int, ops: list[tuple[int, ...]]) -> Problem:
    """The problem's wording and worked solution (names, objects and phrasings drawn from ``rng``)."""
    name, pronoun = rng.choice(NAMES)
    friends = rng.sample([n for n, _ in NAMES if n != name], 5)  # the first gives; up to four others share
    containers, container = rng.choice(CONTAINERS)
    slots = dict(N=name, P=pronoun, Pc=pronoun.capitalize(), Po=_OBJECT[pronoun], Pr=_REFLEXIVE[pronoun], F=friends[0])
    slots.update(obj=rng.choice(OBJECTS), cs=containers, c=container)
    question = [rng.choice(START).format(s=start, **slots)]
    solution = [SOLUTION["start"].format(s=start, **slots)]
    value = start
    for op in ops:
        kind, k, m = op[0], op[1], (op[2] if len(op) > 2 else None)
        result = _apply(value, op)
        template = rng.choice(QUESTIONS[kind][k] if kind == "mul" else QUESTIONS[kind])
        names = friends[1:k] if kind == "div" else []  # the k - 1 friends who share with them
        together = " and ".join(names) if len(names) <= 2 else ", ".join(names[:-1]) + " and " + names[-1]
        question.append(template.format(k=k, m=m, friends=together, **slots))
        solution.append(SOLUTION[kind].format(k=k, m=m, km=k * m if m else None, v=value, r=result, **slots))
        value = result
    question.append(rng.choice(END).format(**slots))
    solution.append(f"#### {value}")
    return Problem(" ".join(question), "\n".join(solution), value, len(ops), _key(start, ops))


def generate(split: str = "test", num_examples: int = 200, seed: int = 0) -> list[Problem]:
    """``num_examples`` problems of ``split``, deterministic in ``seed``; no canonical key repeats."""
    if split not in ("train", "test"):
        raise ValueError(f"`split` is {split!r}; use 'train' or 'test'.")
    if isinstance(num_examples, bool) or not isinstance(num_examples, int) or num_examples < 0:
        raise ValueError(f"`num_examples` is {num_examples!r}; pass an integer >= 0.")
    rng = random.Random(f"arith_steps/{split}/{seed}")
    problems: list[Problem] = []
    seen: set[str] = set()
    for _ in range(1000 * num_examples + 1000):
        if len(problems) == num_examples:
            return problems
        skeleton = _skeleton(rng)
        if skeleton is None:
            continue
        key = _key(*skeleton)
        if key in seen or split_of(key) != split:
            continue
        seen.add(key)
        problems.append(_problem(rng, *skeleton))
    raise RuntimeError(f"could not generate {num_examples} distinct arith_steps problems; lower `num_examples`.")


def load_arith_steps(
    split: str = "test", num_examples: int | None = None, seed: int = 0, chat_template: str = "smollm2"
):
    """A ``datasets.Dataset``: ``prompt`` (the chat-formatted question), ``reference`` (the worked solution ending
    in ``#### <answer>``), ``question``, ``answer`` and ``steps``."""
    from ..lab.tasks.registry import require

    Dataset = require("datasets").Dataset

    problems = generate(split, 200 if num_examples is None else num_examples, seed)
    return Dataset.from_dict(
        {
            "prompt": [chat_prompt(p.question, chat_template) for p in problems],
            "reference": [p.solution for p in problems],
            "question": [p.question for p in problems],
            "answer": [str(p.answer) for p in problems],
            "steps": [p.steps for p in problems],
        }
    )
