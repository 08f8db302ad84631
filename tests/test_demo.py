"""`diversed-hf demo`: the README's first command, on the shipped testbed (and on tiny random models)."""

from __future__ import annotations

import pytest

from diversed_hf import cli
from diversed_hf.demo import run_demo


def test_demo_command_prints_outputs_and_acceptance(capsys):
    assert cli.main(["demo", "--num-prompts", "2", "--max-new-tokens", "12"]) == 0
    out = capsys.readouterr().out
    assert "Testbed pair, task 'arith', 2 held-out prompts" in out
    for method in ("SD (ExactVerifier)", "static ensemble w=0.5", "DIVERSED head"):
        assert f"=== {method}: acceptance " in out
    assert out.count("[prompt]  'Question:") == 6 and out.count("[output]") == 6
    assert "acceptance by draft position:" in out


@pytest.mark.parametrize("random_models", [False, True])
def test_run_demo_returns_texts_and_statistics(random_models):
    results = run_demo("summary", num_prompts=2, max_new_tokens=8, random_models=random_models)
    assert len(results) == 3
    for result in results:
        assert len(result["texts"]) == 2 and all(isinstance(text, str) for text in result["texts"])
        stats = result["stats"]
        assert 0.0 <= stats["acceptance_rate"] <= 1.0 and 0 < stats["num_generated"] <= 2 * 8
        assert len(stats["position_acceptance_rate"]) == 5


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


def test_demo_prints_quality_per_method(capsys):
    assert cli.main(["demo", "--task", "arith", "--num-prompts", "2"]) == 0
    out = capsys.readouterr().out
    assert "| method | exact match (%) | acceptance | tokens / round | seconds |" in out
    rows = [line for line in out.splitlines() if line.startswith("| SD (ExactVerifier)")]
    assert rows and rows[0].split("|")[2].strip().replace(".", "").isdigit()
    assert "Loading weights" not in out
