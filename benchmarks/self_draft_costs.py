"""What a self-draft of SmolLM2-135M-Instruct costs per token, by layer count and head width (docs/real_pair.md).

    python benchmarks/self_draft_costs.py --threads 1            # about 2 min on an idle core

Times one decoding step (batch 1, a warm cache, best of ``--repeats`` runs of ``--tokens`` steps) of the target
and of untrained self-drafts (:func:`diversed_hf.testbed.smollm2.build_self_draft`: the first ``k`` layers and an
LM head over the first ``V`` ids), and prints each draft's cost as a fraction of the target's: the ``c`` of the
speed-up model ``E[tokens per round] / (1 + N c)`` (docs/method.md). Timing only: the adapter does not change it.
"""

from __future__ import annotations

import sys
import time

import torch

from diversed_hf.lab.cli_utils import ArgumentParser, run_script
from diversed_hf.testbed import smollm2


def step_seconds(model, prompt_ids: torch.Tensor, tokens: int, repeats: int) -> float:
    """Best-of-``repeats`` mean seconds of one single-token forward with the cache warm."""
    best = float("inf")
    with torch.no_grad():
        for _ in range(repeats):
            out = model(prompt_ids, use_cache=True)
            cache, next_ids = out.past_key_values, prompt_ids[:, -1:]
            start = time.perf_counter()
            for _ in range(tokens):
                cache = model(next_ids, past_key_values=cache, use_cache=True).past_key_values
            best = min(best, (time.perf_counter() - start) / tokens)
    return best


def main(argv=None) -> list[dict]:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 4, 6, 8])
    parser.add_argument("--vocab", type=int, nargs="+", default=[4096, 8192, 16384, 49152])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    for flag, values in (("--layers", args.layers), ("--vocab", args.vocab)):
        if min(values) < 1:
            parser.error(f"{flag} holds {min(values)}; each value must be >= 1 (checked before the model loads).")
    if args.tokens < 1 or args.repeats < 1 or args.threads < 1:
        parser.error("--tokens, --repeats and --threads must be >= 1.")
    torch.set_num_threads(args.threads)
    target, tokenizer = smollm2.load_smollm2_target(torch_dtype=torch.float32)  # as the recorded costs
    prompt = tokenizer("Write a Python function that returns the sum of a list of numbers.", return_tensors="pt")[
        "input_ids"
    ]
    target_seconds = step_seconds(target, prompt, args.tokens, args.repeats)
    print(f"target: {1000 * target_seconds:.1f} ms per token ({args.threads} thread(s))")
    print("| layers | head ids | ms per token | cost / target |\n|---|---|---|---|")
    rows = []
    for layers in args.layers:
        for vocab in args.vocab:
            draft = smollm2.build_self_draft(target, layers, vocab)
            seconds = step_seconds(draft, prompt, args.tokens, args.repeats)
            rows.append({"layers": layers, "vocab": vocab, "seconds": seconds, "ratio": seconds / target_seconds})
            print(f"| {layers} | {vocab} | {1000 * seconds:.1f} | {seconds / target_seconds:.3f} |", flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(run_script(main))
