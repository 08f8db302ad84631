"""Evaluate a trained head against target-only decoding and lossless SD on held-out prompts (docs/method.md §7).

    python benchmarks/eval_head.py --task testbed_arith --head testbed:arith      # the shipped testbed head
    python benchmarks/eval_head.py --task testbed_summary --head runs/testbed_summary/head --num-examples 200
    python benchmarks/eval_head.py --task gsm8k --target meta-llama/Llama-3.1-8B-Instruct \\
        --draft meta-llama/Llama-3.2-1B-Instruct --head org/head-gsm8k --num-shots 4

For every method, on the same prompts, at the same temperature (sampling, top-k/top-p off):

* ``autoregressive`` -- the target alone (``generate`` without a draft): quality only;
* ``sd``             -- speculative decoding with ``ExactVerifier`` (output distributed as the target's);
* ``diversed``       -- speculative decoding with the head;
* ``static_<w>``     -- the static ensemble with weight w (``--static-weights``), for reference.

Prints and (with ``--output``) writes rows in the model-card results format of
:mod:`diversed_hf.heads.cards`: ``acceptance_rate`` (accepted drafted tokens / drafted tokens, summed over
rounds), ``tokens_per_round``, ``quality`` (the task's metric from :mod:`diversed_hf.lab.tasks`: exact match,
ROUGE-2 F1 or pass@1, as a fraction) and wall-clock ``seconds_per_sample``; plus the ratio of DIVERSED's
acceptance to SD's. ``--task`` is any task of the registry (:func:`diversed_hf.lab.tasks.get_task`), the
testbed's ``arith`` / ``summary`` (also ``testbed_arith`` / ``testbed_summary``) included.

Options take both spellings (``--num-examples``, ``--num_examples``). ``--output`` is checked before the
evaluation and written atomically. A bad argument or file ends as one line with exit status 2 (``--debug``:
the traceback).
"""

from __future__ import annotations

import json
import logging
import sys

import torch

from diversed_hf.cli.evaluation import (
    check_pair,
    evaluate,
    load_any_head,
    load_models,
    load_task_data,
    task_argument,
    task_help,
)
from diversed_hf.lab.cli_utils import ArgumentParser, add_debug_flag, check_output_file, run_script, write_text_atomic

logger = logging.getLogger("eval_head")


def main(argv=None) -> dict:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", required=True, type=task_argument, help=task_help())
    parser.add_argument("--head", required=True, help="testbed:<task>, a head directory or a Hub repo id")
    parser.add_argument("--target", default="testbed", help="target model id/path, or 'testbed'")
    parser.add_argument("--draft", default=None, help="draft model id/path (not with --target testbed)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--num-examples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0, help="selects the held-out examples and the sampling seed")
    parser.add_argument("--num-shots", type=int, default=0)
    parser.add_argument("--data-files", default=None, help="local file of the task (same schema as the Hub dataset)")
    parser.add_argument("--num-sampling-seeds", type=int, default=1, help="sample every prompt this many times")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--num-draft-tokens", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--static-weights", type=float, nargs="*", default=[])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--output", default=None, help="write the results (model-card format) to this JSON file")
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    check_pair(args.task, args.target, args.head)
    if args.output:
        check_output_file(args.output)  # before the evaluation, not after it
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)

    target, draft, tokenizer = load_models(args.target, args.draft, args.dtype, args.device)
    head = load_any_head(args.head).to(args.device)
    data = load_task_data(
        args.task, args.split, args.num_examples, args.seed, num_shots=args.num_shots, data_files=args.data_files
    )
    results = evaluate(
        args.task,
        target,
        draft,
        tokenizer,
        head,
        list(data["prompt"]),
        list(data["reference"]),
        temperature=args.temperature,
        num_draft_tokens=args.num_draft_tokens,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        seed=args.seed,
        static_weights=tuple(args.static_weights),
        num_sampling_seeds=args.num_sampling_seeds,
    )
    logger.info("results:\n%s", json.dumps(results, indent=2))
    if args.output:
        write_text_atomic(args.output, json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    sys.exit(run_script(main))
