"""Train a judge for judge decoding on a task, with labels mined as AutoJudge mines them (docs/method.md §9).

    python training/train_judge.py --task testbed_arith --output_dir runs/judge_arith
    python training/train_judge.py --task testbed_arith --output_dir runs/judge_arith --save_to my_judge

1. **Labels** (``<output_dir>/labels``, resumable shard by shard): on ``--num_train_examples`` training prompts the
   target answers greedily (``--batch_size`` rows at a time); at the first ``--max_swaps`` positions where the
   draft's greedy token differs, the draft's token is swapped in and the target continues; the swap is harmless when
   the task's reward of the continued answer is at least the target's own (``diversed_hf.training.judge_labels``).
2. **The judge**: a ``JudgeHead`` (a linear layer on the target's state after the swapped token), fitted by logistic
   regression with balanced classes; held-out precision and recall of "harmless" are reported.
3. **Measured** on ``--eval_num_examples`` held-out test prompts: lossless SD and ``JudgeVerifier(judge,
   --threshold)``, same prompts and sampling; quality (the task's metric) paired over prompts, acceptance.
4. **Saved** to ``--save_to`` (default ``<output_dir>/judge``): the judge (``config.json``, ``model.safetensors``,
   its card ``README.md``) and ``training.json`` (settings, label statistics, held-out report, measurement).

A bad argument ends as one line with exit status 2 (``--debug``: the traceback).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import torch

from diversed_hf.cli.evaluation import load_models, load_task_data, run_method, task_argument, task_help
from diversed_hf.cli.ship import save_location
from diversed_hf.lab.cli_utils import ArgumentParser, add_debug_flag, check_output_dir, run_script, write_text_atomic

logger = logging.getLogger("train_judge")


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", type=task_argument, required=True, help=task_help())
    parser.add_argument("--target", default="testbed", help="target model id or path; 'testbed' for the CPU testbed")
    parser.add_argument("--draft", default=None, help="draft model id or path (not with the testbed)")
    parser.add_argument(
        "--output_dir", required=True, help="work directory: the mined labels go to <output_dir>/labels"
    )
    parser.add_argument("--save_to", default=None, help="where the judge goes (default <output_dir>/judge)")
    parser.add_argument("--num_train_examples", type=int, default=200, help="training prompts mined (default 200)")
    parser.add_argument("--max_swaps", type=int, default=6, help="mismatches swapped per prompt (default 6)")
    parser.add_argument("--max_new_tokens", type=int, default=48, help="answer length (default 48)")
    parser.add_argument("--threshold", type=float, default=0.5, help="JudgeVerifier's threshold measured (0.5)")
    parser.add_argument("--eval_num_examples", type=int, default=100, help="held-out test prompts (0: skip)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of the measurement")
    parser.add_argument("--num_draft_tokens", type=int, default=5, help="draft length of the measurement")
    parser.add_argument("--batch_size", type=int, default=32, help="rows generated at once while mining (32)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    for name in ("num_train_examples", "max_swaps", "max_new_tokens", "num_draft_tokens", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be a positive integer, got {getattr(args, name)}")
    if args.eval_num_examples < 0:
        parser.error(f"--eval_num_examples must be 0 or positive, got {args.eval_num_examples}")
    if not args.threshold >= 0:
        parser.error(f"--threshold must be a number >= 0 (above 1 the judge never fires), got {args.threshold}")
    return args


def measure(args, target, draft, tokenizer, judge) -> dict:
    """Lossless SD and the judge's rule on the held-out prompts: quality paired over prompts, acceptance."""
    from diversed_hf.lab.bench.stats import paired_difference
    from diversed_hf.lab.tasks import get_task
    from diversed_hf.verifiers import ExactVerifier, JudgeVerifier

    data = load_task_data(args.task, "test", args.eval_num_examples, 0)
    prompts, references = list(data["prompt"]), list(data["reference"])
    reward = get_task(args.task).reward
    rows, scores = {}, {}
    for name, verifier in (("SD", ExactVerifier()), ("judge", JudgeVerifier(judge, threshold=args.threshold))):
        completions, totals = run_method(
            target,
            draft,
            tokenizer,
            prompts,
            verifier=verifier,
            temperature=args.temperature,
            num_draft_tokens=args.num_draft_tokens,
            max_new_tokens=args.max_new_tokens,
            batch_size=25,
            seed=0,
        )
        scores[name] = reward(completions, references)
        rows[name] = {
            "quality": sum(scores[name]) / len(scores[name]),
            "acceptance_rate": totals["num_accepted"] / max(totals["num_drafted"], 1),
        }
    rows["judge"]["quality_minus_sd"] = paired_difference(
        list(enumerate(scores["judge"])), list(enumerate(scores["SD"]))
    )
    return {"metric": get_task(args.task).metric, "num_prompts": len(prompts), "threshold": args.threshold, **rows}


def main(argv=None) -> Path:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    output_dir = Path(args.output_dir)
    destination = save_location(args.save_to or output_dir / "judge", "--save_to", output_dir)
    save_to = destination.folder  # a folder of the testbed's assets is written in the run, then shipped there
    check_output_dir(output_dir, "--output_dir")
    check_output_dir(save_to, "--save_to")
    if args.threads:
        torch.set_num_threads(args.threads)
    from diversed_hf.heads.judge import JudgeHead
    from diversed_hf.lab.tasks import get_task
    from diversed_hf.training.judge_labels import MiningSettings, load_labels, mine_labels, train_judge

    settings = MiningSettings(max_new_tokens=args.max_new_tokens, max_swaps=args.max_swaps)
    target, draft, tokenizer = load_models(args.target, args.draft)
    data = load_task_data(args.task, "train", args.num_train_examples, 0)
    reward = get_task(args.task).reward
    prompts, references = list(data["prompt"]), list(data["reference"])
    labels_dir = mine_labels(
        target,
        draft,
        tokenizer,
        prompts,
        references,
        reward,
        output_dir / "labels",
        settings,
        batch_size=args.batch_size,
    )
    features, labels = load_labels(labels_dir)
    judge = JudgeHead.for_target(target, task=get_task(args.task).name)
    report = train_judge(judge, features, labels)
    logger.info("judge: %s", report)
    record = {
        "recipe": "python training/train_judge.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "task": get_task(args.task).name,
        "target": args.target,
        "draft": args.draft,
        "num_train_examples": args.num_train_examples,
        "mining": settings.__dict__,
        "judge": report,
    }
    if args.eval_num_examples:
        from diversed_hf import enable_diversed

        enable_diversed(target)
        record["measured"] = measure(args, target, draft, tokenizer, judge)
        logger.info("measured: %s", record["measured"])
    judge.save_pretrained(save_to)
    write_text_atomic(save_to / "training.json", json.dumps(record, indent=1) + "\n")
    destination.finish()
    return save_to


if __name__ == "__main__":
    sys.exit(run_script(main))
