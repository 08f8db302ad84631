"""make_real_results' speed page: the batch / thread table, and the task-tuned pair's speed goal stated from the
batch-1, one-thread run (met, missed by how much, or not measured)."""

from __future__ import annotations

from real_pair_speed import speed_goals, speed_table, speed_text

from diversed_hf.lab.bench.schema import BenchResult


def _result(task: str, diversed_speed: float | None) -> BenchResult:
    rows = [
        {"method": "target-only", "tokens_per_second": 10.0, "acceptance_rate": None, "tokens_per_round": 1.0},
        {"method": "SD", "tokens_per_second": 9.0, "acceptance_rate": 0.115, "tokens_per_round": 1.46},
        {"method": "DIVERSED", "tokens_per_second": diversed_speed, "acceptance_rate": 0.327, "tokens_per_round": 2.3},
    ]
    return BenchResult(task, rows, {}, [], {"config": {}})


def test_the_goal_is_read_from_batch_one_one_thread_and_says_by_how_much_it_is_missed():
    runs = {(1, 1): [_result("synopsis", 13.0)], (8, 2): [_result("synopsis", 25.0)]}
    assert speed_goals("tuned", runs) == (
        "Goal on `synopsis`: DIVERSED >= 2x target-only tokens/s at batch 1, one thread; measured 1.30x "
        "(32.7 % of drafts accepted): missed by 0.70."
    )
    assert speed_goals("tuned", {(1, 1): [_result("synopsis", 21.0)]}).endswith(
        "measured 2.10x (32.7 % of drafts accepted): met."
    )
    assert speed_goals("tuned", {(1, 1): [_result("arith_steps", 21.0)]}).endswith("; not measured.")
    assert speed_goals("tuned", {(1, 1): [_result("synopsis", None)]}).endswith("; not measured.")
    assert speed_goals("eagle-tasks", runs) == ""  # no speed goal for that setup


def test_the_page_states_one_run_at_a_time_the_load_and_the_goal():
    runs = {(1, 1): [_result("synopsis", 13.0)]}
    sizes = {"speed": {"num_prompts": 2, "repeats": 1, "max_new_tokens": {"synopsis": 48}}}
    text = speed_text(False, sizes, " --draft tuned", 0.04, runs, "tuned")
    assert "`python training/make_real_results.py --speed-only --draft tuned`" in text
    assert "one run at a time (load average 0.0 on" in text
    assert text.endswith(
        "| 1.30x |\n\nGoal on `synopsis`: DIVERSED >= 2x target-only tokens/s at batch 1, one thread; "
        "measured 1.30x (32.7 % of drafts accepted): missed by 0.70.\n"
    )
    assert not speed_text(False, sizes, "", 0.04, runs, "eagle-tasks").rstrip().endswith("0.70.")
    table = speed_table(runs)
    assert "| synopsis | 1 | 1 | DIVERSED | 32.7 % | 2.30 | 13.0 | 1.30x |" in table
    assert "| synopsis | 1 | 1 | target-only | – | 1.00 | 10.0 | 1.00x |" in table
