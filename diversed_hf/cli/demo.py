"""``diversed-hf demo``: is speculative decoding faster than ``generate``, and what does each verifier trade?

Decodes a few prompts one at a time (batch 1, the latency case speculative decoding is for) with four methods on
one pair: target-only ``generate`` (no draft), lossless SD (``ExactVerifier``), the static ensemble with w = 0.5,
and DIVERSED with a shipped head. Each method runs once untimed (warm-up), then every prompt runs every method in
turn (interleaved, so a busy machine slows all alike), sampling with the same seed per prompt; ``--repeats`` such
passes (default 3) give each speed its spread, since one pass on a shared machine can be off by a third. The table
gives the new tokens each method wrote (up to EOS), tokens/s and its ratio to target-only (the median pass, and the
lowest and highest), acceptance and tokens per round;
on a task with references, the task's metric on those few prompts, which is far too few to compare quality
(``diversed-hf bench`` measures that, with paired intervals). Then the acceptance by draft position and the texts.

- ``--pair testbed`` (default): the shipped 9M pair on ``--task arith`` or ``summary``, temperature 1, the
  testbed's head for the task.
- ``--pair smollm2``: SmolLM2-135M-Instruct with its default draft, the EagleDraft, on held-out everyday chat prompts
  (``diversed_hf.lab.tasks.chat_prompts``; ``--task arith_chat`` or ``synopsis`` for a task's), at temperature 0.7
  (:data:`CHAT_TEMPERATURE`: at 1 the 135M model rambles). The DIVERSED row (``--task arith_chat``) uses the shipped
  ``arith_chat`` head with the draft it was trained with (the head reads that draft's features), at the head's
  training temperature (its operating point), which every row then uses.
- ``--random-models``: tiny random models and an untrained head (no assets; the text is meaningless).

Draft length: the draft's own (``num_assistant_tokens`` in its ``generation_config.json``), unless
``--num-draft-tokens`` says otherwise. ``--temperature`` sets every row's temperature (0: greedy).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass, field

import torch

from ..drafting.length.policy import draft_length_of
from ..generation.mixin import enable_diversed
from ..lab.cli_utils import add_command
from ..lab.tasks import get_task
from ..verifiers.rules import ExactVerifier, HeadVerifier, StaticEnsembleVerifier

TARGET_ONLY = "target-only"
REAL_PAIR_HEAD_TASK = "arith_chat"  # the real pair's shipped head
#: the real pair's temperature on prompts without a head: at 1 SmolLM2-135M-Instruct writes word salad for every row,
#: target-only included; at 0.7 it answers in sentences (greedy: ``--temperature 0``)
CHAT_TEMPERATURE = 0.7


@dataclass
class DemoSetup:
    """What the demo runs: the target, each method's ``(draft, verifier)`` or ``(draft, verifier, N)`` (``(None,
    None)``: target-only; ``N``: the length a head was measured with), the prompts as token ids, their text,
    references (``None``: no quality column) and the sampling temperature."""

    description: str
    target: object
    methods: dict
    prompt_ids: list
    shown: list | None
    references: list | None
    task: str | None
    temperature: float
    tokenizer: object = None
    notes: list = field(default_factory=list)


def _tokenized(tokenizer, prompts: list[str], add_special_tokens: bool = True) -> list[torch.Tensor]:
    return [tokenizer(p, return_tensors="pt", add_special_tokens=add_special_tokens)["input_ids"] for p in prompts]


def _testbed_setup(task: str, num_prompts: int, seed: int) -> DemoSetup:
    from .. import testbed

    if task not in testbed.TASKS:
        raise ValueError(f"--task is {task!r}; the testbed pair's tasks are {testbed.TASKS}.")
    target, draft, tokenizer = testbed.load_pair()
    data = testbed.load_task(task, split="test", num_examples=num_prompts, seed=seed)
    methods = {
        TARGET_ONLY: (None, None),
        "SD (ExactVerifier)": (draft, ExactVerifier()),
        "static ensemble w=0.5": (draft, StaticEnsembleVerifier(0.5)),
    }
    notes = []
    try:
        methods["DIVERSED head"] = (draft, HeadVerifier(testbed.load_head(task)))
    except FileNotFoundError as error:  # a source checkout whose heads have not been trained yet
        notes.append(f"no DIVERSED row: {error}")
    prompts = list(data["prompt"])
    return DemoSetup(
        f"Testbed pair (9M), task {task!r}",
        target,
        methods,
        _tokenized(tokenizer, prompts),
        prompts,
        list(data["reference"]),
        task,
        1.0,
        tokenizer,
        notes,
    )


def _smollm2_setup(task: str | None, num_prompts: int, seed: int) -> DemoSetup:
    from .. import testbed
    from ..lab.tasks.chat_prompts import everyday_messages, everyday_prompts

    target, draft, tokenizer = testbed.load_pair("smollm2")
    head_draft = testbed.SHIPPED_HEAD_DRAFTS[REAL_PAIR_HEAD_TASK]
    head = testbed.load_head(REAL_PAIR_HEAD_TASK, pair="smollm2")
    head_dir = _head_dir(REAL_PAIR_HEAD_TASK)
    temperature = float(json.loads((head_dir / "training_config.json").read_text())["temperature"])
    head_length = json.loads((head_dir / "results.json").read_text())["setting"]["num_draft_tokens"]
    from ..testbed.smollm2 import EAGLE_DRAFTS, load_eagle_draft

    own_draft = load_eagle_draft(target, *EAGLE_DRAFTS[head_draft]) if head_draft in EAGLE_DRAFTS else draft
    if task != REAL_PAIR_HEAD_TASK:  # no head row: a temperature where the target speaks sense
        temperature = CHAT_TEMPERATURE
    if task in (None, "everyday"):
        prompts, shown, references, task = everyday_prompts(num_prompts), list(everyday_messages()), None, None
        where = "held-out everyday chat prompts"
    else:
        data = testbed.load_task(task, split="test", num_examples=num_prompts, seed=seed)
        prompts, references = list(data["prompt"]), list(data["reference"])
        shown, where = prompts, f"task {task!r}"
    methods = {
        TARGET_ONLY: (None, None),
        "SD (ExactVerifier)": (draft, ExactVerifier()),
        "static ensemble w=0.5": (draft, StaticEnsembleVerifier(0.5)),
    }
    if task == REAL_PAIR_HEAD_TASK:  # a task head only on its task's prompts
        methods[f"DIVERSED ({task} head, {head_draft} draft)"] = (own_draft, HeadVerifier(head), head_length)
        notes = [
            f"the {task} head was trained with the {head_draft!r} draft and reads its features, so its row drafts "
            f"with that one, at the length the head was measured with (N = {head_length}); the other rows use the "
            "pair's default EagleDraft at its own length. Every row samples at the head's training temperature "
            f"({temperature:g}), its operating point."
        ]
    else:
        notes = [
            "no DIVERSED head ships for these prompts: the real pair's one head is an operating point on "
            f"{REAL_PAIR_HEAD_TASK} (`--task {REAL_PAIR_HEAD_TASK}` shows it), and the chat heads trained so far are "
            "not operating points on everyday prompts (docs/real_pair.md, 'Quality on chat prompts'); train one for "
            "your prompts with training/train_head.py --dataset (docs/your_task.md).",
            f"temperature {temperature:g}: at 1 the 135M target writes incoherent text on every row, target-only "
            "included (--temperature 0 for greedy, 1 for the full distribution).",
        ]
    return DemoSetup(
        f"Real pair (SmolLM2-135M-Instruct in {str(target.dtype).removeprefix('torch.')}), {where}",
        target,
        methods,
        _tokenized(tokenizer, prompts, add_special_tokens=False),
        shown,
        references,
        task,
        temperature,
        tokenizer,
        notes,
    )


def _head_dir(task: str):
    from ..testbed import ASSETS_DIR

    return ASSETS_DIR / "smollm2" / "heads" / task


def _random_setup(num_prompts: int, seed: int) -> DemoSetup:
    from transformers import LlamaConfig, LlamaForCausalLM

    from ..heads.head import DiversedHead

    def tiny(hidden, layers, model_seed):
        torch.manual_seed(model_seed)
        config = LlamaConfig(
            vocab_size=256,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            eos_token_id=1,
            bos_token_id=2,
            pad_token_id=0,
        )
        return LlamaForCausalLM(config).eval()

    target, draft = tiny(64, 2, 0), tiny(32, 1, 1)
    generator = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 256, (1, 6), generator=generator) for _ in range(num_prompts)]
    methods = {
        TARGET_ONLY: (None, None),
        "SD (ExactVerifier)": (draft, ExactVerifier()),
        "static ensemble w=0.5": (draft, StaticEnsembleVerifier(0.5)),
        "DIVERSED head (untrained)": (draft, HeadVerifier(DiversedHead.for_pair(target, draft, w_0=0.5))),
    }
    return DemoSetup("Tiny RANDOM models (no assets)", target, methods, prompts, None, None, None, 1.0)


def _generate(setup: DemoSetup, method: str, ids: torch.Tensor, max_new_tokens: int, num_draft_tokens, seed: int):
    draft, verifier, *length = setup.methods[method]
    if setup.temperature > 0:
        kwargs = dict(do_sample=True, temperature=setup.temperature, top_k=0, max_new_tokens=max_new_tokens)
    else:
        kwargs = dict(do_sample=False, max_new_tokens=max_new_tokens)
    pad = getattr(setup.tokenizer, "pad_token_id", None)
    kwargs["pad_token_id"] = pad if pad is not None else 0
    if draft is not None:
        n = num_draft_tokens or (length[0] if length else draft_length_of(draft))
        kwargs.update(assistant_model=draft, verifier=verifier, num_assistant_tokens=n)
        kwargs["generator"] = torch.Generator().manual_seed(seed)
    else:
        torch.manual_seed(seed)
    return setup.target.generate(ids, attention_mask=torch.ones_like(ids), return_dict_in_generate=True, **kwargs)


def run_demo(
    task: str | None = "arith",
    num_prompts: int = 4,
    max_new_tokens: int = 64,
    num_draft_tokens: int | None = None,
    seed: int = 0,
    random_models: bool = False,
    pair: str = "testbed",
    temperature: float | None = None,
    repeats: int = 1,
) -> tuple[DemoSetup, list[dict]]:
    """Every method on the same prompts at batch 1, interleaved, after one warm-up each, ``repeats`` timed passes;
    returns the setup and one dict per method: ``texts``, ``new_tokens``, ``seconds`` (the median pass's),
    ``tokens_per_second``, ``speedup`` (x target-only, the median over passes), ``speedup_range`` (the lowest and
    highest pass), ``quality`` (mean task reward on the references, or ``None``), ``stats`` (acceptance, summed over
    prompts). ``temperature`` overrides the pair's (0: greedy)."""
    if repeats < 1:
        raise ValueError(f"`repeats` is {repeats}; it must be >= 1.")
    if temperature is not None and not temperature >= 0:
        raise ValueError(f"`temperature` is {temperature}; use 0 (greedy) or a positive temperature.")
    if random_models:
        setup = _random_setup(num_prompts, seed)
    elif pair == "smollm2":
        setup = _smollm2_setup(task, num_prompts, seed)
    elif pair == "testbed":
        setup = _testbed_setup(task or "arith", num_prompts, seed)
    else:
        raise ValueError(f"--pair is {pair!r}; use 'testbed' or 'smollm2'.")
    if temperature is not None:
        setup.temperature = float(temperature)
    enable_diversed(setup.target)
    names = list(setup.methods)
    for name in names:  # warm-up: kernels, caches, the draft's first call
        _generate(setup, name, setup.prompt_ids[0], 4, num_draft_tokens, seed)
    results = {
        name: {"method": name, "texts": [], "ids": [], "new_tokens": 0, "passes": [0.0] * repeats, "rounds": []}
        for name in names
    }
    for repeat in range(repeats):  # the same seeds every pass: the same texts, only the clock differs
        for i, ids in enumerate(setup.prompt_ids):
            for name in names:
                start = time.perf_counter()
                output = _generate(setup, name, ids, max_new_tokens, num_draft_tokens, seed + i)
                results[name]["passes"][repeat] += time.perf_counter() - start
                if repeat == 0:
                    _record(setup, results[name], output, ids)
    reward = get_task(setup.task).reward if setup.references is not None else None
    base_passes, base_tokens = results[names[0]]["passes"], results[names[0]]["new_tokens"]
    for result in results.values():
        ratios = sorted(
            (base_seconds / base_tokens) / (seconds / result["new_tokens"])
            for seconds, base_seconds in zip(result["passes"], base_passes)
        )
        result["seconds"] = statistics.median(result.pop("passes"))
        result["tokens_per_second"] = result["new_tokens"] / result["seconds"]
        result["speedup"] = statistics.median(ratios)
        result["speedup_range"] = (ratios[0], ratios[-1])
        result["quality"] = (
            None if reward is None else sum(reward(result["texts"], setup.references)) / len(result["texts"])
        )
        result["stats"] = _pooled(result.pop("rounds"))
    if setup.references is None:  # no answers to score: quality against the target itself
        _chat_quality(setup, list(results.values()), max_new_tokens, seed)
    for result in results.values():
        result.pop("ids")
    return setup, list(results.values())


def _record(setup: DemoSetup, result: dict, output, ids: torch.Tensor) -> None:
    new = output.sequences[0, ids.shape[1] :]
    result["new_tokens"] += int(new.numel())
    result["texts"].append(setup.tokenizer.decode(new, skip_special_tokens=True) if setup.tokenizer else _as_text(new))
    result["ids"].append(new)
    if getattr(output, "speculation", None) is not None:
        result["rounds"].append(output.speculation.summary())


def _chat_quality(setup: DemoSetup, results: list[dict], max_new_tokens: int, seed: int) -> None:
    """Each row's ``chat_quality``: the target's mean per-token log-likelihood of its texts and their ROUGE-L
    agreement with an independent target-only sample of each prompt, with paired differences from target-only
    (:mod:`diversed_hf.lab.bench.chat_quality`)."""
    from ..lab.bench.chat_quality import agreement, paired, target_log_likelihood

    samples = []
    for i, ids in enumerate(setup.prompt_ids):
        new = _generate(setup, TARGET_ONLY, ids, max_new_tokens, None, seed + 10_000 + i).sequences[0, ids.shape[1] :]
        samples.append(setup.tokenizer.decode(new, skip_special_tokens=True) if setup.tokenizer else _as_text(new))
    scores = {}
    for result in results:
        likelihood = [target_log_likelihood(setup.target, p, c) for p, c in zip(setup.prompt_ids, result["ids"])]
        scores[result["method"]] = (likelihood, agreement(result["texts"], samples))
    base_likelihood, base_agreement = scores[TARGET_ONLY]
    for result in results:
        likelihood, agree = scores[result["method"]]
        known = [value for value in likelihood if value == value]
        result["chat_quality"] = {
            "log_likelihood": sum(known) / max(len(known), 1),
            "agreement": sum(agree) / len(agree),
            "log_likelihood_delta": paired(likelihood, base_likelihood),
            "agreement_delta": paired(agree, base_agreement),
        }


def _as_text(ids: torch.Tensor) -> str:
    return " ".join(map(str, ids.tolist()))


def _pooled(summaries: list[dict]) -> dict | None:
    """Acceptance statistics summed over the prompts' calls (``None`` for target-only)."""
    if not summaries:
        return None
    drafted = sum(s["num_drafted"] for s in summaries)
    accepted = sum(s["num_accepted"] for s in summaries)
    rounds = sum(s["num_rounds"] for s in summaries)
    generated = sum(s["num_generated"] for s in summaries)
    width = max(len(s["position_acceptance_rate"]) for s in summaries)
    by_position = []
    for j in range(width):  # rates weighted by each call's drafts at position j are not recorded: a plain mean
        rates = [s["position_acceptance_rate"][j] for s in summaries if j < len(s["position_acceptance_rate"])]
        by_position.append(sum(rates) / len(rates))
    return {
        "acceptance_rate": accepted / max(drafted, 1),
        "tokens_per_round": generated / max(rounds, 1),
        "position_acceptance_rate": by_position,
        "num_draft_tokens": summaries[0]["num_draft_tokens"],
    }


def _print(setup: DemoSetup, results: list[dict], show_texts: bool = True, repeats: int = 1) -> None:
    n = len(setup.prompt_ids)
    draft_lengths = sorted({r["stats"]["num_draft_tokens"] for r in results if r["stats"]})
    sampling = f"temperature {setup.temperature:g}" if setup.temperature > 0 else "greedy"
    timing = (
        f"{repeats} timed passes: seconds are the median pass's wall-clock total, x target-only the median ratio "
        "[lowest, highest pass]"
        if repeats > 1
        else "one timed pass: seconds are its wall-clock total (--repeats 3 or more shows the spread: single passes "
        "on a shared machine vary by a third)"
    )
    print(
        f"{setup.description}: {n} prompt{'s' if n != 1 else ''}, batch 1, {sampling}, N = "
        f"{'/'.join(map(str, draft_lengths))} drafts per round, {torch.get_num_threads()} torch thread(s). Each method "
        "ran once untimed (warm-up), then the prompts ran every method in turn; tokens are the new tokens written "
        f"(up to EOS); {timing}."
    )
    quality = setup.references is not None
    chat = results[0].get("chat_quality") is not None
    label = f"{get_task(setup.task).metric_label}, {n} prompts" if quality else None
    header = "| method | new tokens | seconds | tokens/s | x target-only | acceptance | tokens / round |"
    if chat:
        label = "target log-lik / token (vs target-only) | ROUGE-L vs a target sample (vs target-only)"
    print(header + (f" {label} |" if quality or chat else ""))
    print("|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if quality else "---:|---:|" if chat else ""))
    for r in results:
        stats = r["stats"]
        accepted = "-" if stats is None else f"{stats['acceptance_rate']:.1%}"
        per_round = "-" if stats is None else f"{stats['tokens_per_round']:.2f}"
        low, high = r["speedup_range"]
        spread = f" [{low:.2f}, {high:.2f}]" if repeats > 1 and r["method"] != TARGET_ONLY else ""
        row = (
            f"| {r['method']} | {r['new_tokens']} | {r['seconds']:.2f} | {r['tokens_per_second']:.1f} | "
            f"{r['speedup']:.2f}x{spread} | {accepted} | {per_round} |"
        )
        if chat:
            row += _chat_cells(r["chat_quality"])
        print(row + (f" {100 * r['quality']:.1f} |" if quality else ""))
    print()
    if chat:
        print(
            "Quality without answers: the target's own mean log-probability of each row's text, and its ROUGE-L "
            "agreement with an independent target-only sample; in brackets the difference from target-only with a "
            f"paired 95 % interval over the {n} prompts (a few prompts give wide intervals; a rule whose interval "
            "lies below 0 costs the answer what it gains in speed)."
        )
    if quality:
        print(
            f"Quality on {n} prompts cannot tell the methods apart (a paired 95 % interval needs hundreds): "
            "`diversed-hf bench` measures it."
        )
    for note in setup.notes:
        print(f"Note: {note}")
    if not show_texts:
        return
    for r in results:
        stats = r["stats"]
        if stats is not None:
            positions = ", ".join(f"{rate:.0%}" for rate in stats["position_acceptance_rate"])
            print(f"=== {r['method']}: acceptance by draft position: {positions}")
        else:
            print(f"=== {r['method']}")
        for i, text in enumerate(r["texts"]):
            if setup.shown is not None and i < len(setup.shown):
                print(f"  [prompt]  {setup.shown[i]!r}")
            print(f"  [output]  {text.strip()!r}")


def _chat_cells(scores: dict) -> str:
    def delta(result, scale=1.0):
        if result is None:
            return ""
        return f" ({scale * result['delta']:+.2f} [{scale * result['low']:+.2f}, {scale * result['high']:+.2f}])"

    return (
        f" {scores['log_likelihood']:.2f}{delta(scores['log_likelihood_delta'])} |"
        f" {100 * scores['agreement']:.1f}{delta(scores['agreement_delta'], 100)} |"
    )


def main(args: argparse.Namespace) -> int:
    from .. import testbed  # registers the testbed's tasks

    if args.pair == "testbed" and args.task is None:
        args.task = "arith"
    if args.max_new_tokens is None:
        args.max_new_tokens = 64 if args.task in (None, "everyday") else get_task(args.task).max_new_tokens
    for name in ("num_prompts", "max_new_tokens"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} is {getattr(args, name)}; it must be >= 1.")
    if args.num_draft_tokens is not None and args.num_draft_tokens < 1:
        raise ValueError(f"--num-draft-tokens is {args.num_draft_tokens}; it must be >= 1 (or unset: the draft's own).")
    if args.pair == "testbed" and not args.random_models and args.task not in testbed.TASKS:
        raise ValueError(f"--task is {args.task!r}; the testbed pair's tasks are {testbed.TASKS}.")
    if args.pair == "smollm2" and args.task not in (None, "everyday", "arith_chat", "synopsis"):
        raise ValueError(
            f"--task is {args.task!r}; with --pair smollm2 use everyday (default), arith_chat or synopsis."
        )
    if args.pair == "smollm2" and args.task in (None, "everyday"):
        from ..lab.tasks.chat_prompts import everyday_messages

        if args.num_prompts > len(everyday_messages()):
            raise ValueError(f"--num-prompts is {args.num_prompts}; the everyday set has {len(everyday_messages())}.")
    if args.threads < 0:
        raise ValueError(f"--threads is {args.threads}; use a positive count, or 0 for torch's default.")
    if args.repeats < 1:
        raise ValueError(f"--repeats is {args.repeats}; it must be >= 1 (each is one timed pass over every prompt).")
    if args.temperature is not None and not args.temperature >= 0:
        raise ValueError(f"--temperature is {args.temperature}; use 0 (greedy) or a positive temperature.")
    if args.threads:
        torch.set_num_threads(args.threads)
    setup, results = run_demo(
        args.task,
        args.num_prompts,
        args.max_new_tokens,
        args.num_draft_tokens,
        args.seed,
        args.random_models,
        args.pair,
        args.temperature,
        args.repeats,
    )
    _print(setup, results, show_texts=not args.no_texts, repeats=args.repeats)
    return 0


def register(subparsers) -> None:
    parser = add_command(
        subparsers,
        "demo",
        help="Target-only, SD, static ensemble and DIVERSED side by side: speed and text.",
        description=(
            "Target-only generate, lossless SD, the static ensemble (w = 0.5) and DIVERSED with a shipped head "
            "on the same prompts at batch 1: new tokens, tokens/s, x target-only, acceptance and the texts. --pair "
            "smollm2 runs the real pair on held-out everyday chat prompts."
        ),
        func=main,
    )
    parser.add_argument("--pair", default="testbed", choices=["testbed", "smollm2"], help="the model pair")
    parser.add_argument(
        "--task",
        default=None,
        help="prompts: testbed arith (its default) or summary; smollm2 everyday (its default), arith_chat or synopsis",
    )
    parser.add_argument("--num-prompts", type=int, default=4, help="prompts, each decoded alone (batch 1)")
    parser.add_argument(
        "--max-new-tokens", type=int, default=None, help="new tokens per prompt (default: the task's; everyday 64)"
    )
    parser.add_argument(
        "--num-draft-tokens", type=int, default=None, help="drafts per round, N (default: the draft's own length)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompts and of sampling")
    parser.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="every row's temperature, 0 for greedy (default: testbed 1; smollm2 0.7, or the head's on arith_chat)",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed passes over the prompts; speeds are the median and the spread"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: as many as torch chooses)")
    parser.add_argument("--no-texts", action="store_true", help="print the table only")
    parser.add_argument("--random-models", action="store_true", help="tiny random models instead of a shipped pair")
