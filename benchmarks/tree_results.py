"""Token trees against chains, measured on this CPU (RESULTS.md "Token trees"; docs/method.md §8).

    python benchmarks/tree_results.py            # ~25 minutes on one thread
    python benchmarks/tree_results.py --quick    # a smoke run into results_quick/trees

1. **Verification cost**: one target forward over ``n`` new tokens on a cached context, against one over a single
   token (SmolLM2-135M-Instruct, bfloat16, one thread; median of repeats).
2. **Chains and trees, lossless SD**, tokens/s against target-only and tokens per round, greedy and at T = 0.7, one
   thread, ``--max_new_tokens`` new tokens per prompt:
   - the testbed pair (float32) on held-out ``arith`` prompts, batch 1 and 8; transformers' assisted decoding
     (N = 5, constant schedule) beside it, with whether the greedy outputs are token-identical;
   - the real pair with its default draft, the EagleDraft (bfloat16), on the held-out everyday prompts, batch 1 and
     8; the shape with the best mean speed-up at batch 1 goes into the draft's generation config (a tree only where
     one beats the chain) and its card says so.

Each configuration runs every prompt once after a warm-up call; the stage results are kept in
``<output_dir>/results.json`` (a rerun with the same settings skips the stages already measured; delete the file to
measure again). Writes ``<output_dir>/trees.md``; without ``--quick`` also ``results/trees.md``, which RESULTS.md
carries (``benchmarks/make_results.py --head-sections-only`` puts it in place, as this script does).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

import diversed_hf.testbed as testbed
from diversed_hf import enable_diversed
from diversed_hf.cli.sections import refresh_head_sections
from diversed_hf.cli.timing import TREE_MODES as MODES
from diversed_hf.cli.timing import run_configs
from diversed_hf.lab.cli_utils import ArgumentParser, add_debug_flag, run_script, write_text_atomic
from diversed_hf.lab.tasks.chat_prompts import everyday_prompts
from diversed_hf.testbed.arith_chat import load_arith_chat

REPO = Path(__file__).resolve().parents[1]
#: the shapes measured: (name, generate keywords); depth is num_assistant_tokens
SHAPES = {
    "chain N=3": dict(num_assistant_tokens=3, assistant_tree_top_k=1),  # a chain, whatever the draft's config says
    "chain N=5": dict(num_assistant_tokens=5, assistant_tree_top_k=1),
    "tree 3x2 (6)": dict(num_assistant_tokens=3, assistant_tree_top_k=2, assistant_tree_size=6),
    "tree 3x4 (12)": dict(num_assistant_tokens=3, assistant_tree_top_k=4, assistant_tree_size=12),
    "tree 4x3 (12)": dict(num_assistant_tokens=4, assistant_tree_top_k=3, assistant_tree_size=12),
    "tree 5x3 (12)": dict(num_assistant_tokens=5, assistant_tree_top_k=3, assistant_tree_size=12),
}
#: the shapes each shipped EagleDraft was measured at (filled by measure): what ship() can write into its config
SHIP_SHAPES: dict = {}


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num_prompts", type=int, default=8, help="prompts per pair (default 8)")
    parser.add_argument("--max_new_tokens", type=int, default=64, help="new tokens per prompt (default 64)")
    parser.add_argument("--output_dir", default=None, help="default results/trees (results_quick/trees with --quick)")
    parser.add_argument("--quick", action="store_true", help="2 prompts, 16 tokens, the testbed only: a smoke run")
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    for name in ("num_prompts", "max_new_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} is {getattr(args, name)}; it must be >= 1")
    if args.quick:
        args.num_prompts, args.max_new_tokens = min(args.num_prompts, 2), min(args.max_new_tokens, 16)
    args.output_dir = Path(args.output_dir or REPO / ("results_quick" if args.quick else "results") / "trees")
    return args


def verification_costs(target, tokenizer, repeats: int = 7) -> dict:
    """``{n: seconds of a forward over n new tokens / seconds over 1}`` on a cached 120-token context."""
    from diversed_hf import compat

    context = tokenizer(everyday_prompts(1)[0], return_tensors="pt").input_ids[:, :120]
    costs = {}
    for n in (1, 2, 4, 8, 16, 32):
        times = []
        for _ in range(repeats):
            cache = compat.new_cache()
            mask = torch.ones(1, context.shape[1] + n, dtype=torch.long)
            with torch.no_grad():
                compat.forward_with_cache(
                    target, context, mask[:, :-n], cache, logits_to_keep=1, output_hidden_states=False
                )
                new = torch.randint(100, 1000, (1, n))
                start = time.perf_counter()
                compat.forward_with_cache(target, new, mask, cache, logits_to_keep=n, output_hidden_states=False)
                times.append(time.perf_counter() - start)
        costs[n] = statistics.median(times)
    return {str(n): seconds / costs[1] for n, seconds in costs.items()}


def measure(args) -> dict:
    args.output_dir.mkdir(parents=True, exist_ok=True)
    path = args.output_dir / "results.json"
    settings = {"num_prompts": args.num_prompts, "max_new_tokens": args.max_new_tokens, "quick": args.quick}
    results = json.loads(path.read_text()) if path.is_file() else {}
    if results.get("settings") != settings:
        results = {"settings": settings}
    torch.set_num_threads(1)

    def stage(name, compute):
        if name not in results:
            results[name] = compute()
            write_text_atomic(path, json.dumps(results, indent=2) + "\n")
        print(f"{name}: done", flush=True)

    target, draft, tokenizer = testbed.load_pair()
    enable_diversed(target)
    tokenizer.padding_side = "left"
    prompts = list(testbed.load_task("arith", split="test", num_examples=args.num_prompts)["prompt"])
    for batch in (1, 8):
        stage(
            f"testbed batch {batch}",
            lambda batch=batch: run_configs(
                target, draft, tokenizer, prompts, batch, args.max_new_tokens, SHAPES, with_hf=batch == 1
            ),
        )
    if not args.quick:
        target, draft, tokenizer = testbed.load_pair("smollm2")  # the default draft: the EagleDraft
        enable_diversed(target)
        tokenizer.padding_side = "left"
        stage("verification costs", lambda: verification_costs(target, tokenizer))
        real_shapes = {name: shape for name, shape in SHAPES.items() if name != "chain N=5"}
        everyday = everyday_prompts(args.num_prompts)
        shipped = 2  # the default draft's chain before trees (its config now carries its tree: RESULTS "Token trees")
        eagle_shapes = {
            f"chain N={shipped} (shipped)": dict(num_assistant_tokens=shipped, assistant_tree_top_k=1),
            **real_shapes,
        }
        eagle_shapes.pop("chain N=3", None) if shipped != 3 else None
        SHIP_SHAPES["default"] = eagle_shapes
        task_draft = testbed.load_pair("smollm2", draft="eagle-tasks")[1]  # arith_chat's draft, on this target
        task_chain = int(task_draft.generation_config.num_assistant_tokens)
        task_shapes = {
            f"chain N={task_chain} (shipped)": dict(num_assistant_tokens=task_chain, assistant_tree_top_k=1),
            **real_shapes,
        }
        task_shapes.pop("chain N=3", None) if task_chain != 3 else None
        SHIP_SHAPES["task"] = task_shapes
        arith_chat = list(load_arith_chat("test", num_examples=args.num_prompts, seed=17)["prompt"])
        stage(
            "real pair task draft arith_chat batch 1",
            lambda: run_configs(target, task_draft, tokenizer, arith_chat, 1, args.max_new_tokens, task_shapes, False),
        )
        for batch in (1, 8):
            stage(
                f"real pair eagle batch {batch}",
                lambda batch=batch: run_configs(
                    target, draft, tokenizer, everyday, batch, args.max_new_tokens, eagle_shapes, False
                ),
            )
    return results


def table(rows: dict) -> list[str]:
    lines = ["| mode | method | tokens/s | x target-only | tokens / round | nodes / round | greedy = target |"]
    lines.append("|---|---|---|---|---|---|---|")
    for mode, methods in rows.items():
        for name, row in methods.items():
            identical = row.get("identical_to_target")
            lines.append(
                f"| {mode} | {name} | {row['tokens_per_second']:.1f} | {row['speedup']:.2f}x | "
                f"{row.get('tokens_per_round', float('nan')):.2f} | {row.get('nodes_per_round', float('nan')):.1f} | "
                f"{'–' if identical is None else ('yes' if identical else 'no')} |"
            )
    return lines


def page(results: dict, command: str) -> str:
    settings = results["settings"]
    lines = [
        f"Measured with `{command}` on this machine's CPU, one thread, {settings['num_prompts']} prompts per pair, "
        f"at most {settings['max_new_tokens']} new tokens each, lossless SD (`ExactVerifier`) on every row, nothing "
        "else running; each configuration ran every prompt once after a warm-up call. A tree `DxK (M)` drafts D "
        "levels, expands the K best nodes of each level into K children and verifies the M best nodes (docs/method.md "
        "§8); the shapes are passed to `generate` as asked, at every batch size. Greedy rows of the real pair are not "
        "token-identical to target-only: bfloat16 near-ties (float32 is the way to identity; the testbed rows are "
        "float32).",
        "",
    ]
    if "verification costs" in results:
        costs = results["verification costs"]
        lines += [
            "**Verification cost** (SmolLM2-135M-Instruct, bfloat16, a cached 120-token context): one target "
            "forward over n new tokens, against one over a single token: "
            + ", ".join(f"n = {n}: {ratio:.2f}" for n, ratio in costs.items())
            + ".",
            "",
        ]
    for name, title in (
        ("testbed batch 1", "Testbed pair (float32), held-out `arith` prompts, batch 1"),
        ("testbed batch 8", "Testbed pair (float32), the same prompts, batch 8"),
        (
            "real pair eagle batch 1",
            "Real pair with its default draft, the EagleDraft (bfloat16), held-out everyday prompts, batch 1",
        ),
        ("real pair eagle batch 8", "The same, batch 8"),
        (
            "real pair task draft arith_chat batch 1",
            "Real pair with the task EagleDraft (`eagle-tasks`, the draft of the "
            "shipped `arith_chat` head; bfloat16), held-out `arith_chat` prompts, batch 1",
        ),
    ):
        if name in results:
            lines += [f"**{title}**", "", *table(results[name]), ""]
    lines += goals(results)
    return "\n".join(lines).strip() + "\n"


#: the goals of the token-tree work, on the real pair's default draft at batch 1 (greedy, T = 0.7, tokens per round)
GOALS = {"greedy": 1.5, "T=0.7": 1.4, "tokens_per_round": 2.5}


def goals(results: dict) -> list[str]:
    """Each goal met or missed, by how much, from the EagleDraft's best tree at batch 1."""
    rows = results.get("real pair eagle batch 1")
    if rows is None:
        return ["The goals on the real pair's default draft (the EagleDraft) are not measured by this run."]
    lines = ["**Goals** (the EagleDraft's best shape at batch 1 against target-only):", ""]
    chain = next(row for name, row in rows["greedy"].items() if name.startswith("chain"))
    for mode in ("greedy", "T=0.7"):
        trees = {name: row for name, row in rows[mode].items() if name.startswith("tree")}
        name, best = max(trees.items(), key=lambda item: item[1]["speedup"])
        verdict = "met" if best["speedup"] >= GOALS[mode] else f"missed by {GOALS[mode] - best['speedup']:.2f}"
        lines.append(f"- {mode}: goal >= {GOALS[mode]}x, {name} reaches {best['speedup']:.2f}x ({verdict}).")
        if mode == "greedy":
            per_round = best["tokens_per_round"]
            verdict = (
                "met"
                if per_round >= GOALS["tokens_per_round"]
                else (f"missed by {GOALS['tokens_per_round'] - per_round:.2f}")
            )
            lines.append(f"- tokens per round, greedy: goal >= 2.5, {name} {per_round:.2f} ({verdict}).")
    task = results.get("real pair task draft arith_chat batch 1")
    if task:
        for mode in ("greedy", "T=0.7"):
            trees = {name: row for name, row in task[mode].items() if name.startswith("tree")}
            name, best = max(trees.items(), key=lambda item: item[1]["speedup"])
            verdict = "met" if best["speedup"] >= 2.0 else f"missed by {2.0 - best['speedup']:.2f}"
            lines.append(
                f"- `arith_chat` with the task draft, {mode}: goal >= 2.0x, {name} reaches {best['speedup']:.2f}x "
                f"({verdict}; its chain {next(r for n, r in task[mode].items() if n.startswith('chain'))['speedup']:.2f}x)."
            )
    testbed = results.get("testbed batch 1", {}).get("greedy", {})
    theirs = testbed.get("transformers assisted N=5")
    if theirs:
        trees = {name: row for name, row in testbed.items() if name.startswith("tree")}
        tree_name, fastest = max(trees.items(), key=lambda item: item[1]["tokens_per_second"])
        ratio = theirs["tokens_per_second"] / fastest["tokens_per_second"]  # our time / transformers' time
        identical = fastest.get("identical_to_target") and theirs.get("identical_to_target")
        lines.append(
            f"- testbed pair, greedy, batch 1: goal <= 0.75x the time of transformers' assisted decoding (N = 5) at "
            f"identical output; {tree_name} takes {ratio:.2f}x its time ("
            + (
                "met"
                if ratio <= 0.75 and identical
                else f"missed by {ratio - 0.75:.2f}"
                if ratio > 0.75
                else "output differs"
            )
            + (", both token-identical to target-only)." if identical else ").")
        )
    costs = results.get("verification costs", {})
    lines += [
        "",
        f"Why: the draft's second guesses lift greedy rounds from {chain['tokens_per_round']:.2f} tokens (the shipped "
        f"chain) to {per_round:.2f}, but a tree round costs more: the target reads about 12 nodes instead of 3 "
        f"(a pass over 16 tokens costs {costs.get('16', float('nan')):.2f}x one over a single token, over 4 tokens "
        f"{costs.get('4', float('nan')):.2f}x) and the draft makes one pass per level over up to K nodes, its LM head "
        "over the whole vocabulary for each. Sampled (T = 0.7), a second guess is kept with the residual's mass on it "
        "only, so trees add less there. The draft itself caps the gain: its top-1 agreement with the target is about "
        "0.5 on these prompts.",
        "",
        "**Batch 8**: every speculative row is slower than target-only here (batched target passes leave little to "
        "win on this CPU), and a tree of 12 is slower than the chain, so a tree read from the draft's generation "
        "config (the shipped shape, chosen at batch 1) gives each row `size / batch` nodes and becomes the chain when "
        "that leaves no room (`TreeSpec.for_batch`); a tree passed to `generate` is drafted as asked.",
    ]
    return lines


