"""A DIVERSED head for everyday chat on the real pair: calibrated and measured by the chat measures (RESULTS.md, "Real
pair: a head for everyday chat"; docs/real_pair.md, "Quality on chat prompts").

    python training/train_head.py --config training/configs/smollm2_chat.yaml    # runs/smollm2_chat/head
    python benchmarks/chat_head.py --head runs/smollm2_chat/head                 # results/chat_head, and ships it
    python benchmarks/chat_head.py --head runs/smollm2_chat/head --quick         # a smoke run, nothing shipped
    python benchmarks/chat_head.py --publish     # RESULTS.md's section again, from every run in results/chat_head*/

SmolLM2-135M-Instruct with its default EagleDraft (distilled on everyday chat), sampled at ``--temperature`` (the
recipe's, 0.7), N = ``--num_draft_tokens``, batched generation, one torch thread.

1. **Calibration** on ``--calibration_prompts`` broad-chat requests the head did not train on (the broad set after
   the recipe's ``num_train_examples``): for every ``--offsets`` value ``b`` the head's output logit is shifted by
   ``b`` (``w = sigmoid(logit + b)``; larger ``b`` is stricter). Each is scored against target-only samples of the
   same prompts by the two chat measures (:mod:`diversed_hf.lab.bench.chat_quality`): the target's mean per-token
   log-likelihood of the text and ROUGE-L agreement with an independent target sample, each a paired difference with
   a 95 % interval. The chosen offset is the most accepting one whose two intervals both reach 0.
2. **Held-out**: the 64 everyday prompts x ``--num_samples``: target-only, lossless SD and the calibrated head, the
   same measures, acceptance and tokens per round.
3. **Shipped** (not with ``--quick`` or ``--no_ship``) when it is an operating point: acceptance at least
   ``--goal_ratio`` x lossless SD's with both intervals reaching 0. The head goes to
   ``testbed.load_head("chat", pair="smollm2")``'s folder with its card; otherwise RESULTS.md says by how much it
   misses.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import torch

from diversed_hf import DiversedHead, ExactVerifier, HeadVerifier
from diversed_hf.cli.evaluation import load_models, with_offset
from diversed_hf.cli.sections import refresh_head_sections
from diversed_hf.lab.bench.chat_quality import agreement, target_log_likelihood
from diversed_hf.lab.bench.stats import paired_difference
from diversed_hf.lab.cli_utils import ArgumentParser, add_debug_flag, check_output_dir, run_script, write_text_atomic
from diversed_hf.lab.tasks.chat_prompts import broad_chat_prompts, everyday_prompts

logger = logging.getLogger("chat_head")
REPO = Path(__file__).resolve().parents[1]


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head", default=None, help="the trained head's directory (train_head.py's output)")
    parser.add_argument("--publish", action="store_true", help="measure nothing: RESULTS.md's section from the runs")
    parser.add_argument("--output_dir", default=None, help="default results/chat_head (--quick: results_quick/...)")
    parser.add_argument("--offsets", type=float, nargs="+", default=[2.0, 3.0, 4.0, 5.0, 6.0, 8.0])
    parser.add_argument("--calibration_prompts", type=int, default=48, help="broad-chat prompts for calibration")
    parser.add_argument("--trained_prompts", type=int, default=160, help="the recipe's num_train_examples (skipped)")
    parser.add_argument("--num_samples", type=int, default=2, help="samples per held-out prompt")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--num_draft_tokens", type=int, default=3)
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--goal_ratio", type=float, default=1.3, help="acceptance an operating point needs, x SD's")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="8 prompts, two offsets, into results_quick")
    parser.add_argument("--no_ship", action="store_true", help="measure and write results, ship nothing")
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    if args.head is None and not args.publish:
        parser.error("--head is required (or --publish alone)")
    return args


@torch.no_grad()
def sample(models, prompts: list[str], verifier, args, seed: int) -> dict:
    """Every prompt sampled once: new token ids up to EOS, texts, and the speculation totals."""
    target, draft, tokenizer = models
    tokenizer.padding_side = "left"
    ids, texts, drafted, accepted, rounds, emitted = [], [], 0, 0, 0, 0
    for start in range(0, len(prompts), args.batch_size):
        encoded = tokenizer(prompts[start : start + args.batch_size], return_tensors="pt", padding=True)
        torch.manual_seed(seed + start)
        options = dict(
            do_sample=True,
            temperature=args.temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=args.max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            return_dict_in_generate=True,
        )
        if verifier is not None:
            generator = torch.Generator().manual_seed(seed + start)
            options.update(assistant_model=draft, verifier=verifier, num_assistant_tokens=args.num_draft_tokens)
            options.update(num_assistant_tokens_schedule="constant", generator=generator)
        out = target.generate(**encoded, **options)
        for row in out.sequences[:, encoded["input_ids"].shape[1] :]:
            ends = (row == tokenizer.eos_token_id).nonzero()
            row = row[: int(ends[0]) + 1] if len(ends) else row
            row = row[row != tokenizer.pad_token_id] if tokenizer.pad_token_id != tokenizer.eos_token_id else row
            ids.append(row)
            texts.append(tokenizer.decode(row, skip_special_tokens=True))
        if verifier is not None:
            stats = out.speculation
            drafted += stats.total_drafted
            accepted += stats.total_accepted
            rounds += stats.total_rounds
            emitted += int(stats.num_generated.sum())
    return {"ids": ids, "texts": texts, "drafted": drafted, "accepted": accepted, "rounds": rounds, "emitted": emitted}


def measure(models, prompts: list[str], methods: dict, args, num_samples: int) -> dict:
    """Each method (``None``: target-only) on every prompt ``num_samples`` times, scored against target-only."""
    target, _, tokenizer = models
    prompt_ids = [tokenizer(prompt, return_tensors="pt")["input_ids"] for prompt in prompts]
    reference = [sample(models, prompts, None, args, seed=10_000 + s * 1000)["texts"] for s in range(num_samples)]
    scores, rows = {}, {}
    for name, verifier in methods.items():
        likelihood, agree, totals = [], [], {"drafted": 0, "accepted": 0, "rounds": 0, "emitted": 0}
        for s in range(num_samples):
            run = sample(models, prompts, verifier, args, seed=s * 1000)
            logger.info("%s, sample %d: %d prompts", name, s, len(prompts))
            for key in totals:
                totals[key] += run[key]
            likelihood += [
                (i, target_log_likelihood(target, p, c)) for i, (p, c) in enumerate(zip(prompt_ids, run["ids"]))
            ]
            agree += list(enumerate(agreement(run["texts"], reference[s])))
        scores[name] = (likelihood, agree)
        known = [value for _, value in likelihood if value == value]
        rows[name] = {
            "log_likelihood": sum(known) / max(len(known), 1),
            "agreement": sum(value for _, value in agree) / len(agree),
            "acceptance": totals["accepted"] / totals["drafted"] if totals["drafted"] else None,
            "tokens_per_round": totals["emitted"] / totals["rounds"] if totals["rounds"] else None,
        }
    base_likelihood, base_agreement = scores["target-only"]
    for name, (likelihood, agree) in scores.items():
        rows[name]["log_likelihood_delta"] = _paired(likelihood, base_likelihood)
        rows[name]["agreement_delta"] = _paired(agree, base_agreement)
    return rows


def _paired(method: list[tuple[int, float]], reference: list[tuple[int, float]]) -> dict | None:
    """Per-prompt means paired over prompts (``paired_difference``), NaN scores (empty texts) left out."""
    return paired_difference([p for p in method if p[1] == p[1]], [p for p in reference if p[1] == p[1]])


def reaches_zero(row: dict) -> bool:
    """Both chat measures' intervals against target-only reach 0 (not significantly below the target)."""
    return all(row[key] is not None and row[key]["high"] >= 0 for key in ("log_likelihood_delta", "agreement_delta"))


