"""The real pair's default EagleDraft on the prompts a user brings (RESULTS.md, "Real pair: the EagleDraft on everyday
prompts").

    python benchmarks/everyday_results.py            # results/everyday/{results.json,everyday.md}, RESULTS.md, the card
    python benchmarks/everyday_results.py --quick    # a smoke run into results_quick/everyday (nothing shipped changes)

Lossless SD (``ExactVerifier``) against the target alone (SmolLM2-135M-Instruct), batch 1, one torch thread, on two
prompt sets:

- **everyday**: the held-out everyday chat prompts (``diversed_hf.lab.tasks.chat_prompts.everyday_prompts``: 64 prompts
  written apart from the broad set the draft was distilled on);
- **arith_chat**: held-out ``arith_chat`` test prompts (the task rows the earlier draft was measured on).

Two drafts: the pair's default EagleDraft (``"eagle"``, distilled on everyday chat and the tasks) at every constant
length of ``--draft_lengths``, and the task EagleDraft (``"eagle-tasks"``, distilled on the tasks alone) at its own
length; greedy and at temperature 0.7 (top-k 0, top-p 1). Every configuration runs on each prompt in turn
(interleaved, so load changes hit all alike), after one short warm-up call each. Tokens are the new tokens up to EOS.

Then (unless ``--quick`` or ``--no_ship``) the default EagleDraft carries the length with the most tokens/s on
everyday prompts at temperature 0.7 in its ``generation_config.json``, and its ``training.json``, card
(``README.md``, ``model_cards/smollm2_eagle_draft.md``), docs/real_model.md (``<!-- everyday-draft -->``) and the
README's headline (``<!-- headline -->``, and the site's home docs/index.md) get
the measured summary.
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
from diversed_hf.cli.timing import measure, sampling_modes, step_costs
from diversed_hf.lab.cli_utils import (
    ArgumentParser,
    regenerate_lines,
    replace_marked_block,
    run_script,
    write_site_home,
    write_text_atomic,
)

logger = logging.getLogger("everyday_results")
REPO = Path(__file__).resolve().parents[1]
DRAFT_LABELS = {"eagle": "EagleDraft (everyday + tasks)", "eagle-tasks": "task EagleDraft (tasks only)"}
GOALS = {"greedy": (0.50, 1.3), "t0.7": (0.45, 1.2)}  # (acceptance, x target-only) on everyday prompts
MODES = {"greedy": "greedy", "t0.7": "temperature 0.7"}


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num_prompts", type=int, default=32, help="held-out everyday prompts (at most 64)")
    parser.add_argument("--task_prompts", type=int, default=12, help="held-out arith_chat prompts")
    parser.add_argument("--max_new_tokens", type=int, default=96, help="new tokens per prompt")
    parser.add_argument(
        "--draft_lengths", type=int, nargs="+", default=[2, 3], help="the default draft's N (the fastest ships)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the task prompts and of sampling")
    parser.add_argument(
        "--dtype",
        choices=("bfloat16", "float32"),
        default="bfloat16",
        help="the pair's dtype (a float32 target-only row is measured beside a bfloat16 run)",
    )
    parser.add_argument("--output_dir", default=None, help="default results/everyday (results_quick/... with --quick)")
    parser.add_argument("--quick", action="store_true", help="a few prompts and tokens: a smoke run")
    parser.add_argument("--no_ship", action="store_true", help="leave the shipped draft's files and the README")
    args = parser.parse_args(argv)
    for name in ("num_prompts", "task_prompts", "max_new_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be a positive integer, got {getattr(args, name)}")
    if args.num_prompts > 64:
        parser.error(f"--num_prompts must be at most 64 (the everyday set's size), got {args.num_prompts}")
    if min(args.draft_lengths) < 1:
        parser.error(f"--draft_lengths must be positive integers, got {args.draft_lengths}")
    if args.quick:
        args.num_prompts, args.task_prompts, args.max_new_tokens, args.draft_lengths = 2, 2, 16, [2]
    return args


def _row(block: dict, key: str) -> str:
    row, base = block[key], block["target"]["tokens_per_second"]
    if key.startswith("target"):
        label = "target only" if key == "target" else "target only, float32"
        return f"| {label} | – | – | 1.00 | {row['tokens_per_second']:.1f} | {row['tokens_per_second'] / base:.2f}x |"
    name, _, setting = key.partition(":N=")
    return (
        f"| {DRAFT_LABELS[name]} | {setting} | {100 * row['acceptance']:.1f} % | {row['tokens_per_round']:.2f} | "
        f"{row['tokens_per_second']:.1f} | {row['tokens_per_second'] / base:.2f}x |"
    )


def render(results: dict, command: str) -> str:
    costs = results["costs"]
    lines = [
        *regenerate_lines(command),
        f"SmolLM2-135M-Instruct as target in {results['dtype']}, lossless SD (`ExactVerifier`), batch 1, one torch "
        "thread, at most "
        f"{results['max_new_tokens']} new tokens (counted up to EOS), nothing else running; every configuration runs on "
        "each prompt in turn after a warm-up call. " + results["environment"],
        "",
        f"Draft step / target step: c = {costs['c_eagle']:.3f} (EagleDraft), {costs['c_eagle-tasks']:.3f} (task "
        f"EagleDraft); target {costs['target_ms']:.1f} ms per token.",
        "",
        *_verification_costs(results),
    ]
    for prompts, count, title in (
        ("everyday", results["num_prompts"], f"{results['num_prompts']} held-out everyday chat prompts"),
        ("arith_chat", results["task_prompts"], f"{results['task_prompts']} held-out `arith_chat` prompts"),
    ):
        for mode, mode_title in MODES.items():
            block = results[prompts][mode]
            lines += [
                f"### {title}, {mode_title}",
                "",
                "| draft | N | acceptance | tokens/round | tokens/s | x target-only |",
                "|---|---:|---:|---:|---:|---:|",
            ]
            lines += [_row(block, key) for key in block]
            lines.append("")
            if mode == "greedy":
                lines += [_same_text(results, block, count), ""]
    lines += ["### Against the goals (everyday prompts, the default draft at its shipped N)", ""]
    n = results["best"]
    for mode, (acceptance_goal, speed_goal) in GOALS.items():
        row = results["everyday"][mode][f"eagle:N={n}"]
        speedup = row["tokens_per_second"] / results["everyday"][mode]["target"]["tokens_per_second"]
        verdicts = [
            f"acceptance {100 * row['acceptance']:.1f} % (goal {100 * acceptance_goal:.0f} %: "
            + (
                "met"
                if row["acceptance"] >= acceptance_goal
                else f"missed by {100 * (acceptance_goal - row['acceptance']):.1f} points"
            )
            + ")",
            f"{speedup:.2f}x target-only (goal {speed_goal:.1f}x: "
            + ("met" if speedup >= speed_goal else f"missed by {speed_goal - speedup:.2f}x")
            + ")",
        ]
        lines.append(f"- {MODES[mode]}, N = {n}: " + ", ".join(verdicts) + ".")
    lines.append("")
    return "\n".join(lines)


def _verification_costs(results: dict) -> list[str]:
    """A forward over n new tokens in units of a one-token forward, per dtype measured (warm cache, best of 3)."""
    measured = [(results["dtype"], results["costs"])]
    if "float32" in results["costs"]:  # the float32 reference beside a bfloat16 run
        measured.append(("float32", results["costs"]["float32"]))
    n = len(measured[0][1]["c_verify"])
    lines = [
        "A target forward over n new tokens (a verification of n - 1 drafts), in one-token forwards of the same "
        "dtype (" + ", ".join(f"{dtype}: {costs['target_ms']:.1f} ms" for dtype, costs in measured) + "):",
        "",
        "| dtype | " + " | ".join(f"n = {i + 1}" for i in range(n)) + " |",
        "|---|" + "---:|" * n,
    ]
    lines += [f"| {dtype} | " + " | ".join(f"{c:.2f}" for c in costs["c_verify"]) + " |" for dtype, costs in measured]
    return [*lines, ""]


def _same_text(results: dict, block: dict, count: int) -> str:
    """How many greedy SD texts equal target-only's in the same dtype, and why bfloat16 may differ."""
    counts = ", ".join(
        f"{DRAFT_LABELS[k.partition(':')[0]]} at N = {k.partition('=')[2]}: {block[k]['same_text']}"
        for k in block
        if not k.startswith("target")
    )
    line = f"Greedy texts identical to target-only's ({results['dtype']}), of {count} prompts: {counts}."
    if results["dtype"] != "float32":
        line += (
            " bfloat16 rounds a forward over several tokens differently from one over a single token, so at a "
            "near-tie the texts part; in float32 they are identical (tests/test_real_pair.py)."
        )
    return line


