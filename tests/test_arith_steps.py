"""``arith_steps``: the 2-4 step chat word problems the tuned target learns. No model runs."""

from __future__ import annotations

import re
from collections import Counter

import pytest

import diversed_hf.testbed  # noqa: F401  (registers arith_steps)
from diversed_hf.lab.tasks import get_task, load_task_dataset
from diversed_hf.lab.tasks.rewards import exact_match, extract_final_number
from diversed_hf.testbed import arith_steps

#: one arithmetic of a solution line: ``a op b = c``
CALCULATION = re.compile(r"(\d+) ([-+*/]) (\d+) = (\d+)")


def _recompute(solution: str) -> int:
    """The final value, recomputed from the solution's lines: the start, then each line's calculations, the last one
    on a line continuing from the value before it."""
    lines = solution.split("\n")
    value = int(re.search(r"starts with (\d+)", lines[0]).group(1))
    for line in lines[1:-1]:
        calculations = CALCULATION.findall(line)
        assert calculations, line
        for a, op, b, c in calculations:
            a, b, c = int(a), int(b), int(c)
            exact = {"+": a + b, "-": a - b, "*": a * b, "/": a / b}[op]
            assert exact == c, f"{line!r}: {a} {op} {b} is {exact}, not {c}"
        assert int(calculations[-1][0]) == value, f"{line!r} does not continue from {value}"
        value = int(calculations[-1][3])
    return value


def test_generation_is_deterministic_in_the_seed():
    first = load_task_dataset("arith_steps", split="train", num_examples=50, seed=3)
    again = load_task_dataset("arith_steps", split="train", num_examples=50, seed=3)
    other = load_task_dataset("arith_steps", split="train", num_examples=50, seed=4)
    assert first["prompt"] == again["prompt"] and first["reference"] == again["reference"]
    assert first["prompt"] != other["prompt"]


def test_train_and_test_are_disjoint_by_canonical_key_for_any_seeds():
    train = {p.key for seed in (0, 1) for p in arith_steps.generate("train", 1500, seed)}
    test = {p.key for seed in (0, 1) for p in arith_steps.generate("test", 1500, seed)}
    assert not train & test
    assert len({p.key for p in arith_steps.generate("train", 1500, 0)}) == 1500  # no repeat within a call


def test_problems_take_two_to_four_steps_and_stay_small_non_negative_integers():
    problems = arith_steps.generate("test", 600, 0)
    counts = Counter(p.steps for p in problems)
    assert set(counts) == {2, 3, 4} and min(counts.values()) > 100
    for problem in problems:
        lines = problem.solution.split("\n")
        assert len(lines) == problem.steps + 2  # the start, one line per step, the answer
        assert len(problem.key.split("|")[2].split(";")) == problem.steps
        numbers = [int(n) for n in re.findall(r"\d+", problem.solution)]
        assert all(0 < n <= arith_steps.MAX_VALUE for n in numbers)  # every operand and value
    kinds = Counter(op.split(",")[0] for p in problems for op in p.key.split("|")[2].split(";"))
    assert set(kinds) == {"add", "sub", "group", "mul", "div"}


def test_every_references_final_number_is_its_arithmetic():
    data = load_task_dataset("arith_steps", split="test", num_examples=400, seed=0)
    for row in data:
        assert row["reference"].endswith(f"\n#### {row['answer']}")
        assert extract_final_number(row["reference"]) == row["answer"]
        assert _recompute(row["reference"]) == int(row["answer"])
        assert 1 <= int(row["answer"]) <= arith_steps.MAX_VALUE
        assert 2 <= row["steps"] <= 4


def test_registered_like_arith_chat_with_chat_prompts():
    spec = get_task("arith_steps")
    assert spec.metric == "exact_match" and spec.reward is get_task("arith_chat").reward is exact_match
    assert spec.max_new_tokens >= 160  # a 4-step worked solution is about 140 SmolLM2 tokens
    data = spec.load_dataset(split="test", num_examples=5, seed=0)
    assert set(data.column_names) >= {"prompt", "reference", "question", "answer", "steps"}
    for row in data:
        assert row["prompt"].startswith("<|im_start|>system\n") and row["prompt"].endswith("<|im_start|>assistant\n")
        assert f"<|im_start|>user\n{row['question']}<|im_end|>" in row["prompt"]
    plain = spec.load_dataset(split="test", num_examples=5, seed=0, chat_template="none")
    assert plain["prompt"] == data["question"]
    with pytest.raises(ValueError, match="`split` is 'validation'"):
        spec.load_dataset(split="validation")


def test_reward_is_exact_match_on_the_final_number():
    data = load_task_dataset("arith_steps", split="test", num_examples=4, seed=0)
    references, answers = data["reference"], [int(a) for a in data["answer"]]
    spec = get_task("arith_steps")
    assert spec.reward(references, references) == [1.0] * 4
    assert spec.reward([f"So the answer is {a}." for a in answers], references) == [1.0] * 4
    assert spec.reward([f"#### {a + 1}" for a in answers], references) == [0.0] * 4
    assert spec.reward([f"#### {a}\n#### {a + 1}" for a in answers], references) == [0.0] * 4  # the last one counts
    assert spec.reward(["I do not know."] * 4, references) == [0.0] * 4
