"""make_real_results' speed page: the batch / thread table, and the task-tuned pair's speed goal stated from the
batch-1, one-thread run (met, missed by how much, or not measured)."""

from __future__ import annotations

from diversed_hf.cli.real_pair_speed import refresh_speed_goals, speed_goals, speed_table, speed_text
from diversed_hf.lab.bench.schema import BenchResult, write_json_results


def _result(task: str, diversed_speed: float | None) -> BenchResult:
    rows = [
        {"method": "target-only", "tokens_per_second": 10.0, "acceptance_rate": None, "tokens_per_round": 1.0},
        {"method": "SD", "tokens_per_second": 9.0, "acceptance_rate": 0.115, "tokens_per_round": 1.46},
        {
            "method": "DIVERSED",
            "tokens_per_second": diversed_speed,
            "acceptance_rate": 0.327,
            "tokens_per_round": 2.3,
            "verify_cost": 1.76,
            "predicted_speedup_measured_verify": 1.16,
        },
    ]
    meta = {"config": {"temperature": 1.0, "num_draft_tokens": 4, "max_new_tokens": 48}, "cost_ratio": 0.069}
    rows = [dict(row, num_prompts=8) for row in rows]
    return BenchResult(task, rows, {}, [], dict(meta, quality_metric="rouge2_f1", target="t", draft="d"))


def test_the_goal_is_read_from_batch_one_one_thread_and_says_by_how_much_it_is_missed():
    runs = {(1, 1): [_result("synopsis", 13.0)], (8, 2): [_result("synopsis", 25.0)]}
    missed = (
        "Goal on `synopsis`: DIVERSED >= 2x target-only tokens/s at batch 1, one thread; measured 1.30x "
        "(32.7 % of drafts accepted): missed by 0.70."
    )
    why = (
        " Why, from the run's own costs: a drafted token costs 0.069 target tokens and a verification pass 1.76 on "
        "this machine, so its 2.30 tokens a round predict at most 1.16x (the bench's speed model); the loop's "
        "per-round overhead takes the rest."
    )
    assert speed_goals("tuned", runs) == missed + why
    assert speed_goals("tuned", {(1, 1): [_result("synopsis", 21.0)]}).endswith(  # met: no account of costs
        "measured 2.10x (32.7 % of drafts accepted): met."
    )
    unrecorded = _result("synopsis", 13.0)
    del unrecorded.meta["cost_ratio"]  # a run without its cost measurement: the verdict alone
    assert speed_goals("tuned", {(1, 1): [unrecorded]}) == missed
    assert speed_goals("tuned", {(1, 1): [_result("arith_steps", 21.0)]}).endswith("; not measured.")
    assert speed_goals("tuned", {(1, 1): [_result("synopsis", None)]}).endswith("; not measured.")
    assert speed_goals("eagle-tasks", runs) == ""  # no speed goal for that setup


def test_the_page_states_one_run_at_a_time_the_load_and_the_goal():
    runs = {(1, 1): [_result("synopsis", 13.0)]}
    sizes = {"speed": {"num_prompts": 2, "repeats": 1, "max_new_tokens": {"synopsis": 48}}}
    text = speed_text(False, sizes, " --draft tuned", 0.04, runs, "tuned")
    assert "`python benchmarks/make_real_results.py --speed-only --draft tuned`" in text
    assert "one run at a time (load average 0.0 on" in text
    assert "| 1.30x |\n\nGoal on `synopsis`: DIVERSED >= 2x target-only tokens/s at batch 1, one thread; " in text
    assert text.endswith("overhead takes the rest.\n")
    assert speed_text(False, sizes, "", 0.04, runs, "eagle-tasks").endswith("| 1.30x |\n")
    table = speed_table(runs)
    assert "| synopsis | 1 | 1 | DIVERSED | 32.7 % | 2.30 | 13.0 | 1.30x |" in table
    assert "| synopsis | 1 | 1 | target-only | – | 1.00 | 10.0 | 1.00x |" in table


def test_section_only_states_the_goals_again_from_the_saved_runs_and_keeps_the_table(tmp_path):
    runs = {(1, 1): [_result("synopsis", 13.0)]}
    sizes = {"speed": {"num_prompts": 2, "repeats": 1, "max_new_tokens": {"synopsis": 48}}}
    page = tmp_path / "speed.md"
    written = speed_text(False, sizes, "", 0.2, runs, "tuned")
    page.write_text(written.split("\n\nGoal on `")[0] + "\n\nGoal on `synopsis`: an older wording.\n")
    refresh_speed_goals(tmp_path / "missing.md", "tuned")  # no page: nothing written
    assert not (tmp_path / "missing.md").exists()
    write_json_results(runs[(1, 1)], tmp_path / "speed" / "batch1_threads1" / "synopsis")
    refresh_speed_goals(page, "tuned")
    assert page.read_text() == written  # as the run would write it now, the table untouched
    refresh_speed_goals(page, "eagle-tasks")  # a setup without speed goals: the paragraph goes
    assert page.read_text() == written.split("\n\nGoal on `")[0] + "\n"
