"""The real pair's drafts side by side: the EagleDraft against the self-draft (RESULTS.md, "Real pair: feature draft
against self-draft").

    python benchmarks/eagle_results.py                 # results/eagle/{results.json,eagle.md}, RESULTS.md, the task draft's card
    python benchmarks/eagle_results.py --quick         # a smoke run into results_quick/eagle (nothing shipped changes)

On held-out ``arith_chat`` chat prompts, lossless SD (``ExactVerifier``) with each draft against the target alone. The
EagleDraft here is the task EagleDraft (``load_pair("smollm2", draft="eagle-tasks")``), distilled on the tasks alone;
the pair's default EagleDraft, distilled on everyday chat too, is measured by ``benchmarks/everyday_results.py``.

1. **Costs** (batch 1, warm caches, best of 3): ``c`` = one draft step / one target step; ``c_verify(n)`` = one target
   pass over ``n`` tokens / one target step.
2. **Batch 1, one thread** (the headline), greedy and at temperature 0.7: every constant draft length in
   ``--draft-lengths`` and the ``"optimal"`` policy (its ``N`` the longest of them), each prompt running every
   configuration in turn (interleaved, so load changes hit all alike): per-token acceptance, tokens per round against
   the i.i.d. theory ``(1 - a^(N+1)) / (1 - a)`` and the unbiased ``E[T]`` estimator, tokens/s against target-only
   and the speed model ``E[T] / (N c + c_verify(N + 1))``.
3. **Batch 8** (one thread) and **two threads** (batch 1): each draft at its best constant length from step 2.

Then each draft measured carries its best constant length at temperature 0.7 (the task EagleDraft in its
``generation_config.json``, the self-draft in ``self_draft.json``, which ``load_pair`` puts into its generation config),
and the task EagleDraft's card gets the measured summary (unless ``--quick`` or ``--no-ship``).
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
from diversed_hf.cli.timing import aggregate_runs, measure, sampling_modes, step_costs, timed_generate
from diversed_hf.lab.cli_utils import (
    ArgumentParser,
    regenerate_lines,
    replace_marked_block,
    run_script,
    write_text_atomic,
)

logger = logging.getLogger("eagle_results")
REPO = Path(__file__).resolve().parents[1]
DRAFT_NAMES = {"self": "self-draft (6 layers + LoRA)", "eagle": "task EagleDraft (1 layer on the target's features)"}


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num_prompts", type=int, default=12, help="held-out arith_chat prompts (batch 1)")
    parser.add_argument("--batch_prompts", type=int, default=16, help="prompts of the batch-8 runs")
    parser.add_argument("--max_new_tokens", type=int, default=96)
    parser.add_argument("--draft_lengths", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output_dir", default=None, help="default results/eagle (results_quick/eagle with --quick)")
    parser.add_argument("--quick", action="store_true", help="a few prompts, N in {2, 4}: a smoke run")
    parser.add_argument("--no_ship", action="store_true", help="leave the shipped draft's generation_config and card")
    args = parser.parse_args(argv)
    for name in ("num_prompts", "batch_prompts", "max_new_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be a positive integer, got {getattr(args, name)}")
    if min(args.draft_lengths) < 1:
        parser.error(f"--draft_lengths must be positive integers, got {args.draft_lengths}")
    if args.quick:
        args.num_prompts, args.batch_prompts, args.max_new_tokens, args.draft_lengths = 2, 8, 24, [2, 4]
    return args


def batch_one(target, drafts, tokenizer, prompts, args, sampling: dict, label: str) -> dict:
    """Target-only, each draft at every ``--draft_lengths`` and under the "optimal" schedule: :func:`measure`."""
    configs = [("target", target, None, {})]
    for name, draft in drafts.items():
        configs += [(f"{name}:N={n}", target, draft, {"num_assistant_tokens": n}) for n in args.draft_lengths]
        optimal = {"num_assistant_tokens": max(args.draft_lengths), "num_assistant_tokens_schedule": "optimal"}
        configs.append((f"{name}:optimal", target, draft, optimal))
    return measure(tokenizer, prompts, configs, sampling, args.seed, label)


def batched(target, drafts, tokenizer, prompts, best: dict, sampling: dict, batch_size: int, seed: int) -> dict:
    tokenizer.padding_side = "left"
    results = {}
    configs = [("target", None, {})] + [
        (f"{name}:N={best[name]}", name, {"num_assistant_tokens": best[name]}) for name in drafts
    ]
    records = {key: [] for key, _, _ in configs}
    for start in range(0, len(prompts), batch_size):
        inputs = tokenizer(
            prompts[start : start + batch_size], return_tensors="pt", padding=True, add_special_tokens=False
        )
        for key, name, kwargs in configs:
            records[key].append(timed_generate(target, drafts.get(name), inputs, sampling, seed + start, **kwargs))
    for key, value in records.items():
        results[key] = aggregate_runs(value)
    return results


def _speed_model(row: dict, n: float, c: float, c_verify: list[float]) -> float:
    """``E[T] / (n c + c_verify(n + 1))``; ``c_verify[k]`` is a pass over ``k`` tokens (``c_verify[0] = 0``)."""
    index = min(int(round(n)) + 1, len(c_verify) - 1)
    return row["expected_tokens_per_round"] / (n * c + c_verify[index])


def _preamble(results: dict, args, command: str) -> list[str]:
    """The command, the setting, the measured costs and what each column means."""
    costs = results["costs"]
    return [
        *regenerate_lines(command),
        f"SmolLM2-135M-Instruct as target; held-out `arith_chat` chat prompts ({args.num_prompts} at batch 1, "
        f"{args.batch_prompts} at batch 8), at most {args.max_new_tokens} new tokens, lossless SD (`ExactVerifier`); "
        "every configuration runs on each prompt in turn. " + results["environment"],
        "",
        f"Costs (batch 1, one thread, warm caches): target {costs['target_ms']:.1f} ms per token; draft step / target step "
        + ", ".join(f"c = {costs['c_' + name]:.3f} ({DRAFT_NAMES[name]})" for name in results["drafts"])
        + "; one target pass over n tokens costs c_verify(n) = "
        + ", ".join(f"{v:.2f}" for v in costs["c_verify"])
        + " target steps (n = 1, 2, ...).",
        "",
        "*acceptance* = accepted drafts / drafted; *a* = mean per-position acceptance probability (the i.i.d. model's "
        "alpha); *tokens/round* measured, against the i.i.d. theory `(1 - a^(N+1)) / (1 - a)` and the unbiased E[T] "
        "estimator; *predicted* = `E[T] / (N c + c_verify(N + 1))`; *speedup* = tokens/s over target-only tokens/s.",
        "",
    ]


def _batch_one_table(results: dict, mode: str) -> list[str]:
    """The batch-1 table of one sampling mode: every configuration against the i.i.d. theory and the speed model."""
    costs = results["costs"]
    block = results["batch1"][mode]
    target_tps = block["target"]["tokens_per_second"]
    title = "greedy" if mode == "greedy" else "temperature 0.7"
    lines = [
        f"### Batch 1, one thread, {title}",
        "",
        "| draft | N | acceptance | a | tokens/round | i.i.d. | E[T] est. | tokens/s | speedup | predicted |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| target only | – | – | – | 1.00 | – | – | {target_tps:.1f} | 1.00x | – |",
    ]
    for key, row in block.items():
        if key == "target":
            continue
        name, _, setting = key.partition(":")
        n = row["mean_draft_length"]
        a = row["alpha"]
        iid = (1 - a ** (n + 1)) / (1 - a) if a < 1 else n + 1
        predicted = _speed_model(row, n, costs[f"c_{name}"], [0.0] + costs["c_verify"])
        label = f"{setting.split('=')[1]}" if setting.startswith("N=") else f"optimal ({n:.2f})"
        lines.append(
            f"| {DRAFT_NAMES[name]} | {label} | {100 * row['acceptance']:.1f} % | {a:.2f} | "
            f"{row['tokens_per_round']:.2f} | {iid:.2f} | {row['expected_tokens_per_round']:.2f} | "
            f"{row['tokens_per_second']:.1f} | {row['tokens_per_second'] / target_tps:.2f}x | {predicted:.2f}x |"
        )
    lines.append("")
    return lines


def _goal_lines(results: dict) -> list[str]:
    """The EagleDraft at its best constant N against the speed-up goal of each mode, with the speed model."""
    costs = results["costs"]
    lines = ["### Against the goal", ""]
    for mode, goal in (("greedy", 1.3), ("t0.7", 1.1)):
        block = results["batch1"][mode]
        n = results["best"][mode]["eagle"]
        row = block[f"eagle:N={n}"]
        speedup = row["tokens_per_second"] / block["target"]["tokens_per_second"]
        model = _speed_model(row, row["mean_draft_length"], costs["c_eagle"], [0.0] + costs["c_verify"])
        verdict = "met" if speedup >= goal else f"missed by {goal - speedup:.2f}x"
        lines.append(
            f"- {'greedy' if mode == 'greedy' else 'temperature 0.7'}: goal {goal:.1f}x target-only tokens/s, the "
            f"EagleDraft reaches {speedup:.2f}x at N = {n} ({verdict}): acceptance {100 * row['acceptance']:.1f} % per "
            f"drafted token, E[T] = {row['expected_tokens_per_round']:.2f} tokens per round, c = {costs['c_eagle']:.3f}, "
            f"c_verify({n + 1}) = {costs['c_verify'][min(n, len(costs['c_verify']) - 1)]:.2f}; the speed model predicts "
            f"{model:.2f}x, the rest is the loop's per-round overhead (sampling, cache edits, Python)."
        )
    return lines


def _best_length_table(results: dict) -> list[str]:
    """Each draft's best constant N against the ``optimal`` policy, per mode (batch 1)."""
    lines = [
        "",
        "### Best constant N against the `optimal` policy (batch 1, one thread)",
        "",
        "| draft | mode | best constant N | its tokens/s | `optimal`: mean N | its tokens/s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for mode in ("greedy", "t0.7"):
        for name in results["drafts"]:
            best = results["best"][mode][name]
            block = results["batch1"][mode]
            lines.append(
                f"| {DRAFT_NAMES[name]} | {mode} | {best} | {block[f'{name}:N={best}']['tokens_per_second']:.1f} | "
                f"{block[f'{name}:optimal']['mean_draft_length']:.2f} | {block[f'{name}:optimal']['tokens_per_second']:.1f} |"
            )
    lines.append("")
    return lines


def _best_length_runs(results: dict, label: str, key: str) -> list[str]:
    """The table of the runs ``key`` (``batch8`` or ``threads2``): each draft at its best constant N, per mode."""
    lines = [
        f"### {label} (each draft at its best constant N)",
        "",
        "| mode | configuration | acceptance | tokens/round | tokens/s | speedup |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for mode in ("greedy", "t0.7"):
        block = results[key][mode]
        target_tps = block["target"]["tokens_per_second"]
        for config, row in block.items():
            name = config.partition(":")[0]
            shown = "target only" if config == "target" else f"{DRAFT_NAMES[name]}, {config.partition(':')[2]}"
            acc = f"{100 * row['acceptance']:.1f} %" if "acceptance" in row else "–"
            tpr = f"{row['tokens_per_round']:.2f}" if "tokens_per_round" in row else "1.00"
            lines.append(
                f"| {mode} | {shown} | {acc} | {tpr} | {row['tokens_per_second']:.1f} | "
                f"{row['tokens_per_second'] / target_tps:.2f}x |"
            )
    lines.append("")
    return lines


def render(results: dict, args, command: str) -> str:
    """The RESULTS.md section: the setting and costs, the batch-1 tables, the goals, the best constant N against
    ``optimal``, then batch 8 and two threads."""
    lines = _preamble(results, args, command)
    for mode in ("greedy", "t0.7"):
        lines += _batch_one_table(results, mode)
    lines += _goal_lines(results)
    lines += _best_length_table(results)
    for label, key in (("Batch 8, one thread", "batch8"), ("Batch 1, two threads", "threads2")):
        lines += _best_length_runs(results, label, key)
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    output_dir, command = start_script("eagle_results", args, argv, "eagle")
    from diversed_hf import enable_diversed
    from diversed_hf.lab.tasks import load_task_dataset
    from diversed_hf.testbed import smollm2

    # float32, as this script's RESULTS.md section was measured (the pair's default is bfloat16: everyday_results.py)
    target, self_draft, tokenizer = smollm2.load_smollm2_pair(draft="self", torch_dtype=torch.float32)
    enable_diversed(target)
    # the EagleDraft of this section: the task EagleDraft ("eagle-tasks"), distilled on arith_chat, humaneval and
    # docstrings; the pair's default EagleDraft, distilled on everyday chat too, is measured by everyday_results.py
    drafts = {"self": self_draft, "eagle": smollm2.load_eagle_draft(target, *smollm2.EAGLE_DRAFTS["eagle-tasks"])}
    prompts = list(
        load_task_dataset(
            "arith_chat", split="test", num_examples=max(args.num_prompts, args.batch_prompts), seed=args.seed
        )["prompt"]
    )
    modes = sampling_modes(args.max_new_tokens)
    probe = tokenizer(prompts[0], return_tensors="pt", add_special_tokens=False)["input_ids"]
    results = {
        "drafts": list(drafts),
        "num_prompts": args.num_prompts,
        "costs": step_costs(target, drafts, probe),
        "batch1": {},
        "best": {},
        "batch8": {},
        "threads2": {},
        "environment": f"Python {platform.python_version()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread, {platform.machine()}.",
    }
    started = time.time()
    for mode, sampling in modes.items():
        block = batch_one(target, drafts, tokenizer, prompts[: args.num_prompts], args, sampling, f"batch 1 {mode}")
        results["batch1"][mode] = block
        results["best"][mode] = {
            name: max(args.draft_lengths, key=lambda n: block[f"{name}:N={n}"]["tokens_per_second"]) for name in drafts
        }
        results["batch8"][mode] = batched(
            target, drafts, tokenizer, prompts[: args.batch_prompts], results["best"][mode], sampling, 8, args.seed
        )
    torch.set_num_threads(2)
    for mode, sampling in modes.items():
        results["threads2"][mode] = batched(
            target, drafts, tokenizer, prompts[: args.num_prompts], results["best"][mode], sampling, 1, args.seed
        )
    results["seconds"] = round(time.time() - started)
    output_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(output_dir / "results.json", json.dumps(results, indent=2) + "\n")
    section = render(results, args, command)
    write_text_atomic(output_dir / "eagle.md", section + "\n")
    print(section)
    if args.quick or args.no_ship:
        stage_drafts(results, command, output_dir)  # to ship later: diversed-hf ship OUTPUT_DIR
        return 0
    write_text_atomic(REPO / "results" / "eagle.md", section + "\n")
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "make_results.py"), "--head-sections-only"], check=True)
    ship(results, command, output_dir)
    return 0


