"""The paper's evaluation on the real pair (SmolLM2-135M-Instruct): RESULTS.md's "Real pair" sections.

    python benchmarks/make_real_results.py --skip-speed --extra-runs   # the EagleDraft: results/smollm2_eagle/
    python benchmarks/make_real_results.py --draft self    # the self-draft: results/smollm2/ (its heads were withdrawn)
    python benchmarks/make_real_results.py --quick         # a smoke run into results_quick/smollm2_eagle/
    python benchmarks/make_real_results.py --skip-speed --task arith_chat   # only arith_chat's methods run again

``--draft tuned`` measures the task-tuned pair (``load_pair("smollm2-tuned")``) on ``synopsis`` and ``arith_steps`` at
temperature 1 with its EagleDraft's N = 4, 200 prompts x 2 samples for target-only, SD and DIVERSED, 100 x 2 for the
other methods, and each task's head on the other task (the paper's cross-task row); its heads are the shipped ones,
else those ``training/configs/smollm2_tuned_<task>.yaml`` trained into ``runs/``. Its section is "Real pair: the
paper's table on the task-tuned target".

``--draft eagle-tasks`` (the default: the task EagleDraft, the draft the shipped heads were trained with) measures ``synopsis`` and ``arith_chat`` at temperature 1,
the paper's setting, with the heads shipped for the EagleDraft (``testbed.load_head(task, pair="smollm2")``), 200
prompts x 2 samples for target-only, SD and DIVERSED and the first 100 x 2 for the other methods; ``--extra-runs``
adds both tasks at temperature 0.7 on half as many prompts; ``--jobs 2`` runs two bench runs at once. Its section
is "Real pair: the paper's table with the EagleDraft". What follows describes ``--draft self``, the first evaluation,
kept as it was measured:

Runs of ``diversed-hf bench --pair smollm2`` on ``arith_chat``, ``humaneval`` and ``synopsis`` (held-out splits).
``arith_chat`` and ``humaneval`` run at temperature 0.7 (the temperature the self-draft and their heads were trained
at; at 1.0 the 135M model solves almost no problem), ``synopsis`` at 1.0, the paper's setting, with 200 prompts x 2
samples for target-only, SD and DIVERSED and the first 100 for the other methods:

1. **Methods** (:data:`METHODS`, N = 3 drafts per round): target-only, lossless SD, the static-ensemble
   front (w = 0 .. 0.75; SD is w = 1), SpecCascade (its ``opt`` rule), typical acceptance, DIVERSED
   with the task's shipped head and, on ``humaneval``, with the ``arith_chat`` head; quality with
   the paired 95 % interval against the target distribution, acceptance, tokens per round, and
   tokens/s at batch 1 on one thread with the measured against predicted speed-up.
2. **Speed at batch 1 and 8, one thread and two** for target-only, SD and DIVERSED (:data:`SPEED_METHODS`).

``--task`` runs the methods of one task again (after its shipped head changed, say) and takes the other tasks'
results from the last run's ``bench.json``; the page says which task was measured when.

The section lands in RESULTS.md under its own heading (``results/real_pair.md``, which
``benchmarks/make_results.py`` also carries); the full page of run 1 is ``results/smollm2/RESULTS_smollm2.md``.
Options take both spellings; a bad argument ends as one line with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

from diversed_hf.cli.real_pair_runs import (  # what each --draft measures
    COMMON,
    GOAL_POINTS,
    GOAL_RATIO,
    GOALS,
    METHODS,
    QUICK,
    SETUPS,
    SPEED_METHODS,
    TASK_METHODS,
    TASKS,
    TUNED_DRAFT_LENGTH,
    TUNED_METHODS,
    head_provenance,
    pair_flags,
    run_conditions,
)
from diversed_hf.cli.real_pair_speed import refresh_speed_goals, speed_text
from diversed_hf.cli.sections import bench_flags, refresh_head_sections, run_bench_argv
from diversed_hf.heads.metrics import metric_label, metric_unit
from diversed_hf.lab.bench import read_results, write_results, write_results_page
from diversed_hf.lab.bench.partial import clear_partial
from diversed_hf.lab.cli_utils import ArgumentParser, add_debug_flag, check_output_dir, run_script

REPO = Path(__file__).resolve().parents[1]


def head_dir_of(draft: str, task: str) -> Path:
    """Where ``--draft``'s head for ``task`` is: the shipped one; for the task-tuned pair, until its heads ship, the
    one its recipe trained (``training/configs/smollm2_tuned_<task>.yaml`` writes ``runs/smollm2_tuned_<task>/head``),
    calibrated on training prompts where ``training/calibrate_head.py`` saved it as ``head_cal`` beside it."""
    from diversed_hf import testbed

    if draft != "tuned":
        return testbed.head_folder("smollm2") / task
    shipped = testbed.head_folder("smollm2-tuned") / task
    if (shipped / "config.json").is_file():
        return shipped
    trained = REPO / "runs" / f"smollm2_tuned_{task}"
    return trained / "head_cal" if (trained / "head_cal" / "config.json").is_file() else trained / "head"


def check_tuned_heads(draft: str) -> None:
    """Before any run: the task-tuned pair's heads that do not ship must be where their recipes put them (``runs/`` is
    not in the repository, so a fresh clone trains them first; the recipes are seeded). A head the table measures
    calibrated (``TUNED_CALIBRATED``) must have its ``head_cal``: the uncalibrated one is another operating point."""
    if draft != "tuned":
        return
    from diversed_hf.cli.real_pair_runs import TUNED_CALIBRATED, TUNED_TASKS
    from diversed_hf.testbed import HEAD_HOMES

    for task in TUNED_TASKS:
        path = head_dir_of(draft, task)
        recipe = f"training/configs/{HEAD_HOMES['smollm2-tuned'][1]}{task}.yaml"
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"No head for {task} in {path.relative_to(REPO)}: none ships for the task-tuned pair, so the table "
                f"measures its recipe's head. Train it with `python training/train_head.py --config {recipe}`"
                + (" and calibrate it with the command in the recipe's comment." if task in TUNED_CALIBRATED else ".")
            )
        if task in TUNED_CALIBRATED and path.name != "head_cal":
            raise FileNotFoundError(
                f"The {task} head in {path.relative_to(REPO)} is not calibrated: the table measures it with its "
                f"offset chosen on training prompts. Run the calibrate_head.py command in {recipe}'s comment."
            )


def _trained_heads(draft: str) -> dict[str, str]:
    """The task-tuned pair's heads that its recipes trained and that do not ship yet, by task (bench's ``--head``)."""
    if draft != "tuned":
        return {}
    from diversed_hf.cli.real_pair_runs import TUNED_TASKS

    dirs = {task: head_dir_of(draft, task) for task in TUNED_TASKS}
    return {task: str(path) for task, path in dirs.items() if "runs" in path.parts and (path / "config.json").is_file()}


def _argv(task: str, sizes: dict, output_dir: Path, threads: int, draft: str = "self", **options) -> list[str]:
    argv = [
        *pair_flags(draft, _trained_heads(draft)),
        "--task",
        task,
        "--split",
        "test",
        "--threads",
        str(threads),
        "--output-dir",
        str(output_dir),
        "--no-progress",
    ]
    return argv + bench_flags({**COMMON, **sizes, **options})


def _run(argv: list[str]):
    return run_bench_argv(argv)[1]


def _run_all(runs: dict[str, list[str]], jobs: int) -> dict[str, list]:
    """Each named bench command line's results; ``jobs`` > 1 runs that many at once, each in a process of its own
    (one torch thread each, as ``--threads 1`` asks)."""
    if jobs == 1 or len(runs) < 2:
        return {name: _run(argv) for name, argv in runs.items()}
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        futures = {name: pool.submit(_run, argv) for name, argv in runs.items()}
        return {name: future.result() for name, future in futures.items()}


def earlier_results(bench_json: Path, task: str, tasks: tuple[str, ...] = TASKS) -> dict:
    """The results of every task but ``task`` from the last methods run (its ``bench.json``), by task."""
    if not bench_json.is_file():
        raise FileNotFoundError(
            f"--task {task} keeps the other tasks' results from {bench_json}, which does not exist: "
            "run without --task once first."
        )
    kept = {result.task: result for result in read_results(bench_json) if result.task != task}
    missing = sorted(set(tasks) - {task} - set(kept))
    if missing:
        raise ValueError(
            f"{bench_json} has no results for {', '.join(missing)}: run without --task to measure every task."
        )
    for result in kept.values():  # rows of the re-measured task's head stay as that earlier run measured them
        stale = [row["method"] for row in result.rows if row.get("head_task") == task]
        note = (
            f"{', '.join(stale)}: measured by an earlier run with the {task} head shipped then; a later run with "
            f"`--task {task}` measured only {task} again."
        )
        if stale and note not in result.notes:
            result.notes.append(note)
    return kept


def _training_config(head_dir: Path) -> dict:
    """The head's ``training_config.json`` (empty when it has none: a withdrawn head, say)."""
    path = head_dir / "training_config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def front_gap(result, head: dict) -> float | None:
    """Points of quality ``head`` has above (> 0) or below the static-ensemble front at its acceptance: the front's
    rows (``w`` = 0 .. 0.75, and SD as ``w`` = 1) sorted by acceptance, joined by straight lines; None outside it."""
    points = sorted(
        (row["acceptance_rate"], row["quality"])
        for row in result.rows
        if row.get("family") in ("static-ensemble", "sd") and row.get("acceptance_rate") is not None
    )
    accepted = head["acceptance_rate"]
    for (a0, q0), (a1, q1) in zip(points, points[1:]):
        if a0 <= accepted <= a1:
            front = q0 + (q1 - q0) * (accepted - a0) / (a1 - a0) if a1 > a0 else max(q0, q1)
            return 100 * (head["quality"] - front)
    return None


