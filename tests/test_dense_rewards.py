"""Dense rewards for weak targets: the target's greedy answers (cached once), task reward minus the target's, and
agreement with the target's answer; train_head.py trains with them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from datasets import Dataset

pytest.importorskip("trl")

import diversed_hf.testbed  # noqa: E402,F401 - registers arith / summary
from diversed_hf.lab.tasks import get_task
from diversed_hf.lab.tasks.dense_rewards import (
    REWARD_MODES,
    add_target_columns,
    check_reward_mode,
    dense_reward,
    target_completions,
)

REPO = Path(__file__).resolve().parents[1]


def _rows():
    data = Dataset.from_dict({"prompt": ["p0", "p1", "p2"], "reference": ["#### 7", "#### 3", "#### 5"]})
    return add_target_columns(data, "arith", ["so #### 7", "I think 4", "no idea"])


def test_columns_and_the_three_modes_on_an_exact_match_task():
    data = _rows()
    assert data["target_reward"] == [1.0, 0.0, 0.0]
    completions = ["#### 7", "#### 4", "#### 5"]
    kwargs = dict(
        prompts=data["prompt"],
        completions=completions,
        reference=data["reference"],
        target_completion=data["target_completion"],
        target_reward=data["target_reward"],
    )
    assert dense_reward("arith", "task")(**kwargs) == [1.0, 0.0, 1.0]
    assert dense_reward("arith", "task_minus_target")(**kwargs) == [0.0, 0.0, 1.0]
    # agreement with the target's final number; a target answer without one gives 0
    assert dense_reward("arith", "target_agreement")(**kwargs) == [1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="reads the columns 'target_completion'"):
        dense_reward("arith", "target_agreement")(completions=completions, reference=data["reference"])


def test_agreement_on_a_rouge_task_is_rouge2_against_the_targets_answer():
    data = add_target_columns(
        Dataset.from_dict({"prompt": ["a"], "reference": ["the cat sat on the mat"]}), "summary", ["the cat sat down"]
    )
    reward = dense_reward("summary", "target_agreement")
    row = data[0]
    scores = reward(
        prompts=["a", "a"],
        completions=["the cat sat down", "a dog ran"],
        reference=[row["reference"]] * 2,
        target_completion=[row["target_completion"]] * 2,
        target_reward=[row["target_reward"]] * 2,
    )
    assert scores == [1.0, 0.0]


def test_modes_are_checked_before_anything_runs():
    assert REWARD_MODES == ("task", "task_minus_target", "target_agreement", "target_likelihood")
    with pytest.raises(ValueError, match="`reward` is 'dense'"):
        check_reward_mode("dense", "arith")
    with pytest.raises(ValueError, match="'target_agreement' scores agreement by .* task 'mbpp' is scored by 'pass@1'"):
        check_reward_mode("target_agreement", "mbpp")
    check_reward_mode("task_minus_target", "mbpp")


def test_the_targets_greedy_answers_are_cached_and_reused(tmp_path):
    from test_training import tiny_tokenizer
    from tiny_models import make_pair

    target, _ = make_pair("llama")
    tokenizer = tiny_tokenizer()
    cache = tmp_path / "target_completions.json"
    prompts = ["a b c", "a c", "b b a c"]
    first = target_completions(target, tokenizer, prompts, max_new_tokens=5, batch_size=2, cache=cache)
    assert len(first) == 3 and json.loads(cache.read_text())["key"]["max_new_tokens"] == 5
    target.generate = lambda *a, **k: pytest.fail("a cached completion was generated again")
    assert target_completions(target, tokenizer, prompts, max_new_tokens=5, cache=cache) == first
    with pytest.raises(
        ValueError, match=f"cache {cache} holds .* other generation settings .*max_new_tokens: cached 5"
    ):
        target_completions(target, tokenizer, prompts, max_new_tokens=6, cache=cache)


def test_the_cache_serves_only_the_target_and_settings_that_wrote_it(tmp_path):
    """Another model, the same model in another dtype, or with an adapter's weights: each is refused, naming the
    file, instead of serving the first target's answers."""
    import copy

    from test_training import tiny_tokenizer
    from tiny_models import make_model, make_pair

    target, _ = make_pair("llama")
    tokenizer = tiny_tokenizer()
    cache = tmp_path / "target_completions.json"
    prompts = ["a b c", "a c"]
    target_completions(target, tokenizer, prompts, max_new_tokens=4, cache=cache)
    adapted = copy.deepcopy(target)
    adapted.lm_head.register_parameter("lora_B", torch.nn.Parameter(torch.ones(2)))  # an adapter's extra weights
    for other in (make_model("llama", seed=5), copy.deepcopy(target).to(torch.bfloat16), adapted):
        other.generate = lambda *a, **k: pytest.fail("refused before generating")
        with pytest.raises(ValueError, match=f"cache {cache} holds the completions of another target .*target_finger"):
            target_completions(other, tokenizer, prompts, max_new_tokens=4, cache=cache)
    assert target_completions(target, tokenizer, prompts, max_new_tokens=4, cache=cache)  # its own target: served