def summary_paragraph(results: dict) -> str:
    """The headline, for docs/real_model.md and docs/eagle.md (between ``<!-- eagle-draft -->`` markers)."""
    costs = results["costs"]
    parts = []
    for mode, label in (("greedy", "greedy"), ("t0.7", "at temperature 0.7")):
        block = results["batch1"][mode]
        target_tps = block["target"]["tokens_per_second"]
        rows = []
        for name in results["drafts"]:
            n = results["best"][mode][name]
            row = block[f"{name}:N={n}"]
            rows.append(
                f"{'the task EagleDraft' if name == 'eagle' else 'the self-draft'} {row['tokens_per_second'] / target_tps:.2f}x "
                f"(acceptance {100 * row['acceptance']:.1f} %, {row['tokens_per_round']:.2f} tokens per round, N = {n})"
            )
        parts.append(f"{label}: " + ", ".join(rows))
    return (
        '**Measured** (`python benchmarks/eagle_results.py`, RESULTS.md "Real pair: feature draft against self-draft"; '
        f"{results['num_prompts']} held-out `arith_chat` chat prompts, lossless SD, batch 1, one thread): the task "
        f"EagleDraft costs "
        f"c = {costs['c_eagle']:.3f} of the target per draft step against {costs['c_self']:.3f} for the self-draft, and "
        f"a target pass over 4 tokens costs {costs['c_verify'][3]:.2f} target steps. Tokens/s against the target alone, "
        + "; ".join(parts)
        + "."
    )


