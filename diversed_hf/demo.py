"""``diversed-hf demo``: speculative decoding on the shipped CPU testbed, printing text and acceptance.

Runs a few held-out prompts (``--num-prompts``, default 4) of *one* testbed task, ``--task arith`` (the
default) or ``--task summary``, through lossless SD (``ExactVerifier``), the static ensemble with w = 0.5
and, when the testbed ships one, the task's trained DIVERSED head, all in one batch per method, sampling
at temperature 1 for the task's generation length on 1 torch thread (``--max-new-tokens``,
``--threads``). It prints a table of what each method trades: quality on the prompts' reference answers
(the task's metric), acceptance, tokens per round and the time after a warm-up; then, per method, the
acceptance by draft position and the completions. ``--random-models`` swaps in tiny randomly
initialised models and an untrained head (no testbed needed; the text is then gibberish and there is
no quality).
"""

from __future__ import annotations

import argparse
import time

import torch

from .generation import enable_diversed
from .tasks import get_task
from .verifiers import ExactVerifier, HeadVerifier, StaticEnsembleVerifier


def _testbed_setup(task: str, num_prompts: int, seed: int):
    from . import testbed

    target, draft, tokenizer = testbed.load_pair()
    data = testbed.load_task(task, split="test", num_examples=num_prompts, seed=seed)
    methods = {"SD (ExactVerifier)": ExactVerifier(), "static ensemble w=0.5": StaticEnsembleVerifier(0.5)}
    try:
        methods["DIVERSED head"] = HeadVerifier(testbed.load_head(task))
    except FileNotFoundError:  # a source checkout whose heads have not been trained yet
        pass
    return target, draft, tokenizer, list(data["prompt"]), methods, list(data["reference"])


def _random_setup(num_prompts: int, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    from .head import DiversedHead

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
    prompts = [torch.randint(3, 256, (6,), generator=generator) for _ in range(num_prompts)]
    head = DiversedHead.for_pair(target, draft, w_0=0.5)
    methods = {
        "SD (ExactVerifier)": ExactVerifier(),
        "static ensemble w=0.5": StaticEnsembleVerifier(0.5),
        "DIVERSED head (untrained)": HeadVerifier(head),
    }
    return target, draft, None, prompts, methods, None


def run_demo(
    task: str = "arith",
    num_prompts: int = 4,
    max_new_tokens: int = 64,
    num_draft_tokens: int = 5,
    seed: int = 0,
    random_models: bool = False,
) -> list[dict]:
    """Run every method on the same prompts; returns one dict per method with texts, quality and statistics.

    ``quality`` is the mean of the task's reward on the prompts' references (``None`` with random models);
    ``seconds`` is measured after one warm-up call per method.
    """
    if random_models:
        target, draft, tokenizer, prompts, methods, references = _random_setup(num_prompts, seed)
        input_ids = torch.stack(prompts)
        attention_mask = torch.ones_like(input_ids)
        pad_token_id = 0
    else:
        target, draft, tokenizer, prompts, methods, references = _testbed_setup(task, num_prompts, seed)
        tokenizer.padding_side = "left"
        batch = tokenizer(prompts, return_tensors="pt", padding=True)
        input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
        pad_token_id = tokenizer.pad_token_id
    enable_diversed(target)
    results = []
    reward = None if references is None else get_task(task).reward
    for name, verifier in methods.items():
        common = dict(
            assistant_model=draft,
            verifier=verifier,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            num_assistant_tokens=num_draft_tokens,
            pad_token_id=pad_token_id,
        )
        target.generate(input_ids[:1], attention_mask=attention_mask[:1], max_new_tokens=4, **common)  # warm-up
        start = time.perf_counter()
        output = target.generate(
            input_ids,
            attention_mask=attention_mask,
            max_new_tokens=max_new_tokens,
            return_dict_in_generate=True,
            generator=torch.Generator().manual_seed(seed),
            **common,
        )
        seconds = time.perf_counter() - start
        new_tokens = output.sequences[:, input_ids.shape[1] :]
        texts = (
            tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
            if tokenizer is not None
            else [" ".join(map(str, row.tolist())) for row in new_tokens]
        )
        quality = None if reward is None else sum(reward(texts, references)) / len(texts)
        results.append(
            {
                "method": name,
                "texts": texts,
                "quality": quality,
                "seconds": seconds,
                "stats": output.speculation.summary(),
            }
        )
    return results


def _print(results, prompts_shown: list[str] | None, quality_label: str | None = None) -> None:
    label = quality_label or "quality"
    print(f"| method | {label} | acceptance | tokens / round | seconds |")
    print("|---|---:|---:|---:|---:|")
    for result in results:
        stats, quality = result["stats"], result["quality"]
        shown = "-" if quality is None else f"{100 * quality:.1f}"
        print(
            f"| {result['method']} | {shown} | {stats['acceptance_rate']:.1%} | {stats['tokens_per_round']:.2f} | "
            f"{result['seconds']:.2f} |"
        )
    print()
    for result in results:
        stats = result["stats"]
        print(
            f"=== {result['method']}: acceptance {stats['acceptance_rate']:.1%}, {stats['tokens_per_round']:.2f} "
            f"tokens/round, {stats['num_generated']} tokens in {result['seconds']:.1f}s"
        )
        print("    acceptance by draft position: " + ", ".join(f"{r:.0%}" for r in stats["position_acceptance_rate"]))
        for i, text in enumerate(result["texts"]):
            if prompts_shown is not None and i < len(prompts_shown):
                print(f"  [prompt]  {prompts_shown[i]!r}")
            print(f"  [output]  {text.strip()!r}")


def main(args: argparse.Namespace) -> int:
    from . import testbed  # registers the testbed's tasks

    if args.max_new_tokens is None:
        args.max_new_tokens = get_task(args.task).max_new_tokens  # long enough for a whole answer
    for name in ("num_prompts", "max_new_tokens", "num_draft_tokens"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} is {getattr(args, name)}; it must be >= 1.")
    if args.threads < 0:
        raise ValueError(f"--threads is {args.threads}; use a positive count, or 0 for torch's default.")
    if args.threads:
        torch.set_num_threads(args.threads)
    results = run_demo(
        args.task, args.num_prompts, args.max_new_tokens, args.num_draft_tokens, args.seed, args.random_models
    )
    if args.random_models:
        print("Tiny RANDOM models (no testbed): the text is meaningless, the statistics are real.")
        shown, label = None, None
    else:
        shown = list(
            testbed.load_task(args.task, split="test", num_examples=args.num_prompts, seed=args.seed)["prompt"]
        )
        label = get_task(args.task).metric_label
        print(
            f"Testbed pair, task {args.task!r}, {args.num_prompts} held-out prompts, temperature 1, N = "
            f"{args.num_draft_tokens}, {torch.get_num_threads()} torch thread(s); seconds after a warm-up."
        )
    _print(results, shown, label)
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("demo", help="Speculative decoding on the shipped CPU testbed, with statistics.")
    parser.add_argument("--task", default="arith", choices=["arith", "summary"])
    parser.add_argument("--num-prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="Default: the task's (arith 100, summary 40).")
    parser.add_argument("--num-draft-tokens", type=int, default=5, help="Drafts per round, N.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (0: torch's default; 1 keeps times steady on a busy machine).",
    )
    parser.add_argument("--random-models", action="store_true", help="Use tiny random models instead of the testbed.")
    parser.set_defaults(func=main)
