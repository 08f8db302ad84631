"""How the real pair's EagleDraft improves with data (RESULTS.md, "Draft data scaling"): the same recipe distilled on
1x, 2x, 4x and 8x of the response positions today's default draft was trained on, each measured on the same held-out
prompts.

    python benchmarks/draft_scaling.py --data runs/collect_t1/data runs/collect_turns/data runs/collect_t07/data
    python benchmarks/draft_scaling.py --data runs/collect_t1/data --scales 0.01 0.02 --epochs 1 --quick   # smoke
    python benchmarks/draft_scaling.py --data ... --arch eagle3   # EAGLE-3 drafts on the same answers

Each scale takes the collections' shards in the order given until it holds ``scale x --unit`` response positions
(``--unit`` 589,000: what the shipped default draft was distilled on), as a view of symbolic links under
``--runs_dir`` (nothing copied), and distils a draft there with the shipped draft's settings (its ``training.json``:
learning rate, batch, loss weights, seed) for ``--epochs``, in batches of like lengths under ``--mixed_precision``
(``diversed_hf.training.eagle_distill.distill``; resumable: a rerun goes on from its checkpoints and skips the scales
measured). A scale the collections cannot fill yet is reported, not run. Every draft is measured on the same held-out
answers (the target's own to the held-out everyday prompts, half greedy and half at T = 0.7 as users decode,
collected once into ``--runs_dir``; a results file scored on another set is scored again): top-1
agreement and ``sum min(p, q)`` per unrolled step; then tokens per round and acceptance of lossless SD with the
draft's tree (``--tree``, the shipped shape) at batch 1, greedy, on ``--num_prompts`` held-out everyday prompts.
With ``--arch eagle3`` the drafts are EAGLE-3 ones (``--aux_layer_ids``, default the target's layers 2, L // 2,
L - 3): the chosen shards and the held-out answers are read again by the target for those layers
(``diversed_hf.training.eagle_features``, under ``--runs_dir``/eagle3, once for every scale), so both architectures
learn from the same answers. ``--num_layers 2`` distils drafts of two decoder layers (``x<scale>-2layers``), a table
of their own. Writes ``<output_dir>/results.json`` after each scale, and the section
(``<output_dir>/draft_scaling.md``, and RESULTS.md without ``--quick``) when done.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path

import torch

from diversed_hf.cli.sections import start_script
from diversed_hf.lab.cli_utils import ArgumentParser, regenerate_lines, replace_section, run_script, write_text_atomic

REPO = Path(__file__).resolve().parents[1]
TITLE = "Draft data scaling"  # the RESULTS.md section (--section names another, for a variant of the recipe)
#: response positions the shipped default EagleDraft was distilled on (its training.json)
UNIT = 589_000


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", nargs="+", required=True, help="collections (train_eagle_draft.py --data_only)")
    parser.add_argument("--scales", type=float, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--unit", type=int, default=UNIT, help="response positions of scale 1")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument(
        "--learning_rate",
        type=float,
        default=None,
        help="default the shipped EAGLE-1-style draft's (its training.json)",
    )
    parser.add_argument(
        "--mixed_precision",
        choices=("no", "bf16"),
        default="bf16",
        help="bf16: the loss under bfloat16 autocast over float32 weights; no: float32",
    )
    parser.add_argument(
        "--tree", default="3,4,12", help="depth,top_k,size of the tree the drafts are measured with (the shipped one)"
    )
    parser.add_argument("--num_prompts", type=int, default=10, help="held-out everyday prompts timed per draft")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs_dir", default=str(REPO / "runs" / "draft_scaling"))
    parser.add_argument("--output_dir", default=None, help="default results/draft_scaling")
    parser.add_argument("--arch", choices=("eagle", "eagle3"), default="eagle", help="the drafts' architecture")
    parser.add_argument("--aux_layer_ids", type=int, nargs=3, default=None, help="with --arch eagle3: its layers")
    parser.add_argument(
        "--num_layers",
        type=int,
        default=1,
        help="decoder layers of the drafts (1: the shipped depth; 2: a table apart)",
    )
    parser.add_argument("--section", default=TITLE, help="the RESULTS.md section written")
    parser.add_argument("--quick", action="store_true", help="results_quick/, 2 held-out prompts")
    args = parser.parse_args(argv)
    if args.aux_layer_ids is not None and args.arch != "eagle3":
        parser.error("--aux_layer_ids names an EAGLE-3 draft's layers: add --arch eagle3")
    if min(args.scales) <= 0:
        parser.error(f"--scales must be positive, got {args.scales}")
    try:
        depth, top_k, size = (int(x) for x in args.tree.split(","))
    except ValueError:
        parser.error(f"--tree is {args.tree!r}: give depth,top_k,size, e.g. 4,3,12")
    args.tree = dict(num_assistant_tokens=depth, assistant_tree_top_k=top_k, assistant_tree_size=size)
    return args


def shard_positions(directory: Path) -> list[tuple[Path, int]]:
    """Each shard of a collection, in order, with its response positions (tokens after the prompts)."""
    return [(shard, positions) for shard, positions, _ in _shards(directory)]


def _shards(directory: Path) -> list[tuple[Path, int, float | None]]:
    """Each shard with its response positions and the seconds its decoding took (None for a shard written before
    shards recorded it)."""
    from safetensors import safe_open

    shards = sorted(Path(directory).glob("shard-*.safetensors"))
    if not shards:
        raise ValueError(f"--data {directory} holds no shard-*.safetensors: collect into it first.")
    counted = []
    for shard in shards:
        with safe_open(str(shard), "pt") as data:
            total = int(data.get_tensor("offsets")[-1])
            prompts = int(data.get_tensor("prompt_lengths").sum())
            seconds = (data.metadata() or {}).get("seconds")
        counted.append((shard, total - prompts, None if seconds is None else float(seconds)))
    return counted


def select_shards(collections: list[list[tuple[Path, int]]], budget: int) -> list[list[Path]] | None:
    """The first shards, collection by collection, whose positions reach ``budget``; None when all of them fall
    short."""
    chosen, held = [], 0
    for shards in collections:
        taken = []
        for shard, positions in shards:
            if held >= budget:
                break
            taken.append(shard)
            held += positions
        chosen.append(taken)
    return chosen if held >= budget else None


def data_view(chosen: list[list[Path]], data_dirs: list[Path], root: Path) -> list[Path]:
    """Per collection, a folder of links to its chosen shards and its manifest (nothing copied)."""
    views = []
    for index, (shards, source) in enumerate(zip(chosen, data_dirs, strict=True)):
        if not shards:
            continue
        view = root / f"data{index}"
        view.mkdir(parents=True, exist_ok=True)
        for shard in [*shards, source / "manifest.json"]:
            link = view / shard.name
            if not link.exists():
                os.symlink(shard.resolve(), link)
        views.append(view)
    return views


#: the held-out answers every draft is scored on: the target's, as users decode (half greedy, half at T = 0.7)
HELD_OUT = {"temperature": 0.7, "greedy_fraction": 0.5, "seed": 7}
HELD_OUT_NAME = "held_out_t0.7"


def held_out_answers(target, tokenizer, root: Path, num_prompts: int | None) -> Path:
    """The target's answers to the held-out everyday prompts in the modes users decode (:data:`HELD_OUT`): the fixed
    set every draft is scored on."""
    from diversed_hf.lab.tasks.chat_prompts import everyday_prompts
    from diversed_hf.training.eagle_data import CollectionSettings, collect

    directory = root / HELD_OUT_NAME
    prompts = [
        (
            tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True),
            160,
        )
        for p in everyday_prompts(num_prompts)
    ]
    settings = CollectionSettings(**HELD_OUT, batch_size=16, shard_size=64)
    collect(target, tokenizer, prompts, directory, settings, progress=False)
    return directory


def measure_draft(target, draft, tokenizer, held_out: Path, prompts: list[str], tree: dict) -> dict:
    """Held-out agreement per unrolled step, and lossless SD with the tree on ``prompts`` (batch 1, greedy)."""
    from diversed_hf.training.eagle_distill import held_out_agreement
    from diversed_hf.verifiers import ExactVerifier

    scores = held_out_agreement(draft, target, held_out)
    rounds = tokens = drafted = accepted = 0
    for prompt in prompts:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        inputs = tokenizer(text, return_tensors="pt", add_special_tokens=False)
        out = target.generate(
            **inputs, assistant_model=draft, verifier=ExactVerifier(), do_sample=False, max_new_tokens=64,
            return_dict_in_generate=True, **tree,
        )  # fmt: skip
        stats = out.speculation
        rounds += int(stats.num_rounds.sum())
        tokens += int(stats.num_generated.sum())
        drafted, accepted = drafted + stats.total_drafted, accepted + stats.total_accepted
    return {**scores, "tokens_per_round": tokens / max(rounds, 1), "tree_acceptance": accepted / max(drafted, 1)}


def measure_shipped(args, target, tokenizer, held_out: Path, prompts: list[str]) -> dict:
    """The shipped draft of ``--arch``, measured as every scale's (its data: its ``training.json``)."""
    from diversed_hf.testbed.smollm2 import EAGLE3_DIR, EAGLE_DIR, load_eagle_draft

    path = EAGLE_DIR if args.arch == "eagle" else EAGLE3_DIR
    draft = load_eagle_draft(target, path)
    if args.arch == "eagle3" and tuple(draft.config.aux_layer_ids) != args.layers:
        return {"skipped": f"it fuses layers {draft.config.aux_layer_ids}, not {list(args.layers)}"}
    measured = measure_draft(target, draft, tokenizer, held_out, prompts, args.tree)
    measured["held_out_positions"] = measured.pop("positions")
    return {**measured, "positions": json.loads((path / "training.json").read_text())["train_positions"]}


