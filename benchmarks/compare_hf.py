"""Time our speculative loop against transformers' assisted decoding on the shipped CPU testbed.

    python benchmarks/compare_hf.py                  # defaults: 12 prompts, 5 repeats, 1 thread (~2 min)
    python benchmarks/compare_hf.py --threads 4 --repeats 5
    python benchmarks/compare_hf.py --num-prompts 16 --max-new-tokens 64 --repeats 2 --profile   # + where a round goes

Two pairings, batch 1, greedy, ``N`` drafts per round (constant schedule):

* ``lossless``: ``target.generate(..., assistant_model=draft, do_sample=False)`` against ours with
  ``verifier=ExactVerifier()``;
* ``ensemble``: transformers with ``assistant_ensemble_weight=w`` against ours with
  ``verifier=StaticEnsembleVerifier(w)``.

Each repeat runs every prompt through all four methods, alternating which side goes first, after
one warm-up pass. Per method the time is the median over repeats of the summed time over prompts.
The outputs of each pairing must be token-identical (exit status 1 otherwise); the table shows
``ours / transformers``. ``--clock cpu`` times this process's CPU time, steadier on a shared machine.
Options take both spellings (``--num-prompts``, ``--num_prompts``); a bad argument ends as one line with exit
status 2 (``--debug``: the traceback).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

import diversed_hf.testbed as testbed
from diversed_hf import ExactVerifier, StaticEnsembleVerifier, enable_diversed
from diversed_hf.lab.cli_utils import ArgumentParser, add_debug_flag, run_script

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv=None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=12, help="test prompts of the `arith` task (default 12)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats; the median is reported (default 5)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--num-assistant-tokens", type=int, default=5, help="drafts per round N (default 5)")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="new tokens per prompt (default 96)")
    parser.add_argument("--weight", type=float, default=0.5, help="target weight of the ensemble pairing (default 0.5)")
    parser.add_argument(
        "--profile", action="store_true", help="then one more run of ours, lossless, its rounds profiled"
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: time.perf_counter (default); cpu: this process's CPU time, steadier on a shared machine",
    )
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    for name in ("num_prompts", "repeats", "threads", "num_assistant_tokens", "max_new_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} is {getattr(args, name)}; it must be >= 1.")
    return args


def compare(args: argparse.Namespace, profile: bool = False) -> dict:
    """``{pairing: {"transformers": s, "ours": s, "ratio": ours / transformers, "identical": bool}}`` (medians over
    ``args.repeats``), with ``"profile"``: where our lossless round's time goes (one more run, profiled) if asked."""
    torch.set_num_threads(args.threads)
    target, draft, tokenizer = testbed.load_pair()
    enable_diversed(target)
    # transformers reads the schedule from the assistant's generation config; keep it constant and
    # switch off its confidence early-exit so both sides draft exactly N tokens per round.
    draft = copy.deepcopy(draft)
    draft.generation_config.num_assistant_tokens = args.num_assistant_tokens
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    prompts = testbed.load_task("arith", split="test", num_examples=args.num_prompts)["prompt"]
    encoded = [tokenizer(text, return_tensors="pt") for text in prompts]
    common = dict(
        assistant_model=draft,
        do_sample=False,
        max_new_tokens=args.max_new_tokens,
        num_assistant_tokens=args.num_assistant_tokens,
    )
    methods = {
        ("lossless", "transformers"): dict(num_assistant_tokens_schedule="constant"),
        ("lossless", "ours"): dict(verifier=ExactVerifier()),
        ("ensemble", "transformers"): dict(
            num_assistant_tokens_schedule="constant", assistant_ensemble_weight=args.weight
        ),
        ("ensemble", "ours"): dict(verifier=StaticEnsembleVerifier(args.weight)),
    }

    clock = time.perf_counter if args.clock == "wall" else time.process_time

    def run(key):
        outputs, start = [], clock()
        for enc in encoded:
            with torch.no_grad():
                outputs.append(target.generate(**enc, **common, **methods[key]))
        return clock() - start, outputs

    for key in methods:  # warm-up
        run(key)
    times = {key: [] for key in methods}
    identical = {pairing: True for pairing, _ in methods}
    for repeat in range(args.repeats):
        for pairing in ("lossless", "ensemble"):
            order = ("transformers", "ours") if repeat % 2 == 0 else ("ours", "transformers")
            results = {}
            for side in order:
                elapsed, results[side] = run((pairing, side))
                times[(pairing, side)].append(elapsed)
            identical[pairing] &= all(torch.equal(a, b) for a, b in zip(results["transformers"], results["ours"]))
    measured = {}
    for pairing in ("lossless", "ensemble"):
        theirs = statistics.median(times[(pairing, "transformers")])
        ours = statistics.median(times[(pairing, "ours")])
        measured[pairing] = {
            "transformers": theirs,
            "ours": ours,
            "ratio": ours / theirs,
            "identical": identical[pairing],
        }
    if profile:
        from diversed_hf.common.round_profile import profile_rounds

        with profile_rounds() as rounds:
            run(("lossless", "ours"))
        measured["profile"] = {
            "rounds": rounds.rounds,
            "seconds": rounds.wall,
            "table": rounds.table(),
            "rows": [{"phase": name, "ms_per_round": ms, "share": share} for name, ms, share in rounds.rows()],
        }
    return measured


def main(argv=None) -> int:
    args = parse_args(argv)
    measured = compare(args, profile=args.profile)
    print(
        f"testbed arith, {args.num_prompts} prompts, batch 1, greedy, N={args.num_assistant_tokens}, "
        f"max_new_tokens={args.max_new_tokens}, threads={args.threads}, {args.clock} clock, median of {args.repeats} repeats"
    )
    print(f"{'pairing':<10} {'transformers (s)':>17} {'ours (s)':>10} {'ours/transformers':>18} {'identical':>10}")
    for pairing in ("lossless", "ensemble"):
        row = measured[pairing]
        print(
            f"{pairing:<10} {row['transformers']:>17.3f} {row['ours']:>10.3f} {row['ratio']:>18.3f} "
            f"{str(row['identical']):>10}"
        )
    if args.profile:
        print(f"\nWhere our lossless round's time goes (docs/profile.md):\n\n{measured['profile']['table']}")
    return 0 if measured["lossless"]["identical"] and measured["ensemble"]["identical"] else 1


if __name__ == "__main__":
    sys.exit(run_script(main))