def best_shape(rows: dict) -> tuple[str, float]:
    """The shape with the highest mean speed-up over greedy and T = 0.7 (batch 1), and that mean."""
    names = [name for name in rows["greedy"] if name != "target-only"]
    means = {name: statistics.mean(rows[mode][name]["speedup"] for mode in MODES) for name in names}
    name = max(means, key=means.get)
    return name, means[name]


#: each shipped EagleDraft: the stage that measures it, its folder's name in testbed.smollm2, its card, its prompts
SHIPPED = {
    "default": ("real pair eagle batch 1", "EAGLE_DIR", "smollm2_eagle_draft.md", "held-out everyday prompts"),
    "task": (
        "real pair task draft arith_chat batch 1",
        "EAGLE_TASKS_DIR",
        "smollm2_eagle_tasks_draft.md",
        "held-out arith_chat prompts",
    ),
}


def ship(results: dict, command: str, output_dir: Path, which: str = "default") -> str:
    """A shipped EagleDraft's generation config carries its best shape at batch 1 (a tree only where one beats its
    chain), and its card says how the shape was chosen: staged in ``output_dir/shipments``, then shipped."""
    from transformers import GenerationConfig

    from diversed_hf.cli import ship as shipping
    from diversed_hf.testbed import ASSETS_DIR, smollm2

    stage_name, folder, card_name, prompts = SHIPPED[which]
    EAGLE_DIR = getattr(smollm2, folder)
    rows = results[stage_name]
    name, mean = best_shape(rows)
    config = GenerationConfig.from_pretrained(EAGLE_DIR)
    shape = SHIP_SHAPES[which].get(name)
    chain = [other for other in rows["greedy"] if other.startswith("chain") and "shipped" in other][0]
    if shape is not None and "assistant_tree_top_k" in shape:
        config.num_assistant_tokens = shape["num_assistant_tokens"]
        config.assistant_tree_top_k = shape["assistant_tree_top_k"]
        config.assistant_tree_size = shape["assistant_tree_size"]
        verdict = (
            f"ships {name} (in its generation config: num_assistant_tokens, assistant_tree_top_k, assistant_tree_size)"
        )
    else:
        for knob in ("assistant_tree_top_k", "assistant_tree_size"):
            if hasattr(config, knob):
                delattr(config, knob)
        verdict = f"keeps its chain ({chain}): no tree was faster"
    parts = [
        f"{shape_name} {rows[mode][shape_name]['speedup']:.2f}x"
        for shape_name in rows["greedy"]
        if shape_name != "target-only"
        for mode in ("greedy",)
    ]
    summary = (
        f'Chosen by `{command}` (RESULTS.md, "Token trees"): lossless SD at batch 1, one thread, bfloat16, on '
        f"{results['settings']['num_prompts']} {prompts} x {results['settings']['max_new_tokens']} "
        f"tokens, greedy and T = 0.7; the shape with the best mean speed-up over target-only ({name}: {mean:.2f}x). "
        f"Greedy: {', '.join(parts)}. The draft {verdict}."
    )
    record = json.loads((EAGLE_DIR / "training.json").read_text())
    record["tree"] = {"summary": summary, "command": command, "shape": shape if shape else None}
    name = EAGLE_DIR.relative_to(ASSETS_DIR).as_posix()
    shipping.ship(shipping.stage_eagle_update(output_dir, name, config, record, card_name, command))
    return summary