@pytest.mark.parametrize(
    "text, match",
    [
        ('{"key": {}, "completions": {"ab', "is not valid JSON .*cut short"),
        ("[1, 2]", "holds a JSON list, not the object"),
        ('{"max_new_tokens": 4, "completions": {}}', "does not record which target wrote it"),
    ],
)
def test_a_damaged_or_old_cache_is_refused_naming_the_file(tmp_path, text, match):
    from test_training import tiny_tokenizer
    from tiny_models import make_pair

    cache = tmp_path / "target_completions.json"
    cache.write_text(text)
    with pytest.raises(ValueError, match=f"cache {cache} {match}.*Remove it"):
        target_completions(make_pair("llama")[0], tiny_tokenizer(), ["a b"], max_new_tokens=4, cache=cache)


def _saved_pair(tmp_path) -> list[str]:
    """A tiny target and draft saved with their tokenizer: the directories train_head.py loads."""
    from test_training import tiny_tokenizer
    from tiny_models import make_pair

    paths = []
    for name, model in zip(("target", "draft"), make_pair(noise=0.5)):
        model.save_pretrained(tmp_path / name)
        tiny_tokenizer().save_pretrained(tmp_path / name)
        paths.append(str(tmp_path / name))
    return paths


def test_train_head_trains_with_target_agreement(tmp_path):
    import train_head

    paths = _saved_pair(tmp_path)
    out = tmp_path / "run"
    train_head.main(
        [
            "--config",
            str(REPO / "training" / "configs" / "testbed_arith.yaml"),
            "--target_model",
            paths[0],
            "--draft_model",
            paths[1],
            "--output_dir",
            str(out),
            "--num_train_examples",
            "16",
            "--max-steps",
            "1",
            "--max_completion_length",
            "6",
            "--eval_num_examples",
            "0",
            "--threads",
            "1",
            "--disable_tqdm",
            "true",
            "--reward",
            "target_agreement",
            "--max_unknown_share",  # tiny random models: their word-level vocabulary is not English
            "1",
        ]
    )
    cached = json.loads((out / "target_completions.json").read_text())
    assert len(cached["completions"]) == 16 and cached["key"]["max_new_tokens"] == 6
    assert json.loads((out / "head" / "training_config.json").read_text())["reward"] == "target_agreement"
    with pytest.raises(ValueError, match="`reward` is 'nope'"):
        train_head.parse_arguments(["--task", "testbed_arith", "--reward", "nope"])
    assert get_task("arith").metric == "exact_match"


def test_target_likelihood_is_the_targets_own_log_likelihood_of_the_text():
    """The reward for text without answers: the target's mean per-token log-probability of the completion after its
    prompt, as the bench's chat measure scores it; an empty completion takes the batch's lowest score."""
    from diversed_hf import testbed
    from diversed_hf.lab.bench.chat_quality import target_log_likelihood
    from diversed_hf.lab.tasks.dense_rewards import likelihood_reward

    assert "target_likelihood" in REWARD_MODES
    target, _, tokenizer = testbed.load_pair()
    prompt = testbed.load_task("arith", num_examples=1)["prompt"][0]
    reward = likelihood_reward(target, tokenizer, "arith")
    likely, unlikely, empty = reward(prompts=[prompt] * 3, completions=[" 3 + 4 = 7", " zebra zebra zebra", ""])
    prompt_ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    expected = target_log_likelihood(
        target, prompt_ids, tokenizer(" 3 + 4 = 7", add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    )
    assert likely == pytest.approx(expected, abs=1e-5) and unlikely < likely and empty == min(likely, unlikely)
    check_reward_mode("target_likelihood", "summary")  # any task: it needs no answers


def test_train_head_trains_with_the_targets_likelihood(tmp_path):
    import train_head

    paths = _saved_pair(tmp_path)
    out = tmp_path / "run"
    argv = ["--config", str(REPO / "training" / "configs" / "testbed_summary.yaml"), "--target_model", paths[0]]
    argv += ["--draft_model", paths[1], "--output_dir", str(out), "--num_train_examples", "16", "--max-steps", "1"]
    argv += ["--max_completion_length", "6", "--eval_num_examples", "0", "--threads", "1", "--disable_tqdm", "true"]
    train_head.main([*argv, "--reward", "target_likelihood", "--max_unknown_share", "1"])  # tiny random models
    assert json.loads((out / "head" / "training_config.json").read_text())["reward"] == "target_likelihood"
    assert not (out / "target_completions.json").exists()  # no greedy answers needed
    logged = [json.loads(line) for line in (out / "head" / "train_log.jsonl").read_text().splitlines()]
    assert any(key.endswith("target_likelihood/mean") and value < 0 for row in logged for key, value in row.items())
