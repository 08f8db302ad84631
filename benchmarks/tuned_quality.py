"""The task-tuned target's quality beside the untuned one, on the same held-out prompts (docs/real_pair.md, "The
task-tuned target").

    python benchmarks/tuned_quality.py                                   # the shipped adapter, full test splits
                                                                       # (then its card and RESULTS.md get the table)
    python benchmarks/tuned_quality.py --adapter runs/tuned_target/checkpoints/checkpoint-100   # a run on the way
    python benchmarks/tuned_quality.py --num_examples 16                 # a quick look

For each task (``synopsis``: ROUGE-2 F1 x 100; ``arith_steps``: exact match of the final number, %), both targets
answer every test prompt ``--samples`` times at temperature 1 (top-k 0, top-p 1: the target distribution the paper's
quality claim is about) and once greedily, ``--batch_size`` prompts at a time, up to the task's length limit. The
table gives each target's mean and the tuned minus the untuned one, paired over prompts with a 95 % bootstrap interval
(:func:`diversed_hf.lab.bench.stats.paired_difference`), and the goals at temperature 1 (``synopsis`` >= 8,
``arith_steps`` >= 50 %).

**Resumable.** Each completion is appended to ``<output_dir>/records/<target>_<dtype>_<mode>_<task>_seed<seed>.jsonl``
as its batch finishes; a rerun scores only what is missing. The tuned target's records are keyed by a hash of the adapter's weights,
so another adapter never reuses them. Sampling is seeded per batch from ``--seed`` and the batch's first prompt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import sys
import time
from pathlib import Path

import torch

from diversed_hf.lab.cli_utils import ArgumentParser, check_output_dir, regenerate_lines, run_script, write_text_atomic

logger = logging.getLogger("tuned_quality")

REPO = Path(__file__).resolve().parents[1]
TASKS = ("synopsis", "arith_steps")
#: quality at temperature 1 the tuned target should reach (x100), per task
GOALS = {"synopsis": 8.0, "arith_steps": 50.0}
MODES = {
    "t1": {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0},
    "greedy": {"do_sample": False},
}
MODE_NAMES = {"t1": "temperature 1", "greedy": "greedy"}


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapter", default=None, help="the tuned LoRA adapter (default: the shipped one)")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS, help="tasks (default: both)")
    parser.add_argument("--num_examples", type=int, default=None, help="test prompts per task (default: all)")
    parser.add_argument("--samples", type=int, default=1, help="samples per prompt at temperature 1 (default 1)")
    parser.add_argument("--batch_size", type=int, default=16, help="prompts generated together (default 16)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"), help="the targets' dtype")
    parser.add_argument("--seed", type=int, default=0, help="seed of sampling (default 0)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--output_dir", default=None, help="default results/tuned_quality")
    args = parser.parse_args(argv)
    for name in ("num_examples", "samples", "batch_size", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be a positive integer, got {value}")
    return args


def adapter_key(adapter: Path) -> str:
    """A short hash of the adapter's weights: the tuned target's records belong to one adapter."""
    digest = hashlib.sha256((adapter / "adapter_model.safetensors").read_bytes()).hexdigest()
    return f"tuned-{digest[:10]}"


def read_records(path: Path) -> dict[tuple[int, int], dict]:
    """``{(prompt index, sample): record}`` written so far; a last line cut short by a killed run is dropped (and the
    file trimmed to the complete lines, so what is appended next starts on a line of its own)."""
    if not path.is_file():
        return {}
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    records = {}
    for number, line in enumerate(lines[:-1], 1):
        try:
            row = json.loads(line)
        except ValueError as error:
            raise ValueError(f"{path}, line {number}: not a record. Remove the file to answer again.") from error
        records[row["index"], row["sample"]] = row
    if lines[-1]:  # no newline at the end: the write a kill interrupted, answered again
        write_text_atomic(path, "".join(json.dumps(row) + "\n" for row in records.values()))
    return records


def answer(model, tokenizer, prompts: list[str], references: list[str], task, mode: str, args, path: Path) -> list:
    """Every ``(index, sample)`` of ``prompts`` answered and scored, reading ``path`` first and appending to it."""
    from tqdm.auto import tqdm

    samples = args.samples if mode == "t1" else 1
    done = read_records(path)
    todo = [(i, s) for s in range(samples) for i in range(len(prompts)) if (i, s) not in done]
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    with open(path, "a", encoding="utf-8") as stream, tqdm(total=len(todo), desc=path.stem) as bar:
        for start in range(0, len(todo), args.batch_size):
            batch = todo[start : start + args.batch_size]
            first = batch[0]
            # seeded per batch, from its first prompt
            torch.manual_seed(args.seed * 1_000_003 + first[1] * len(prompts) + first[0])
            encoded = tokenizer([prompts[i] for i, _ in batch], return_tensors="pt", padding=True)
            encoded.pop("token_type_ids", None)
            with torch.no_grad():
                out = model.generate(
                    **encoded.to(model.device),
                    **MODES[mode],
                    max_new_tokens=task.max_new_tokens,
                    pad_token_id=tokenizer.pad_token_id,
                )
            new = out[:, encoded["input_ids"].shape[1] :]  # (batch, new tokens)
            completions = tokenizer.batch_decode(new, skip_special_tokens=True)
            rewards = task.reward(completions, [references[i] for i, _ in batch])
            for (index, sample), completion, reward in zip(batch, completions, rewards):
                row = {"index": index, "sample": sample, "completion": completion, "reward": float(reward)}
                done[index, sample] = row
                stream.write(json.dumps(row) + "\n")
            stream.flush()
            bar.update(len(batch))
    tokenizer.padding_side = side
    return [(index, 100 * done[index, sample]["reward"]) for index in range(len(prompts)) for sample in range(samples)]


def summarise(scores: dict, tasks) -> dict:
    """Per task and mode: each target's mean (x100) and the tuned minus the untuned one, paired over prompts."""
    from diversed_hf.lab.bench.stats import paired_difference

    table = {}
    for task in tasks:
        for mode in MODES:
            untuned, tuned = scores["untuned", mode, task], scores["tuned", mode, task]
            table[f"{task}/{mode}"] = {
                "untuned": sum(r for _, r in untuned) / len(untuned),
                "tuned": sum(r for _, r in tuned) / len(tuned),
                "difference": paired_difference(tuned, untuned),
            }
    return table


