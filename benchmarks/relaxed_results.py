"""The field's relaxed acceptance rules against DIVERSED on the testbed tables and on the task-tuned pair's
``synopsis`` and ``arith_steps`` (RESULTS.md "Relaxed rules: testbed", "Relaxed rules: the task-tuned pair";
docs/method.md §9).

    python training/train_judge.py --task testbed_arith --output_dir runs/judge_arith --threads 1 --num_train_examples 300
    python training/train_judge.py --task testbed_summary --output_dir runs/judge_summary --threads 1 \
        --num_train_examples 300
    python benchmarks/relaxed_results.py                        # ~60 minutes on one thread; resumable
    python training/train_judge.py --target smollm2-tuned --task synopsis --output_dir runs/judge_tuned_synopsis \
        --threads 1 --num_train_examples 200 --eval_num_examples 0 --batch_size 64            # ~20 minutes
    python training/train_judge.py --target smollm2-tuned --task arith_steps --output_dir runs/judge_tuned_arith_steps \
        --threads 1 --num_train_examples 200 --eval_num_examples 0 --batch_size 64 --max_new_tokens 192
    python benchmarks/relaxed_results.py --pair smollm2-tuned   # about an hour per task on one thread; resumable

One ``diversed-hf bench`` run per task (``arith``, ``summary``) on the same held-out prompts and sampling seeds for
every method: target-only, lossless SD, the static ensemble swept over ``w``, the shipped DIVERSED head, fuzzy SD swept
over its JS threshold, top-2 relaxed acceptance swept over ``delta`` and judge decoding swept over its threshold (with
the judges ``training/train_judge.py`` trained, ``--judge``). Each rule's sweep is its own front in the trade-off
plots. The verdict per task: at the target's quality (a row whose paired 95 % interval against the target
distribution reaches 0 or above), the highest acceptance each front reaches, against DIVERSED's; and at DIVERSED's
acceptance, the front's quality.

``--pair smollm2-tuned`` (``--tasks`` to run one): each task at its table's setting (temperature 1, N = 4, 48 new
tokens on ``synopsis``, 192 on ``arith_steps``) on the first 100 held-out prompts x 2 samples, where that table
measured its static rows: target-only, lossless SD, the fuzzy and top-k fronts and, once its judge is trained
(``runs/judge_tuned_<task>/judge``), the judge's front; a run without a judge keeps its finished methods in
``<output_dir>/<task>/partial``, so that the judge's front later adds only itself. DIVERSED's row and the static
front are the table's own (``results/smollm2_tuned``: its recipe's calibrated head, which does not ship, on 200
prompts x 2 with the same seeds).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from diversed_hf.cli.sections import refresh_head_sections, run_bench_argv
from diversed_hf.lab.bench import write_results
from diversed_hf.lab.bench.partial import clear_partial
from diversed_hf.lab.cli_utils import ArgumentParser, add_debug_flag, run_script, write_text_atomic

REPO = Path(__file__).resolve().parents[1]
METHODS = [
    "target",
    "sd",
    "static:0,0.25,0.5,0.75",
    "diversed",
    "fuzzy:0.02,0.05,0.1,0.2",
    "topk:0.25,1,4",
    "judge:0.9,0.97,0.99,0.999",
]
TUNED_METHODS = ["target", "sd", "fuzzy:0.02,0.05,0.1,0.2", "topk:0.25,1,4"]
TUNED_TASKS = ("synopsis", "arith_steps")
TUNED_JUDGE_SWEEP = "judge:0.9,0.99,0.999"
TUNED_JUDGE_RECIPE = (
    "python training/train_judge.py --target smollm2-tuned --task <task> --output_dir runs/judge_tuned_<task> "
    "--threads 1 --num_train_examples 200 --eval_num_examples 0 --batch_size 64"
)
FRONTS = {
    "static-ensemble": "static ensemble",
    "fuzzy": "fuzzy SD",
    "topk-relaxed": "top-2 relaxed",
    "judge": "judge decoding",
}
JUDGES = f"arith={REPO}/runs/judge_arith/judge,summary={REPO}/runs/judge_summary/judge"  # train_judge.py's


def bench_argv(args) -> list[str]:
    return [
        "--task", "arith", "summary", "--methods", *METHODS, "--num-prompts", str(args.num_prompts),
        "--num-baseline-prompts", str(args.num_prompts), "--num-samples", "2", "--num-timing-prompts", "2",
        "--repeats", "1", "--max-new-tokens", "100", "--batch-size", "16", "--threads", "1",
        "--output-dir", str(args.output_dir), "--no-progress", "--resume", "--judge", args.judge,
    ]  # fmt: skip


def tuned_bench_argv(task: str, judge: Path | None, output_dir: Path) -> list[str]:
    from diversed_hf.cli.real_pair_runs import TUNED_FULL, pair_flags
    from diversed_hf.cli.sections import bench_flags

    sizes = dict(TUNED_FULL[task], num_prompts=100, num_baseline_prompts=100, num_timing_prompts=2)
    methods = TUNED_METHODS + ([TUNED_JUDGE_SWEEP] if judge is not None else [])
    return [
        *pair_flags("tuned"), "--task", task, "--split", "test", "--threads", "1",
        "--output-dir", str(output_dir), "--no-progress", "--resume",
        *(["--judge", f"{task}={judge}"] if judge is not None else []),
        *bench_flags({**sizes, "methods": methods}),
    ]  # fmt: skip


def at_target(row: dict) -> bool:
    """Whether ``row`` keeps the target's quality: its paired 95 % interval against the target distribution reaches 0."""
    return row.get("quality_delta_high") is not None and row["quality_delta_high"] >= 0


