"""What a speculative round spends outside the two models' forwards, measured (RESULTS.md "Per-round overhead";
docs/profile.md).

    python benchmarks/overhead_results.py              # ~15 minutes on one thread
    python benchmarks/overhead_results.py --quick      # a smoke run into results_quick/overhead

1. **Testbed against transformers**: ``benchmarks/compare_hf.py``'s measurement (greedy, batch 1, lossless and the
   static ensemble, ``--num_prompts`` held-out ``arith`` prompts x ``--max_new_tokens``, every repeat interleaving
   both sides, median of ``--repeats``), then one profiled run of our lossless loop: where its round's time goes.
2. **Real pair against the speed model**: ``diversed-hf bench`` on SmolLM2-135M-Instruct with its default EagleDraft,
   target-only and lossless SD, greedy, batch 1, on held-out ``arith_chat`` prompts, in float32 and in bfloat16, with
   ``--profile``: measured / predicted speedup (the model with the verification pass's measured cost) and the profile.

Writes ``<output_dir>/results.json`` after each stage (a rerun with the same settings keeps the stages already
measured: delete the file to measure again) and ``overhead.md``; without ``--quick`` also ``results/overhead.md``, which
RESULTS.md carries (``benchmarks/make_results.py --head-sections-only`` puts it in place, as this script does).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

from diversed_hf.cli import timing
from diversed_hf.cli.sections import run_bench_argv, start_script
from diversed_hf.lab.cli_utils import ArgumentParser, regenerate_lines, run_script, write_text_atomic

REPO = Path(__file__).resolve().parents[1]
#: the issue's goals: our time against transformers' on the testbed; measured / predicted on the real pair
GOAL_RATIO, GOAL_MEASURED_OVER_PREDICTED = 0.80, 0.90
REAL_DTYPES = ("float32", "bfloat16")
logger = logging.getLogger("overhead_results")


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num_prompts", type=int, default=16, help="testbed prompts (default 16)")
    parser.add_argument("--max_new_tokens", type=int, default=64, help="new tokens per prompt (default 64)")
    parser.add_argument("--repeats", type=int, default=2, help="testbed repeats; the median is kept (default 2)")
    parser.add_argument("--real_prompts", type=int, default=8, help="real-pair arith_chat prompts (default 8)")
    parser.add_argument("--output_dir", default=None, help="default results/overhead (results_quick/... with --quick)")
    parser.add_argument("--quick", action="store_true", help="a few prompts and tokens, the testbed only: a smoke run")
    args = parser.parse_args(argv)
    for name in ("num_prompts", "max_new_tokens", "repeats", "real_prompts"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} is {getattr(args, name)}; it must be >= 1")
    return args


def testbed_rows(args) -> dict:
    """compare_hf's medians and our profiled round on the testbed."""
    flags = ["--num-prompts", str(args.num_prompts), "--max-new-tokens", str(args.max_new_tokens)]
    flags += ["--repeats", str(args.repeats), "--threads", "1"]
    return timing.compare(timing.compare_arguments(flags), profile=True)


def real_pair_rows(args, dtype: str, output_dir: Path) -> dict:
    """The SD row of a bench run on the real pair (speedups, both predictions) and its profile."""
    argv = ["--pair", "smollm2", "--task", "arith_chat", "--methods", "target", "sd", "--temperature", "0"]
    argv += ["--num_prompts", str(args.real_prompts), "--num_timing_prompts", str(args.real_prompts)]
    argv += ["--max_new_tokens", str(args.max_new_tokens), "--threads", "1", "--repeats", "1", "--dtype", dtype]
    argv += ["--profile", "--no_plots", "--no_progress", "--output_dir", str(output_dir / f"bench_{dtype}")]
    _, results = run_bench_argv(argv)
    result = results[0]
    row = next(r for r in result.rows if r["family"] == "sd")
    keep = ("acceptance_rate", "tokens_per_round", "throughput_speedup_vs_target", "predicted_speedup")
    keep += ("predicted_speedup_measured_verify", "cost_ratio", "verify_cost", "mean_draft_length")
    measured = {key: row[key] for key in keep}
    measured["measured_over_predicted"] = row["throughput_speedup_vs_target"] / row["predicted_speedup_measured_verify"]
    measured["profile"] = result.meta["profile"][row["method"]]
    return measured


def _load(stage: dict) -> str:
    """The load average when a stage started (stages measured before it was recorded have none)."""
    value = stage.get("load_average")
    return f"{value:.2f}" if value is not None else "not recorded"


def forward_share(profile: dict) -> float:
    """The share of a profiled round spent in the models' forwards (prefill, draft, target)."""
    models = ("prefill", "draft forward", "target forward")
    return sum(row["share"] for row in profile["rows"] if row["phase"] in models)


