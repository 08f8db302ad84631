"""The real pair under lm-evaluation-harness (RESULTS.md "lm-evaluation-harness"; docs/lm_eval.md).

    python benchmarks/lm_eval_results.py --write_tasks   # docs/lm_eval/{arith_chat,synopsis}.jsonl from the registry
    python benchmarks/lm_eval_results.py                 # results/lm_eval{.md,/results.json}, RESULTS.md, docs/lm_eval.md
    python benchmarks/lm_eval_results.py --quick         # 8 prompts per task into results_quick/lm_eval (nothing shipped)

The harness-format tasks (``docs/lm_eval/*.yaml``, read with ``--include_path docs/lm_eval`` from the repository root)
are the held-out test splits of ``arith_chat`` (exact match of the final number) and ``synopsis`` (ROUGE-2 F1
against the reference sentence), each scored as the project's own task scores it (``docs/lm_eval/utils.py``), the
prompts as the project's tasks render them (SmolLM2's chat template). Each method is one ``lm_eval.simple_evaluate`` with the ``diversed`` model on the same model instances
(SmolLM2-135M-Instruct in bfloat16 with the task EagleDraft ``eagle-tasks``, one torch thread, the harness's batches
of ``--batch_size``, greedy): target-only, lossless SD, static ensembles and, on ``arith_chat``, the shipped head.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import torch

from diversed_hf.lab.cli_utils import (
    ArgumentParser,
    add_debug_flag,
    regenerate_lines,
    replace_marked_block,
    replace_section,
    run_script,
    write_text_atomic,
)

REPO = Path(__file__).resolve().parents[1]
TASKS_DIR = REPO / "docs" / "lm_eval"
TASKS = {"arith_chat": "arith_chat_lm", "synopsis": "synopsis_lm"}  # registry task -> harness task
METHODS = {
    "target-only": {},
    "lossless SD": {"verifier": "exact"},
    "static w=0.5": {"verifier": "static:0.5"},
    "static w=0.25": {"verifier": "static:0.25"},
    "DIVERSED head": {"diversed_head": "arith_chat"},
}


def write_tasks() -> None:
    """The held-out test splits as JSON lines beside the task YAMLs (prompt, answer)."""
    from diversed_hf import testbed  # noqa: F401  (registers the testbed's tasks)
    from diversed_hf.lab.tasks import load_task_dataset

    for task in TASKS:
        rows = load_task_dataset(task, split="test")
        lines = [json.dumps({"prompt": p, "answer": a}) for p, a in zip(rows["prompt"], rows["reference"])]
        write_text_atomic(TASKS_DIR / f"{task}.jsonl", "\n".join(lines) + "\n")
        print(f"{TASKS_DIR / f'{task}.jsonl'}: {len(lines)} held-out rows")


def _metric(results: dict, task: str) -> tuple[str, float]:
    scores = results["results"][task]
    name = "exact_match,none" if "exact_match,none" in scores else "rouge2,none"
    return name.split(",")[0], float(scores[name])


def measure(args) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    from diversed_hf import testbed
    from diversed_hf.lab import harness

    torch.set_num_threads(args.threads)
    target, draft, tokenizer = testbed.load_pair("smollm2", draft="eagle-tasks")
    head = testbed.load_head("arith_chat", pair="smollm2")
    manager = TaskManager(include_path=str(TASKS_DIR))
    rows = []
    for task, harness_task in TASKS.items():
        for name, rule in METHODS.items():
            if "diversed_head" in rule and task != "arith_chat":
                continue
            rule = {"diversed_head": head} if "diversed_head" in rule else rule
            model = harness.DiversedLM(
                pretrained=target,
                tokenizer=tokenizer,
                batch_size=args.batch_size,
                assistant_model=None if name == "target-only" else draft,
                **rule,
            )
            started = time.time()
            results = lm_eval.simple_evaluate(model=model, tasks=[harness_task], task_manager=manager, limit=args.limit)
            metric, score = _metric(results, harness_task)
            stats = model.speculation_summary()[harness_task]
            rows.append({"task": task, "method": name, "metric": metric, "score": score, **stats})
            print(f"{task} {name}: {metric} {score:.3f}, {stats} ({time.time() - started:.0f} s)", flush=True)
    return {
        "setting": {
            "pair": "SmolLM2-135M-Instruct (bfloat16) with the task EagleDraft eagle-tasks",
            "limit": args.limit,
            "batch_size": args.batch_size,
            "threads": args.threads,
            "decoding": "greedy (the tasks' generation_kwargs)",
            "torch": torch.__version__,
        },
        "rows": rows,
    }


def table(record: dict, command: str) -> str:
    setting = record["setting"]
    lines = regenerate_lines(command) + [
        f"lm-evaluation-harness (`diversed` model, docs/lm_eval.md) on harness-format versions of the held-out "
        f"`arith_chat` and `synopsis` test splits (`docs/lm_eval/*.yaml`, the first {setting['limit']} prompts of "
        f"each), {setting['pair']}, the harness's batches of {setting['batch_size']}, {setting['threads']} torch "
        f"thread(s), {setting['decoding']}. The metric is the task's (exact match of the final number, as "
        "the project's `exact_match`; ROUGE-2 F1); acceptance is accepted / drafted tokens, tokens/s the generated "
        "tokens over the time in `generate` (batched: speculation at batch "
        f'{setting["batch_size"]} is slower than batched target-only decoding on this CPU, RESULTS.md "Token '
        'trees").',
        "",
        "| task | method | metric | score | acceptance | tokens/round | tokens/s |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for row in record["rows"]:
        cells = [row["acceptance_rate"], row["tokens_per_round"], row["tokens_per_second"]]
        shown = [
            "-" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value) for value in cells
        ]
        score = f"{row['score']:.3f}"
        if row["metric"] == "exact_match":  # a share of the prompts: its binomial 95 % half-width
            score += f" ± {1.96 * math.sqrt(row['score'] * (1 - row['score']) / setting['limit']):.2f}"
        lines.append(f"| {row['task']} | {row['method']} | {row['metric']} | {score} | " + " | ".join(shown) + " |")
    lines += [
        "",
        "Exact match is a share of the prompts (± its binomial 95 % half-width); ROUGE-2 is a mean of per-prompt "
        "scores. Greedy decoding against a relaxed rule keeps the mixture's argmax, which is not the target's: a "
        "rule's quality under sampling (the bench's tables; the head's training temperature) need not carry over.",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write_tasks", action="store_true", help="only write docs/lm_eval/*.jsonl")
    parser.add_argument("--quick", action="store_true", help="8 prompts per task into results_quick/lm_eval")
    parser.add_argument("--limit", type=int, default=100, help="prompts per task (the first of its test split)")
    parser.add_argument("--batch_size", type=int, default=8, help="the harness's batch size")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument(
        "--table_only", action="store_true", help="re-render the table from results/lm_eval/results.json"
    )
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    if args.write_tasks:
        write_tasks()
        return 0
    if args.quick:
        args.limit = 8
    out = REPO / ("results_quick" if args.quick else "results") / "lm_eval"
    if args.table_only:
        record = json.loads((out / "results.json").read_text())
        args.limit = record["setting"]["limit"]
    else:
        record = measure(args)
        write_text_atomic(out / "results.json", json.dumps(record, indent=1) + "\n")
    command = "python benchmarks/lm_eval_results.py" + (f" --limit {args.limit}" if args.limit != 100 else "")
    text = table(record, command)
    write_text_atomic(out.parent / "lm_eval.md", text + "\n")
    if not args.quick:
        replace_section(REPO / "RESULTS.md", "lm-evaluation-harness", text)
        rows = text[text.index("| task |") :]  # the table and its reading, for the docs page
        replace_marked_block(REPO / "docs" / "lm_eval.md", rows, "lm-eval-table")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
