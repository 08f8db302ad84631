"""Block against token-wise verification (issue 25): RESULTS.md's "Block verification" section.

    python benchmarks/block_results.py                      # the testbed pair: arith and summary
    python benchmarks/block_results.py --pair smollm2       # the real pair: arith_chat and humaneval (small)
    python benchmarks/block_results.py --quick              # a smoke run into results_quick/block/
    python benchmarks/block_results.py --section-only       # rebuild the section from the last runs' tables

One ``diversed-hf bench`` run per pair decodes the same prompts with SD, the static ensemble (w = 0.5) and
DIVERSED (the task's shipped head), each token-wise and block-verified (``block:`` specs,
:class:`diversed_hf.verifiers.BlockVerifier`). Every method sees every prompt, seeded alike, so block minus
token-wise is paired over prompts: quality (which must not move: block verification keeps the law), measured
tokens per round and the unbiased ``E[T_N]`` estimator, with 95 % bootstrap intervals; tokens/s from the timed
runs (batch 1, median of interleaved runs after a warm-up). Each pair's table lands in
``results/block_<pair>.md``; the section in RESULTS.md carries every pair's table written so far
(``benchmarks/make_results.py`` keeps it). Options take both spellings; a bad argument ends as one line with exit
status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from diversed_hf.cli.sections import BLOCK_SECTION, bench_flags, refresh_head_sections, run_bench_argv
from diversed_hf.lab.bench import block_table, write_results
from diversed_hf.lab.cli_utils import ArgumentParser, add_debug_flag, check_output_dir, run_script

REPO = Path(__file__).resolve().parents[1]

METHODS = ["sd", "block:sd", "static:0.5", "block:static:0.5", "diversed", "block:diversed"]
PAIRS = {
    # the testbed: its shipped heads; T = 1, N = 5 (the bench's defaults)
    "testbed": dict(tasks=("arith", "summary"), options=dict(max_new_tokens=100, batch_size=16)),
    # the real pair at the temperature and N its heads were trained for (benchmarks/make_real_results.py)
    "smollm2": dict(tasks=("arith_chat", "humaneval"), options=dict(temperature=0.7, num_draft_tokens=3, split="test")),
}
SIZES = {
    ("testbed", False): dict(num_prompts=200, num_samples=1, num_timing_prompts=6, repeats=3),
    ("smollm2", False): dict(
        num_prompts=24, num_samples=1, num_timing_prompts=2, repeats=1, max_new_tokens=64, batch_size=8
    ),
    ("testbed", True): dict(num_prompts=8, num_samples=1, num_timing_prompts=1, repeats=1, max_new_tokens=24),
    ("smollm2", True): dict(
        num_prompts=2, num_samples=1, num_timing_prompts=1, repeats=1, max_new_tokens=16, batch_size=2
    ),
}
NOTE = (
    'Block verification (Sun et al. 2024; docs/method.md §2, "Block verification") against token-wise verification '
    "of the same distribution, on the same prompts with the same seeds: SD (`pi = p`), the static ensemble "
    "(`w = 0.5`) and DIVERSED (the task's shipped head), each `X → block X`. Δ columns: block minus token-wise, "
    "paired over prompts, with 95 % bootstrap intervals — tokens per round measured and by the unbiased E[T] "
    "estimator (the tighter one), and quality, which must not move (block verification keeps the emitted law). "
    "tokens/s: batch 1, one thread, median of interleaved timed runs after a warm-up."
)


def section(root: Path) -> str | None:
    """The section's Markdown: the note, then every pair's table written so far."""
    tables = [(root / f"block_{pair}.md") for pair in PAIRS]
    bodies = [path.read_text().strip() for path in tables if path.is_file()]
    return NOTE + "\n\n" + "\n\n".join(bodies) if bodies else None


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", choices=sorted(PAIRS), default="testbed", help="Which shipped pair to run.")
    parser.add_argument("--quick", action="store_true", help="Small smoke run into results_quick/block/.")
    parser.add_argument("--threads", type=int, default=1, help="torch threads.")
    parser.add_argument(
        "--section-only",
        action="store_true",
        help="Run nothing: rebuild RESULTS.md's section from the tables the last runs wrote.",
    )
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    root = REPO / ("results_quick" if args.quick else "results")
    if not args.section_only:
        output_dir = root / "block" / args.pair
        check_output_dir(output_dir, "results directory")  # before the run, not after it
        load = os.getloadavg()[0]
        pair = PAIRS[args.pair]
        sizes = SIZES[(args.pair, args.quick)]
        options = {
            **pair["options"],
            **sizes,
            "methods": METHODS,
            "num_baseline_prompts": sizes["num_prompts"],
            "no_plots": True,
        }
        argv_bench = [
            "--pair",
            args.pair,
            "--task",
            *pair["tasks"],
            "--threads",
            str(args.threads),
            "--output-dir",
            str(output_dir),
            "--no-progress",
        ] + bench_flags(options)
        _, results = run_bench_argv(argv_bench)
        write_results(results, output_dir, plots=False)
        table = block_table(results)
        if table is None:
            raise ValueError(f"the run on {args.pair} gave no block-verified row; see the notes in {output_dir}.")
        minutes = (time.perf_counter() - started) / 60
        command = (
            "python benchmarks/block_results.py"
            + (f" --pair {args.pair}" if args.pair != "testbed" else "")
            + (" --quick" if args.quick else "")
        )
        (root / f"block_{args.pair}.md").write_text(
            f"### {args.pair}\n\nRegenerate with `{command}` ({minutes:.1f} min; load average {load:.1f} on "
            f"{os.cpu_count()} cores when it started). {sizes['num_prompts']} prompts per task x "
            f"{sizes['num_samples']} sample, every method; tokens/s from {sizes['num_timing_prompts']} prompts "
            f"(median of {sizes['repeats']}). Full tables: `{output_dir.relative_to(REPO).as_posix()}/`.\n\n"
            + table
            + "\n"
        )
    body = section(root)
    if body is None:
        raise FileNotFoundError(f"no table under {root}: run `python benchmarks/block_results.py` first.")
    (root / f"{BLOCK_SECTION[0]}.md").write_text(body + "\n")
    if not args.quick:
        refresh_head_sections(REPO / "RESULTS.md", root)
    print(
        f"Wrote {(root / f'{BLOCK_SECTION[0]}.md').relative_to(REPO)} in {(time.perf_counter() - started) / 60:.1f} min."
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