def featurized(target, chosen: list[list[Path]], data_dirs: list[Path], root: Path, layers) -> list[list[Path]]:
    """The chosen shards read again by the target for an EAGLE-3 draft's ``layers``, into ``root/data<i>`` (each
    shard once, whatever scale first needed it)."""
    from diversed_hf.training.eagle_features import featurize

    made = []
    for index, (shards, source) in enumerate(zip(chosen, data_dirs, strict=True)):
        directory = root / f"data{index}"
        if shards:
            featurize(target, source, directory, layers, shards=[shard.name for shard in shards])
        made.append([directory / shard.name for shard in shards])
    return made


#: the shipped draft's settings every scale shares (its training.json); the rest are the benchmark's
RECIPE_KEYS = ("num_layers", "draft_vocab_size", "unroll", "batch_size", "learning_rate", "warmup_fraction")
RECIPE_KEYS += ("feature_weight", "tv_weight", "max_grad_norm", "held_out", "seed")


def recipe(args) -> dict:
    """The distillation settings of every scale: the shipped EAGLE-1-style draft's, with ``--epochs``,
    ``--learning_rate`` (when given), ``--mixed_precision`` and batches of like lengths (2.0x as fast with bfloat16,
    at the same held-out agreement: RESULTS.md "Distillation speed")."""
    from diversed_hf.testbed.smollm2 import EAGLE_DIR

    shipped = json.loads((EAGLE_DIR / "training.json").read_text())["settings"]
    settings = {key: shipped[key] for key in RECIPE_KEYS if key in shipped}
    settings.update(epochs=args.epochs, save_steps=200, mixed_precision=args.mixed_precision, group_by_length=True)
    if args.learning_rate is not None:
        settings["learning_rate"] = args.learning_rate
    settings["num_layers"] = args.num_layers
    return settings


