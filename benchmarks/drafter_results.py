"""transformers' model-free drafters against the EagleDraft on the real pair (RESULTS.md, "Drafters").

    python benchmarks/drafter_results.py            # results/drafters/{results.json,drafters.md}, RESULTS.md
    python benchmarks/drafter_results.py --quick    # a smoke run into results_quick/drafters (nothing shipped changes)

SmolLM2-135M-Instruct as target, one torch thread, on two prompt sets: held-out ``synopsis`` test prompts (a summary
copies words from its source: what prompt lookup feeds on) and the held-out everyday chat prompts
(``diversed_hf.lab.tasks.chat_prompts.everyday_prompts``). Drafters: the shipped EagleDraft at its shipped length, prompt
lookup (``prompt_lookup_num_tokens``) and early exit (``assistant_early_exit``: the target's first layers, untrained
for it), each verified losslessly (``ExactVerifier``) and, when sampling, by a static ensemble (``--weight``, the
declared law ``w p + (1 - w) q``). Greedy and temperature 0.7 (top-k 0, top-p 1); batch 1 (every configuration on
each prompt in turn, after a warm-up call each) and batches of ``--batch_size`` prompts. Tokens are the new tokens up
to EOS.
"""

from __future__ import annotations

import json
import logging
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from diversed_hf.cli.sections import start_script
from diversed_hf.cli.timing import aggregate_runs, measure, sampling_modes, timed_generate
from diversed_hf.lab.cli_utils import ArgumentParser, regenerate_lines, run_script, write_text_atomic