def verdict(rows: list[dict]) -> list[str]:
    """At the target's quality: each front's best acceptance against DIVERSED's."""
    ours = next(row for row in rows if row["family"] == "diversed" and row.get("head_task") in (None, row["task"]))
    lines = [
        f"DIVERSED: {100 * ours['acceptance_rate']:.1f} % accepted, quality {_interval(ours)} against the target "
        f"distribution ({'at' if at_target(ours) else 'short of'} the target's quality)."
    ]
    for family, label in FRONTS.items():
        front = [row for row in rows if row["family"] == family]
        if not front:
            continue  # not measured here
        members = [row for row in front if at_target(row)]
        if not members:
            line = f"{label}: no setting reaches the target's quality" + (
                "; DIVERSED lies above the whole front." if at_target(ours) else ", nor does DIVERSED."
            )
        else:
            best = max(members, key=lambda row: row["acceptance_rate"])
            more = 100 * (ours["acceptance_rate"] - best["acceptance_rate"])
            if not at_target(ours):
                placed = f"DIVERSED, short of the target's quality itself, is not above this front ({more:+.1f} points)"
            else:
                placed = f"DIVERSED is {'above' if more > 0 else 'not above'} this front ({more:+.1f} points)"
            line = (
                f"{label}: at the target's quality at most {100 * best['acceptance_rate']:.1f} % accepted "
                f"({best['method']}, quality {_interval(best)}): {placed}."
            )
        lines.append(f"{line} {_at_equal_acceptance(front, ours)}")
    lines.append(_winner(rows, ours))
    return lines


def _winner(rows: list[dict], ours: dict) -> str:
    """Which row accepts the most at the target's quality: lossless SD, a front's setting or DIVERSED."""
    fronts = [row for row in rows if (row["family"] in FRONTS or row["family"] == "sd") and at_target(row)]
    top = max([*fronts, *([ours] if at_target(ours) else [])], key=lambda row: row["acceptance_rate"])
    if top is ours:
        return "At the target's quality DIVERSED accepts the most of every rule measured."
    more = 100 * (ours["acceptance_rate"] - top["acceptance_rate"])
    said = (
        f"At the target's quality {top['method']} accepts the most ({100 * top['acceptance_rate']:.1f} %, quality "
        f"{_interval(top)}); DIVERSED accepts {more:+.1f} points against it"
    )
    if not at_target(ours):
        return f"{said} but is short of the target's quality (its interval ends at {ours['quality_delta_high']:+.3f})."
    return f"{said}."


def _interval(row: dict) -> str:
    return f"{row['quality_delta']:+.3f} [{row['quality_delta_low']:+.3f}, {row['quality_delta_high']:+.3f}]"