def results_key(args) -> str:
    """Where a run's scales go in results.json (and their table): one key per architecture and depth."""
    key = "scales" if args.arch == "eagle" else "scales_eagle3"
    return key if args.num_layers == 1 else f"{key}_{args.num_layers}layers"


def key_settings(key: str) -> tuple[str, int]:
    """The ``(--arch, --num_layers)`` of a results key (:func:`results_key`'s inverse)."""
    arch = "eagle3" if key.startswith("scales_eagle3") else "eagle"
    return arch, int(key.rsplit("_", 1)[1].removesuffix("layers")) if key.endswith("layers") else 1


def table_keys(results: dict) -> list[str]:
    """The results keys of the section's tables that hold rows, in the order it shows them: one layer (EAGLE-1
    style, then EAGLE-3), then each deeper one."""
    return sorted(
        (k for k in results if k.startswith("scales") and results[k]), key=lambda k: (k.endswith("layers"), k)
    )


def run_scale(args, scale, target, tokenizer, collections, data_dirs, held_out, prompts) -> dict:
    from diversed_hf import EagleDraft
    from diversed_hf.training.eagle_distill import DistillSettings, distill

    budget = round(scale * args.unit)
    chosen = select_shards(collections, budget)
    if chosen is None:
        have = sum(positions for shards in collections for _, positions in shards)
        return {"skipped": f"{have:,} response positions collected, {budget:,} needed"}
    started = time.time()
    name = f"x{scale:g}" + ("" if args.num_layers == 1 else f"-{args.num_layers}layers")
    root, settings, sources = Path(args.runs_dir) / name, recipe(args), chosen
    if args.arch == "eagle3":
        root = Path(args.runs_dir) / "eagle3" / name
        settings |= {"architecture": "eagle3", "aux_layer_ids": args.layers}
        sources = featurized(target, chosen, data_dirs, Path(args.runs_dir) / "eagle3", args.layers)
        data_dirs = [Path(args.runs_dir) / "eagle3" / f"data{i}" for i in range(len(data_dirs))]
    views = data_view(sources, data_dirs, root)
    cost = root / "cost.json"  # what featurizing and distilling took, kept when a trained scale is scored again
    resumed = not cost.is_file() and any((root / "checkpoints").glob("checkpoint-*"))  # a run before this one
    saved = distill(
        target, views, root / "checkpoints", root / "draft", DistillSettings(**settings), progress=not args.quick
    )
    if not cost.is_file():
        minutes = round((time.time() - started) / 60, 2)
        write_text_atomic(cost, json.dumps({"minutes": minutes, "resumed": resumed}) + "\n")
    draft = EagleDraft.from_pretrained(saved, target=target)
    measured = measure_draft(target, draft, tokenizer, held_out, prompts, args.tree)
    positions = sum(n for shards in collections for shard, n in shards if any(shard in c for c in chosen))
    measured["held_out_positions"] = measured.pop("positions")  # evaluate's count: the held-out set's
    spent = json.loads(cost.read_text())
    return {**measured, "positions": positions, "minutes": spent["minutes"], "resumed": spent.get("resumed", False)}


