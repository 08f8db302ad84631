"""Compare trained heads on the same held-out prompts: the ablation table of RESULTS.md.

    python benchmarks/ablation.py --task arith \\
        --heads "hidden, linear=runs/abl_arith_h/head" "hidden + features, linear=runs/abl_arith_hf/head" \\
                "features, linear=runs/abl_arith_f/head" "shipped#seed1=runs/arith_s1/head"

Every head verifies the same ``--num-prompts`` held-out prompts x ``--num-samples`` samples as target-only
decoding and lossless SD (one ``diversed-hf bench`` run, :func:`diversed_hf.lab.bench.run_bench`; untimed), so
each head's quality is compared with the target distribution's on the same prompts (paired, 95 % bootstrap
interval; target-only and SD pooled). Per head the table shows what it reads (hidden states and/or
distribution features), its architecture and size, acceptance and its ratio to SD's, quality, and the
training time recorded in its ``training_config.json``. Heads named ``NAME#...`` (e.g. ``shipped#seed1``)
are training seeds of one configuration: a line gives their mean and spread (standard deviation).

Writes ``ablation_<task>.json`` (the bench's rows) and ``ablation_<task>.md`` (the table and the command) into
``--output-dir`` (default ``runs/ablation``; checked before the run). ``benchmarks/make_results.py`` puts the tables of
``results/`` into RESULTS.md, so pass ``--output-dir results`` to publish them.

``--front``: the heads are one recipe trained with several ``lambda_acceptance`` (the acceptance bonus; read from
each head's ``training_config.json``), and the table is their acceptance-quality front, by lambda. The operating
point to ship (:func:`operating_point`) is the head with the highest acceptance whose paired interval against the
target distribution reaches 0 (upper end >= 0: no measured loss at this sample size). The files are then
``front_<task>.json`` / ``front_<task>.md`` and ``front_<task>_results.json``: target-only, SD and the chosen head
in the model-card results format, with the front and the rule under ``selection`` (the card shows them); put it
next to the head with ``diversed-hf card DIR --results front_<task>_results.json``.

Options take both spellings (``--num-prompts``, ``--num_prompts``). A bad argument or file ends as one line
with exit status 2 (``--debug``: the traceback).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

import torch
import yaml

from diversed_hf import DiversedHead, testbed
from diversed_hf.lab.bench import BenchConfig, Method, load_task, parse_methods, run_bench
from diversed_hf.lab.bench.report import _cell, _delta_cell
from diversed_hf.lab.bench.schema import BenchResult, task_setting
from diversed_hf.lab.cli_utils import ArgumentParser, add_debug_flag, check_output_dir, run_script
from diversed_hf.lab.tasks import metric_label
from diversed_hf.verifiers import HeadVerifier

REPO = Path(__file__).resolve().parents[1]


def _head_spec(text: str) -> tuple[str, str]:
    name, sep, path = text.rpartition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--heads entries are NAME=DIR (or NAME=testbed:TASK), got {text!r}.")
    return name, path


def _load(path: str) -> tuple[DiversedHead, dict]:
    if path.startswith("testbed:"):
        task = path.split(":", 1)[1]
        return testbed.load_head(task), _training_config(testbed.ASSETS_DIR / "heads" / task)
    return DiversedHead.from_pretrained(path), _training_config(Path(path))


def _training_config(directory: Path) -> dict:
    path = directory / "training_config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _reads(head: DiversedHead) -> str:
    parts = ["hidden states"] if head.config.use_hidden_states else []
    if head.config.features:
        parts.append(f"{len(head.config.features)} features")
    return " + ".join(parts)


FINETUNED = " (fine-tuned draft)"  # suffix of the rows that draft with the task's fine-tuned draft (the transfer)


def table(rows: list[dict], heads: dict[str, tuple[DiversedHead, dict]]) -> str:
    sd = next(r for r in rows if r["family"] == "sd")
    sd_finetuned = next((r for r in rows if r["family"] == "sd-finetuned"), None)
    metric = metric_label(rows[0]["quality_metric"])
    lines = [
        f"| head | reads | architecture | parameters | acceptance | x SD | {metric} | vs target distribution [95 % CI] "
        "| training time |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        if row["family"] != "diversed":
            lines.append(
                f"| {row['method']} | – | – | – | {_pct(row['acceptance_rate'])} | – "
                f"| {100 * row['quality']:.1f} | {_delta_cell(row)} | – |"
            )
            continue
        transferred = row["method"].endswith(FINETUNED)  # a pair-agnostic head with another draft: vs SD with it
        head, training = heads[row["method"].removesuffix(FINETUNED)]
        baseline = sd_finetuned if transferred else sd
        seconds = training.get("train_seconds")
        threads = training.get("torch_threads")
        trained = "–" if seconds is None else f"{seconds / 60:.1f} min" + (f" ({threads} thread)" if threads else "")
        lines.append(
            f"| {row['method']} | {_reads(head)} | {head.config.architecture} | {sum(t.numel() for t in head.parameters())} "
            f"| {_pct(row['acceptance_rate'])} | {_cell(_times(row['acceptance_rate'], baseline), '.2f', suffix='x')} "
            f"| {100 * row['quality']:.1f} | {_delta_cell(row)} | {trained} |"
        )
    groups: dict[str, list[dict]] = {}
    for row in rows:
        if row["family"] == "diversed" and "#" in row["method"] and not row["method"].endswith(FINETUNED):
            groups.setdefault(row["method"].split("#")[0], []).append(row)
    for name, members in groups.items():
        if len(members) < 2:
            continue
        ratios = [_times(r["acceptance_rate"], sd) for r in members]
        if None in ratios:
            continue
        deltas = [100 * r["quality_delta"] for r in members]
        lines.append(
            f"| **{name}: {len(members)} seeds** | | | | {_pct(statistics.mean(r['acceptance_rate'] for r in members))} "
            f"± {100 * statistics.stdev(r['acceptance_rate'] for r in members):.1f} "
            f"| {statistics.mean(ratios):.2f}x ± {statistics.stdev(ratios):.2f} | | {statistics.mean(deltas):+.1f} "
            f"± {statistics.stdev(deltas):.1f} (mean ± sd over seeds) | |"
        )
    return "\n".join(lines)


#: training settings a recipe line spells out when a head was trained with another value than the task's YAML has
RECIPE_SETTINGS = ("max_steps", "num_generations", "per_device_train_batch_size", "learning_rate")


def recipes(task: str, heads: dict[str, tuple[DiversedHead, dict]]) -> str:
    """How each head was trained: the ``train_head.py`` command its recorded training configuration implies."""
    recipe = REPO / "training" / "configs" / f"testbed_{task}.yaml"
    defaults = yaml.safe_load(recipe.read_text()) if recipe.is_file() else {}
    lines = []
    for name, (head, training) in heads.items():
        if not training.get("lambda_acceptance"):
            continue
        flags = [
            f"--seed {training.get('seed', 0)}",
            f"--lambda_acceptance {training['lambda_acceptance']:g}",
            f"--head_architecture {head.config.architecture}",
        ]
        flags += [
            f"--{key} {training[key]:g}"
            for key in RECIPE_SETTINGS
            if key in training and key in defaults and float(training[key]) != float(defaults[key])
        ]
        if head.config.features:
            flags.append("--head_features " + " ".join(head.config.features))
        if not head.config.use_hidden_states:
            flags.append("--head_use_hidden_states false")
        offset = training.get("calibration_logit_offset") or 0.0
        note = ""
        if defaults.get("head_features") and not head.config.features:  # the YAML lists features; this head read none
            note = " with `head_features: []` in a copy of the YAML"
        if offset:
            note += f" (then a calibration offset of {offset:+g} on the output logit, training/calibrate_head.py)"
        lines.append(
            f"- {name}: `python training/train_head.py --config training/configs/testbed_{task}.yaml "
            f"--threads 1 {' '.join(flags)} --output_dir runs/... --head_dir runs/.../head`{note}"
        )
    return "\n".join(lines)


#: the shipping rule of a lambda sweep (--front), as the card and RESULTS.md state it
SELECTION_RULE = (
    "the head with the highest acceptance whose paired 95 % interval against the target distribution "
    "reaches 0 (upper end >= 0)"
)


def operating_point(rows: list[dict]) -> dict | None:
    """The head row :data:`SELECTION_RULE` picks among the heads' rows (decoded with the pair's own draft), or
    ``None`` when no head's interval reaches 0."""
    eligible = [
        row
        for row in rows
        if row["family"] == "diversed"
        and not row["method"].endswith(FINETUNED)
        and row.get("acceptance_rate") is not None
        and row.get("quality_delta_high") is not None
        and row["quality_delta_high"] >= 0
    ]
    return max(eligible, key=lambda row: row["acceptance_rate"], default=None)