def arith_chat_head_over_trees(shape_name: str) -> str | None:
    """What ``benchmarks/tree_heads.py`` measured of the shipped ``arith_chat`` head over ``shape_name`` (its tree
    against its chain), when the quality difference's interval holds 0 there; else None."""
    path = REPO / "results" / "tree_heads" / "results.json"
    if not path.is_file():
        return None
    result = json.loads(path.read_text()).get("smollm2 arith_chat")
    if result is None:
        return None
    setting, rows = result["setting"], result["rows"]
    tree = setting["tree"]
    measured = f"tree {setting['depth']}x{tree['assistant_tree_top_k']} ({tree['assistant_tree_size']})"
    paired = rows["DIVERSED, tree"]["vs_chain"]
    if measured != shape_name or not paired["low"] <= 0.0 <= paired["high"]:
        return None
    return (
        f"The shipped `arith_chat` head over this tree keeps its quality (`python benchmarks/tree_heads.py`: "
        f"{setting['num_prompts']} held-out prompts x {setting['num_sampling_seeds']} samples at T = "
        f"{setting['temperature']:g}, exact match over the tree minus over the chain {paired['delta']:+.3f} "
        f"[{paired['low']:+.3f}, {paired['high']:+.3f}], {rows['DIVERSED, tree']['tokens_per_round']:.2f} tokens per "
        f"round against {rows['DIVERSED, chain']['tokens_per_round']:.2f}); its card's table was measured over the "
        "chain."
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    results = measure(args)
    command = "python benchmarks/tree_results.py" + (" --quick" if args.quick else "")
    text = page(results, command)
    if not args.quick and "real pair eagle batch 1" in results:
        text += "\n**Shipped, the default EagleDraft.** " + ship(results, command, args.output_dir) + "\n"
    task_stage = "real pair task draft arith_chat batch 1"
    head_verdict = arith_chat_head_over_trees(best_shape(results[task_stage])[0]) if task_stage in results else None
    if head_verdict and not args.quick:  # the head's quality holds over the tree: the task draft ships it too
        text += (
            "\n**Shipped, the task EagleDraft.** "
            + ship(results, command, args.output_dir, which="task")
            + " "
            + head_verdict
            + "\n"
        )
    elif task_stage in results:  # measured, not shipped: see the sentence
        name, mean = best_shape(results[task_stage])
        text += (
            f"\n**Not shipped, the task EagleDraft.** Its best shape here is {name} ({mean:.2f}x mean speed-up), but "
            "its generation config keeps the chain: the shipped `arith_chat` head was measured as an operating point "
            "with this draft's chain, and a tree moves where rounds end (more tokens from the mixture, fewer bonus "
            "tokens from the target), so the head's table would no longer describe it. Pass the tree to `generate` "
            "to use it; shipping it waits for the head's table measured over trees.\n"
        )
    write_text_atomic(args.output_dir / "trees.md", text)
    print(text)
    if not args.quick:
        write_text_atomic(REPO / "results" / "trees.md", text)
        refresh_head_sections(REPO / "RESULTS.md", REPO / "results")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