def collection_costs(data_dirs: list[Path]) -> list[dict]:
    """Each collection's response positions, and those of its shards that recorded their decoding time with the
    seconds they took (a collection's runs may have stopped: the rate is what the timed shards show)."""
    costs = []
    for directory in data_dirs:
        shards = _shards(directory)
        timed = [(n, seconds) for _, n, seconds in shards if seconds is not None]
        settings = json.loads((Path(directory) / "manifest.json").read_text())["settings"]
        costs.append(
            {
                "data": str(directory),
                "temperature": settings["temperature"],
                "greedy_fraction": settings["greedy_fraction"],
                "positions": sum(n for _, n, _ in shards),
                "timed_positions": sum(n for n, _ in timed),
                "timed_seconds": round(sum(seconds for _, seconds in timed), 1),
                "shards": len(shards),
                "timed_shards": len(timed),
            }
        )
    return costs


def _costs(collections: list[dict]) -> str:
    parts = []
    for c in collections:
        part = f"{c['data']} (T = {c['temperature']:g}, {100 * c['greedy_fraction']:.0f} % greedy) {c['positions']:,} positions"
        if c["timed_seconds"]:
            rate = c["timed_positions"] / c["timed_seconds"]
            part += (
                f" at {rate:.0f} a second (the {c['timed_shards']} of {c['shards']} shards that timed their "
                f"decoding), about {c['positions'] / rate / 3600:.1f} h"
            )
        parts.append(part)
    return (
        "What the data cost (the target decoding at batch 64-128 on two threads, beside other work): "
        f"{'; '.join(parts)}."
    )