logger = logging.getLogger("drafter_results")
REPO = Path(__file__).resolve().parents[1]
PROMPT_SETS = {"synopsis": "held-out `synopsis` prompts", "everyday": "held-out everyday chat prompts"}


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num_prompts", type=int, default=8, help="prompts of each set")
    parser.add_argument("--max_new_tokens", type=int, default=64, help="new tokens per prompt")
    parser.add_argument("--batch_size", type=int, default=8, help="prompts per call in the batched runs")
    parser.add_argument("--lookup_tokens", type=int, default=3, help="prompt_lookup_num_tokens")
    parser.add_argument("--exit_layer", type=int, default=6, help="assistant_early_exit: the layers the draft runs")
    parser.add_argument("--exit_draft_length", type=int, default=3, help="num_assistant_tokens of the early exit")
    parser.add_argument("--weight", type=float, default=0.8, help="the static ensemble's target weight w")
    parser.add_argument("--seed", type=int, default=0, help="seed of the task prompts and of sampling")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="the pair's dtype")
    parser.add_argument("--output_dir", default=None, help="default results/drafters (results_quick/... with --quick)")
    parser.add_argument("--quick", action="store_true", help="a few prompts and tokens: a smoke run")
    args = parser.parse_args(argv)
    for name in ("num_prompts", "max_new_tokens", "batch_size", "lookup_tokens", "exit_layer", "exit_draft_length"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be a positive integer, got {getattr(args, name)}")
    if not 0 <= args.weight < 1:
        parser.error(f"--weight must be in [0, 1) (1 is lossless SD, measured anyway), got {args.weight}")
    if args.quick:
        args.num_prompts, args.max_new_tokens, args.batch_size = 2, 12, 2
    return args


def configurations(args, target, eagle, sampled: bool) -> list:
    """``(key, target, draft or None, generate keywords)``: target-only first, then each drafter lossless and, when
    sampling, under the static ensemble."""
    from diversed_hf.verifiers import StaticEnsembleVerifier

    eagle_n = int(eagle.generation_config.num_assistant_tokens)
    drafters = [
        (f"EagleDraft, N = {eagle_n}", eagle, {}),
        (
            f"prompt lookup, N = {args.lookup_tokens}",
            None,
            {"prompt_lookup_num_tokens": args.lookup_tokens},
        ),
        (
            f"early exit after layer {args.exit_layer}, N = {args.exit_draft_length}",
            None,
            {"assistant_early_exit": args.exit_layer, "num_assistant_tokens": args.exit_draft_length},
        ),
    ]
    configs = [("target only", target, None, {})]
    for name, draft, kwargs in drafters:
        configs.append((f"{name} | lossless", target, draft, kwargs))
        if sampled:
            verifier = StaticEnsembleVerifier(args.weight)
            configs.append((f"{name} | w = {args.weight}", target, draft, {**kwargs, "verifier": verifier}))
    return configs


def measure_batched(tokenizer, prompts: list[str], configs: list, sampling: dict, batch_size: int, seed: int) -> dict:
    """Each configuration on the prompts in left-padded batches of ``batch_size``: tokens/s and acceptance."""
    tokenizer.padding_side = "left"
    records = {key: [] for key, *_ in configs}
    for start in range(0, len(prompts), batch_size):
        inputs = tokenizer(
            prompts[start : start + batch_size], return_tensors="pt", padding=True, add_special_tokens=False
        )
        for key, target, draft, kwargs in configs:
            records[key].append(timed_generate(target, draft, dict(inputs), sampling, seed + start, **kwargs))
    return {key: aggregate_runs(value) for key, value in records.items()}


def render(results: dict, command: str) -> str:
    lines = [
        *regenerate_lines(command),
        f"SmolLM2-135M-Instruct as target in {results['dtype']}, one torch thread, at most {results['max_new_tokens']} "
        f"new tokens (counted up to EOS), nothing else running; batch 1: every configuration on each prompt in turn "
        f"after a warm-up call; batch {results['batch_size']}: left-padded batches. The relaxed rows verify against "
        f"the static ensemble w p + (1 - w) q (w = {results['weight']}): a prompt-lookup draft is a point mass, so "
        "its token is kept with probability at least 1 - w. " + results["environment"],
        "",
    ]
    for prompts, title in PROMPT_SETS.items():
        for mode, mode_title in (("greedy", "greedy"), ("t0.7", "temperature 0.7")):
            one, many = results[prompts][mode]["batch_1"], results[prompts][mode]["batched"]
            size = results["batch_size"]
            lines += [
                f"### {results['num_prompts']} {title}, {mode_title}",
                "",
                f"| drafter | verifier | acceptance | tokens/round | tokens/s, batch 1 | x target-only | tokens/s, "
                f"batch {size} | x target-only |",
                "|---|---|---:|---:|---:|---:|---:|---:|",
            ]
            for key in one:
                lines.append(_row(key, one, many))
            lines.append("")
    return "\n".join(lines)


def _row(key: str, one: dict, many: dict) -> str:
    name, _, verifier = key.partition(" | ")
    row = one[key]
    cells = [name, verifier or "–"]
    cells += (
        [f"{100 * row['acceptance']:.1f} %", f"{row['tokens_per_round']:.2f}"] if "acceptance" in row else ["–", "1.00"]
    )
    for block in (one, many):
        speed = block[key]["tokens_per_second"]
        cells += [f"{speed:.1f}", f"{speed / block['target only']['tokens_per_second']:.2f}x"]
    return "| " + " | ".join(cells) + " |"


def main(argv=None) -> int:
    args = parse_args(argv)
    output_dir, command = start_script("drafter_results", args, argv, "drafters")
    from diversed_hf import enable_diversed
    from diversed_hf.lab.tasks import load_task_dataset
    from diversed_hf.lab.tasks.chat_prompts import everyday_prompts
    from diversed_hf.testbed import smollm2

    target, eagle, tokenizer = smollm2.load_smollm2_pair(draft="eagle", torch_dtype=getattr(torch, args.dtype))
    enable_diversed(target)
    prompt_sets = {
        "synopsis": list(
            load_task_dataset("synopsis", split="test", num_examples=args.num_prompts, seed=args.seed)["prompt"]
        ),
        "everyday": everyday_prompts(args.num_prompts),
    }
    results = {key: getattr(args, key) for key in ("dtype", "num_prompts", "max_new_tokens", "batch_size", "weight")}
    results["environment"] = (
        f"Python {platform.python_version()}, torch {torch.__version__}, {torch.get_num_threads()} thread, "
        f"{platform.machine()}."
    )
    started = time.time()
    for prompts, texts in prompt_sets.items():
        results[prompts] = {}
        for mode, sampling in sampling_modes(args.max_new_tokens).items():
            configs = configurations(args, target, eagle, sampled=mode != "greedy")
            label = f"{prompts} {mode}"
            results[prompts][mode] = {
                "batch_1": _plain(measure(tokenizer, texts, configs, sampling, args.seed, label)),
                "batched": measure_batched(tokenizer, texts, configs, sampling, args.batch_size, args.seed),
            }
    results["seconds"] = round(time.time() - started)
    output_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(output_dir / "results.json", json.dumps(results, indent=2) + "\n")
    section = render(results, command)
    write_text_atomic(output_dir / "drafters.md", section + "\n")
    print(section)
    if args.quick:
        return 0
    write_text_atomic(REPO / "results" / "drafters.md", section + "\n")
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "make_results.py"), "--head-sections-only"], check=True)
    return 0


def _plain(block: dict) -> dict:
    """``measure``'s aggregates without the greedy-identity count (the relaxed rows are not meant to match)."""
    return {key: {k: v for k, v in row.items() if k != "same_text"} for key, row in block.items()}


if __name__ == "__main__":
    sys.exit(run_script(main))
