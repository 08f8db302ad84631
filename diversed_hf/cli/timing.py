"""How the measurement scripts time ``generate``: one measurer for every script.

- :func:`timed_generate`, :func:`aggregate_runs`, :func:`measure`: speculative ``generate`` against target-only on the
  same prompts, interleaved per prompt (load changes hit every configuration alike), with acceptance and tokens per
  round; :func:`sampling_modes` the greedy and temperature-0.7 settings; :func:`step_costs` the cost of a draft step
  and of a target pass over ``n`` tokens, relative to one target step.
- :func:`run_configs`: token-tree shapes against target-only per sampling mode (:data:`TREE_MODES`), over batches.
- :func:`compare_arguments` / :func:`compare`: the testbed's loop against transformers' own assisted decoding.

Scripts import this module, never each other (``tests/test_architecture.py``).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

import diversed_hf.testbed as testbed
from diversed_hf import ExactVerifier, StaticEnsembleVerifier, enable_diversed
from diversed_hf.generation.outputs import lengths_to_end
from diversed_hf.lab.cli_utils import ArgumentParser, add_debug_flag

COMPARE_DESCRIPTION = "Our batched loop against transformers' own assisted decoding on the testbed pair."
TREE_MODES = {"greedy": dict(do_sample=False), "T=0.7": dict(do_sample=True, temperature=0.7, top_k=0, top_p=1.0)}


@torch.no_grad()
def step_costs(target, drafts: dict, prompt_ids: torch.Tensor, max_tokens: int = 7, repeats: int = 3) -> dict:
    """``c`` per draft and ``c_verify(n)`` for ``n = 1..max_tokens``, from warm-cache single steps (best of repeats)."""
    from diversed_hf import compat
    from diversed_hf.lab.bench.runner import timing_features

    def best(run) -> float:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        return min(times)

    def timed_steps(model, extra_for) -> list[float]:
        width = prompt_ids.shape[1]
        cache = compat.new_cache()
        compat.forward_with_cache(
            model,
            prompt_ids,
            torch.ones(1, width, dtype=torch.long),
            cache,
            logits_to_keep=1,
            output_hidden_states=False,
            **extra_for(width),
        )
        seconds = []
        for n in range(1, max_tokens + 1):

            def run(n=n):
                compat.forward_with_cache(
                    model,
                    prompt_ids[:, -n:],
                    torch.ones(1, width + n, dtype=torch.long),
                    cache,
                    logits_to_keep=n,
                    output_hidden_states=False,
                    **extra_for(n),
                )
                compat.crop_cache(cache, width)

            seconds.append(best(run))
        return seconds

    target_steps = timed_steps(target, lambda n: {})
    costs = {"target_ms": 1000 * target_steps[0], "c_verify": [s / target_steps[0] for s in target_steps]}
    for name, draft in drafts.items():
        costs[f"c_{name}"] = timed_steps(draft, lambda n, draft=draft: timing_features(draft, n))[0] / target_steps[0]
    return costs


#: ``generate`` keywords that draft without a draft model (diversed_hf.drafting.drafters)
MODEL_FREE_DRAFTERS = ("prompt_lookup_num_tokens", "assistant_early_exit")


def timed_generate(target, draft, inputs, sampling: dict, seed: int, verifier=None, **kwargs) -> dict:
    """One timed ``generate``: target-only without a drafter (a draft model, or a model-free drafter's keyword in
    ``kwargs``), else speculative with ``verifier`` (lossless SD by default)."""
    from diversed_hf.verifiers import ExactVerifier

    start = time.perf_counter()
    if draft is None and not any(name in kwargs for name in MODEL_FREE_DRAFTERS):
        torch.manual_seed(seed)
        out = target.generate(**inputs, return_dict_in_generate=True, **sampling)
        speculation = None
    else:
        out = target.generate(
            **inputs,
            **({"assistant_model": draft} if draft is not None else {}),
            verifier=verifier or ExactVerifier(),
            return_dict_in_generate=True,
            generator=torch.Generator().manual_seed(seed),
            **sampling,
            **kwargs,
        )
        speculation = out.speculation
    seconds = time.perf_counter() - start
    width = inputs["input_ids"].shape[1]
    new = out.sequences[:, width:]
    tokens = int(lengths_to_end(new, target.generation_config.eos_token_id).sum())  # up to and including EOS
    record = {"seconds": seconds, "tokens": tokens, "new_ids": new.tolist()}
    if speculation is not None:
        per_row = torch.nan_to_num(speculation.expected_tokens_per_round, nan=0.0)  # (batch,) mean over its rounds
        betas = [b for r in speculation.position_acceptance for b in r.flatten().tolist() if b == b]
        record.update(
            drafted=int(speculation.num_drafted.sum()),
            accepted=int(speculation.num_accepted.sum()),
            rounds=int(speculation.num_rounds.sum()),
            generated=int(speculation.num_generated.sum()),
            beta_sum=sum(betas),
            beta_count=len(betas),
            expected_sum=float((per_row * speculation.num_rounds.double()).sum()),
            mean_draft_length=float(torch.cat(speculation.draft_lengths).float().mean()),
        )
    return record


def aggregate_runs(records: list[dict]) -> dict:
    total = {k: sum(r[k] for r in records) for k in ("seconds", "tokens")}
    out = {"tokens_per_second": total["tokens"] / total["seconds"], **total}
    if "drafted" in records[0]:
        drafted = sum(r["drafted"] for r in records)
        accepted = sum(r["accepted"] for r in records)
        rounds = sum(r["rounds"] for r in records)
        out.update(
            acceptance=accepted / max(drafted, 1),
            tokens_per_round=sum(r["generated"] for r in records) / rounds,
            alpha=sum(r["beta_sum"] for r in records) / max(sum(r["beta_count"] for r in records), 1),
            mean_draft_length=sum(r["mean_draft_length"] * r["rounds"] for r in records) / rounds,
            expected_tokens_per_round=sum(r["expected_sum"] for r in records) / rounds,
        )
    return out


def measure(tokenizer, prompts: list[str], configs: list, sampling: dict, seed: int, label: str) -> dict:
    """``configs``: ``(key, target, draft or None, generate kwargs)``; each prompt runs every configuration in turn.

    Aggregated per configuration (:func:`eagle_results.aggregate_runs`); a speculative configuration also counts the
    prompts whose new tokens equal those of the first configuration (target-only in the same dtype)."""
    from tqdm.auto import tqdm

    warm = tokenizer(prompts[0], return_tensors="pt", add_special_tokens=False)
    for _, target, draft, kwargs in configs:
        timed_generate(target, draft, warm, {**sampling, "max_new_tokens": 8}, 0, **kwargs)
    records = {key: [] for key, *_ in configs}
    for i, prompt in enumerate(tqdm(prompts, desc=label)):
        inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
        for key, target, draft, kwargs in configs:
            records[key].append(timed_generate(target, draft, inputs, sampling, seed + i, **kwargs))
    reference = [r["new_ids"] for r in records[configs[0][0]]]
    block = {}
    for key, _, draft, _ in configs:
        block[key] = aggregate_runs(records[key])
        if draft is not None:
            block[key]["same_text"] = sum(r["new_ids"] == ids for r, ids in zip(records[key], reference))
    return block


def sampling_modes(max_new_tokens: int) -> dict[str, dict]:
    """``generate`` settings of the two modes measured: greedy, and sampling at temperature 0.7 (top-k, top-p off)."""
    return {
        "greedy": {"do_sample": False, "max_new_tokens": max_new_tokens},
        "t0.7": {
            "do_sample": True,
            "temperature": 0.7,
            "top_k": 0,
            "top_p": 1.0,
            "max_new_tokens": max_new_tokens,
        },
    }


def run_configs(target, draft, tokenizer, prompts, batch: int, max_new_tokens: int, shapes, with_hf: bool) -> dict:
    """Per mode and shape: tokens/s over the prompts (batches of ``batch``), tokens per round, nodes per round,
    and target-only's tokens/s; greedy outputs compared with target-only's."""
    rows = {}
    batches = [prompts[i : i + batch] for i in range(0, len(prompts), batch)]
    encoded = [tokenizer(chunk, return_tensors="pt", padding=True) for chunk in batches]
    for mode, sampling in TREE_MODES.items():

        def timed(**kwargs):
            outputs, tokens, rounds, nodes, start = [], 0, 0, 0, time.perf_counter()
            for enc in encoded:
                with torch.no_grad():
                    out = target.generate(
                        **enc, max_new_tokens=max_new_tokens, return_dict_in_generate=True, **sampling, **kwargs
                    )
                new = out.sequences[:, enc.input_ids.shape[1] :]
                tokens += int((new != tokenizer.pad_token_id).sum())
                outputs.append(new)
                stats = getattr(out, "speculation", None)
                if stats is not None:
                    rounds += int(stats.num_rounds.sum())
                    nodes += (
                        int(stats.tree_nodes.sum()) if stats.tree_nodes is not None else int(stats.num_drafted.sum())
                    )
            return time.perf_counter() - start, tokens, rounds, nodes, outputs

        timed()  # warm-up
        seconds, tokens, _, _, reference = timed()
        base = tokens / seconds
        rows[mode] = {"target-only": {"tokens_per_second": base, "speedup": 1.0}}
        configs = dict(shapes)
        if with_hf and mode == "greedy":
            configs["transformers assisted N=5"] = None
        for name, shape in configs.items():
            if shape is None:  # transformers' own assisted decoding, constant N = 5, no confidence exit
                hf_draft = copy.deepcopy(draft)
                hf_draft.generation_config.num_assistant_tokens_schedule = "constant"
                hf_draft.generation_config.assistant_confidence_threshold = 0.0
                kwargs = dict(assistant_model=hf_draft, num_assistant_tokens=5)
            else:
                kwargs = dict(
                    assistant_model=draft, verifier=ExactVerifier(), generator=torch.Generator().manual_seed(0)
                )
                kwargs.update(shape)
            timed(**kwargs)  # warm-up
            seconds, tokens, rounds, nodes, outputs = timed(**kwargs)
            row = {
                "tokens_per_second": tokens / seconds,
                "speedup": tokens / seconds / base,
                "seconds": seconds,
            }
            if rounds:
                row["tokens_per_round"] = tokens / rounds
                row["nodes_per_round"] = nodes / rounds
            if mode == "greedy":
                row["identical_to_target"] = all(torch.equal(a, b) for a, b in zip(outputs, reference))
            rows[mode][name] = row
    return rows


def compare_arguments(argv=None) -> argparse.Namespace:
    """The settings of :func:`compare` (``benchmarks/compare_hf.py``'s command line)."""
    parser = ArgumentParser(description=COMPARE_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=12, help="test prompts of the `arith` task (default 12)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats; the median is reported (default 5)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--num-assistant-tokens", type=int, default=5, help="drafts per round N (default 5)")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="new tokens per prompt (default 96)")
    parser.add_argument("--weight", type=float, default=0.5, help="target weight of the ensemble pairing (default 0.5)")
    parser.add_argument(
        "--profile", action="store_true", help="then one more run of ours, lossless, its rounds profiled"
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: time.perf_counter (default); cpu: this process's CPU time, steadier on a shared machine",
    )
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    for name in ("num_prompts", "repeats", "threads", "num_assistant_tokens", "max_new_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} is {getattr(args, name)}; it must be >= 1.")
    return args