#: the options that pick a table (its architecture and depth) and its rows; the rest are the section's
_TABLE_OPTIONS = ("--scales", "--arch", "--num_layers")


def table_commands(results: dict, command: str) -> list[str]:
    """One command per table of the section: ``command`` (the run that wrote it) with each table's own
    architecture, depth and every scale it measured, so that each command rebuilds its table's rows."""
    words, base, skipping = shlex.split(command), [], False
    for word in words:
        if word.startswith("--"):
            skipping = word.split("=", 1)[0] in _TABLE_OPTIONS
        if not skipping:
            base.append(word)
    commands = []
    for key in table_keys(results):
        measured = [name for name, row in results[key].items() if "skipped" not in row]
        if not measured:
            continue
        arch, layers = key_settings(key)
        table = ["--scales", *sorted(measured, key=float)]
        table += ["--arch", arch] if arch != "eagle" else []
        table += ["--num_layers", str(layers)] if layers != 1 else []
        commands.append(shlex.join([*base, *table]))
    return commands or [command]


def render(results: dict, command: str) -> str:
    lines = [
        *regenerate_lines("\n".join(table_commands(results, command))),
        f"SmolLM2-135M-Instruct (bfloat16) and EagleDrafts distilled by one recipe ({_recipe(results)}) on "
        f"growing shares of the collections ({', '.join(results['data'])}); scale 1 = {results['unit']:,} response "
        "positions, what the shipped default draft was distilled on. Held-out: the target's answers to the held-out "
        "everyday prompts, half greedy and half at T = 0.7 (top-1: the draft's argmax is the target's; at steps 2 "
        "and 3 on its own features, attending as drafting does). Tokens per "
        "round: lossless SD, greedy, batch 1, the tree "
        f"{results['tree']}, {results['num_prompts']} held-out everyday prompts x 64 tokens.",
        "",
        *(
            _table(results["scales"], results.get("shipped"), 'shipped (`draft="eagle"`)')
            if results["scales"] or results.get("shipped")
            else ["(no EAGLE-1-style draft measured yet)"]
        ),
    ]
    if results.get("collections"):
        lines += ["", _costs(results["collections"]) + " *minutes*: featurizing (EAGLE-3) and distilling a scale."]
    if results.get("scales_eagle3"):
        lines += [
            "",
            f"**EAGLE-3** (`--arch eagle3`: the target's layers {results['aux_layer_ids']} fused, training-time test, "
            "its own LM head; the same answers, read again for those layers, and the same held-out set):",
            "",
            *_table(results["scales_eagle3"], results.get("shipped_eagle3"), 'shipped (`draft="eagle3"`)'),
        ]
    for key in (k for k in table_keys(results) if k.endswith("layers")):
        arch, layers = key_settings(key)
        arch = "EAGLE-3" if arch == "eagle3" else "EAGLE-1 style"
        lines += ["", f"**{layers} decoder layers** ({arch}, `--num_layers {layers}`; the same answers):", ""]
        lines += _table(results[key], None)
    return "\n".join(lines)


def _recipe(results: dict) -> str:
    settings = results.get("recipe")
    if settings is None:  # a results file from before the recipe was recorded
        return f"{results['epochs']} epochs"
    precision = "bfloat16 autocast" if settings.get("mixed_precision") == "bf16" else "float32"
    like = " like-length" if settings.get("group_by_length") else ""
    return (
        f"{settings['epochs']} epochs of batches of {settings['batch_size']}{like} sequences, learning rate "
        f"{settings['learning_rate']:g}, {precision}, training-time test attending as drafting does (the shipped "
        "drafts were trained before it: each unrolled column saw every predicted column); otherwise as the shipped "
        "draft was trained"
    )


