"""The real pair's speed page (``make_real_results.py``'s batch / thread runs): the table, and the speed goal of a
setup where it has one (the task-tuned pair: DIVERSED with its ``synopsis`` head at 2x target-only tokens/s)."""

from __future__ import annotations

import os
from pathlib import Path

#: per ``--draft``: task -> the DIVERSED speed-up over target-only (tokens/s) wanted at batch 1, one thread
SPEED_GOALS = {"tuned": {"synopsis": 2.0}}


def speed_table(runs: dict[tuple[int, int], list]) -> str:
    """tokens/s and the speed-up over target-only, per (batch, threads) setting and method."""
    lines = [
        "| task | batch | threads | method | acceptance | tokens/round | tokens/s | speedup vs target (tokens/s) |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for (batch, threads), results in sorted(runs.items()):
        for result in results:
            rows = {row["method"]: row for row in result.rows}
            base = rows.get("target-only", {}).get("tokens_per_second")
            for name, row in rows.items():
                speed = row.get("tokens_per_second")
                ratio = f"{speed / base:.2f}x" if speed and base else "–"
                acceptance = row.get("acceptance_rate")
                shown = f"{100 * acceptance:.1f} %" if isinstance(acceptance, (int, float)) else "–"
                per_round = row.get("tokens_per_round")
                per_round = f"{per_round:.2f}" if isinstance(per_round, (int, float)) and speed else "–"
                lines.append(
                    f"| {result.task} | {batch} | {threads} | {name} | {shown} | {per_round} | {speed or 0:.1f} | "
                    f"{ratio} |"
                )
    return "\n".join(lines)


def speed_goals(draft: str, runs: dict[tuple[int, int], list]) -> str:
    """One sentence per goal of ``SPEED_GOALS[draft]``: DIVERSED's tokens/s over target-only's at batch 1 and one
    thread, met or missed by how much; "" when the setup has no speed goal."""
    sentences = []
    for task, goal in SPEED_GOALS.get(draft, {}).items():
        [result] = [r for r in runs.get((1, 1), []) if r.task == task] or [None]
        rows = {row["method"]: row for row in result.rows} if result is not None else {}
        base = rows.get("target-only", {}).get("tokens_per_second")
        diversed = next((row for name, row in rows.items() if name.startswith("DIVERSED")), {})
        if not (base and diversed.get("tokens_per_second")):
            sentences.append(f"Goal on `{task}`: DIVERSED >= {goal:g}x target-only tokens/s; not measured.")
            continue
        ratio = diversed["tokens_per_second"] / base
        verdict = "met" if ratio >= goal else f"missed by {goal - ratio:.2f}"
        acceptance = diversed.get("acceptance_rate")
        accepted = f" ({100 * acceptance:.1f} % of drafts accepted)" if isinstance(acceptance, (int, float)) else ""
        sentences.append(
            f"Goal on `{task}`: DIVERSED >= {goal:g}x target-only tokens/s at batch 1, one thread; measured "
            f"{ratio:.2f}x{accepted}: {verdict}."
        )
        if ratio < goal:
            sentences.append(_cost_account(diversed, result.meta.get("cost_ratio")))
    return " ".join(text for text in sentences if text)


def _cost_account(row: dict, cost_ratio) -> str:
    """Why a speed goal is missed, from the run's own cost measurement: what a drafted token and a verification pass
    cost in target tokens on this machine, and the speed-up the bench's model predicts from them ("" if unrecorded)."""
    fields = (
        cost_ratio,
        row.get("verify_cost"),
        row.get("tokens_per_round"),
        row.get("predicted_speedup_measured_verify"),
    )
    if not all(isinstance(value, (int, float)) for value in fields):
        return ""
    c, verify, per_round, predicted = fields
    return (
        f"Why, from the run's own costs: a drafted token costs {c:.3f} target tokens and a verification pass "
        f"{verify:.2f} on this machine, so its {per_round:.2f} tokens a round predict at most {predicted:.2f}x "
        "(the bench's speed model); the loop's per-round overhead takes the rest."
    )


def speed_text(quick: bool, sizes: dict, command_flags: str, load: float, speed: dict, draft: str) -> str:
    """``speed.md``: how the speed runs were made (with the load average when they started), the table, then the
    setup's speed goals."""
    goals = speed_goals(draft, speed)
    return (
        "### Speed by batch size and threads\n\n"
        "Regenerate with `python benchmarks/make_real_results.py --speed-only"
        + command_flags
        + (" --quick" if quick else "")
        + f"`. Target-only, SD and DIVERSED on {sizes['speed']['num_prompts']} held-out prompts per task at batch 1 "
        "(8 at batch 8; at most "
        + ", ".join(f"{n} new tokens on {t}" for t, n in sizes["speed"]["max_new_tokens"].items())
        + "), median of "
        f"{sizes['speed']['repeats']} interleaved timed runs after a warm-up, with one torch thread and with two, one "
        f"run at a time (load average {load:.1f} on {os.cpu_count()} cores when the runs started):\n\n"
        + speed_table(speed)
        + "\n"
        + (f"\n{goals}\n" if goals else "")
    )


def refresh_speed_goals(speed_page: Path, draft: str) -> None:
    """Write the goals paragraph at the end of an existing ``speed.md`` again from the speed runs saved beside it
    (``speed/batch1_threads1/<task>/bench.json``), so that ``--section-only`` states them as the code now does without
    timing anything again; the table and the conditions above it are the run's and stay as written."""
    from diversed_hf.lab.bench import read_results

    if not speed_page.is_file():
        return
    saved = sorted((speed_page.parent / "speed" / "batch1_threads1").glob("*/bench.json"))
    goals = speed_goals(draft, {(1, 1): [result for path in saved for result in read_results(path)]})
    text = speed_page.read_text()
    head = text.split("\n\nGoal on `", 1)[0].rstrip("\n") + "\n"
    speed_page.write_text(head + (f"\n{goals}\n" if goals else ""))
