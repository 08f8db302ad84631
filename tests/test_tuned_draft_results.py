"""benchmarks/tuned_draft_results.py's pure parts: pooled rates, the shipped length, the section (no model)."""

from scripts import load_script

from diversed_hf.cli.sections import TUNED_DRAFT_SECTION, refresh_head_sections

tuned_draft_results = load_script("tuned_draft_results")
tuned_draft_results = load_script("tuned_draft_results")
pooled = tuned_draft_results.pooled
section = tuned_draft_results.section
summary = tuned_draft_results.summary


def _row(tokens, seconds, acceptance=None, same=0):
    row = {"tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds}
    if acceptance is not None:
        row.update(acceptance=acceptance, tokens_per_round=1.5, same_text=same)
    return row


def _results():
    block = {"target": _row(100, 10.0), "eagle:N=1": _row(100, 8.0, 0.5, 3), "eagle:N=2": _row(100, 6.0, 0.4, 3)}
    runs = {task: {"t1": block, "greedy": block} for task in tuned_draft_results.TASKS}
    return {
        "runs": runs,
        "num_prompts": 3,
        "best": 2,
        "pooled_t1": {1: 1.25, 2: 10 / 6},
        "speedup_t1": 10 / 6,
        "acceptance_t1": 0.4,
    }


def test_pooled_rates_are_totals_not_means_of_rates():
    blocks = [{"x": _row(10, 1.0, 0.5)}, {"x": _row(90, 9.0, 0.1)}]
    assert pooled(blocks, "x")["tokens_per_second"] == 10.0
    assert abs(pooled(blocks, "x")["acceptance"] - (0.5 * 10 + 0.1 * 90) / 100) < 1e-12


def test_summary_says_the_goal_and_the_section_lists_every_length(tmp_path):
    text = summary(_results())
    assert "N = 2" in text and "1.67x target-only" in text and "goal >= 1.4x: met" in text
    assert "`synopsis` 40.0 % accepted, 1.67x (met)" in text
    missed = dict(_results(), speedup_t1=1.2)
    assert "missed by 0.20" in summary(missed)

    class Args:
        draft_lengths, max_new_tokens = [1, 2], 96

    page = section(_results(), Args, "python benchmarks/tuned_draft_results.py")
    assert page.startswith("Regenerate with:")
    assert page.count("lossless SD, N = 1") == 4  # two tasks x two modes
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / f"{TUNED_DRAFT_SECTION[0]}.md").write_text(page)
    results_md = tmp_path / "RESULTS.md"
    results_md.write_text("# Results\n\n## Other\n\ntext\n\n## Reading the tokens-per-round columns\n\nx\n")
    refresh_head_sections(results_md, tmp_path / "results")
    refresh_head_sections(results_md, tmp_path / "results")
    text = results_md.read_text()
    assert text.count(f"## {TUNED_DRAFT_SECTION[1]}") == 1 and "## Other" in text