def head_summary(result, head_dir: Path, draft: str = "self") -> str:
    """One paragraph on the task's shipped head against the goal (at least GOAL_RATIO x SD's acceptance, the paired
    interval against the target reaching 0 and the point estimate at most GOAL_POINTS below it; :data:`GOALS` per
    task), from ``result``;
    docs/real_model.md and docs/real_pair.md carry it between ``<!-- real-pair:<task> -->`` markers."""
    rows = {row.get("family"): row for row in result.rows if row.get("head_task") in (None, result.task)}
    target, sd, head = rows.get("target-only"), rows.get("sd"), rows.get("diversed")
    if not (target and sd and head) or head.get("quality_delta_high") is None:
        return f"`{result.task}`: the last run has no target-only, SD and DIVERSED rows with a paired interval."
    training = _training_config(head_dir)
    offset = float(training.get("calibration_logit_offset") or 0.0)
    calibrated = (
        (
            f", calibrated with the offset b = {offset:g} on its output logit (chosen on the training split by "
            "`training/calibrate_head.py`)"
        )
        if offset
        else ""
    )
    ratio = head["acceptance_rate"] / max(sd["acceptance_rate"], 1e-12)
    speed = head["tokens_per_second"] / target["tokens_per_second"] if target.get("tokens_per_second") else None
    delta, low, high = (100 * head[key] for key in ("quality_delta", "quality_delta_low", "quality_delta_high"))
    unit = metric_unit(result.meta.get("quality_metric"))
    metric = metric_label(result.meta.get("quality_metric")).split(" (")[0]  # the label without its "(x100)"
    from diversed_hf import testbed

    pair = "smollm2-tuned" if draft == "tuned" else "smollm2"
    shipped = draft in ("eagle-tasks", "tuned") and result.task in testbed.HEAD_TASKS[pair]
    which = "the shipped" if shipped else ("the trained (not shipped)" if draft == "tuned" else "the withdrawn")
    text = (
        f"**DIVERSED** with {which} `{result.task}` head{calibrated} accepts {100 * head['acceptance_rate']:.1f} % "
        f"on `{result.task}` ({ratio:.2f}x SD's {100 * sd['acceptance_rate']:.1f} %"
        + (f", {speed:.2f}x the target's tokens/s" if speed else "")
        + f") at {metric} {100 * head['quality']:.1f}{unit} against the target's {100 * target['quality']:.1f}{unit}: "
        f"{delta:+.1f} [{low:+.1f}, {high:+.1f}] points against the target distribution ({result.rows[0].get('num_prompts')} "
        f"held-out prompts x {result.meta['config'].get('num_samples', 1)} samples). "
    )
    misses = []
    goal_ratio, goal_points = GOALS.get(result.task, (GOAL_RATIO, GOAL_POINTS))
    if ratio < goal_ratio:
        misses.append(f"acceptance {goal_ratio - ratio:.2f}x short of {goal_ratio:g}x SD's")
    if high < 0:
        misses.append(
            f"the interval lies below 0 (significantly below the target; its upper end {-high:.1f} points short)"
        )
    if delta < -goal_points:
        misses.append(f"the point estimate {-delta - goal_points:.1f} points beyond the allowed {goal_points:g}")
    gap = front_gap(result, head)
    if gap is not None:
        static = next((row for row in result.rows if row.get("family") == "static-ensemble"), {})
        text += (
            f"At its acceptance it lies {abs(gap):.1f} points {'above' if gap >= 0 else 'below'} the static-ensemble "
            f"front (w = 0 .. 1, joined by straight lines; the static rows on the first {static.get('num_prompts')} "
            "prompts). "
        )
    text += "Goal met." if not misses else "Goal missed: " + "; ".join(misses) + "."
    reason = testbed.WITHDRAWN_HEADS.get(("smollm2", draft, result.task))
    return text + (f" Why the head is withdrawn: {reason}." if reason and not shipped else "")


