"""Reward functions: hand-computed cases, and the code sandbox's limits."""

from __future__ import annotations

import os

import pytest

from diversed_hf.lab.tasks import get_task, reward_for_task, rewards


def test_exact_match():
    references = ["She has 3 + 4 = 7.\n#### 1,234", "#### 5", "#### 27"]
    completions = ["... so 1234 in total\n#### 1234", "The answer is 5 or maybe 6", "27.0 apples, #### $27"]
    assert rewards.exact_match(completions, references) == [1.0, 0.0, 1.0]
    assert rewards.exact_match(["no number here"], ["#### 3"]) == [0.0]
    with pytest.raises(ValueError, match="contains no number"):
        rewards.exact_match(["3"], ["three"])
    with pytest.raises(ValueError, match="one per completion"):
        rewards.exact_match(["3", "4"], ["#### 3"])


def test_rouge2_f1_by_hand():
    # bigrams: prediction {the cat, cat ran}, reference {the cat, cat sat}: P = R = 1/2, F1 = 1/2
    assert rewards.rouge2(["the cat ran"], ["the cat sat"]) == [pytest.approx(0.5)]
    assert rewards.rouge2(["a b c"], ["a b c"]) == [pytest.approx(1.0)]
    assert rewards.rouge2(["x y"], ["a b"]) == [0.0]


def test_extract_code():
    assert rewards.extract_code("Here:\n```python\ndef f():\n    return 1\n```\nDone") == "def f():\n    return 1\n"
    assert rewards.extract_code("def f():\n    return 1\n[DONE]\nmore text") == "def f():\n    return 1\n"
    assert rewards.extract_code("x = 1") == "x = 1"


def test_pass_at_1_runs_the_tests():
    tests = "assert add(2, 3) == 5\nassert add(-1, 1) == 0"
    completions = [
        "def add(a, b):\n    return a + b\n[DONE]",
        "def add(a, b):\n    return a - b\n[DONE]",
        "def add(a, b) return",  # syntax error
    ]
    assert rewards.pass_at_1(completions, [tests] * 3, timeout=10) == [1.0, 0.0, 0.0]


def test_sandbox_time_limit():
    passed, reason = rewards.run_program("while True:\n    pass", timeout=1.0)
    assert not passed and reason == "timeout"


def test_sandbox_memory_limit():
    passed, reason = rewards.run_program("x = bytearray(1024 * 1024 * 1024)", timeout=10, memory_mb=256)
    assert not passed and "MemoryError" in reason


def test_sandbox_blocks_network():
    program = "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)"
    passed, reason = rewards.run_program(program, timeout=10)
    assert not passed
    assert "PermissionError" in reason or "network" in reason
    assert rewards.sandbox_network_mode() in ("netns+audit", "audit")


def test_sandbox_is_another_process_in_a_throwaway_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("DIVERSED_SECRET", "do-not-leak")
    monkeypatch.chdir(tmp_path)
    program = (
        "import os\n"
        f"assert os.getpid() != {os.getpid()}\n"
        f"assert os.getcwd() != {str(tmp_path)!r}\n"
        "assert 'DIVERSED_SECRET' not in os.environ\n"
        "open('left_behind.txt', 'w').write('x')\n"
    )
    passed, reason = rewards.run_program(program, timeout=10)
    assert passed, reason
    assert not (tmp_path / "left_behind.txt").exists()


def test_reward_for_task():
    gsm8k = reward_for_task("gsm8k")
    assert gsm8k(prompts=["q", "q"], completions=["#### 4", "#### 5"], reference=["#### 4", "#### 4"]) == [1.0, 0.0]
    mbpp = reward_for_task("mbpp")
    assert mbpp(completions=["def f():\n    return 1"], reference=["assert f() == 1"]) == [1.0]
    with pytest.raises(ValueError, match="column 'reference'"):
        gsm8k(prompts=["q"], completions=["4"])
    with pytest.raises(ValueError, match="Unknown task 'squad'"):
        reward_for_task("squad")


