"""Measure the shipped testbed: the numbers of docs/testbed.md's table.

    python benchmarks/measure_testbed.py            # everything (~5-10 min on one CPU thread)
    python benchmarks/measure_testbed.py --quick    # 50 problems and 10 SD prompts instead of 200 and 40

Prints, for held-out test problems (``load_task(..., split="test", seed=--seed)``):

* greedy ``arith`` exact-match accuracy of the target and the draft,
* greedy ``summary`` ROUGE-2 F1 (x 100) of both,
* per-token forward cost (batch 1, KV cache, float32, ``--threads`` CPU threads) of each model
  and the ratio target / draft,
* standard speculative decoding acceptance (lossless, temperature 1, N drafted tokens per round):
  acceptance rate = accepted drafted tokens / drafted tokens, and the mean per-position
  acceptance probability ``beta = sum_x min(p(x), q(x))`` along the drafted prefixes.

``--json`` is checked before the measurement. Options take both spellings (``--num-examples``,
``--num_examples``). A bad argument or file ends as one line with exit status 2 (``--debug``: the traceback).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import diversed_hf.testbed as testbed
from diversed_hf.lab.cli_utils import (
    ArgumentParser,
    add_debug_flag,
    check_output_file,
    run_script,
    write_text_atomic,
)

REPO = Path(__file__).resolve().parents[1]


def greedy_completions(model, tokenizer, prompts: list[str], batch_size: int, max_new_tokens: int) -> list[str]:
    tokenizer.padding_side = "left"
    out = []
    for i in range(0, len(prompts), batch_size):
        enc = tokenizer(prompts[i : i + batch_size], return_tensors="pt", padding=True)
        with torch.no_grad():
            gen = model.generate(
                **enc,
                do_sample=False,
                max_new_tokens=max_new_tokens,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        out += tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return out


def forward_cost(model, prompt_ids: torch.Tensor, num_tokens: int = 40) -> float:
    """Seconds per single-token forward with a KV cache after a prefill of ``prompt_ids``."""
    with torch.no_grad():
        out = model(input_ids=prompt_ids, use_cache=True)
        cache = out.cache
        token = prompt_ids[:, -1:]  # (1, 1)
        for _ in range(3):  # warm-up
            out = model(input_ids=token, cache=cache, use_cache=True)
        start = time.perf_counter()
        for _ in range(num_tokens):
            out = model(input_ids=token, cache=cache, use_cache=True)
        return (time.perf_counter() - start) / num_tokens


def speculative_acceptance(target, draft, tokenizer, prompts, num_draft_tokens, max_new_tokens, seed):
    """Standard (lossless) speculative sampling at temperature 1, batch 1, recomputing from scratch.

    Per round the draft samples up to N tokens x_i ~ q_i; the target scores them in one pass; x_i is
    accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection a token is drawn
    from norm(max(0, p_i - q_i)); if all N are accepted a bonus token is drawn from p_{N+1}.
    """
    gen = torch.Generator().manual_seed(seed)
    rounds = 0
    eos = tokenizer.eos_token_id
    drafted = accepted = 0  # over all rounds: every drafted token counts, evaluated or not
    beta_sum, beta_count = 0.0, 0  # beta = sum_x min(p, q) at the evaluated positions
    position_accepts = [0] * num_draft_tokens  # rounds in which draft i was accepted
    position_drafts = [0] * num_draft_tokens  # rounds in which draft i was drafted
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids  # (1, prompt_len)
        prompt_len = ids.shape[1]
        while ids.shape[1] - prompt_len < max_new_tokens:
            draft_ids, draft_probs = [], []
            cur = ids
            with torch.no_grad():
                for _ in range(num_draft_tokens):
                    probs = torch.softmax(draft(input_ids=cur).logits[0, -1].float(), -1)  # (vocab,)
                    token = torch.multinomial(probs, 1, generator=gen)  # (1,)
                    draft_ids.append(token.item())
                    draft_probs.append(probs)  # list of (vocab,)
                    cur = torch.cat([cur, token.view(1, 1)], dim=1)
                    if token.item() == eos:
                        break
                n = len(draft_ids)
                logits = target(input_ids=cur).logits[0, ids.shape[1] - 1 :].float()  # (n + 1, vocab)
                target_probs = torch.softmax(logits, -1)  # (n + 1, vocab)
            drafted += n
            for i in range(n):
                position_drafts[i] += 1
            new_tokens = []
            for i, (token, draft_dist) in enumerate(zip(draft_ids, draft_probs)):
                target_dist = target_probs[i]  # (vocab,)
                beta_sum += torch.minimum(target_dist, draft_dist).sum().item()
                beta_count += 1
                ratio = (target_dist[token] / draft_dist[token]).item()
                if torch.rand((), generator=gen).item() < min(1.0, ratio):
                    accepted += 1
                    position_accepts[i] += 1
                    new_tokens.append(token)
                    continue
                residual = torch.clamp(target_dist - draft_dist, min=0)  # (vocab,)
                new_tokens.append(torch.multinomial(residual / residual.sum(), 1, generator=gen).item())
                break
            else:
                if not draft_ids or draft_ids[-1] != eos:
                    new_tokens.append(torch.multinomial(target_probs[n], 1, generator=gen).item())
            rounds += 1
            ids = torch.cat([ids, torch.tensor([new_tokens])], dim=1)
            if eos in new_tokens:
                break
    return {
        "acceptance_rate": accepted / max(drafted, 1),
        "mean_beta": beta_sum / max(beta_count, 1),
        # P(the first i+1 drafts all accepted), over the rounds that drafted position i
        "per_position_acceptance": [a / max(d, 1) for a, d in zip(position_accepts, position_drafts)],
        "mean_tokens_per_round": (accepted + rounds) / max(rounds, 1),
        "drafted_tokens": drafted,
    }


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-examples", type=int, default=200, help="held-out problems for accuracy / ROUGE")
    parser.add_argument("--sd-prompts", type=int, default=40, help="prompts for the SD acceptance loop")
    parser.add_argument("--num-draft-tokens", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0, help="seed of the test problems (load_task)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="50 problems, 10 SD prompts")
    parser.add_argument("--json", type=str, default=None, help="also write the results to this file")
    parser.add_argument("--assets-dir", type=str, default=None, help="measure models other than the shipped ones")
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    for name in ("num_examples", "sd_prompts", "num_draft_tokens", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} is {getattr(args, name)}; it must be >= 1.")
    if args.json:
        check_output_file(args.json, "--json")  # before the measurement, not after it
    if args.assets_dir:
        testbed.ASSETS_DIR = Path(args.assets_dir)
    if args.quick:
        args.num_examples, args.sd_prompts = 50, 10
    torch.set_num_threads(args.threads)
    target, draft, tokenizer = testbed.load_pair()
    results: dict = {
        "target_params": sum(p.numel() for p in target.parameters()),
        "draft_params": sum(p.numel() for p in draft.parameters()),
    }

    arith = testbed.load_task("arith", split="test", num_examples=args.num_examples, seed=args.seed)
    summary = testbed.load_task("summary", split="test", num_examples=args.num_examples, seed=args.seed)
    for name, model in (("target", target), ("draft", draft)):
        t0 = time.perf_counter()
        comps = greedy_completions(model, tokenizer, arith["prompt"], 50, 160)
        results[f"arith_accuracy_{name}"] = statistics.mean(testbed.reward("arith", comps, arith["reference"]))
        comps = greedy_completions(model, tokenizer, summary["prompt"], 50, 64)
        results[f"summary_rouge2_{name}"] = 100 * statistics.mean(
            testbed.reward("summary", comps, summary["reference"])
        )
        print(
            f"{name}: arith accuracy {results[f'arith_accuracy_{name}']:.3f}, "
            f"summary ROUGE-2 {results[f'summary_rouge2_{name}']:.2f} ({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
        print(f"  e.g. {comps[0]!r}", flush=True)

    prompt_ids = tokenizer(arith["prompt"][0], return_tensors="pt").input_ids  # (1, prompt_len)
    costs = {"target": [], "draft": []}
    for _ in range(5):  # interleaved repeats; the median resists noise from other processes
        for name, model in (("target", target), ("draft", draft)):
            costs[name].append(forward_cost(model, prompt_ids))
    for name in costs:
        results[f"forward_ms_{name}"] = 1000 * statistics.median(costs[name])
    results["cost_ratio"] = results["forward_ms_target"] / results["forward_ms_draft"]
    print(
        f"per-token forward (batch 1, KV cache, fp32, {args.threads} thread): target "
        f"{results['forward_ms_target']:.2f} ms, draft {results['forward_ms_draft']:.2f} ms, "
        f"ratio {results['cost_ratio']:.1f}",
        flush=True,
    )

    for task, data in (("arith", arith), ("summary", summary)):
        t0 = time.perf_counter()
        sd = speculative_acceptance(
            target, draft, tokenizer, data["prompt"][: args.sd_prompts], args.num_draft_tokens, 160, seed=args.seed
        )
        results[f"sd_{task}"] = sd
        print(
            f"SD on {task} (T=1, N={args.num_draft_tokens}, {args.sd_prompts} prompts, {sd['drafted_tokens']} drafted): "
            f"acceptance rate {sd['acceptance_rate']:.3f}, mean beta {sd['mean_beta']:.3f}, "
            f"tokens/round {sd['mean_tokens_per_round']:.2f}, per position "
            f"{[round(a, 3) for a in sd['per_position_acceptance']]} ({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    if args.json:
        write_text_atomic(args.json, json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