def calibration_table(head_dir: Path, output_dir: Path, task: str) -> str:
    """The training-split table of ``training/calibrate_head.py`` for the task's head: the shipped head's own
    ``calibration.json`` when it is calibrated, else ``<output_dir>/calibration_<task>.json`` (measured, not shipped)."""
    from diversed_hf.heads.card_results import _format_calibration

    shipped = (head_dir / "calibration.json").is_file()
    path = head_dir / "calibration.json" if shipped else output_dir / f"calibration_{task}.json"
    if not path.is_file():
        return ""
    from diversed_hf.lab.tasks import get_task

    shown = _format_calibration(path, str(path), get_task(task).metric)
    measured = (
        f"on {shown['num_prompts']} {shown['split']}-split prompts x {shown['num_samples']} samples (temperature "
        f"{shown['temperature']}, N = {shown['num_draft_tokens']}; not the held-out prompts above), where "
        f"target-only decoding scored {shown['target_quality']}"
    )
    if shipped:
        text = (
            f"The {'trained (not shipped)' if 'runs' in head_dir.parts else 'shipped'} `{task}` head is its recipe's "
            f"head with the offset b = {shown['offset']} added to its output "
            f"logit (`w = sigmoid(logit + b)`, which moves every weight toward the target), chosen by "
            f"`training/calibrate_head.py` {measured}: {shown['rule']}. The DIVERSED rows above measure this head."
        )
    else:
        text = (
            f"`training/calibrate_head.py` measured the shipped `{task}` head with offsets b added to its output "
            f"logit (`w = sigmoid(logit + b)`, which moves every weight toward the target) {measured}. Its rule "
            f"gives {shown['rule']} (b = {shown['offset']}); no offset reached the target's quality, so the "
            f"shipped head is left as trained (`{path.relative_to(REPO) if path.is_relative_to(REPO) else path}`)."
        )
    lines = [
        f"### Calibration of the `{task}` head",
        "",
        text,
        "",
        f"| offset b | {metric_label(get_task(task).metric)} | acceptance |",
        "|---:|---:|---:|",
    ]
    lines += [f"| {' | '.join(row)} |" for row in shown["rows"]]
    return "\n".join(lines)