def test_testbed_rewards_are_the_same_functions():
    arith = reward_for_task("testbed_arith")
    assert arith(completions=["1 + 2 = 3\n#### 3"], reference=["#### 3"]) == [1.0]
    summary = reward_for_task("testbed_summary")
    assert summary(completions=["the cat ran"], reference=["the cat sat"]) == [pytest.approx(0.5)]


def test_testbed_and_paper_tasks_share_reward_functions():
    import diversed_hf.testbed  # noqa: F401 - registers arith / summary

    assert get_task("arith").reward is get_task("gsm8k").reward
    assert get_task("testbed_summary").reward is get_task("xsum").reward
    assert get_task("arith").metric_label == get_task("gsm8k").metric_label == "exact match (%)"


def test_only_the_percentage_metrics_carry_a_percent_sign_in_prose():
    from diversed_hf.heads.metrics import metric_unit

    assert metric_unit("exact_match") == metric_unit("accuracy") == metric_unit("pass@1") == " %"
    assert metric_unit("rouge2_f1") == metric_unit("rouge2") == metric_unit(None) == ""


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("```python3\ndef f():\n    return 1\n```", "def f():\n    return 1\n"),
        ("``` python\ndef f():\n    return 1\n```\nDone", "def f():\n    return 1\n"),
        ("```Py\nx = 2\n```", "x = 2\n"),
        # a lone closing fence after unfenced code closes it; the explanation after it is not code
        ("def f():\n    return 1\n```\nThis function returns 1.", "def f():\n    return 1\n"),
        ("Run:\n```bash\npip install x\n```\nThen:\n```python\nx = 3\n```", "x = 3\n"),
        ("```python\nx = 4```\nmore", "x = 4"),  # a closing fence at the end of a code line
        ("Here:\n```\nx = 5\n```\nand\n```python\ny = 6\n```", "x = 5\n"),  # the first Python-or-untagged block
        ("```python\nx = 7\n", "x = 7\n"),  # unclosed: to the end
    ],
)
def test_extract_code_fences(completion, expected):
    assert rewards.extract_code(completion) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("#### \u22127", "-7"),
        ("#### \uff0d7", "-7"),
        ("#### 07", "7"),
        ("#### -007.50", "-7.5"),
        ("#### 0.50", "0.5"),
        ("#### -0", "0"),
        ("#### 000", "0"),
        ("#### -0.0", "0"),
    ],
)
def test_final_number_reads_unicode_minus_and_leading_zeros(text, expected):
    assert rewards.extract_final_number(text) == expected
    assert rewards.exact_match([text], [f"#### {expected}"]) == [1.0]


def test_rewards_take_trl_conversational_completions_and_refuse_other_types():
    conversational = [
        [{"role": "assistant", "content": "so 7\n#### 7"}],
        [{"role": "assistant", "content": [{"type": "text", "text": "#### 8"}]}],
    ]
    assert rewards.exact_match(conversational, ["#### 7", "#### 9"]) == [1.0, 0.0]
    reward = reward_for_task("arith")
    assert reward(prompts=["p"], completions=[[{"role": "assistant", "content": "#### 3"}]], reference=["#### 3"]) == [
        1.0
    ]
    with pytest.raises(TypeError, match=r"`completions\[0\]` is bytes .*pass the completion's text"):
        rewards.exact_match([b"#### 7"], ["#### 7"])
    with pytest.raises(TypeError, match=r"`completions\[1\]` is NoneType"):
        rewards.rouge2(["a b", None], ["a b", "c d"])
    with pytest.raises(TypeError, match=r"`references\[0\]` is bytes"):
        rewards.rouge2(["a b"], [b"a b"])
    with pytest.raises(TypeError, match=r"`tests\[0\]` is NoneType"):
        rewards.pass_at_1(["x = 1"], [None])
    with pytest.raises(TypeError, match="got `completions` of type NoneType"):
        rewards.exact_match(None, ["#### 1"])
    with pytest.raises(ValueError, match="needs `completions`"):
        reward(prompts=["p"], completions=None, reference=["#### 3"])