def summary_paragraph(results: dict) -> str:
    """docs/real_model.md's paragraph on the default draft (between ``<!-- everyday-draft -->`` markers)."""
    n = results["best"]
    parts = []
    for prompts, label in (("everyday", "held-out everyday chat prompts"), ("arith_chat", "held-out `arith_chat`")):
        for mode in MODES:
            block = results[prompts][mode]
            row = block[f"eagle:N={n}"]
            parts.append(
                f"{label}, {MODES[mode]}: {100 * row['acceptance']:.1f} % accepted, "
                f"{row['tokens_per_second'] / block['target']['tokens_per_second']:.2f}x target-only tokens/s"
            )
    old = results["everyday"]["greedy"]
    old_key = next(k for k in old if k.startswith("eagle-tasks:"))
    return (
        f'**Measured** (`python benchmarks/everyday_results.py`, RESULTS.md "Real pair: the EagleDraft on everyday '
        f'prompts"; lossless SD with the default EagleDraft at its shipped N = {n}, {results["dtype"]}, batch 1, one thread): '
        + "; ".join(parts)
        + f". The task EagleDraft it replaces, distilled on the tasks alone, is accepted "
        f"{100 * old[old_key]['acceptance']:.1f} % on the same everyday prompts (greedy)."
    )


def headline(results: dict) -> str:
    """One sentence for the top of the README (between ``<!-- headline -->`` markers), each figure with its prompts."""
    n = results["best"]
    parts = []
    for prompts, label in (
        ("everyday", "held-out everyday chat prompts"),
        ("arith_chat", "held-out `arith_chat` problems"),
    ):
        greedy, sampled = (results[prompts][mode] for mode in MODES)
        speed = [b[f"eagle:N={n}"]["tokens_per_second"] / b["target"]["tokens_per_second"] for b in (greedy, sampled)]
        parts.append(f"{speed[0]:.2f}x greedy and {speed[1]:.2f}x at temperature 0.7 on {label}")
    return (
        f"On a real model (SmolLM2-135M-Instruct in {results['dtype']}, batch 1, one CPU thread), lossless "
        "speculative decoding with the shipped EagleDraft keeps the target's output distribution and runs at "
        + ", and ".join(parts)
        + ", the tokens/s of `generate` alone ([A real model](docs/real_model.md); "
        "`python benchmarks/everyday_results.py`)."
    )