def render(results: dict, command: str) -> str:
    testbed = results["testbed"]
    lines = [
        *regenerate_lines(command),
        f"Batch 1, greedy, one torch thread. {results['environment']} The load average when each measurement started "
        "is given with it: each busy core adds about 1, and the speed figures assume nothing else runs.",
        "",
        f"### Testbed: our loop against transformers' assisted decoding ({results['num_prompts']} held-out `arith` "
        f"prompts x {results['max_new_tokens']} new tokens, N = 5, median of {results['repeats']} interleaved "
        "repeats)",
        "",
        f"Load average {_load(testbed)}.",
        "",
        "| pairing | transformers (s) | ours (s) | ours / transformers | identical output |",
        "|---|---:|---:|---:|---|",
    ]
    for pairing in ("lossless", "ensemble"):
        row = testbed[pairing]
        lines.append(
            f"| {pairing} | {row['transformers']:.3f} | {row['ours']:.3f} | {row['ratio']:.2f} | "
            f"{'yes' if row['identical'] else 'NO'} |"
        )
    ratio = testbed["lossless"]["ratio"]
    verdict = "met" if ratio <= GOAL_RATIO else f"missed by {ratio - GOAL_RATIO:.2f}"
    forwards = forward_share(testbed["profile"])
    lines += [
        "",
        f"Goal: ours <= {GOAL_RATIO:.2f}x transformers' time (lossless): {ratio:.2f}x, {verdict}. The two models' "
        f"forwards, the same in both loops, take {100 * forwards:.1f} % of our round (below): a loop with no "
        f"overhead at all would take {forwards * ratio:.2f}x transformers' time.",
        "",
        f"Where our lossless round's time goes ({testbed['profile']['rounds']} rounds):",
        "",
        testbed["profile"]["table"],
        "",
    ]
    if results.get("real_pair"):
        lines += [
            f"### Real pair: measured against the speed model (SmolLM2-135M-Instruct, its EagleDraft, lossless, "
            f"{results['real_prompts']} held-out `arith_chat` prompts x {results['max_new_tokens']} new tokens)",
            "",
            "| dtype | load average | acceptance | tokens/round | tokens/s speedup | predicted, measured c_verify "
            "| measured / predicted |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for dtype, row in results["real_pair"].items():
            lines.append(
                f"| {dtype} | {_load(row)} | {100 * row['acceptance_rate']:.1f} % | {row['tokens_per_round']:.2f} | "
                f"{row['throughput_speedup_vs_target']:.2f}x | {row['predicted_speedup_measured_verify']:.2f}x | "
                f"{row['measured_over_predicted']:.2f} |"
            )
        lines.append("")
        for dtype, row in results["real_pair"].items():
            value = row["measured_over_predicted"]
            verdict = "met" if value >= GOAL_MEASURED_OVER_PREDICTED else "missed"
            lines.append(
                f"- {dtype}: measured / predicted {value:.2f} (goal >= {GOAL_MEASURED_OVER_PREDICTED}: {verdict}); "
                f"outside the models' forwards: {100 * (1 - forward_share(row['profile'])):.1f} % of the wall time."
            )
            if row["verify_cost"] < 1:  # a pass over several tokens cannot cost less than one over a single token
                lines.append(
                    f"  Its verification pass measured cheaper than a one-token step (c_verify = "
                    f"{row['verify_cost']:.2f}): the cost measurement was disturbed and the prediction with it; "
                    "rerun with nothing else running."
                )
        for dtype, row in results["real_pair"].items():
            lines += ["", f"Where the round's time goes, {dtype} ({row['profile']['rounds']} rounds):", ""]
            lines.append(row["profile"]["table"])
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    output_dir, command = start_script("overhead_results", args, argv, "overhead", threads=None)
    if args.quick:
        args.num_prompts, args.max_new_tokens, args.repeats = min(args.num_prompts, 2), min(args.max_new_tokens, 8), 1
    results = {
        "num_prompts": args.num_prompts,
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "real_prompts": args.real_prompts,
        "environment": f"Python {platform.python_version()}, torch {torch.__version__}, {platform.machine()}.",
    }
    output_dir.mkdir(parents=True, exist_ok=True)
    done = output_dir / "results.json"  # each stage kept as it finishes, reused by a rerun with the same settings
    before = json.loads(done.read_text()) if done.is_file() else {}
    same = all(before.get(key) == results[key] for key in ("num_prompts", "max_new_tokens", "repeats", "real_prompts"))
    stages = [("testbed", lambda: testbed_rows(args))]
    if not args.quick:  # the real pair needs the smollm2 extra and minutes
        stages += [(dtype, lambda dtype=dtype: real_pair_rows(args, dtype, output_dir)) for dtype in REAL_DTYPES]
    for name, measure in stages:
        kept = before.get("testbed") if name == "testbed" else before.get("real_pair", {}).get(name)
        if same and kept is not None:
            logger.info("%s: kept from %s (remove it to measure again)", name, done)
            value = kept
        else:
            load = os.getloadavg()[0]  # what else ran when this stage started
            value = measure()
            value["load_average"] = load
        if name == "testbed":
            results["testbed"] = value
        else:
            results.setdefault("real_pair", {})[name] = value
        write_text_atomic(done, json.dumps(results, indent=2, default=str) + "\n")
    section = render(results, command)
    write_text_atomic(output_dir / "overhead.md", section + "\n")
    print(section)
    if not args.quick:
        write_text_atomic(REPO / "results" / "overhead.md", section + "\n")
        subprocess.run(
            [sys.executable, str(REPO / "benchmarks" / "make_results.py"), "--head-sections-only"], check=True
        )
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