def _lambda(training: dict) -> float | None:
    value = training.get("lambda_acceptance")
    return None if value is None else float(value)


def front_entries(rows: list[dict], heads: dict[str, tuple[DiversedHead, dict]]) -> list[dict]:
    """One entry per head (own draft), by lambda: what the front table and the card's ``selection`` show."""
    sd = next(r for r in rows if r["family"] == "sd")
    entries = []
    for row in rows:
        if row["family"] != "diversed" or row["method"].endswith(FINETUNED):
            continue
        entries.append(
            {
                "method": row["method"],
                "lambda_acceptance": _lambda(heads[row["method"]][1]),
                "acceptance_rate": row["acceptance_rate"],
                "acceptance_ratio_vs_sd": _times(row["acceptance_rate"], sd),
                "quality": row["quality"],
                "quality_delta": row.get("quality_delta"),
                "quality_delta_low": row.get("quality_delta_low"),
                "quality_delta_high": row.get("quality_delta_high"),
            }
        )
    return sorted(entries, key=lambda e: (e["lambda_acceptance"] is None, e["lambda_acceptance"] or 0.0))


def front_table(rows: list[dict], heads: dict[str, tuple[DiversedHead, dict]]) -> str:
    """The acceptance-quality front of a lambda sweep, by lambda, with the operating point the rule picks."""
    metric = metric_label(rows[0]["quality_metric"])
    chosen = operating_point(rows)
    lines = [
        f"| lambda | head | acceptance | x SD | {metric} | vs target distribution [95 % CI] | interval reaches 0 |",
        "|---:|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        if row["family"] in ("target-only", "sd"):
            lines.append(
                f"| – | {row['method']} | {_pct(row['acceptance_rate'])} | – | {100 * row['quality']:.1f} "
                f"| {_delta_cell(row)} | – |"
            )
    by_name = {row["method"]: row for row in rows}
    for entry in front_entries(rows, heads):
        row = by_name[entry["method"]]
        reaches = "–" if entry["quality_delta_high"] is None else ("yes" if entry["quality_delta_high"] >= 0 else "no")
        name = f"**{entry['method']}** (chosen)" if chosen is not None and row is chosen else entry["method"]
        lam = "–" if entry["lambda_acceptance"] is None else f"{entry['lambda_acceptance']:g}"
        lines.append(
            f"| {lam} | {name} | {_pct(entry['acceptance_rate'])} "
            f"| {_cell(entry['acceptance_ratio_vs_sd'], '.2f', suffix='x')} | {100 * row['quality']:.1f} "
            f"| {_delta_cell(row)} | {reaches} |"
        )
    if chosen is None:
        verdict = "No head's interval reaches 0: none of these heads meets the rule."
    else:
        lam = _lambda(heads[chosen["method"]][1])
        verdict = (
            f"By this rule the head to ship is **{chosen['method']}**"
            + (f" (lambda = {lam:g})" if lam is not None else "")
            + "."
        )
    return "\n".join(lines) + "\n\n" + verdict


def front_results(result, heads: dict[str, tuple[DiversedHead, dict]], command: str) -> dict | None:
    """The chosen head's ``results.json`` (model-card format): target-only, SD and its row (as ``DIVERSED``),
    with the front and the rule under ``selection``; ``None`` when no head meets the rule."""
    rows = result.rows
    chosen = operating_point(rows)
    if chosen is None:
        return None
    own = [dict(row) for row in rows if row["family"] in ("target-only", "sd")]
    own.append(dict(chosen, method="DIVERSED", head_task=result.task))
    lam = _lambda(heads[chosen["method"]][1])
    selection = {
        "rule": SELECTION_RULE,
        "chosen": chosen["method"],
        "lambda_acceptance": lam,
        "front": front_entries(rows, heads),
        "command": command,
    }
    return {"setting": task_setting(result), "rows": own, "selection": selection}


def _times(acceptance, baseline: dict | None) -> float | None:
    """``acceptance`` as a multiple of ``baseline``'s acceptance; ``None`` without one (no SD row, or it drafted
    nothing)."""
    if acceptance is None or baseline is None or not baseline.get("acceptance_rate"):
        return None
    return acceptance / baseline["acceptance_rate"]


def _pct(value) -> str:
    return "–" if value is None else f"{100 * value:.1f} %"


def _parser() -> ArgumentParser:
    """The command line: the heads, the held-out prompts, where the table goes and what it shows."""
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", required=True, help="arith or summary (the testbed's tasks)")
    parser.add_argument("--heads", required=True, nargs="+", type=_head_spec, help="NAME=DIR or NAME=testbed:TASK")
    parser.add_argument("--num-prompts", type=int, default=400)
    parser.add_argument("--num-samples", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1, help="held-out prompts and sampling seed")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--output-dir",
        default=str(REPO / "runs" / "ablation"),
        help="where the table goes; `results` to publish it in RESULTS.md (benchmarks/make_results.py)",
    )
    parser.add_argument(
        "--finetuned-draft",
        action="store_true",
        help="also decode with the task's fine-tuned draft (testbed.load_finetuned_draft): SD, and every "
        "features-only head (pair-agnostic: trained with the testbed draft, used with another)",
    )
    parser.add_argument(
        "--front",
        action="store_true",
        help="the heads are a lambda sweep of one recipe: write the acceptance-quality front by lambda and "
        "the chosen head's results (front_<task>.md/.json, front_<task>_results.json)",
    )
    parser.add_argument(
        "--rows-from",
        default=None,
        help="re-render the table from the rows of an earlier run (its ablation_<task>.json) instead of decoding",
    )
    add_debug_flag(parser)
    return parser


def _check_front(heads: dict[str, tuple[DiversedHead, dict]]) -> None:
    """``--front`` orders the heads by their recorded ``lambda_acceptance``: refuse heads without one."""
    unknown = [name for name, (_, training) in heads.items() if _lambda(training) is None]
    if unknown:
        raise ValueError(
            f"--front: the heads {unknown} record no lambda_acceptance in their training_config.json; "
            "a front is a lambda sweep of heads train_head.py saved."
        )


def _saved_rows(path: str, task: str, front: bool) -> tuple[list[dict], BenchResult | None]:
    """The rows of an earlier run (``--rows-from``), and with ``--front`` its bench result (the chosen head's
    results need the run's setting); ``None`` without ``--front``."""
    saved = json.loads(Path(path).read_text())
    rows = saved["rows"] if isinstance(saved, dict) else saved
    if not front:
        return rows, None
    return rows, BenchResult(task=task, rows=rows, examples={}, notes=[], meta=saved["meta"])


def _decode(
    args: argparse.Namespace, heads: dict[str, tuple[DiversedHead, dict]], output: Path, stem: str
) -> BenchResult:
    """One untimed bench run: target-only, SD and every head on the same held-out prompts (with
    ``--finetuned-draft`` also SD and the features-only heads with the fine-tuned draft); its rows are saved as
    ``<stem>.json`` (with ``--front`` together with the run's setting, which the front re-renders with)."""
    target, draft, tokenizer = testbed.load_pair()
    task = load_task(args.task, args.num_prompts, seed=args.seed)
    methods, _ = parse_methods(["target", "sd"])
    methods += [Method(name, "diversed", HeadVerifier(head)) for name, (head, _) in heads.items()]
    finetuned = testbed.load_finetuned_draft(args.task) if args.finetuned_draft else None
    if finetuned is not None:
        methods += parse_methods(["sd-ft"], has_finetuned_draft=True)[0]
        methods += [
            Method(name + FINETUNED, "diversed", HeadVerifier(head), draft="finetuned")
            for name, (head, _) in heads.items()
            if not head.config.use_hidden_states
        ]
    config = BenchConfig(
        num_prompts=args.num_prompts,
        num_samples=args.num_samples,
        num_timing_prompts=0,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        num_html_examples=0,
        cost_tokens=4,
    )
    result = run_bench(target, draft, tokenizer, task, methods, config, finetuned_draft=finetuned, progress=True)
    output.mkdir(parents=True, exist_ok=True)
    saved = {"rows": result.rows, "meta": result.meta} if args.front else result.rows
    (output / f"{stem}.json").write_text(json.dumps(saved, indent=2, default=str) + "\n")
    return result


def _command(argv: list[str] | None) -> str:
    """The command line that decodes these rows (without ``--rows-from``: not the one that re-rendered them)."""
    given = list(argv if argv is not None else sys.argv[1:])
    for flag in ("--rows-from", "--rows_from"):
        if flag in given:
            index = given.index(flag)
            del given[index : index + 2]
    return "python benchmarks/ablation.py " + " ".join(shlex.quote(a) for a in given)


def _front_text(args: argparse.Namespace, rows: list[dict], heads: dict, command: str) -> str:
    """``front_<task>.md``: the setting, the rule, the command, the front by lambda and each head's recipe."""
    return (
        f"On `{args.task}`: one recipe (`training/configs/testbed_{args.task}.yaml`) trained with several values of "
        f"`lambda_acceptance`, the weight of the acceptance bonus; {args.num_prompts} held-out prompts (seed "
        f"{args.seed}) x {args.num_samples} samples, temperature 1, N = 5, at most {args.max_new_tokens} new tokens, "
        f"every head on the same prompts as target-only and SD. The shipped head is {SELECTION_RULE}. "
        f"Regenerate with:\n\n```bash\n{command}\n```\n\n{front_table(rows, heads)}\n\nThe heads (`runs/` is "
        f"not shipped; each line rebuilds one):\n\n{recipes(args.task, heads)}\n"
    )


def _ablation_text(args: argparse.Namespace, rows: list[dict], heads: dict, command: str) -> str:
    """``ablation_<task>.md``: the setting, the command, the head table and each head's recipe."""
    transfer_note = (
        "; rows marked *(fine-tuned draft)* decode with the task's fine-tuned draft instead (a features-only head "
        "does not read the pair's hidden states, so it runs with any draft sharing the tokenizer; its x SD is "
        "against SD with that draft)"
        if any(r["method"].endswith(FINETUNED) for r in rows)
        else ""
    )
    return (
        f"On `{args.task}`: {args.num_prompts} held-out prompts (seed {args.seed}) x {args.num_samples} samples, "
        f"temperature 1, N = 5, at most {args.max_new_tokens} new tokens; every head on the same prompts as "
        f"target-only and SD{transfer_note}. Training times are as recorded by `train_head.py` on this shared 2-core machine "
        f"(other jobs ran alongside most of them). Regenerate with:\n\n"
        f"```bash\n{command}\n```\n\n{table(rows, heads)}\n\nThe heads (`runs/` is not shipped; each line "
        f"rebuilds one):\n\n{recipes(args.task, heads)}\n"
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    output = check_output_dir(args.output_dir)  # before the run, not after it
    torch.set_num_threads(args.threads)
    heads = {name: _load(path) for name, path in args.heads}
    stem = f"front_{args.task}" if args.front else f"ablation_{args.task}"
    if args.front:
        _check_front(heads)
    if args.rows_from:
        rows, result = _saved_rows(args.rows_from, args.task, args.front)
    else:
        result = _decode(args, heads, output, stem)
        rows = result.rows
    command = _command(argv)
    if args.front:
        text = _front_text(args, rows, heads, command)
        card_results = front_results(result, heads, command)
        output.mkdir(parents=True, exist_ok=True)
        (output / f"{stem}.md").write_text(text)
        if card_results is not None:
            (output / f"{stem}_results.json").write_text(json.dumps(card_results, indent=2, default=str) + "\n")
        print(text)
        return 0
    text = _ablation_text(args, rows, heads, command)
    output.mkdir(parents=True, exist_ok=True)
    (output / f"{stem}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
