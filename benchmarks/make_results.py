"""Regenerate RESULTS.md and results/ on the shipped CPU testbed: every method on both tasks, one command.

    python benchmarks/make_results.py                  # the results page (27 min with the 2 processes below)
    python benchmarks/make_results.py --quick          # a few-minute smoke run into results_quick/
    accelerate launch --multi_gpu --num_processes 2 benchmarks/make_results.py   # data parallel, 2 processes

Three runs of ``diversed-hf bench`` (see ``diversed_hf/lab/bench/``) on the testbed pair, tasks ``arith`` and
``summary``, make one page:

1. **Methods** (:data:`METHODS`): target-only, SD, lossy SD, the static ensemble (with SD as w = 1 they
   trace the front), SpecCascade (every rule), SD with the fine-tuned draft, DIVERSED with the task's head
   and, for the transfer experiment, with the other task's head. Target-only, SD and DIVERSED decode
   ``--num-prompts`` held-out prompts x 2 samples, so that DIVERSED's quality against the target
   distribution (paired over prompts, 95 % bootstrap interval) is tight; the other methods the first
   ``--num-baseline-prompts``. Speed: the first 10 prompts one at a time, median of 3 interleaved runs
   after an untimed warm-up run, next to both speed models (c_verify = 1, and the measured c_verify).
2. **Draft-length policies** (:data:`SCHEDULES`) for SD and DIVERSED: acceptance and draft lengths from 32
   prompts one at a time, timed at batch 1 (16 prompts, median of 5 interleaved runs) and
3. at batch 8 (16 prompts); acceptance, mean draft length and tokens per round come from the batch-1 run.

The page also carries the lambda sweeps ``results/front_<task>.md`` (``benchmarks/ablation.py --front``: the
acceptance-quality front and the operating point shipped), the head ablation tables ``results/ablation_<task>.md``
and the headroom tables ``results/headroom_<task>.md`` when ``benchmarks/ablation.py`` and ``benchmarks/headroom.py`` have
written them
(they need trained heads, so those commands are separate; ``--head-sections-only`` puts new ones into
the existing RESULTS.md without running the bench). The full
run then copies each task's rows (``results/results_<task>.json``) next to the testbed's head
for that task as its ``results.json`` and re-renders the heads' cards and ``model_cards/`` (skip with
``--no-cards``; ``--quick`` never touches them). Extra arguments go to every bench run (e.g.
``--temperature 0.1``). This is the one script that writes into the repository by default: RESULTS.md and
``results/`` are what it is for (the training recipes and the other scripts write to ``runs/``).

Options take both spellings (``--no-cards``, ``--no_cards``). A bad argument ends as one line with exit status 2
(``--debug``: the traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from diversed_hf.cli.sections import (
    TASKS,
    bench_flags,
    refresh_head_sections,
    run_bench_argv,
    trained_head_sections,
)
from diversed_hf.lab.bench import policy_table, write_results, write_results_page
from diversed_hf.lab.bench.runner import process_state
from diversed_hf.lab.cli_utils import (
    ArgumentParser,
    add_debug_flag,
    check_output_dir,
    check_output_file,
    run_script,
)

REPO = Path(__file__).resolve().parents[1]

METHODS = [
    "target",
    "sd",
    "lossy:0.3,0.6",
    "static:0,0.25,0.5,0.75",
    "cascade:0.2",
    "sd-ft",
    "diversed",
    "diversed@arith",
    "diversed@summary",
]
SCHEDULES = ["constant:5,8,12,16", "heuristic", "confidence:0.4", "optimal:16"]
COMMON = dict(max_new_tokens=100, batch_size=16)
FULL = {
    "methods": dict(num_prompts=1000, num_baseline_prompts=160, num_samples=2, num_timing_prompts=10, repeats=3),
    "policies": dict(num_prompts=32, batch_size=1, num_timing_prompts=16, repeats=5),
    "policies_batch": dict(num_prompts=16, num_timing_prompts=16, timing_batch_size=8, repeats=3),
}
QUICK = {
    "methods": dict(num_prompts=24, num_baseline_prompts=8, num_samples=2, num_timing_prompts=2, repeats=1),
    "policies": dict(num_prompts=4, batch_size=1, num_timing_prompts=2, repeats=1),
    "policies_batch": dict(num_prompts=8, num_timing_prompts=8, timing_batch_size=8, repeats=1),
}
POLICY_NOTE = (
    "Each speculative method once per draft-length policy (`--schedules`): constant N, transformers' `heuristic` "
    "(its value kept from call to call, as transformers keeps it) and `assistant_confidence_threshold` 0.4 (with "
    "N = 5), and this project's `optimal` (N <= 16: a row drafts again while the next draft is worth its cost at the "
    "pair's rate, judged from the draft's confidence in its tokens; docs/method.md §6). Acceptance, mean draft length "
    "and tokens per round from {prompts} prompts decoded one at a time; tokens/s at batch 1 ({timed} prompts one at "
    "a time, median of {repeats} interleaved runs after an untimed warm-up run) and at batch 8 "
    "({batch_timed} prompts in batches of 8). The fastest policy per method at batch 1 is in bold."
)


def _bench_argv(sizes: dict, output_dir: Path, threads: int, extra: list[str], **options) -> list[str]:
    argv = ["--task", *TASKS, "--threads", str(threads), "--output-dir", str(output_dir), "--no-progress"]
    return argv + bench_flags({**COMMON, **sizes, **options}) + extra


def update_cards(results, output_dir: Path) -> list[Path]:
    """Each task's rows become the results.json of the testbed's head for that task; then every shipped head's
    card (its README.md and ``model_cards/<name>.md``) is rendered again (staged in ``output_dir/shipments``, then shipped)."""
    from diversed_hf import testbed
    from diversed_hf.cli import hub as hub_cli
    from diversed_hf.cli import ship

    for result in results:
        head_dir = testbed.ASSETS_DIR / "heads" / result.task
        if (head_dir / "config.json").is_file():
            text = _merged_results(output_dir / f"results_{result.task}.json", head_dir / "results.json")
            name = head_dir.relative_to(testbed.ASSETS_DIR).as_posix()
            ship.ship(ship.stage(output_dir, name, {"results.json": text}))
    return hub_cli.render_shipped_cards(REPO / "model_cards")


def _merged_results(new: Path, current: Path) -> str:
    """``new``'s text to replace ``current``, keeping the ``selection`` of ``current`` (why the head was chosen: the
    lambda sweep of ``benchmarks/ablation.py --front``), which a bench run does not measure."""
    content = json.loads(new.read_text())
    if current.is_file():
        selection = json.loads(current.read_text()).get("selection")
        if selection is not None:
            content["selection"] = selection
    return json.dumps(content, indent=2) + "\n"


def _parser() -> ArgumentParser:
    """The command line; arguments it does not know go to every bench run."""
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick", action="store_true", help="Small smoke run into results_quick/ and RESULTS_quick.md."
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process.")
    parser.add_argument("--skip-policies", action="store_true", help="Only the methods run (no policy table).")
    parser.add_argument(
        "--no-cards", action="store_true", help="Leave the shipped heads' results.json and cards alone."
    )
    parser.add_argument(
        "--head-sections-only",
        action="store_true",
        help="Only put the current ablation / headroom tables (results/ablation_*.md, headroom_*.md) "
        "into the existing RESULTS.md; runs no bench.",
    )
    add_debug_flag(parser)
    return parser


def _policy_section(sizes: dict, output_dir: Path, threads: int, extra: list[str]) -> tuple[str, str] | None:
    """The draft-length policies of SD and DIVERSED at batch 1 and at batch 8 (every process runs them); the main
    process writes their tables and gets the section ``(title, Markdown)``, the others ``None``."""
    policy_dir = output_dir / "policies"
    _, at_one = run_bench_argv(
        _bench_argv(
            sizes["policies"],
            policy_dir / "batch1",
            threads,
            extra,
            methods=["sd", "diversed"],
            schedules=SCHEDULES,
            no_plots=True,
        )
    )
    _, at_eight = run_bench_argv(
        _bench_argv(
            sizes["policies_batch"],
            policy_dir / "batch8",
            threads,
            extra,
            methods=["sd", "diversed"],
            schedules=SCHEDULES,
            no_plots=True,
        )
    )
    if not process_state().is_main_process:
        return None
    write_results(at_one, policy_dir / "batch1", plots=False)
    write_results(at_eight, policy_dir / "batch8", plots=False)
    note = POLICY_NOTE.format(
        prompts=sizes["policies"]["num_prompts"],
        timed=sizes["policies"]["num_timing_prompts"],
        repeats=sizes["policies"]["repeats"],
        batch_timed=sizes["policies_batch"]["num_timing_prompts"],
    )
    return ("Draft-length policies", note + "\n\n" + policy_table({1: at_one, 8: at_eight}))


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if args.head_sections_only:
        if extra:
            parser.error(
                f"--head-sections-only runs no bench, so the bench arguments {extra} would be ignored; drop them."
            )
        refresh_head_sections(REPO / "RESULTS.md", REPO / "results")
        print("Updated the trained-head sections of RESULTS.md.")
        return 0
    started = time.perf_counter()
    sizes = QUICK if args.quick else FULL
    output_dir = REPO / ("results_quick" if args.quick else "results")
    page = REPO / ("RESULTS_quick.md" if args.quick else "RESULTS.md")
    command = " ".join(["python benchmarks/make_results.py"] + (["--quick"] if args.quick else []) + extra)
    check_output_dir(output_dir, "results directory")  # before the runs, not after them
    check_output_file(page, "results page")

    _, results = run_bench_argv(_bench_argv(sizes["methods"], output_dir, args.threads, extra, methods=METHODS))
    sections = []
    if not args.skip_policies:
        policies = _policy_section(sizes, output_dir, args.threads, extra)
        if policies is not None:
            sections.append(policies)
    if not args.quick:
        sections += trained_head_sections(output_dir)
    if process_state().is_main_process:
        write_results_page(
            results, output_dir, page, command=command, seconds=time.perf_counter() - started, sections=sections
        )
        if not (args.quick or args.no_cards):
            for path in update_cards(results, output_dir):
                print(f"Wrote {path.relative_to(REPO)}")
        print(
            f"Wrote {page.relative_to(REPO)} and {output_dir.relative_to(REPO)}/ in "
            f"{(time.perf_counter() - started) / 60:.1f} min."
        )
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
