"""The task-tuned pair's EagleDraft: its best draft length and lossless SD's speed (RESULTS.md, "Real pair: the
task-tuned target's EagleDraft").

    python benchmarks/tuned_draft_results.py            # results/tuned_draft/, RESULTS.md, the draft's files
    python benchmarks/tuned_draft_results.py --quick    # a smoke run into results_quick/tuned_draft (nothing shipped)

Lossless SD (``ExactVerifier``) with the EagleDraft distilled from the tuned target
(``testbed.load_pair("smollm2-tuned")``) against that target alone, batch 1, one torch thread, bfloat16, on held-out
test prompts of the tuned target's two tasks, ``synopsis`` and ``arith_steps``, at temperature 1 (top-k 0, top-p 1:
the setting of the paper's table) and greedy, at every constant length of ``--draft_lengths``. Every configuration
runs on each prompt in turn (interleaved, so load changes hit all alike), after one short warm-up call each. Tokens are
the new tokens up to EOS.

Then (unless ``--quick`` or ``--no_ship``) the draft carries the length with the most tokens/s at temperature 1, over
both tasks' prompts, in its ``generation_config.json``; its ``training.json`` and card (``README.md``, and
``model_cards/smollm2_tuned_eagle_draft.md``) record the measurement, and RESULTS.md gets the section.
"""

from __future__ import annotations

import json
import logging
import platform
import subprocess
import sys
from pathlib import Path

import torch

from diversed_hf.cli.sections import start_script
from diversed_hf.cli.timing import measure
from diversed_hf.lab.cli_utils import ArgumentParser, run_script, write_text_atomic