def _table(scales: dict, shipped: dict | None, label: str = "shipped") -> list[str]:
    lines = [
        "| scale | positions | top-1 step 1 / 2 / 3 | sum min(p, q) step 1 | tokens per round | acceptance | minutes |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    rows = [(label, shipped)] if shipped else []
    for scale, row in [*rows, *((f"{scale}x", row) for scale, row in scales.items())]:
        if "skipped" in row:
            lines.append(f"| {scale} | – | not run: {row['skipped']} | | | | |")
            continue
        top1 = " / ".join(f"{x:.3f}" for x in row["top1_agreement"])
        minutes = (
            f"{row['minutes']:.0f}" + (" + an earlier run's" if row.get("resumed") else "") if "minutes" in row else "–"
        )
        lines.append(
            f"| {scale} | {row['positions']:,} | {top1} | {row['acceptance_t1'][0]:.3f} | "
            f"{row['tokens_per_round']:.2f} | {100 * row['tree_acceptance']:.1f} % | {minutes} |"
        )
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    output_dir, command = start_script("draft_scaling", args, argv, "draft_scaling", threads=args.threads)
    from diversed_hf import enable_diversed, testbed
    from diversed_hf.lab.tasks.chat_prompts import everyday_prompts

    data_dirs = [Path(d) for d in args.data]
    collections = [shard_positions(d) for d in data_dirs]  # refused by name before the target loads
    target, _, tokenizer = testbed.load_pair("smollm2", torch_dtype=torch.bfloat16)
    enable_diversed(target)
    held_out = held_out_answers(target, tokenizer, Path(args.runs_dir), 4 if args.quick else None)
    key = results_key(args)
    if args.arch == "eagle3":
        from diversed_hf.drafting.eagle3 import check_aux_layer_ids, default_aux_layer_ids
        from diversed_hf.training.eagle_features import featurize

        layers = target.config.get_text_config().num_hidden_layers
        args.layers = tuple(check_aux_layer_ids(args.aux_layer_ids or default_aux_layer_ids(layers), layers))
        held_out = featurize(target, held_out, Path(args.runs_dir) / "eagle3" / HELD_OUT_NAME, args.layers)
    prompts = everyday_prompts(2 if args.quick else args.num_prompts)
    path = output_dir / "results.json"
    results = json.loads(path.read_text()) if path.is_file() else {"scales": {}}
    if results.get("held_out") != HELD_OUT:  # scored on another set: scored again (a trained scale only reloads)
        results = {"scales": {}, "held_out": HELD_OUT}
    results.update(data=args.data, unit=args.unit, epochs=args.epochs, tree=args.tree, num_prompts=len(prompts))
    results["recipe"] = {k: v for k, v in recipe(args).items() if k != "num_layers"}  # the depth: per table
    results["collections"] = collection_costs(data_dirs)
    if args.arch == "eagle3":
        results["aux_layer_ids"] = list(args.layers)
    baseline = "shipped" if args.arch == "eagle" else "shipped_eagle3"
    if baseline not in results:  # today's draft of the architecture, on the same held-out set and prompts
        results[baseline] = measure_shipped(args, target, tokenizer, held_out, prompts)
    measured = results.setdefault(key, {})
    for scale in args.scales:
        name = f"{scale:g}"
        if "skipped" not in measured.get(name, {"skipped": ""}):
            continue  # measured by an earlier run
        measured[name] = run_scale(args, scale, target, tokenizer, collections, data_dirs, held_out, prompts)
        write_text_atomic(path, json.dumps(results, indent=2) + "\n")
        print(f"scale {name} ({args.arch}): {measured[name]}", flush=True)
    text = render(results, command)
    write_text_atomic(output_dir / "draft_scaling.md", f"# {args.section}\n\n{text}\n")
    if not args.quick:
        replace_section(REPO / "RESULTS.md", args.section, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
