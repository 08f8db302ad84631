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

import sys
from pathlib import Path

from diversed_hf.cli.timing import compare
from diversed_hf.cli.timing import compare_arguments as parse_args
from diversed_hf.lab.cli_utils import run_script

REPO = Path(__file__).resolve().parents[1]


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