logger = logging.getLogger("tuned_draft_results")
REPO = Path(__file__).resolve().parents[1]
TASKS = ("synopsis", "arith_steps")
GOAL = 1.4  # lossless SD's tokens/s against target-only at temperature 1 (issue: a real target that knows its tasks)


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num_prompts", type=int, default=12, help="held-out test prompts per task")
    parser.add_argument("--max_new_tokens", type=int, default=96, help="new tokens per prompt")
    parser.add_argument("--draft_lengths", type=int, nargs="+", default=[1, 2, 3, 4], help="N to measure")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompts and of sampling")
    parser.add_argument("--output_dir", default=None, help="default results/tuned_draft (results_quick/... --quick)")
    parser.add_argument("--quick", action="store_true", help="a few prompts and tokens: a smoke run")
    parser.add_argument("--no_ship", action="store_true", help="leave the shipped draft's files and RESULTS.md")
    parser.add_argument(
        "--section_only",
        action="store_true",
        help="measure nothing: the section and the draft's files again from the last run's results.json",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.num_prompts, args.max_new_tokens, args.draft_lengths = 2, 16, [1, 2]
    return args


def modes(max_new_tokens: int) -> dict[str, dict]:
    return {
        "t1": {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "max_new_tokens": max_new_tokens},
        "greedy": {"do_sample": False, "max_new_tokens": max_new_tokens},
    }


def pooled(blocks: list[dict], key: str) -> dict:
    """One configuration's tokens/s and acceptance over several prompt sets (totals, not a mean of rates)."""
    rows = [block[key] for block in blocks]
    out = {"tokens_per_second": sum(r["tokens"] for r in rows) / sum(r["seconds"] for r in rows)}
    if "acceptance" in rows[0]:
        out["acceptance"] = sum(r["acceptance"] * r["tokens"] for r in rows) / sum(r["tokens"] for r in rows)
    return out


def table(results: dict, lengths: list[int]) -> list[str]:
    lines = [
        "| task | decoding | configuration | acceptance | tokens/round | tokens/s | x target-only | = target-only |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for task in TASKS:
        for mode, label in (("t1", "temperature 1"), ("greedy", "greedy")):
            block = results["runs"][task][mode]
            base = block["target"]["tokens_per_second"]
            for key in ["target"] + [f"eagle:N={n}" for n in lengths]:
                row = block[key]
                name = "target only" if key == "target" else f"lossless SD, N = {key.split('=')[1]}"
                same = "–" if key == "target" else f"{row['same_text']} / {results['num_prompts']}"
                accepted = "–" if key == "target" else f"{100 * row['acceptance']:.1f} %"
                per_round = "1.00" if key == "target" else f"{row['tokens_per_round']:.2f}"
                lines.append(
                    f"| `{task}` | {label} | {name} | {accepted} | {per_round} | {row['tokens_per_second']:.1f} | "
                    f"{row['tokens_per_second'] / base:.2f}x | {same if mode == 'greedy' else '–'} |"
                )
    return lines


def _verdict(speedup: float) -> str:
    return "met" if speedup >= GOAL else f"missed by {GOAL - speedup:.2f}"


def summary(results: dict) -> str:
    """The shipped length's figures over both tasks' prompts, then each task's, against the goal."""
    best, speedup = results["best"], results["speedup_t1"]
    per_task = []
    for task in TASKS:
        block = results["runs"][task]["t1"]
        row, base = block[f"eagle:N={best}"], block["target"]["tokens_per_second"]
        fastest = max((key for key in block if key != "target"), key=lambda key: block[key]["tokens_per_second"])
        task_speed = row["tokens_per_second"] / base
        per_task.append(
            f"`{task}` {100 * row['acceptance']:.1f} % accepted, {task_speed:.2f}x ({_verdict(task_speed)}"
            + (
                f"; its fastest length, N = {fastest.split('=')[1]}, {block[fastest]['tokens_per_second'] / base:.2f}x)"
                if fastest != f"eagle:N={best}"
                else ")"
            )
        )
    return (
        f"Lossless SD with the tuned pair's EagleDraft at its shipped N = {best}, on {results['num_prompts']} held-out "
        f"test prompts of each of `synopsis` and `arith_steps` at temperature 1 (batch 1, one thread): "
        f"{100 * results['acceptance_t1']:.1f} % of drafts accepted (the tasks weighted by their tokens), {speedup:.2f}x "
        "target-only tokens/s over both "
        f"tasks' prompts (goal >= {GOAL}x: {_verdict(speedup)}); by task: " + "; ".join(per_task) + "."
    )


def section(results: dict, args, command: str) -> str:
    lengths = args.draft_lengths
    lines = [
        "Regenerate with:",
        "",
        "```bash",
        command,
        "```",
        "",
        f'SmolLM2-135M-Instruct with the task-tuning adapter merged (`testbed.load_pair("smollm2-tuned")`) and the '
        f"EagleDraft distilled from it, in bfloat16, batch 1, one torch thread, nothing else running; "
        f"{results['num_prompts']} held-out test prompts per task, at most {args.max_new_tokens} new tokens (counted "
        "up to EOS); every configuration on each prompt in turn after a warm-up call. Lossless SD is `ExactVerifier`; "
        'at temperature 1, top-k 0 and top-p 1. The greedy column "= target-only" counts the prompts whose output is '
        f"the target's, token for token. Python {platform.python_version()}, torch {torch.__version__}, "
        f"{platform.machine()}.",
        "",
        summary(results)
        + " The shipped length is the fastest at temperature 1 over both tasks' prompts: "
        + ", ".join(f"N = {n}: {results['pooled_t1'][n]:.2f}x" for n in lengths)
        + ".",
        "",
        *table(results, lengths),
        "",
    ]
    return "\n".join(lines)


def stage_draft(results: dict, command: str, output_dir: Path) -> Path:
    """Stage the tuned pair's EagleDraft at its fastest length (generation config, training record, card) in
    ``output_dir/shipments`` (``diversed-hf ship`` copies it into the assets)."""
    from transformers import GenerationConfig

    from diversed_hf.cli.ship import stage_eagle_update
    from diversed_hf.testbed import ASSETS_DIR
    from diversed_hf.testbed.smollm2_tuned import TUNED_EAGLE_DIR

    config = GenerationConfig.from_pretrained(TUNED_EAGLE_DIR)
    config.num_assistant_tokens = results["best"]
    config.num_assistant_tokens_schedule = "constant"
    record_path = TUNED_EAGLE_DIR / "training.json"
    record = json.loads(record_path.read_text())
    record["measured"] = {
        "summary": summary(results),
        "prompts": "held-out synopsis and arith_steps test prompts",
        "command": command,
        "best_draft_length": results["best"],
    }
    name = TUNED_EAGLE_DIR.relative_to(ASSETS_DIR).as_posix()
    return stage_eagle_update(output_dir, name, config, record, "smollm2_tuned_eagle_draft.md", command)


def main(argv=None) -> int:
    args = parse_args(argv)
    output_dir, command = start_script("tuned_draft_results", args, argv, "tuned_draft")
    from diversed_hf import enable_diversed
    from diversed_hf.lab.tasks import load_task_dataset
    from diversed_hf.testbed import load_pair

    if args.section_only:
        results = json.loads((output_dir / "results.json").read_text())
        results["pooled_t1"] = {int(n): value for n, value in results["pooled_t1"].items()}
        return _publish(results, args, output_dir, command)
    target, draft, tokenizer = load_pair("smollm2-tuned", torch_dtype=torch.bfloat16)
    enable_diversed(target)
    configs = [("target", target, None, {})]
    configs += [(f"eagle:N={n}", target, draft, {"num_assistant_tokens": n}) for n in args.draft_lengths]
    runs = {}
    for task in TASKS:
        rows = load_task_dataset(task, split="test", num_examples=args.num_prompts, seed=args.seed)
        prompts = list(rows["prompt"])
        runs[task] = {
            mode: measure(tokenizer, prompts, configs, sampling, args.seed, f"{task} {mode}")
            for mode, sampling in modes(args.max_new_tokens).items()
        }
    t1 = [runs[task]["t1"] for task in TASKS]
    base = pooled(t1, "target")["tokens_per_second"]
    speed = {n: pooled(t1, f"eagle:N={n}")["tokens_per_second"] / base for n in args.draft_lengths}
    best = max(args.draft_lengths, key=speed.get)
    results = {
        "runs": runs,
        "num_prompts": args.num_prompts,
        "best": best,
        "pooled_t1": speed,
        "speedup_t1": speed[best],
        "acceptance_t1": pooled(t1, f"eagle:N={best}")["acceptance"],
    }
    output_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(output_dir / "results.json", json.dumps(results, indent=2) + "\n")
    return _publish(results, args, output_dir, command)


def _publish(results: dict, args, output_dir: Path, command: str) -> int:
    text = section(results, args, command)
    write_text_atomic(output_dir / "tuned_draft.md", text)
    print(text)
    staged = stage_draft(results, command, output_dir)  # --no_ship: to ship later, diversed-hf ship OUTPUT_DIR
    if not (args.quick or args.no_ship):
        from diversed_hf.cli import ship

        ship.ship(staged)
        # RESULTS.md's section ("Real pair: the task-tuned target's EagleDraft"), carried by make_results.py
        write_text_atomic(REPO / "results" / "tuned_draft.md", text.strip() + "\n")
        subprocess.run(
            [sys.executable, str(REPO / "benchmarks" / "make_results.py"), "--head-sections-only"], check=True
        )
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