def stage_draft(results: dict, command: str, output_dir: Path) -> Path:
    """Stage the default EagleDraft at the length with the most tokens/s (its generation config, the measured summary
    in its training record, its card) in ``output_dir/shipments`` (``diversed-hf ship`` copies it into the assets)."""
    from transformers import GenerationConfig

    from diversed_hf.cli.ship import stage_eagle_update
    from diversed_hf.testbed.smollm2 import EAGLE_DIR

    n = results["best"]
    config = GenerationConfig.from_pretrained(EAGLE_DIR)
    config.num_assistant_tokens = n
    config.num_assistant_tokens_schedule = "constant"
    record = json.loads((EAGLE_DIR / "training.json").read_text())
    record["measured"] = {
        "summary": summary_paragraph(results).split("): ", 1)[1],
        "prompts": "the held-out everyday chat prompts (diversed_hf.lab.tasks.chat_prompts.everyday_prompts) and held-out "
        "arith_chat test prompts",
        "command": command,
        "best_draft_length": n,
    }
    return stage_eagle_update(output_dir, "smollm2/eagle", config, record, "smollm2_eagle_draft.md", command)


def ship(results: dict, command: str, output_dir: Path) -> None:
    from diversed_hf.cli import ship as shipping

    shipping.ship(stage_draft(results, command, output_dir))
    replace_marked_block(REPO / "docs" / "real_model.md", summary_paragraph(results), marker="everyday-draft")
    replace_marked_block(REPO / "README.md", headline(results), marker="headline")
    write_site_home(REPO)  # the site's home is the README, links for the site