def compare(args: argparse.Namespace, profile: bool = False) -> dict:
    """``{pairing: {"transformers": s, "ours": s, "ratio": ours / transformers, "identical": bool}}`` (medians over
    ``args.repeats``), with ``"profile"``: where our lossless round's time goes (one more run, profiled) if asked."""
    torch.set_num_threads(args.threads)
    target, draft, tokenizer = testbed.load_pair()
    enable_diversed(target)
    # transformers reads the schedule from the assistant's generation config; keep it constant and
    # switch off its confidence early-exit so both sides draft exactly N tokens per round.
    draft = copy.deepcopy(draft)
    draft.generation_config.num_assistant_tokens = args.num_assistant_tokens
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    prompts = testbed.load_task("arith", split="test", num_examples=args.num_prompts)["prompt"]
    encoded = [tokenizer(text, return_tensors="pt") for text in prompts]
    common = dict(
        assistant_model=draft,
        do_sample=False,
        max_new_tokens=args.max_new_tokens,
        num_assistant_tokens=args.num_assistant_tokens,
    )
    methods = {
        ("lossless", "transformers"): dict(num_assistant_tokens_schedule="constant"),
        ("lossless", "ours"): dict(verifier=ExactVerifier()),
        ("ensemble", "transformers"): dict(
            num_assistant_tokens_schedule="constant", assistant_ensemble_weight=args.weight
        ),
        ("ensemble", "ours"): dict(verifier=StaticEnsembleVerifier(args.weight)),
    }

    clock = time.perf_counter if args.clock == "wall" else time.process_time

    def run(key):
        outputs, start = [], clock()
        for enc in encoded:
            with torch.no_grad():
                outputs.append(target.generate(**enc, **common, **methods[key]))
        return clock() - start, outputs

    for key in methods:  # warm-up
        run(key)
    times = {key: [] for key in methods}
    identical = {pairing: True for pairing, _ in methods}
    for repeat in range(args.repeats):
        for pairing in ("lossless", "ensemble"):
            order = ("transformers", "ours") if repeat % 2 == 0 else ("ours", "transformers")
            results = {}
            for side in order:
                elapsed, results[side] = run((pairing, side))
                times[(pairing, side)].append(elapsed)
            identical[pairing] &= all(torch.equal(a, b) for a, b in zip(results["transformers"], results["ours"]))
    measured = {}
    for pairing in ("lossless", "ensemble"):
        theirs = statistics.median(times[(pairing, "transformers")])
        ours = statistics.median(times[(pairing, "ours")])
        measured[pairing] = {
            "transformers": theirs,
            "ours": ours,
            "ratio": ours / theirs,
            "identical": identical[pairing],
        }
    if profile:
        from diversed_hf.common.round_profile import profile_rounds

        with profile_rounds() as rounds:
            run(("lossless", "ours"))
        measured["profile"] = {
            "rounds": rounds.rounds,
            "seconds": rounds.wall,
            "table": rounds.table(),
            "rows": [{"phase": name, "ms_per_round": ms, "share": share} for name, ms, share in rounds.rows()],
        }
    return measured