def _at_equal_acceptance(front: list[dict], ours: dict) -> str:
    """The front's quality where it accepts as much as DIVERSED: its least accepting setting that accepts at least
    as much (each row's interval against the target distribution)."""
    reach = [row for row in front if row["acceptance_rate"] >= ours["acceptance_rate"]]
    if not reach:
        most = max(row["acceptance_rate"] for row in front)
        return f"No setting accepts as much as DIVERSED (at most {100 * most:.1f} %)."
    near = min(reach, key=lambda row: row["acceptance_rate"])
    return (
        f"At DIVERSED's acceptance or more ({near['method']}, {100 * near['acceptance_rate']:.1f} %) its quality is "
        f"{_interval(near)}, DIVERSED's {_interval(ours)} ({near['quality_delta'] - ours['quality_delta']:+.3f} "
        "against DIVERSED)."
    )


def main(argv=None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num_prompts", type=int, default=300, help="held-out prompts per task (default 300)")
    parser.add_argument("--pair", choices=("testbed", "smollm2-tuned"), default="testbed")
    parser.add_argument(
        "--judge", default=JUDGES, help="the testbed's judges, task=dir,... (default: runs/judge_<task>/judge)"
    )
    parser.add_argument("--output_dir", default=None, help="default results/relaxed_rules[_tuned]")
    parser.add_argument("--no_ship", action="store_true", help="write the results, ship no judge")
    parser.add_argument(
        "--tasks", nargs="+", choices=TUNED_TASKS, default=list(TUNED_TASKS), help="--pair smollm2-tuned's tasks"
    )
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    if args.pair == "smollm2-tuned":
        return tuned(args, argv)
    args.output_dir = args.output_dir or str(REPO / "results" / "relaxed_rules")
    output_dir = Path(args.output_dir)
    if (
        not (output_dir / "results.json").is_file()
        or {row["task"] for row in json.loads((output_dir / "results.json").read_text())} != {"arith", "summary"}
        or not any(row["family"] == "judge" for row in json.loads((output_dir / "results.json").read_text()))
    ):
        measure(bench_argv(args), output_dir)
    rows = json.loads((output_dir / "results.json").read_text())
    command = "python benchmarks/relaxed_results.py" + (" " + " ".join(argv) if argv else "")
    lines = [
        f"Measured with `{command}` (`diversed-hf bench`, the testbed pair, {args.num_prompts} held-out prompts x 2 "
        "samples per task, temperature 1, N = 5, every method on the same prompts and seeds; quality intervals are "
        "paired over prompts against the target distribution). Each rule swept over its knob is its own front in "
        "the plots (grey: the static ensemble's; dashed: every other rule's). The judges were trained by "
        "`training/train_judge.py` on 300 training prompts per task (the commands are in the script's docstring).",
        "",
    ]
    for task in ("arith", "summary"):
        table = (output_dir / f"{task}_table.md").read_text().strip()
        plot = f"![{task}: quality vs time and vs acceptance, every front](results/relaxed_rules/{task}_tradeoffs.png)"
        found = verdict([r for r in rows if r["task"] == task])
        judge = operating_judge([r for r in rows if r["task"] == task])
        if judge is None:
            found.append(
                "No judge ships for this task: no threshold keeps the target's quality and accepts more than SD."
            )
        else:
            found.append(
                f'The judge ships (`testbed.load_judge("{task}")`) with its operating threshold '
                f"{judge['param']:g}: {100 * judge['acceptance_rate']:.1f} % accepted at quality "
                f"{judge['quality_delta']:+.3f} [{judge['quality_delta_low']:+.3f}, {judge['quality_delta_high']:+.3f}]."
            )
            trained = Path(dict(item.split("=", 1) for item in args.judge.split(","))[task])
            if not args.no_ship and not (trained / "config.json").is_file():
                print(f"{trained} holds no trained judge: the shipped {task} judge is left as it is.", file=sys.stderr)
            elif not args.no_ship:
                ship_judge(task, trained, judge, command, output_dir)
        lines += [f"**{task}**", "", table, "", plot, "", *(f"- {line}" for line in found), ""]
    text = "\n".join(lines)
    write_text_atomic(REPO / "results" / "relaxed_rules.md", text + "\n")
    refresh_head_sections(REPO / "RESULTS.md", REPO / "results")
    print(text)
    return 0


def measure(argv: list[str], output_dir: Path, keep_partial: bool = False) -> None:
    """One bench run (resumable: its finished methods are kept in ``<output_dir>/partial`` until this writes the
    results, or longer with ``keep_partial``, for a later run that adds methods), written to ``output_dir`` with its
    tables and plots."""
    _, results = run_bench_argv(argv)
    write_results(results, output_dir)
    if not keep_partial:
        clear_partial(output_dir, [result.task for result in results])


def operating_judge(rows: list[dict]) -> dict | None:
    """The judge's row a shipped judge is measured by: the most accepting threshold whose quality interval against
    the target distribution reaches 0 and that accepts more than lossless SD; None when no threshold does."""
    sd = next(row for row in rows if row["family"] == "sd")
    members = [
        row
        for row in rows
        if row["family"] == "judge" and at_target(row) and row["acceptance_rate"] > sd["acceptance_rate"]
    ]
    return max(members, key=lambda row: row["acceptance_rate"]) if members else None


def ship_judge(
    task: str,
    trained: Path,
    row: dict,
    command: str,
    output_dir: Path,
    pair: str = "testbed",
    section: str = "Relaxed rules: testbed",
) -> None:
    """The judge ``train_judge.py`` trained, into ``pair``'s judges with its operating threshold and measurement
    (RESULTS.md's ``section`` shows it): staged in ``output_dir/shipments``, then shipped."""
    from diversed_hf.cli import ship
    from diversed_hf.testbed import JUDGE_HOMES

    record = json.loads((trained / "training.json").read_text())
    record["operating_point"] = {
        "threshold": row["param"],
        "acceptance_rate": row["acceptance_rate"],
        "quality_delta": [row["quality_delta"], row["quality_delta_low"], row["quality_delta_high"]],
        "measured_by": command,
        "prompts": f"{row['num_prompts']} held-out {pair} {task} prompts x {row['num_samples']} samples, T = 1, "
        f"N = {row['num_draft_tokens']}",
    }
    card = (trained / "README.md").read_text().rstrip()
    measured = (
        f"\n\n## Operating point\n\nOn {record['operating_point']['prompts']}: `JudgeVerifier(judge, threshold="
        f"{row['param']:g})` accepts {100 * row['acceptance_rate']:.1f} % of the drafts at quality "
        f"{row['quality_delta']:+.3f} [{row['quality_delta_low']:+.3f}, {row['quality_delta_high']:+.3f}] against "
        f'the target distribution (`{command}`; RESULTS.md, "{section}"). Trained by `'
        f"{record['recipe']}`.\n"
    )
    files = {
        "config.json": trained / "config.json",
        "model.safetensors": trained / "model.safetensors",
        "training.json": json.dumps(record, indent=1) + "\n",
        "README.md": card + measured,
    }
    ship.ship(ship.stage(output_dir, f"{JUDGE_HOMES[pair]}/{task}", files, measured_by=command))


def tuned(args, argv) -> int:
    """The task-tuned pair's fronts on each task, against its table's DIVERSED row (module docstring)."""
    output_root = Path(args.output_dir or REPO / "results" / "relaxed_rules_tuned")
    command = "python benchmarks/relaxed_results.py" + (" " + " ".join(argv) if argv else "")
    lines = [
        f'Measured with `{command}` (`diversed-hf bench`, the task-tuned pair `load_pair("smollm2-tuned")`, the '
        "first 100 held-out prompts x 2 samples per task, temperature 1, N = 4, the pair's table's answer lengths "
        "(48 new tokens on `synopsis`, 192 on `arith_steps`), one thread; quality intervals paired over prompts "
        "against the target distribution). DIVERSED is the row of the pair's table (RESULTS.md, \"Real pair: the "
        "paper's table on the task-tuned target\"): its recipe's calibrated head, which does not ship, on 200 "
        "held-out prompts x 2 with the same seeds; the static front is that table's too. The judges were trained on "
        f"the pair by `{TUNED_JUDGE_RECIPE}` (`<task>`: synopsis, and arith_steps with `--max_new_tokens 192`, its "
        "answer length).",
        "",
    ]
    for task in TUNED_TASKS:
        output_dir = output_root / task
        judge = REPO / "runs" / f"judge_tuned_{task}" / "judge"
        judge = judge if (judge / "config.json").is_file() else None
        results_file = output_dir / f"results_{task}.json"
        has_judge = results_file.is_file() and any(
            row["family"] == "judge" for row in json.loads(results_file.read_text())["rows"]
        )
        if task in args.tasks and (not results_file.is_file() or (judge is not None and not has_judge)):
            # without its judge the run keeps its finished methods, so that the judge's front adds only itself
            measure(tuned_bench_argv(task, judge, output_dir), output_dir, keep_partial=judge is None)
        if judge is not None and results_file.is_file():  # the judge's training record beside its front
            write_text_atomic(output_dir / "judge_training.json", (judge / "training.json").read_text())
        if results_file.is_file():
            lines += tuned_section(task, output_dir, judge, None if args.no_ship else command)
    text = "\n".join(lines)
    write_text_atomic(REPO / "results" / "relaxed_rules_tuned.md", text + "\n")
    refresh_head_sections(REPO / "RESULTS.md", REPO / "results")
    print(text)
    return 0


def tuned_section(task: str, output_dir: Path, judge: Path | None, ship_with: str | None = None) -> list[str]:
    """One task's table, plot and verdict on the task-tuned pair (from ``output_dir`` alone: its results and the
    judge's training record); the judge (``judge``) at its operating point ships when ``ship_with`` (the command that
    measured it) is given."""
    rows = json.loads((output_dir / f"results_{task}.json").read_text())["rows"]
    table = json.loads((REPO / "results" / "smollm2_tuned" / f"results_{task}.json").read_text())
    ours = next(row for row in table["rows"] if row["family"] == "diversed" and row.get("head_task") in (None, task))
    static = [row for row in table["rows"] if row["family"] == "static-ensemble"]
    borrowed = [*static, {**ours, "method": "DIVERSED (the table's row)"}]
    found = verdict([*rows, *borrowed])
    from diversed_hf.lab.bench.plots import metric_label, plot_tradeoffs

    # quality against each run's own target distribution (the runs sampled apart), and the table's rows on the
    # acceptance panel only (their seconds were timed in another run)
    plot_tradeoffs(
        [
            *({**row, "quality": row["quality_delta"]} for row in rows),
            *({**row, "quality": row["quality_delta"], "seconds_per_sample": None} for row in borrowed),
        ],
        output_dir / f"{task}_fronts.png",
        title=f"{task} on the task-tuned pair: every front (static and DIVERSED from the pair's table)",
        quality_label=f"{metric_label(rows[0]['quality_metric'])}, minus the target distribution's",
    )
    if not any(row["family"] == "judge" for row in rows):
        found.append(f"No judge front yet: no judge trained for `{task}` (`{TUNED_JUDGE_RECIPE}`).")
    else:
        record = json.loads((output_dir / "judge_training.json").read_text())
        mined = record["judge"]
        found.append(
            f"The judge: {mined['num_swaps']} swaps mined on {record['num_train_examples']} training prompts, "
            f"{100 * mined['harmless_share']:.0f} % of them harmless; on its held-out fifth, precision "
            f"{mined['at_0.5']['precision']:.2f} and recall {mined['at_0.5']['recall']:.2f} of 'harmless' at 0.5, "
            f"{mined['at_0.9']['precision']:.2f} and {mined['at_0.9']['recall']:.2f} at 0.9 (its labels are greedy "
            "swaps; the fronts sample at temperature 1)."
        )
        point = operating_judge(rows)
        if point is None:
            found.append(
                "No judge ships for this task: no threshold keeps the target's quality and accepts more than SD."
            )
        else:
            found.append(
                f'The judge ships (`testbed.load_judge("{task}", pair="smollm2-tuned")`) with its operating threshold '
                f"{point['param']:g}: {100 * point['acceptance_rate']:.1f} % accepted at quality {_interval(point)}."
            )
            if ship_with is not None and judge is not None:
                ship_judge(
                    task, judge, point, ship_with, output_dir, "smollm2-tuned", "Relaxed rules: the task-tuned pair"
                )
    relative = output_dir.relative_to(REPO)
    return [
        f"**{task}**",
        "",
        (output_dir / f"{task}_table.md").read_text().strip(),
        "",
        f"![{task} on the task-tuned pair: quality vs time and vs acceptance, every front]({relative}/{task}"
        "_fronts.png)",
        "",
        *(f"- {line}" for line in found),
        "",
    ]


if __name__ == "__main__":
    sys.exit(run_script(main))