def stage_drafts(results: dict, command: str, output_dir: Path) -> None:
    """Stage the task EagleDraft at its best draft length at temperature 0.7 (``generation_config.json``, the
    measured summary in ``training.json``, its card) and the self-draft's best length, in ``output_dir/shipments``."""
    from transformers import GenerationConfig

    from diversed_hf.cli.ship import stage, stage_eagle_update
    from diversed_hf.testbed.smollm2 import DRAFT_DIR
    from diversed_hf.testbed.smollm2 import EAGLE_TASKS_DIR as EAGLE_DIR  # the task EagleDraft (see main)

    self_config = json.loads((DRAFT_DIR / "self_draft.json").read_text())  # the self-draft's best length too
    self_config["num_assistant_tokens"] = results["best"]["t0.7"]["self"]
    stage(
        output_dir, "smollm2/draft", {"self_draft.json": json.dumps(self_config, indent=2) + "\n"}, measured_by=command
    )
    best = results["best"]["t0.7"]["eagle"]
    config = GenerationConfig.from_pretrained(EAGLE_DIR)
    config.num_assistant_tokens = best
    config.num_assistant_tokens_schedule = "constant"
    record = json.loads((EAGLE_DIR / "training.json").read_text())
    parts = []
    for mode, label in (("greedy", "greedy"), ("t0.7", "temperature 0.7")):
        block = results["batch1"][mode]
        n = results["best"][mode]["eagle"]
        row = block[f"eagle:N={n}"]
        parts.append(
            f"{label}: acceptance {100 * row['acceptance']:.1f} % per drafted token, {row['tokens_per_round']:.2f} "
            f"tokens per round, {row['tokens_per_second'] / block['target']['tokens_per_second']:.2f}x the "
            f"target's tokens/s at N = {n}"
        )
    record["measured"] = {
        "summary": f"Lossless SD on held-out arith_chat chat prompts, batch 1, one thread (c = "
        f"{results['costs']['c_eagle']:.3f} of the target per draft step): "
        + "; ".join(parts)
        + f". `generation_config.num_assistant_tokens` = {best}, the best constant length at temperature 0.7.",
        "command": command,
        "best_draft_length": results["best"],
    }
    stage_eagle_update(output_dir, "smollm2/eagle_tasks", config, record, "smollm2_eagle_tasks_draft.md", command)


def ship(results: dict, command: str, output_dir: Path) -> None:
    """Ship what :func:`stage_drafts` stages, and the summary into the docs pages that quote it."""
    from diversed_hf.cli import ship as shipping

    stage_drafts(results, command, output_dir)
    shipping.ship(output_dir)
    for page in (REPO / "docs" / "real_model.md", REPO / "docs" / "eagle.md"):
        replace_marked_block(page, summary_paragraph(results), marker="eagle-draft")


if __name__ == "__main__":
    sys.exit(run_script(main))