def _interval(delta: dict | None, scale: float = 1.0) -> str:
    if delta is None:
        return "–"
    return f"{delta['delta'] * scale:+.3f} [{delta['low'] * scale:+.3f}, {delta['high'] * scale:+.3f}]"


def table(rows: dict) -> list[str]:
    lines = [
        "| method | acceptance | tokens/round | target log-lik. / token | vs target-only [95 % CI] | ROUGE-L agreement "
        "| vs target-only [95 % CI] |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in rows.items():
        acceptance = "–" if row["acceptance"] is None else f"{100 * row['acceptance']:.1f} %"
        per_round = "1.00" if row["tokens_per_round"] is None else f"{row['tokens_per_round']:.2f}"
        lines.append(
            f"| {name} | {acceptance} | {per_round} | {row['log_likelihood']:.3f} | "
            f"{_interval(row['log_likelihood_delta'])} | {row['agreement']:.3f} | {_interval(row['agreement_delta'])} |"
        )
    return lines


def render(results: dict) -> str:
    setting = results["setting"]
    held = results["held_out"]
    sd, head = held["SD"]["acceptance"], held["DIVERSED"]["acceptance"]
    ratio = head / sd
    operating = results["operating_point"]
    lines = [
        f"Measured with `{results['command']}` on SmolLM2-135M-Instruct and its default EagleDraft, temperature "
        f"{setting['temperature']}, N = {setting['num_draft_tokens']}, {setting['max_new_tokens']} new tokens, float32, "
        'one thread. Quality without references (docs/real_pair.md, "Quality on chat prompts"): the target\'s mean '
        "per-token log-likelihood of each text and its ROUGE-L agreement with an independent target-only sample, "
        "paired over prompts against target-only.",
        "",
        f"**Calibration** on {setting['calibration_prompts']} broad-chat prompts the head did not train on, one sample "
        "each (the offset `b` shifts the head's logit, `w = sigmoid(logit + b)`):",
        "",
        *table({f"offset {k}" if k not in ("target-only", "SD") else k: v for k, v in results["calibration"].items()}),
        "",
        f"Chosen: offset {results['offset']} (the most accepting whose two intervals reach 0).",
        "",
        f"**Held-out**: {setting['held_out_prompts']} everyday prompts x {setting['num_samples']} samples "
        "(`diversed_hf.lab.tasks.chat_prompts.everyday_prompts`):",
        "",
        *table(held),
        "",
        f"The head accepts {ratio:.2f}x lossless SD's share of drafts ({100 * head:.1f} % against {100 * sd:.1f} %); "
        f"the goal is {setting['goal_ratio']}x with both intervals reaching 0. "
        + (
            'It is an operating point and ships as `testbed.load_head("chat", pair="smollm2")`.'
            if operating
            else "It is not an operating point, and no chat head ships: " + "; ".join(results["misses"]) + "."
        ),
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.publish:
        return publish()
    torch.set_num_threads(args.threads)
    output_dir = Path(args.output_dir or REPO / ("results_quick" if args.quick else "results") / "chat_head")
    check_output_dir(output_dir, "--output_dir")
    if args.quick:
        args.offsets, args.calibration_prompts, args.num_samples = args.offsets[:2], 8, 1
    models = load_models("smollm2", "eagle")
    head = DiversedHead.from_pretrained(args.head).eval()
    calibration = broad_chat_prompts()[args.trained_prompts : args.trained_prompts + args.calibration_prompts]
    methods = {"target-only": None, "SD": ExactVerifier()}
    methods.update({str(b): HeadVerifier(with_offset(head, b)) for b in args.offsets})
    calibrated = measure(models, calibration, methods, args, num_samples=1)
    eligible = [b for b in args.offsets if reaches_zero(calibrated[str(b)])]
    offset = max(eligible, key=lambda b: (calibrated[str(b)]["acceptance"], -b)) if eligible else max(args.offsets)
    held_prompts = everyday_prompts(8 if args.quick else None)
    chosen = with_offset(head, offset)
    held = measure(
        models,
        held_prompts,
        {"target-only": None, "SD": ExactVerifier(), "DIVERSED": HeadVerifier(chosen)},
        args,
        num_samples=args.num_samples,
    )
    ratio = held["DIVERSED"]["acceptance"] / held["SD"]["acceptance"]
    misses = []
    if ratio < args.goal_ratio:
        misses.append(f"it accepts {ratio:.2f}x SD's drafts, {args.goal_ratio - ratio:.2f} short of {args.goal_ratio}x")
    for key, name in (("log_likelihood_delta", "log-likelihood"), ("agreement_delta", "ROUGE-L agreement")):
        delta = held["DIVERSED"][key]
        if delta["high"] < 0:
            misses.append(f"its {name} is below target-only's by {_interval(delta)} (the interval misses 0)")
    command = "python benchmarks/chat_head.py " + " ".join(argv if argv is not None else sys.argv[1:])
    results = {
        "command": command.strip(),
        "setting": {key: getattr(args, key) for key in ("temperature", "num_draft_tokens", "max_new_tokens")}
        | {"calibration_prompts": len(calibration), "held_out_prompts": len(held_prompts)}
        | {"num_samples": args.num_samples, "goal_ratio": args.goal_ratio},
        "calibration": calibrated,
        "offset": offset,
        "held_out": held,
        "operating_point": not misses,
        "misses": misses,
    }
    output_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(output_dir / "results.json", json.dumps(results, indent=2) + "\n")
    text = render(results)
    write_text_atomic(output_dir / "chat_head.md", text)
    print(text)
    if not args.quick and not args.no_ship:
        publish()
        if not misses:
            ship(chosen, Path(args.head), results, output_dir)
    return results


#: which head each run under results/ measured (the recipe changed between them; runs/ is not in the repository)
RUN_HEADS = {
    "chat_head": "the recipe's first version (`reward: target_agreement`, ROUGE-2 agreement with the target's greedy "
    "answer; `lambda_acceptance: 0.05`, `head_w_0: 0.7`; trained in 320 s, its `mean_w` fell from 0.68 to 0.14), "
    "calibrated over positive offsets",
    "chat_head_likelihood": "the recipe as it stands (`reward: target_likelihood`, the target's own log-likelihood of "
    "the text; `lambda_acceptance: 0.02`, `head_w_0: 0.9`; trained in 1009 s, its `mean_w` rose from 0.90 to 0.99), "
    "relaxed over negative offsets",
}


def publish() -> dict:
    """RESULTS.md's section (``results/chat_head.md``) from every run's ``results.json`` under results/chat_head*/."""
    parts = []
    for name, description in RUN_HEADS.items():
        path = REPO / "results" / name / "results.json"
        if path.is_file():
            parts.append(f"**The head of {description}.** " + render(json.loads(path.read_text())))
    text = "\n".join(parts)
    write_text_atomic(REPO / "results" / "chat_head.md", text)
    refresh_head_sections(REPO / "RESULTS.md", REPO / "results")
    return {"published": len(parts)}


def ship(head: DiversedHead, trained: Path, results: dict, output_dir: Path) -> None:
    """The calibrated head into the real pair's head folder with its training record, its chat measurement
    (``chat_quality.json``) and its card, staged in ``output_dir`` and shipped; ``testbed.load_head("chat",
    pair="smollm2")`` serves it once ``"chat"`` is in ``testbed.HEAD_TASKS["smollm2"]`` and ``SHIPPED_HEAD_DRAFTS``
    (with the ``"eagle"`` draft it was trained for)."""
    from diversed_hf.cli import ship as shipping
    from diversed_hf.heads import cards
    from diversed_hf.lab.tasks import task_card
    from diversed_hf.testbed import ASSETS_DIR, head_folder

    folder = output_dir / "head"
    head.save_pretrained(folder)
    for name in ("training_config.json", "train_log.jsonl"):
        if (trained / name).exists():
            write_text_atomic(folder / name, (trained / name).read_text())
    write_text_atomic(folder / "chat_quality.json", json.dumps(results, indent=2) + "\n")
    cards.write_card(folder, task_card=task_card("chat"))
    name = (head_folder("smollm2") / "chat").relative_to(ASSETS_DIR).as_posix()
    shipping.ship(shipping.stage_folder(output_dir, name, folder, card="smollm2_chat.md"))
    logger.info("shipped the chat head as %s: register it in testbed.HEAD_TASKS to serve it", name)


if __name__ == "__main__":
    run_script(main)
