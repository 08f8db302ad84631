"""What a distillation step costs on the real pair's answers, per way of batching and precision (RESULTS.md,
"Distillation speed"; docs/eagle.md, "Training").

    python benchmarks/distill_speed.py --data runs/collect_t1/data --num_sequences 1024 \
        --held_out runs/draft_scaling/held_out_t0.7

Three variants of an EAGLE-1-style draft's distillation (``diversed_hf.training.eagle_distill.step_speed``: the loss
over the unrolled steps, its backward pass, AdamW, warm-up and cosine decay) on the first ``--num_sequences`` answers
of ``--data``: batches drawn uniformly in float32 (how the shipped draft was trained), batches of like lengths in
float32, and batches of like lengths under bfloat16 autocast. Each trains a fresh draft for ``--epochs`` (or
``--steps`` steps) of ``--batch_size`` sequences, timing all but the first 2 steps, and reports the padded cells per
trained position (``ids`` cells of a batch over its response positions: prompt and padding both count), trained
response positions a second and, with ``--held_out`` (a collection: the draft scaling's held-out answers), the
trained draft's top-1 agreement per unrolled step there, so a faster way is seen to learn as well.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from diversed_hf.cli.sections import start_script
from diversed_hf.lab.cli_utils import ArgumentParser, regenerate_lines, replace_section, run_script, write_text_atomic

REPO = Path(__file__).resolve().parents[1]
TITLE = "Distillation speed"
#: (name, group_by_length, mixed_precision)
VARIANTS = (
    ("uniform batches, float32", False, "no"),
    ("like-length batches, float32", True, "no"),
    ("like-length batches, bfloat16 autocast", True, "bf16"),
)


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a collection (train_eagle_draft.py --data_only)")
    parser.add_argument("--num_sequences", type=int, default=1024, help="answers the batches are drawn from")
    parser.add_argument("--epochs", type=int, default=2, help="passes over them per variant")
    parser.add_argument("--steps", type=int, default=None, help="steps per variant instead (the first 2 untimed)")
    parser.add_argument("--held_out", default=None, help="a collection the trained drafts are scored on")
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output_dir", default=None, help="default results/distill_speed")
    parser.add_argument("--quick", action="store_true", help="results_quick/")
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 3:
        parser.error(f"--steps {args.steps} leaves nothing timed: give at least 3 (the first 2 are untimed).")
    return args


def render(results: dict, command: str) -> str:
    base = results["variants"][VARIANTS[0][0]]["positions_per_second"]
    lines = [
        *regenerate_lines(command),
        f"An EAGLE-1-style draft for SmolLM2-135M-Instruct distilled three ways (a step: 3 unrolled steps, backward, "
        f"AdamW; the shipped draft's learning rate and loss) on the first "
        f"{results['num_sequences']:,} answers of {results['data']}, batches of {results['batch_size']} sequences, "
        f"{results['threads']} threads, {results['trained']} per variant (2 steps untimed)"
        + (f"; held-out top-1 on {results['held_out']}." if results["held_out"] else "."),
        "",
        "| batches, precision | padded cells per trained position | trained positions / s | against the first "
        "| held-out top-1 step 1 / 2 / 3 |",
        "|---|---:|---:|---:|---|",
    ]
    for name, row in results["variants"].items():
        top1 = " / ".join(f"{x:.3f}" for x in row["top1_agreement"]) if "top1_agreement" in row else "–"
        lines.append(
            f"| {name} | {row['cells_per_position']:.2f} | {row['positions_per_second']:.0f} | "
            f"{row['positions_per_second'] / base:.2f}x | {top1} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    output_dir, command = start_script("distill_speed", args, argv, "distill_speed", threads=args.threads)
    from diversed_hf import testbed
    from diversed_hf.training.eagle_data import load_sequences
    from diversed_hf.training.eagle_distill import DistillSettings, held_out_agreement, step_speed

    sequences = load_sequences(args.data)[: args.num_sequences]
    target, _, _ = testbed.load_pair("smollm2", torch_dtype=torch.bfloat16)
    trained = f"{args.steps} steps" if args.steps else f"{args.epochs} epochs"
    results = {"data": args.data, "num_sequences": len(sequences), "batch_size": args.batch_size}
    results |= {"threads": args.threads, "trained": trained, "held_out": args.held_out, "variants": {}}
    for name, group, precision in VARIANTS:
        settings = DistillSettings(
            batch_size=args.batch_size, group_by_length=group, mixed_precision=precision, epochs=args.epochs
        )
        speed, draft = step_speed(target, sequences, settings, args.steps)
        if args.held_out:
            speed["top1_agreement"] = held_out_agreement(draft, target, args.held_out)["top1_agreement"]
        results["variants"][name] = speed
        print(f"{name}: {results['variants'][name]}", flush=True)
    write_text_atomic(output_dir / "results.json", json.dumps(results, indent=2) + "\n")
    text = render(results, command)
    write_text_atomic(output_dir / "distill_speed.md", f"# {TITLE}\n\n{text}\n")
    if not args.quick:
        replace_section(REPO / "RESULTS.md", TITLE, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