def render(results: dict, command: str) -> str:
    lines = [
        *regenerate_lines(command),
        f"SmolLM2-135M-Instruct untuned and with the adapter {results['adapter']} merged, in {results['dtype']}, on "
        f"the test splits ({', '.join(f'{t}: {n} prompts' for t, n in results['prompts'].items())}); temperature 1 "
        f"with top-k 0 and top-p 1, {results['samples']} sample(s) per prompt, and greedy. {results['environment']}",
        "",
        "| task | decoding | untuned | tuned | tuned - untuned [95 % CI] | goal at temperature 1 |",
        "|---|---|---:|---:|---:|---|",
    ]
    for key, row in results["table"].items():
        task, mode = key.split("/")
        diff = row["difference"]
        goal = ""
        if mode == "t1":
            met = "met" if row["tuned"] >= GOALS[task] else f"missed by {GOALS[task] - row['tuned']:.1f}"
            goal = f">= {GOALS[task]:g}: {met}"
        lines.append(
            f"| `{task}` | {MODE_NAMES[mode]} | {row['untuned']:.1f} | {row['tuned']:.1f} | "
            f"{diff['delta']:+.1f} [{diff['low']:+.1f}, {diff['high']:+.1f}] | {goal} |"
        )
    lines += ["", "Quality is ROUGE-2 F1 x 100 for `synopsis` and exact match (%) for `arith_steps`."]
    missed = [
        task
        for task in GOALS
        if f"{task}/t1" in results["table"] and results["table"][f"{task}/t1"]["tuned"] < GOALS[task]
    ]
    gaps = [
        f"`{task}` {results['table'][f'{task}/greedy']['tuned']:.1f} greedy against "
        f"{results['table'][f'{task}/t1']['tuned']:.1f} at temperature 1"
        for task in missed
        if f"{task}/greedy" in results["table"]
    ]
    if gaps:
        lines += [
            "",
            "Where a goal at temperature 1 is missed, the same tuned target decoded greedily shows how much of the task "
            "it has learnt at its mode: " + "; ".join(gaps) + ". The difference is the probability the 135M model "
            "still puts on other continuations, which sampling with top-k 0 and top-p 1 draws from.",
        ]
    return "\n".join(lines)


def load_targets(adapter: Path, dtype):
    """``{"untuned": model, "tuned": model}`` and the tokenizer."""
    from diversed_hf.testbed import smollm2, smollm2_tuned

    untuned, tokenizer = smollm2.load_smollm2_target(torch_dtype=dtype)
    tuned, _ = smollm2_tuned.load_tuned_target(torch_dtype=dtype, adapter=adapter)
    return {"untuned": untuned, "tuned": tuned}, tokenizer