def _configs(args, target, draft, task_draft) -> list:
    """The configurations :func:`measure` runs: target-only (beside another dtype also target-only in float32), the
    default draft at every ``--draft_lengths`` and the task draft at its own length."""
    from diversed_hf.testbed import smollm2

    old_n = int(task_draft.generation_config.num_assistant_tokens)
    configs = [("target", target, None, {})]
    if args.dtype != "float32":  # the fastest target-only in the other dtype, for reference
        configs.append(("target-float32", smollm2.load_smollm2_target(torch_dtype=torch.float32)[0], None, {}))
    chain = {"assistant_tree_top_k": 1}  # a chain of n, whatever tree the draft's generation config carries
    configs += [(f"eagle:N={n}", target, draft, {"num_assistant_tokens": n, **chain}) for n in args.draft_lengths]
    configs.append((f"eagle-tasks:N={old_n}", target, task_draft, {"num_assistant_tokens": old_n, **chain}))
    return configs


def _measure_prompt_sets(args, tokenizer, prompt_sets: dict, configs: list, modes: dict) -> dict:
    """Every configuration on the everyday prompts in each mode, the default draft's length to ship (the fastest
    there at temperature 0.7), then target-only, that length and the task draft on the ``arith_chat`` prompts."""
    everyday = {}
    for mode, sampling in modes.items():
        everyday[mode] = measure(tokenizer, prompt_sets["everyday"], configs, sampling, args.seed, f"everyday {mode}")
    best = max(
        args.draft_lengths, key=lambda n: everyday["t0.7"][f"eagle:N={n}"]["tokens_per_second"]
    )  # the shipped length: the fastest on everyday prompts at temperature 0.7
    keep = ("target", "target-float32", f"eagle:N={best}")
    task_configs = [c for c in configs if c[0] in keep or c[0].startswith("eagle-tasks")]
    arith_chat = {
        mode: measure(
            tokenizer,
            prompt_sets["arith_chat"],
            task_configs,
            sampling,
            args.seed,
            f"arith_chat {mode}",
        )
        for mode, sampling in modes.items()
    }
    return {"everyday": everyday, "best": best, "arith_chat": arith_chat}


def main(argv=None) -> int:
    args = parse_args(argv)
    output_dir, command = start_script("everyday_results", args, argv, "everyday")
    from diversed_hf import enable_diversed
    from diversed_hf.lab.tasks import load_task_dataset
    from diversed_hf.lab.tasks.chat_prompts import everyday_prompts
    from diversed_hf.testbed import smollm2

    target, draft, tokenizer = smollm2.load_smollm2_pair(draft="eagle", torch_dtype=getattr(torch, args.dtype))
    enable_diversed(target)
    drafts = {"eagle": draft, "eagle-tasks": smollm2.load_eagle_draft(target, *smollm2.EAGLE_DRAFTS["eagle-tasks"])}
    configs = _configs(args, target, draft, drafts["eagle-tasks"])
    prompt_sets = {
        "everyday": everyday_prompts(args.num_prompts),
        "arith_chat": list(
            load_task_dataset("arith_chat", split="test", num_examples=args.task_prompts, seed=args.seed)["prompt"]
        ),
    }
    modes = sampling_modes(args.max_new_tokens)
    probe = tokenizer(prompt_sets["everyday"][0], return_tensors="pt", add_special_tokens=False)["input_ids"]
    costs = step_costs(target, {"eagle": drafts["eagle"], "eagle-tasks": drafts["eagle-tasks"]}, probe)
    if configs[1][0] == "target-float32":  # what a verification costs in the other dtype
        costs["float32"] = step_costs(configs[1][1], {}, probe)
    results = {
        "dtype": args.dtype,
        "num_prompts": args.num_prompts,
        "task_prompts": args.task_prompts,
        "max_new_tokens": args.max_new_tokens,
        "costs": costs,
        "environment": f"Python {platform.python_version()}, torch {torch.__version__}, {torch.get_num_threads()} "
        f"thread, {platform.machine()}.",
    }
    started = time.time()
    results.update(_measure_prompt_sets(args, tokenizer, prompt_sets, configs, modes))
    results["seconds"] = round(time.time() - started)
    output_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(output_dir / "results.json", json.dumps(results, indent=2) + "\n")
    section = render(results, command)
    write_text_atomic(output_dir / "everyday.md", section + "\n")
    print(section)
    if args.quick or args.no_ship:
        stage_draft(results, command, output_dir)  # to ship later: diversed-hf ship OUTPUT_DIR
        return 0
    write_text_atomic(REPO / "results" / "everyday.md", section + "\n")
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "make_results.py"), "--head-sections-only"], check=True)
    ship(results, command, output_dir)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