def training_curves(head_dir: Path, task: str) -> str:
    """The shipped head's training curve (its ``train_log.jsonl``: reward, mean w, expected acceptance with the head
    and with lossless SD, per logged step) and the reward it trained on, as a Markdown subsection."""
    log = head_dir / "train_log.jsonl"
    if not log.is_file():
        return ""
    training = _training_config(head_dir)
    reward = training.get("reward", "task")
    described = {
        "task": "the task's own reward",
        "task_minus_target": "the task's reward minus the target's greedy score",
        "target_agreement": "agreement with the target's own greedy answer",
    }.get(reward, reward)
    lines = [
        f"### Training curve of the `{task}` head",
        "",
        f"Reward: `{reward}` ({described}; docs/training.md), lambda = {training.get('lambda_acceptance', '?')}, "
        f"{training.get('global_steps', '?')} steps at temperature {training.get('temperature', '?')}. From the "
        "head's `train_log.jsonl` (the recipe logs every `logging_steps`):",
        "",
        "| step | reward | mean w | expected acceptance, head | expected acceptance, SD |",
        "|---:|---:|---:|---:|---:|",
    ]
    for line in log.read_text().splitlines():
        row = json.loads(line)
        if "reward" in row:
            lines.append(
                f"| {row['step']} | {row['reward']:.3f} | {row['mean_w']:.3f} | {row['acceptance_proxy']:.3f} | "
                f"{row['acceptance_exact_sd']:.3f} |"
            )
    return "\n".join(lines)