def main(argv=None, targets=None) -> int:
    """Run the comparison; ``targets() -> ({"untuned": model, "tuned": model}, tokenizer)`` replaces the real
    models (tests pass tiny ones)."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from diversed_hf.lab.tasks import get_task, load_task_dataset
    from diversed_hf.testbed import smollm2_tuned

    adapter = Path(args.adapter) if args.adapter else smollm2_tuned.TUNED_DIR
    smollm2_tuned.check_tuned_files(adapter, eagle=None)  # before any model loads
    output_dir = Path(args.output_dir or REPO / "results" / "tuned_quality")
    check_output_dir(output_dir, "--output_dir")
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    models, tokenizer = targets() if targets is not None else load_targets(adapter, dtype)
    keys = {"untuned": "untuned", "tuned": adapter_key(adapter)}
    (output_dir / "records").mkdir(parents=True, exist_ok=True)
    started, scores, prompts = time.time(), {}, {}
    for task_name in args.tasks:
        task = get_task(task_name)
        data = load_task_dataset(task_name, split="test", num_examples=args.num_examples)
        prompts[task_name] = len(data)
        for name, model in models.items():
            for mode in MODES:
                path = output_dir / "records" / f"{keys[name]}_{args.dtype}_{mode}_{task_name}_seed{args.seed}.jsonl"
                scores[name, mode, task_name] = answer(
                    model, tokenizer, list(data["prompt"]), list(data["reference"]), task, mode, args, path
                )
    results = {
        "adapter": _shown(adapter),
        "adapter_key": keys["tuned"],
        "dtype": args.dtype,
        "samples": args.samples,
        "prompts": prompts,
        "seconds_this_run": round(time.time() - started),
        "environment": f"Python {platform.python_version()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s), {platform.machine()}.",
        "table": summarise(scores, args.tasks),
    }
    given = sys.argv[1:] if argv is None else list(argv)
    command = " ".join(["python benchmarks/tuned_quality.py", *given])
    section = render(results, command)
    write_text_atomic(output_dir / "results.json", json.dumps(results, indent=2) + "\n")
    write_text_atomic(output_dir / "quality.md", section + "\n")
    print(section)
    shipped = adapter.resolve() == smollm2_tuned.TUNED_DIR.resolve() and targets is None
    if shipped and args.num_examples is None and set(args.tasks) == set(TASKS) and args.output_dir is None:
        ship(results, command, adapter, output_dir)
    return 0


def _shown(path: Path) -> str:
    """``path`` as the section shows it: relative to the repository when inside it."""
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def summary_line(results: dict) -> str:
    """One sentence per task and decoding: tuned beside untuned, with the paired interval."""
    parts = []
    for key, row in results["table"].items():
        task, mode = key.split("/")
        diff = row["difference"]
        parts.append(
            f"`{task}` {MODE_NAMES[mode]}: {row['tuned']:.1f} tuned against {row['untuned']:.1f} untuned "
            f"({diff['delta']:+.1f} [{diff['low']:+.1f}, {diff['high']:+.1f}])"
        )
    return "; ".join(parts)


def ship(results: dict, command: str, adapter: Path, output_dir: Path) -> None:
    """The shipped adapter's ``training.json`` and card (beside it and in ``model_cards/``) get the measured quality,
    staged in ``output_dir/shipments`` and shipped; RESULTS.md its section."""
    import subprocess

    from diversed_hf.cli import ship as shipping
    from diversed_hf.testbed import ASSETS_DIR
    from diversed_hf.training.tuned_card import render_tuned_card

    record = json.loads((adapter / "training.json").read_text())
    record["measured"] = {
        "summary": summary_line(results),
        "prompts": ", ".join(f"{task}: all {n} test prompts" for task, n in results["prompts"].items()),
        "metrics": "ROUGE-2 F1 x 100 (synopsis), exact match of the final number in % (arith_steps)",
        "command": command,
    }
    files = {"training.json": json.dumps(record, indent=2) + "\n", "README.md": render_tuned_card(record)}
    name = adapter.resolve().relative_to(ASSETS_DIR.resolve()).as_posix()
    shipping.ship(shipping.stage(output_dir, name, files, card="smollm2_tuned_target.md", measured_by=command))
    write_text_atomic(REPO / "results" / "tuned_quality.md", render(results, command) + "\n")
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "make_results.py"), "--head-sections-only"], check=True)


if __name__ == "__main__":
    sys.exit(run_script(main))
