"""Regenerate RESULTS.md and results/ on the shipped CPU testbed: every method on both tasks, one run.

    python training/make_results.py                  # the results page (~15-25 min on 2 CPU cores)
    python training/make_results.py --quick          # a 2-minute smoke run into results_quick/
    accelerate launch --multi_gpu --num_processes 2 training/make_results.py   # data parallel, 2 processes

It is ``diversed-hf bench`` with the settings below (see ``diversed_hf/bench/``): the testbed pair,
tasks ``arith`` and ``summary``, target-only, SD, lossy SD (2 leniences), the static ensemble
(4 weights; with SD as w = 1 they trace the front), SpecCascade (every rule, one alpha), SD with the
fine-tuned draft and DIVERSED with the task's trained head when the testbed ships them (otherwise
those rows are skipped and the page says so). Quality and acceptance come from ``--num-prompts``
held-out prompts decoded in batches, each sampled ``num_samples`` times (quality's standard error is over
prompts); speed from the first ``--num-timing-prompts`` decoded one at
a time, median of 3 interleaved runs after a warm-up. Extra arguments are passed on to the bench
(e.g. ``--temperature 0.1``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from diversed_hf import cli  # noqa: E402

METHODS = ["target", "sd", "lossy:0.3,0.6", "static:0,0.25,0.5,0.75", "cascade:0.2", "sd-ft", "diversed"]
FULL = dict(num_prompts=160, num_samples=3, num_timing_prompts=10, repeats=3, max_new_tokens=80, batch_size=16)
QUICK = dict(num_prompts=16, num_timing_prompts=2, repeats=1, max_new_tokens=64, batch_size=16)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="Small smoke run into results_quick/ and RESULTS_quick.md.")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process.")
    args, extra = parser.parse_known_args(argv)
    sizes = QUICK if args.quick else FULL
    output_dir = REPO / ("results_quick" if args.quick else "results")
    page = REPO / ("RESULTS_quick.md" if args.quick else "RESULTS.md")
    bench_argv = ["bench", "--task", "arith", "summary", "--methods", *METHODS, "--threads", str(args.threads),
                  "--output-dir", str(output_dir), "--results-page", str(page),
                  "--page-command", " ".join(["python training/make_results.py"] + (["--quick"] if args.quick else []) + extra)]
    for key, value in sizes.items():
        bench_argv += ["--" + key.replace("_", "-"), str(value)]
    return cli.main(bench_argv + extra)


if __name__ == "__main__":
    sys.exit(main())
