"""Choose a head's calibration logit offset on training-split prompts, and save the calibrated head.

    python training/train_head.py --config training/configs/testbed_arith.yaml      # writes runs/testbed_arith/head
    python training/calibrate_head.py --task testbed_arith --head runs/testbed_arith/head \\
        --output-dir runs/testbed_arith/head_cal

A head trained with a small acceptance bonus can still be too lenient on the tokens that matter. Adding
an offset ``b`` to its output logit, ``w = sigmoid(logit + b)``, moves every ``w`` toward the target:
quality goes up, acceptance goes down. This script measures target-only quality and, for every
``--offsets`` value, the head's quality and acceptance on the same ``--split`` prompts (the training
split by default: never choose on the held-out split you report). It picks the offset with the highest
acceptance among those whose quality is at least target-only quality minus ``--tolerance`` (if none
qualifies, the one with the best quality), prints the table and, with ``--output-dir``, saves the
head with the offset folded into its bias. The head directory's ``training_config.json`` and
``train_log.jsonl`` are carried over, with the choice recorded (the full table goes to
``calibration.json``); measure the saved head on held-out
prompts with ``benchmarks/eval_head.py --output <output-dir>/results.json``, then re-render its card
(``diversed-hf card <output-dir>``). ``--output-dir`` is checked before the measurement starts.
``--reuse DIR/calibration.json`` takes the target-only quality and the offsets an earlier run measured with the
same head, prompts and settings (to extend its ``--offsets``).

Options take both spellings (``--num-examples``, ``--num_examples``). A bad argument or file ends as one line
with exit status 2 (``--debug``: the traceback).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shutil
import sys
from pathlib import Path

import torch

from diversed_hf.cli.evaluation import (
    check_pair,
    evaluate,
    load_any_head,
    load_models,
    task_argument,
    task_help,
    with_offset,
)
from diversed_hf.heads.hub import weights_digest
from diversed_hf.lab.cli_utils import ArgumentParser, add_debug_flag, check_output_dir, run_script
from diversed_hf.lab.tasks import get_task, load_task_dataset

REPO = Path(__file__).resolve().parents[1]

logger = logging.getLogger("calibrate_head")


def choose_offset(target_quality: float, rows: list[dict], tolerance: float) -> dict:
    """The row with the highest acceptance among those within ``tolerance`` of target quality
    (ties: the smaller offset); if none is, the row with the best quality."""
    eligible = [row for row in rows if row["quality"] >= target_quality - tolerance]
    if eligible:
        return max(eligible, key=lambda row: (row["acceptance_rate"], -row["offset"]))
    logger.warning(
        "no offset reaches target-only quality %.3f - %.3f; taking the best quality", target_quality, tolerance
    )
    return max(rows, key=lambda row: (row["quality"], -row["offset"]))


#: settings that must match for --reuse: what selects the prompts and how they are decoded
REUSE_KEYS = (
    "task",
    "split",
    "num_examples",
    "seed",
    "num_sampling_seeds",
    "temperature",
    "num_draft_tokens",
    "max_new_tokens",
    "batch_size",
    "dtype",
    "target",
    "draft",
)


def reused_measurements(path: str, args: argparse.Namespace, head_sha256: str) -> tuple[float, dict[float, dict]]:
    """(target-only quality, rows by offset) of an earlier ``calibration.json`` measured like this run, with a head
    of the same weights (``head_sha256``: a head calibrated in place since has other weights at the same path)."""
    earlier = json.loads(Path(path).read_text())
    settings = earlier.get("settings", {})
    differ = [key for key in REUSE_KEYS if settings.get(key) != getattr(args, key)]
    if earlier.get("head_sha256") != head_sha256:
        differ.append("head weights")
    if differ:
        raise ValueError(
            f"--reuse {path}: it was measured with other settings ({', '.join(differ)}: "
            + ", ".join(f"{key}={settings.get(key)!r}" for key in differ if key in settings)
            + "); measure everything again."
        )
    return float(earlier["target_quality"]), {float(row["offset"]): row for row in earlier["rows"]}


def parse_args(argv=None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", required=True, type=task_argument, help=task_help())
    parser.add_argument("--head", required=True, help="testbed:<task>, a head directory or a Hub repo id")
    parser.add_argument("--target", default="testbed", help="target model id/path, or 'testbed'")
    parser.add_argument("--draft", default=None, help="draft model id/path (not with --target testbed)")
    parser.add_argument("--offsets", type=float, nargs="+", default=[0.0, 1.5, 3.0, 5.0, 8.0])
    parser.add_argument("--tolerance", type=float, default=0.0, help="allowed quality loss vs target-only (a fraction)")
    parser.add_argument("--split", default="train", help="split of the calibration prompts (not the held-out one)")
    parser.add_argument("--num-examples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1, help="selects the prompts and the sampling seed")
    parser.add_argument("--num-sampling-seeds", type=int, default=1, help="sample every prompt this many times")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--num-draft-tokens", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--output-dir", default=None, help="save the calibrated head here (e.g. runs/<task>/head_cal)")
    parser.add_argument(
        "--reuse",
        default=None,
        help="calibration.json of an earlier run with the same head, prompts and settings: its target-only "
        "quality and the offsets it measured are taken from it, only the other --offsets are run",
    )
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    if args.tolerance < 0:
        parser.error(f"--tolerance is {args.tolerance}; it must be >= 0 (a fraction, e.g. 0.01 for one point).")
    if args.num_examples < 1:
        parser.error(f"--num-examples is {args.num_examples}; it must be >= 1.")
    bad = [offset for offset in args.offsets if not math.isfinite(offset)]
    if bad:
        parser.error(f"--offsets holds {bad}; offsets are finite logit shifts of the head (e.g. 0 1.5 3).")
    try:
        check_pair(args.task, args.target, args.head)
    except ValueError as error:
        parser.error(str(error))
    return args


def measure(
    args: argparse.Namespace, target, draft, tokenizer, head, prompts: list[str], references: list[str]
) -> tuple[float, list[dict]]:
    """Target-only quality and one row (offset, quality, acceptance) per ``--offsets`` value on the same prompts;
    with ``--reuse`` what the earlier run measured is taken from it."""
    common = dict(
        temperature=args.temperature,
        num_draft_tokens=args.num_draft_tokens,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        seed=args.seed,
        num_sampling_seeds=args.num_sampling_seeds,
    )
    digest = weights_digest(head)
    target_quality, earlier = reused_measurements(args.reuse, args, digest) if args.reuse else (None, {})
    if target_quality is None:
        target_quality = evaluate(
            args.task, target, draft, tokenizer, None, prompts, references, methods=("autoregressive",), **common
        )["rows"][0]["quality"]
    rows = []
    for offset in args.offsets:
        if offset in earlier:
            logger.info("offset %g: from %s", offset, args.reuse)
            rows.append(earlier[offset])
            continue
        row = evaluate(
            args.task,
            target,
            draft,
            tokenizer,
            with_offset(head, offset),
            prompts,
            references,
            methods=("diversed",),
            **common,
        )["rows"][0]
        rows.append({"offset": offset, "quality": row["quality"], "acceptance_rate": row["acceptance_rate"]})
    return target_quality, rows


def calibration_table(
    args: argparse.Namespace, num_prompts: int, target_quality: float, rows: list[dict], chosen: dict
) -> str:
    """The measurements as a Markdown table, the chosen offset marked."""
    table = [
        f"{args.task}, {args.split} split, {num_prompts} prompts x {args.num_sampling_seeds} seeds: "
        f"target-only quality {target_quality:.3f}",
        "| offset | quality | acceptance |",
        "|---:|---:|---:|",
    ]
    for row in rows:
        mark = " (chosen)" if row is chosen else ""
        table.append(f"| {row['offset']:g}{mark} | {row['quality']:.3f} | {row['acceptance_rate']:.3f} |")
    return "\n".join(table)


def save_calibrated(args: argparse.Namespace, head, summary: dict, chosen: dict, num_prompts: int) -> None:
    """The head with the chosen offset folded into its bias in ``--output-dir``, with the source head's training
    record (the choice added), its training curve and ``calibration.json``; a stale ``results.json`` is removed."""
    target_quality = summary["target_quality"]
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    source = Path(args.head)
    record = {}
    if (source / "training_config.json").is_file():
        record = json.loads((source / "training_config.json").read_text())
    previous = float(record.get("calibration_logit_offset") or 0.0)
    record["calibration_logit_offset"] = previous + chosen["offset"]
    bar = f"target-only {target_quality:.3f}{f' - {args.tolerance:g}' if args.tolerance else ''}"
    rule = (
        f"the highest acceptance with quality >= {bar}"
        if chosen["quality"] >= target_quality - args.tolerance
        else f"no offset reached {bar}, so the best quality"
    )
    record["calibration_note"] = (
        f"offset {chosen['offset']:g} chosen among {args.offsets} on {num_prompts} {args.split}-split prompts "
        f"(seed {args.seed}) x {args.num_sampling_seeds} sampling seeds: {rule} (python training/calibrate_head.py)"
    )
    (output / "calibration.json").write_text(json.dumps({**summary, "settings": vars(args)}, indent=2) + "\n")
    if (source / "train_log.jsonl").is_file() and source.resolve() != output.resolve():
        shutil.copyfile(source / "train_log.jsonl", output / "train_log.jsonl")
    stale = output / "results.json"
    if stale.is_file():  # results of another head: the calibrated one must be measured again
        stale.unlink()
    with_offset(head, chosen["offset"]).save_pretrained(str(output), training_config=record)
    logger.info(
        "saved the calibrated head to %s; measure it with benchmarks/eval_head.py --output %s",
        output,
        output / "results.json",
    )


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.reuse and not Path(args.reuse).is_file():
        raise FileNotFoundError(f"--reuse {args.reuse}: no such file (the calibration.json an earlier run wrote).")
    if args.output_dir:
        check_output_dir(args.output_dir)  # before the measurement, not after it
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    head = load_any_head(args.head)  # before the models: a head of another task is refused first
    task = get_task(args.task).name
    if head.config.task and head.config.task != task:
        raise ValueError(
            f"--head {args.head} was trained for the task {head.config.task!r} and --task is {args.task!r}: a "
            f"calibration on {task!r} prompts would choose its offset for another task. Calibrate it with --task "
            f"{head.config.task}, or pass a head trained for {task!r}."
        )
    target, draft, tokenizer = load_models(args.target, args.draft, args.dtype, args.device)
    head = head.to(args.device)
    data = load_task_dataset(args.task, split=args.split, num_examples=args.num_examples, seed=args.seed)
    prompts, references = list(data["prompt"]), list(data["reference"])
    target_quality, rows = measure(args, target, draft, tokenizer, head, prompts, references)
    chosen = choose_offset(target_quality, rows, args.tolerance)
    logger.info("calibration:\n%s", calibration_table(args, len(prompts), target_quality, rows, chosen))
    summary = {"target_quality": target_quality, "rows": rows, "chosen_offset": chosen["offset"]}
    summary["head_sha256"] = weights_digest(head)  # what --reuse checks: the weights measured, not their path
    if args.output_dir:
        save_calibrated(args, head, summary, chosen, len(prompts))
    return summary


if __name__ == "__main__":
    sys.exit(run_script(main))
