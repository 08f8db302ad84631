"""`diversed-hf demo`: the README's first command, on the shipped testbed (and on tiny random models)."""

from __future__ import annotations

import re

import pytest

from diversed_hf import cli
from diversed_hf.cli.demo import run_demo


def test_demo_command_prints_target_only_and_speed_against_it(capsys):
    assert cli.main(["demo", "--num-prompts", "2", "--max-new-tokens", "12", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    assert "Testbed pair (9M), task 'arith': 2 prompts, batch 1, temperature 1" in out
    assert "2 timed passes" in out and "[lowest, highest pass]" in out
    assert "1 torch thread(s)" in out and "warm-up" in out and "new tokens written (up to EOS)" in out
    assert "| method | new tokens | seconds | tokens/s | x target-only |" in out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    for method in ("target-only", "SD (ExactVerifier)", "static ensemble w=0.5", "DIVERSED head"):
        assert method in rows
    assert "| 1.00x |" in rows["target-only"]
    assert re.search(r"\| \d+\.\d\dx \[\d+\.\d\d, \d+\.\d\d\] \|", rows["SD (ExactVerifier)"])  # the spread
    assert "Quality on 2 prompts cannot tell the methods apart" in out
    for method in ("SD (ExactVerifier)", "static ensemble w=0.5", "DIVERSED head"):
        assert f"=== {method}: acceptance by draft position: " in out
    assert out.count("[prompt]  'Question:") == 8 and out.count("[output]") == 8


@pytest.mark.parametrize("random_models", [False, True])
def test_run_demo_returns_speed_texts_and_statistics(random_models):
    setup, results = run_demo("summary", num_prompts=2, max_new_tokens=8, random_models=random_models)
    assert [r["method"] for r in results][0] == "target-only" and len(results) == 4
    assert results[0]["stats"] is None and results[0]["speedup"] == pytest.approx(1.0)
    for result in results:
        assert len(result["texts"]) == 2 and all(isinstance(text, str) for text in result["texts"])
        assert 0 < result["new_tokens"] <= 2 * 8 and result["seconds"] > 0
        assert result["tokens_per_second"] == pytest.approx(result["new_tokens"] / result["seconds"])
    for result in results[1:]:
        stats = result["stats"]
        assert 0.0 <= stats["acceptance_rate"] <= 1.0
        assert len(stats["position_acceptance_rate"]) == stats["num_draft_tokens"]
    assert (setup.references is None) == random_models


def test_demo_uses_the_drafts_own_length_unless_told():
    from diversed_hf.drafting.length.policy import DEFAULT_DRAFT_TOKENS

    _, results = run_demo("arith", num_prompts=1, max_new_tokens=8)
    assert {r["stats"]["num_draft_tokens"] for r in results[1:]} == {
        DEFAULT_DRAFT_TOKENS
    }  # the testbed draft names none
    _, results = run_demo("arith", num_prompts=1, max_new_tokens=8, num_draft_tokens=2)
    assert {r["stats"]["num_draft_tokens"] for r in results[1:]} == {2}


def test_demo_rejects_bad_counts(capsys):
    assert cli.main(["demo", "--num-prompts", "0"]) == 2
    assert capsys.readouterr().err.strip() == "diversed-hf demo: --num-prompts is 0; it must be >= 1."


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["throughput", "--batch-sizes", "0"],
            "diversed-hf throughput: --batch-sizes 0: every batch size must be >= 1.",
        ),
        (["throughput", "--num-prompts", "0"], "diversed-hf throughput: --num-prompts is 0; it must be >= 1."),
    ],
)
def test_user_errors_are_one_line_with_status_2(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip() == message and "Traceback" not in err


def test_demo_prints_quality_per_method_with_its_sample_size(capsys):
    assert cli.main(["demo", "--task", "arith", "--num-prompts", "2", "--no-texts"]) == 0
    captured = capsys.readouterr()
    assert "| acceptance | tokens / round | exact match (%), 2 prompts |" in captured.out
    rows = [line for line in captured.out.splitlines() if line.startswith("| SD (ExactVerifier)")]
    assert rows and rows[0].split("|")[-2].strip().replace(".", "").isdigit()
    assert "[output]" not in captured.out
    assert "Loading weights" not in captured.out + captured.err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["demo", "--task", "synopsis"], "--task is 'synopsis'; the testbed pair's tasks are"),
        (["demo", "--pair", "smollm2", "--task", "arith"], "with --pair smollm2 use everyday (default)"),
        (["demo", "--pair", "smollm2", "--num-prompts", "65"], "the everyday set has 64"),
        (["demo", "--num-draft-tokens", "0"], "--num-draft-tokens is 0"),
        (["demo", "--repeats", "0"], "--repeats is 0; it must be >= 1"),
        (["demo", "--temperature", "-1"], "--temperature is -1.0; use 0 (greedy) or a positive temperature"),
    ],
)
def test_demo_refuses_bad_choices_before_loading(argv, message, capsys):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_rows_without_answers_carry_quality_against_the_target():
    """Prompts without references: every row reports the target's per-token log-likelihood of its texts and their
    ROUGE-L agreement with an independent target sample, paired with target-only (diversed_hf.lab.bench.chat_quality)."""
    from diversed_hf.cli.demo import TARGET_ONLY, run_demo

    _, results = run_demo(random_models=True, num_prompts=3, max_new_tokens=8)
    for result in results:
        scores = result["chat_quality"]
        assert scores["log_likelihood"] < 0 and 0 <= scores["agreement"] <= 1
        assert {"delta", "low", "high"} <= set(scores["log_likelihood_delta"])
    base = next(r for r in results if r["method"] == TARGET_ONLY)["chat_quality"]
    assert base["log_likelihood_delta"]["delta"] == 0.0 and base["agreement_delta"]["delta"] == 0.0


