"""``diversed-hf throughput``: tokens/s of batched speculative decoding at several batch sizes.

A benchmark script, not a test: it prints a table. On the testbed pair, each batch size decodes the
same held-out prompts of ``--task`` (``--num-prompts``, split into batches) with sampling at
temperature 1, lossless SD unless ``--target-weight`` asks for the static ensemble. One untimed pass
over all the prompts at the largest batch size warms up first; the figure is generated tokens /
wall-clock seconds, with the median time of ``--repeats`` runs (every run draws the same samples, so
tokens and acceptance are those of the first).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from ..generation.mixin import enable_diversed
from ..lab.cli_utils import add_command, check_output_file, write_text_atomic
from ..verifiers.rules import ExactVerifier, StaticEnsembleVerifier


def measure_throughput(
    target,
    draft,
    tokenizer,
    prompts: list[str],
    batch_sizes=(1, 4, 8, 16),
    verifier=None,
    max_new_tokens: int = 64,
    num_draft_tokens: int = 5,
    repeats: int = 1,
    seed: int = 0,
) -> list[dict]:
    """Rows of {batch_size, tokens, seconds, tokens_per_second, acceptance_rate} for each batch size."""
    enable_diversed(target)
    verifier = verifier or ExactVerifier()
    tokenizer.padding_side = "left"

    def run(batch_size: int) -> tuple[int, float, int, int]:
        tokens = drafted = accepted = 0
        start = time.perf_counter()
        for begin in range(0, len(prompts), batch_size):
            batch = tokenizer(prompts[begin : begin + batch_size], return_tensors="pt", padding=True)
            output = target.generate(
                **batch,
                assistant_model=draft,
                verifier=verifier,
                do_sample=True,
                top_k=0,
                temperature=1.0,
                max_new_tokens=max_new_tokens,
                num_assistant_tokens=num_draft_tokens,
                pad_token_id=tokenizer.pad_token_id,
                return_dict_in_generate=True,
                generator=torch.Generator().manual_seed(seed + begin),
            )
            stats = output.speculation
            tokens += int(stats.num_generated.sum())
            drafted += stats.total_drafted
            accepted += stats.total_accepted
        return tokens, time.perf_counter() - start, drafted, accepted

    run(max(batch_sizes))  # warm-up
    rows = []
    for batch_size in batch_sizes:
        timings = [run(batch_size) for _ in range(repeats)]
        seconds = statistics.median(t[1] for t in timings)
        tokens, _, drafted, accepted = timings[0]
        rows.append(
            {
                "batch_size": batch_size,
                "tokens": tokens,
                "seconds": seconds,
                "tokens_per_second": tokens / seconds,
                "acceptance_rate": accepted / max(drafted, 1),
            }
        )
    return rows


def main(args: argparse.Namespace) -> int:
    from .. import testbed

    for name in ("num_prompts", "max_new_tokens", "num_draft_tokens", "repeats"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} is {getattr(args, name)}; it must be >= 1.")
    if any(size < 1 for size in args.batch_sizes):
        raise ValueError(f"--batch-sizes {' '.join(map(str, args.batch_sizes))}: every batch size must be >= 1.")
    if args.threads < 0:
        raise ValueError(f"--threads is {args.threads}; use a positive count, or 0 for torch's default.")
    if args.json:
        check_output_file(args.json, "--json")  # before the run, not after it
    if args.threads:
        torch.set_num_threads(args.threads)
    target, draft, tokenizer = testbed.load_pair()
    prompts = list(testbed.load_task(args.task, split="test", num_examples=args.num_prompts, seed=args.seed)["prompt"])
    verifier = ExactVerifier() if args.target_weight is None else StaticEnsembleVerifier(args.target_weight)
    rows = measure_throughput(
        target,
        draft,
        tokenizer,
        prompts,
        tuple(args.batch_sizes),
        verifier,
        args.max_new_tokens,
        args.num_draft_tokens,
        args.repeats,
        args.seed,
    )
    base = rows[0]["tokens_per_second"]
    print(
        f"testbed {args.task}, {len(prompts)} prompts, {verifier}, N = {args.num_draft_tokens}, "
        f"max_new_tokens = {args.max_new_tokens}, torch threads = {torch.get_num_threads()}"
    )
    print("| batch | tokens | seconds | tokens/s | vs batch 1 | acceptance |")
    print("|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['batch_size']} | {row['tokens']} | {row['seconds']:.1f} | {row['tokens_per_second']:.1f} | "
            f"{row['tokens_per_second'] / base:.2f}x | {row['acceptance_rate']:.1%} |"
        )
    if args.json:
        write_text_atomic(args.json, json.dumps(rows, indent=2) + "\n")
    return 0


def register(subparsers) -> None:
    parser = add_command(
        subparsers,
        "throughput",
        help="Tokens/s of batched speculative decoding on the testbed.",
        description=(
            "Tokens/s of speculative decoding on the testbed pair at several batch sizes: held-out prompts of "
            "--task split into batches, sampled at temperature 1, lossless SD (or the static ensemble with "
            "--target-weight); one untimed warm-up pass, then the median of --repeats timed runs. Prints a table."
        ),
        func=main,
    )
    parser.add_argument("--task", default="arith", choices=["arith", "summary"], help="the testbed task's prompts")
    parser.add_argument("--num-prompts", type=int, default=32, help="prompts decoded at every batch size")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8, 16], help="batch sizes to measure")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per prompt")
    parser.add_argument("--num-draft-tokens", type=int, default=5, help="drafts per round, N")
    parser.add_argument(
        "--target-weight", type=float, default=None, help="static ensemble weight w (default: unset, lossless SD)"
    )
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per batch size; the median is kept")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompts and of sampling")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: as many as torch chooses)")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