def update_marked(path: Path, key: str, text: str) -> bool:
    """Replace what stands between ``<!-- real-pair:key -->`` and ``<!-- /real-pair:key -->`` in ``path``."""
    begin, end = f"<!-- real-pair:{key} -->", f"<!-- /real-pair:{key} -->"
    content = path.read_text() if path.is_file() else ""
    if begin not in content or end not in content:
        return False
    head, rest = content.split(begin, 1)
    path.write_text(head + begin + "\n" + text + "\n" + end + rest.split(end, 1)[1])
    return True


def update_cards(results, output_dir: Path) -> list[Path]:
    """Each task's rows become the results.json of the real pair's shipped head for that task; then every shipped
    head's card is rendered again (staged in ``output_dir/shipments``, then shipped) (``model_cards/smollm2_<task>.md`` for these)."""
    from diversed_hf import testbed
    from diversed_hf.cli import hub as hub_cli
    from diversed_hf.cli import ship

    for result in results:
        head_dir = testbed.ASSETS_DIR / "smollm2" / "heads" / result.task
        if (head_dir / "config.json").is_file():
            text = (output_dir / f"results_{result.task}.json").read_text()
            name = head_dir.relative_to(testbed.ASSETS_DIR).as_posix()
            ship.ship(ship.stage(output_dir, name, {"results.json": text}))
    return hub_cli.render_shipped_cards(REPO / "model_cards")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; a combination of options that contradict each other ends as a usage error."""
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--draft",
        choices=sorted(SETUPS),
        default="eagle-tasks",
        help="What to measure: 'eagle-tasks' (the real pair's task EagleDraft, with the heads shipped for it), "
        "'self' (the first evaluation, whose heads were withdrawn) or 'tuned' (the task-tuned pair, its EagleDraft and "
        "its heads: shipped ones, else the ones its recipes trained into runs/).",
    )
    parser.add_argument("--quick", action="store_true", help="Small smoke run into results_quick/<the draft's>/.")
    phases = parser.add_mutually_exclusive_group()
    phases.add_argument("--skip-speed", action="store_true", help="Only the methods runs (no batch / thread table).")
    phases.add_argument(
        "--speed-only",
        action="store_true",
        help="Only the batch / thread runs; the methods tables of the last run are kept.",
    )
    phases.add_argument(
        "--section-only",
        action="store_true",
        help="Run nothing: rebuild the RESULTS.md section from the last runs' tables.",
    )
    parser.add_argument(
        "--task",
        choices=sorted({task for setup in SETUPS.values() for task in setup.tasks}),
        default=None,
        help="Run only this task's methods again; the other tasks' results come from the last run's "
        "bench.json (the speed runs, unless skipped, cover every task).",
    )
    parser.add_argument(
        "--extra-runs",
        action="store_true",
        help="Also run the draft's runs at temperature 0.7 (with --task: that task's; "
        + "; ".join(f"{draft}: " + ", ".join(run[2] for run in setup.extra_runs) for draft, setup in SETUPS.items())
        + "); their tables join the section whenever they exist.",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="Make the methods runs resumable (bench --resume): each bench run keeps every finished method in its "
        "folder's partial/ until the results are written, and the same command with --resume again reuses them, so "
        "an interruption costs only the methods it was in.",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="Bench runs of the methods phase (each task, each extra run) at once, one torch thread each; their "
        "results do not depend on it.",
    )
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs is {args.jobs}; give at least 1.")
    if args.extra_runs and (args.speed_only or args.section_only):
        parser.error("--extra-runs runs methods; --speed-only and --section-only run none.")
    if args.task and (args.speed_only or args.section_only):
        parser.error("--task selects which methods runs to repeat; --speed-only and --section-only run none.")
    setup = SETUPS[args.draft]
    if args.task and args.task not in setup.tasks:
        parser.error(f"--task {args.task}: --draft {args.draft} measures {', '.join(setup.tasks)}.")
    return args


def _run_methods(args, setup, sizes: dict, output_dir: Path, page: Path, command_flags: str, started: float) -> None:
    """The methods runs of every task (with ``--task`` only that task's; the others' results come from the last
    run's ``bench.json``) and, with ``--extra-runs``, the extra runs; then the methods page, the shipped heads'
    cards and each extra run's tables."""
    kept = earlier_results(output_dir / "bench.json", args.task, setup.tasks) if args.task else {}
    runs, run_tasks = {}, {}  # bench command lines, and the task of each
    for task in setup.tasks:
        methods = TUNED_METHODS[task] if setup.draft == "tuned" else TASK_METHODS.get(task, METHODS)
        if setup.draft == "eagle-tasks":
            methods = [m for m in methods if "@" not in m]  # no heads of other tasks to transfer
        if task not in kept:
            runs[task] = _argv(task, sizes[task], output_dir / task, 1, draft=setup.draft, methods=methods)
            run_tasks[task] = task
    extra_runs = [run for run in setup.extra_runs if args.extra_runs and args.task in (None, run[1])]
    if extra_runs:
        for name, task, _, extra_sizes in extra_runs:
            sizes_here = QUICK[task] if args.quick else extra_sizes
            methods = TASK_METHODS.get(task, METHODS)
            runs[name] = _argv(task, sizes_here, output_dir / name, 1, draft=setup.draft, methods=methods)
            run_tasks[name] = task
    if args.resume:
        runs = {name: argv + ["--resume"] for name, argv in runs.items()}
    measured = _run_all(runs, args.jobs)
    results = [result for task in setup.tasks for result in ([kept[task]] if task in kept else measured[task])]
    command = "python benchmarks/make_real_results.py --skip-speed" + command_flags + (" --quick" if args.quick else "")
    if args.task:
        command += f" --task {args.task}   # {', '.join(sorted(kept))}: from an earlier run of the same command"
    seconds = None if (args.task or args.resume) else time.perf_counter() - started
    sections = run_conditions(args.jobs, args.resume)  # [] for one job, not resumed
    write_results_page(results, output_dir, page, command=command, seconds=seconds, sections=sections)
    if not args.quick and setup.draft == "eagle-tasks":  # the self-draft's heads were withdrawn
        for path in update_cards(results, output_dir):
            print(f"Wrote {path.relative_to(REPO)}")
    for name, _, _, _ in extra_runs:
        # bench.json, the table and the plots, read by the section (_section_body)
        write_results(measured[name], output_dir / name)
    for name, task in run_tasks.items():  # written: what an interruption would have resumed from goes
        clear_partial(output_dir / name, [task])


def _measure_speed(setup, sizes: dict, output_dir: Path) -> dict[tuple[int, int], list]:
    """Target-only, SD and DIVERSED on every task at batch 1 and 8, with one torch thread and with two, by
    ``(batch, threads)``; each run's tables (no plots) go under ``<output_dir>/speed``."""
    speed = {}
    for batch in (1, 8):
        for threads in (1, 2):
            speed[(batch, threads)] = []
            for task in setup.tasks:
                limits = dict(
                    sizes["speed"],
                    max_new_tokens=sizes["speed"]["max_new_tokens"][task],
                    temperature=sizes[task].get("temperature", COMMON["temperature"]),
                    timing_batch_size=batch,
                    batch_size=8,
                    num_timing_prompts=max(batch, sizes["speed"]["num_timing_prompts"]),
                    num_prompts=max(batch, sizes["speed"]["num_prompts"]),
                )
                run_dir = output_dir / "speed" / f"batch{batch}_threads{threads}" / task
                outcome = _run(
                    _argv(task, limits, run_dir, threads, draft=setup.draft, methods=SPEED_METHODS, no_plots=True)
                )
                write_results(outcome, run_dir, plots=False)
                speed[(batch, threads)] += outcome
    return speed


def _section_body(
    setup, root: Path, output_dir: Path, page: Path, speed_page: Path, command_flags: str
) -> tuple[str, dict[str, str]]:
    """The section's Markdown and each task's head summary by task. The section is the methods page (its task
    sections as subsections, its links resolved from RESULTS.md's folder), each task with its head's summary,
    calibration table and training curve, then the extra runs' tables and the speed table."""

    body = page.read_text().split("\n", 1)[1]  # the page without its title
    body = body.replace("\n## ", "\n### ")  # its task sections become subsections of this one
    prefix = output_dir.relative_to(root.parent).as_posix() + "/"  # links now resolve from RESULTS.md's folder
    body = re.sub(r"\]\((?![a-z]+:|/|#)", "](" + prefix, body)
    summaries = {}
    for result in read_results(output_dir / "bench.json"):
        head_dir = head_dir_of(setup.draft, result.task)
        summaries[result.task] = head_summary(result, head_dir, setup.draft)
        extra = [
            text
            for text in (calibration_table(head_dir, output_dir, result.task), training_curves(head_dir, result.task))
            if text
        ]
        note = head_provenance(result, head_dir) if extra else ""  # whether they are the measured head's
        if note:  # under the first one's heading
            heading, rest = extra[0].split("\n\n", 1)
            extra[0] = f"{heading}\n\n{note}\n\n{rest}"
        body = body.replace(f"\n### {result.task}\n", f"\n### {result.task}\n\n{summaries[result.task]}\n", 1)
        body += "".join("\n\n" + text for text in extra if text)
    for name, task, title, _ in setup.extra_runs:
        run_dir = output_dir / name
        if (run_dir / "bench.json").is_file() and (run_dir / f"{task}_table.md").is_file():
            [extra] = [r for r in read_results(run_dir / "bench.json") if r.task == task]
            table = (run_dir / f"{task}_table.md").read_text().strip()
            table = re.sub(r"\]\((?![a-z]+:|/|#)", "](" + prefix + name + "/", table)
            body += (
                f"\n\n### {title}\n\nRegenerate with `python benchmarks/make_real_results.py --skip-speed{command_flags} "
                f"--task {task} --extra-runs` (it also runs {task}'s main rows again). "
                + head_summary(extra, head_dir_of(setup.draft, task), setup.draft)
                + "\n\n"
                + table
            )
    if speed_page.is_file():
        body += "\n\n" + speed_page.read_text()
    return body, summaries


def _publish(setup, root: Path, summaries: dict[str, str]) -> None:
    """RESULTS.md's carried sections again, and each task's head summary between its markers in docs/real_model.md and
    docs/real_pair.md."""
    refresh_head_sections(REPO / "RESULTS.md", root)
    for task, text in summaries.items():
        key = task if setup.draft == "self" else f"{setup.draft}:{task}"
        for doc in (REPO / "docs" / "real_model.md", REPO / "docs" / "real_pair.md"):
            if update_marked(doc, key, text):
                print(f"Updated the {task} summary in {doc.relative_to(REPO)}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup = SETUPS[args.draft]
    started = time.perf_counter()
    sizes = QUICK if args.quick else setup.full
    root = REPO / ("results_quick" if args.quick else "results")
    output_dir = root / setup.output_name
    page, speed_page = output_dir / "RESULTS_smollm2.md", output_dir / "speed.md"
    if setup.draft in ("eagle-tasks", "tuned"):  # every task at the paper's temperature
        sizes = {task: dict(value, temperature=1.0) if task != "speed" else value for task, value in sizes.items()}
    if setup.draft == "tuned":  # its draft's shipped length, in the smoke run too
        sizes = {
            t: dict(value, num_draft_tokens=TUNED_DRAFT_LENGTH) if t != "speed" else value for t, value in sizes.items()
        }
    command_flags = "" if setup.draft == "eagle-tasks" else f" --draft {setup.draft}"
    load = os.getloadavg()[0]  # recorded with the timings: other jobs on the machine slow every method
    check_output_dir(output_dir, "results directory")  # before the runs, not after them
    check_tuned_heads(setup.draft)

    if not (args.speed_only or args.section_only):
        _run_methods(args, setup, sizes, output_dir, page, command_flags, started)
    if not (args.skip_speed or args.section_only):
        speed = _measure_speed(setup, sizes, output_dir)
        speed_page.write_text(speed_text(args.quick, sizes, command_flags, load, speed, setup.draft))
    elif args.section_only:
        refresh_speed_goals(speed_page, setup.draft)
    if not page.is_file():  # --speed-only before any methods run: the section waits for it
        print(f"Wrote {speed_page.relative_to(REPO)}; the section needs the methods run (without --speed-only).")
        return 0
    body, summaries = _section_body(setup, root, output_dir, page, speed_page, command_flags)
    section = root / f"{setup.section}.md"
    section.write_text(body.strip() + "\n")
    if not args.quick:
        _publish(setup, root, summaries)
    print(
        f"Wrote {section.relative_to(REPO)} and {output_dir.relative_to(REPO)}/ in "
        f"{(time.perf_counter() - started) / 60:.1f} min."
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