def test_the_target_log_likelihood_is_the_mean_log_probability_of_the_text():
    import torch
    from tiny_models import make_model

    from diversed_hf.lab.bench.chat_quality import agreement, paired, target_log_likelihood

    target = make_model("llama")
    prompt, completion = torch.tensor([[5, 6, 7]]), torch.tensor([9, 3])
    with torch.no_grad():
        log_probs = target(torch.tensor([[5, 6, 7, 9, 3]])).logits[0].log_softmax(-1)
    expected = float((log_probs[2, 9] + log_probs[3, 3]) / 2)
    assert abs(target_log_likelihood(target, prompt, completion) - expected) < 1e-5
    assert target_log_likelihood(target, prompt, torch.tensor([], dtype=torch.long)) != 0.0  # NaN for no text
    assert agreement(["the cat sat"], ["the cat sat"]) == [1.0]
    assert paired([float("nan")], [1.0]) is None


def test_demo_repeats_report_the_median_and_the_spread_of_the_same_texts():
    _, once = run_demo(random_models=True, num_prompts=2, max_new_tokens=8)
    _, results = run_demo(random_models=True, num_prompts=2, max_new_tokens=8, repeats=3)
    for single, repeated in zip(once, results):
        assert repeated["texts"] == single["texts"]  # every pass samples with the same seeds: only the clock differs
        low, high = repeated["speedup_range"]
        assert low <= repeated["speedup"] <= high
    assert results[0]["speedup_range"] == pytest.approx((1.0, 1.0))


def test_demo_runs_greedy_at_temperature_0(capsys):
    setup, results = run_demo(random_models=True, num_prompts=2, max_new_tokens=8, temperature=0)
    assert setup.temperature == 0
    by_method = {r["method"]: r["texts"] for r in results}
    assert by_method["SD (ExactVerifier)"] == by_method["target-only"]  # greedy and lossless: the target's text
    assert (
        cli.main(
            [
                "demo",
                "--random-models",
                "--num-prompts",
                "1",
                "--max-new-tokens",
                "4",
                "--temperature",
                "0",
                "--repeats",
                "1",
                "--no-texts",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "batch 1, greedy" in out and "one timed pass" in out and "--repeats 3 or more shows the spread" in out
