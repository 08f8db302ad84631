"""DIVERSED heads over token trees against the same heads over chains, at equal quality (RESULTS.md "Token trees:
heads"; docs/method.md §8).

    python benchmarks/tree_heads.py            # the testbed heads and the real pair's arith_chat head
    python benchmarks/tree_heads.py --quick    # a smoke run into results_quick/tree_heads

For each shipped head, on its task's held-out test prompts, at the temperature and draft length its card was
measured at, every prompt is sampled ``--num_sampling_seeds`` times by five methods: target-only, lossless SD over
the chain and over a tree, the head over the chain and over the same tree. A tree keeps the chain's depth and adds
the draft's second guesses (``assistant_tree_top_k``, ``assistant_tree_size``). Reported per method: the task's
quality, tokens per round (every emitted token over every round) and tokens/s; and, paired over prompts with a 95 %
bootstrap interval, the head's quality over the tree minus over the chain, and each method's quality minus the
target distribution's (target-only and lossless SD pooled: all exact samples of ``p``).

Each case's results are kept in ``<output_dir>/results.json`` (a rerun with the same settings skips the cases
already measured; delete the file to measure again). Writes ``<output_dir>/tree_heads.md``; without ``--quick`` also
``results/tree_heads.md``, which RESULTS.md carries (this script puts it in place).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

import diversed_hf.testbed as testbed
from diversed_hf import ExactVerifier, enable_diversed
from diversed_hf.cli.evaluation import load_task_data, run_method
from diversed_hf.cli.sections import refresh_head_sections
from diversed_hf.lab.bench.stats import paired_difference
from diversed_hf.lab.cli_utils import ArgumentParser, add_debug_flag, run_script, write_text_atomic
from diversed_hf.lab.tasks import get_task

REPO = Path(__file__).resolve().parents[1]
#: (case, pair, draft, head, task, temperature, chain depth, tree knobs, new tokens): each head at its card's setting
CASES = (
    (
        "testbed arith",
        "testbed",
        None,
        "arith",
        "arith",
        1.0,
        5,
        dict(assistant_tree_top_k=3, assistant_tree_size=12),
        100,
    ),
    (
        "testbed summary",
        "testbed",
        None,
        "summary",
        "summary",
        1.0,
        5,
        dict(assistant_tree_top_k=3, assistant_tree_size=12),
        100,
    ),
    (
        "smollm2 arith_chat",
        "smollm2",
        "eagle-tasks",
        "arith_chat",
        "arith_chat",
        1.0,
        3,
        dict(assistant_tree_top_k=4, assistant_tree_size=12),
        64,
    ),
)
CHAIN = dict(assistant_tree_top_k=1)  # a chain, whatever the draft's generation config says


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num_prompts", type=int, default=200, help="held-out test prompts per case (default 200)")
    parser.add_argument("--num_sampling_seeds", type=int, default=2, help="samples of each prompt (default 2)")
    parser.add_argument("--batch_size", type=int, default=25, help="prompts per generate call (default 25)")
    parser.add_argument(
        "--output_dir", default=None, help="default results/tree_heads (results_quick/... with --quick)"
    )
    parser.add_argument("--quick", action="store_true", help="8 prompts, one seed, the testbed arith head: a smoke run")
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    for name in ("num_prompts", "num_sampling_seeds", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} is {getattr(args, name)}; it must be at least 1.")
    if args.quick:
        args.num_prompts, args.num_sampling_seeds = min(args.num_prompts, 8), 1
    default = REPO / ("results_quick" if args.quick else "results") / "tree_heads"
    args.output_dir = Path(args.output_dir) if args.output_dir else default
    return args


def measure_case(case: tuple, args) -> dict:
    name, pair, draft_name, head_name, task, temperature, depth, tree, max_new_tokens = case
    if pair == "testbed":
        target, draft, tokenizer = testbed.load_pair()
        head = testbed.load_head(head_name)
    else:
        target, draft, tokenizer = testbed.load_pair(pair, draft=draft_name)
        head = testbed.load_head(head_name, pair=pair, draft=draft_name)
    enable_diversed(target)
    data = load_task_data(task, "test", args.num_prompts, 0)
    prompts, references = list(data["prompt"]), list(data["reference"])
    score = get_task(task).reward
    methods = {
        "target-only": dict(verifier=None, head=None, generate_options=None),
        "SD, chain": dict(verifier=ExactVerifier(), head=None, generate_options=CHAIN),
        "SD, tree": dict(verifier=ExactVerifier(), head=None, generate_options=tree),
        "DIVERSED, chain": dict(verifier=None, head=head, generate_options=CHAIN),
        "DIVERSED, tree": dict(verifier=None, head=head, generate_options=tree),
    }
    rows = {}
    for method, options in methods.items():
        rewards, totals = [], {"num_generated": 0, "num_rounds": 0, "seconds": 0.0}
        for seed in range(args.num_sampling_seeds):
            completions, run = run_method(
                target,
                draft,
                tokenizer,
                prompts,
                temperature=temperature,
                num_draft_tokens=depth,
                max_new_tokens=max_new_tokens,
                batch_size=args.batch_size,
                seed=seed,
                **options,
            )
            rewards += list(enumerate(score(completions, references)))
            totals = {key: totals[key] + run[key] for key in totals}
        rows[method] = {
            "quality": sum(reward for _, reward in rewards) / len(rewards),
            "rewards": rewards,
            "tokens_per_round": totals["num_generated"] / totals["num_rounds"] if totals["num_rounds"] else None,
            "tokens_per_second": totals["num_generated"] / max(totals["seconds"], 1e-9),
        }
        print(
            f"{name} / {method}: quality {rows[method]['quality']:.3f}, "
            f"tokens/round {rows[method]['tokens_per_round']}",
            flush=True,
        )
    exact = ("target-only", "SD, chain", "SD, tree")
    for method, row in rows.items():  # an exact method against the other exact ones
        reference = [reward for other in exact if other != method for reward in rows[other]["rewards"]]
        row["vs_target"] = paired_difference(row["rewards"], reference)
    rows["DIVERSED, tree"]["vs_chain"] = paired_difference(
        rows["DIVERSED, tree"]["rewards"], rows["DIVERSED, chain"]["rewards"]
    )
    setting = dict(
        pair=pair,
        draft=draft_name or "testbed draft",
        head=head_name,
        task=task,
        metric=get_task(task).metric,
        temperature=temperature,
        depth=depth,
        tree=tree,
        max_new_tokens=max_new_tokens,
        num_prompts=len(prompts),
        num_sampling_seeds=args.num_sampling_seeds,
        batch_size=args.batch_size,
        threads=torch.get_num_threads(),
    )
    return {"setting": setting, "rows": rows}


def interval(result: dict | None) -> str:
    if result is None:
        return "–"
    return f"{result['delta']:+.3f} [{result['low']:+.3f}, {result['high']:+.3f}]"


def verdict(result: dict) -> str:
    """One sentence: does the head over the tree accept more per round than over the chain at the same quality?"""
    rows = result["rows"]
    chain, tree = rows["DIVERSED, chain"], rows["DIVERSED, tree"]
    more = tree["tokens_per_round"] > chain["tokens_per_round"]
    paired = tree["vs_chain"]
    same = paired["low"] <= 0.0 <= paired["high"]
    per_round = f"{tree['tokens_per_round']:.2f} tokens per round against {chain['tokens_per_round']:.2f}"
    quality = f"quality over the tree minus over the chain {interval(paired)}"
    if more and same:
        return f"the head over the tree accepts more per round ({per_round}) at the same quality ({quality}: the interval holds 0)."
    if more:
        return f"the head over the tree accepts more per round ({per_round}) but its quality moves ({quality})."
    return f"the head over the tree does not accept more per round ({per_round}; {quality})."


def page(results: dict, command: str) -> str:
    lines = [
        f"Measured with `{command}` on this machine's CPU, one thread. Each head runs at the temperature and draft "
        "length its card was measured at, on its task's held-out test prompts (the first prompts of the test split), "
        "every prompt sampled once per seed by every method. A tree keeps the chain's depth and verifies the "
        "draft's second guesses too (`DxK (M)`: D levels, the K best nodes of a level expanded into K children, the "
        "M best nodes verified; docs/method.md §8). Quality differences are paired over prompts with a 95 % "
        "bootstrap interval; the target's quality pools target-only and lossless SD (exact samples of `p`).",
        "",
    ]
    for name, result in results.items():
        if name == "settings":
            continue
        setting = result["setting"]
        tree = setting["tree"]
        shape = f"{setting['depth']}x{tree['assistant_tree_top_k']} ({tree['assistant_tree_size']})"
        lines += [
            f"**{name}**: the `{setting['head']}` head, {setting['pair']} pair with the {setting['draft']}, "
            f"`{setting['task']}` ({setting['metric']}), T = {setting['temperature']:g}, chain N = {setting['depth']} "
            f"against tree {shape}, {setting['num_prompts']} prompts x {setting['num_sampling_seeds']} seeds, "
            f"at most {setting['max_new_tokens']} new tokens, batches of {setting['batch_size']}.",
            "",
            "| method | quality | vs target (paired, 95 %) | tokens / round | tokens/s |",
            "|---|---|---|---|---|",
        ]
        for method, row in result["rows"].items():
            per_round = "–" if row["tokens_per_round"] is None else f"{row['tokens_per_round']:.2f}"
            lines.append(
                f"| {method} | {row['quality']:.3f} | {interval(row['vs_target'])} | {per_round} | "
                f"{row['tokens_per_second']:.1f} |"
            )
        lines += ["", f"Verdict: {verdict(result)}", ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    path = args.output_dir / "results.json"
    settings = {
        "num_prompts": args.num_prompts,
        "num_sampling_seeds": args.num_sampling_seeds,
        "batch_size": args.batch_size,
        "quick": args.quick,
    }
    results = json.loads(path.read_text()) if path.is_file() else {}
    if results.get("settings") != settings:
        results = {"settings": settings}
    torch.set_num_threads(1)
    for case in CASES[:1] if args.quick else CASES:
        if case[0] not in results:
            results[case[0]] = measure_case(case, args)
            write_text_atomic(path, json.dumps(results, indent=1) + "\n")
    command = "python benchmarks/tree_heads.py" + (" --quick" if args.quick else "")
    text = page(results, command)
    write_text_atomic(args.output_dir / "tree_heads.md", text)
    if not args.quick:
        write_text_atomic(REPO / "results" / "tree_heads.md", text)
        refresh_head_sections(REPO / "RESULTS.md", REPO / "results")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
