"""Evaluating a head against target-only decoding and lossless SD on held-out prompts (docs/method.md §7).

What ``benchmarks/eval_head.py`` runs and the recipes under ``training/`` call after training (:func:`evaluate`),
with the loaders the scripts share: :func:`load_models` (a shipped pair by name, or any two causal LMs),
:func:`load_any_head`, :func:`load_task_data`. For every method, on the same prompts, at the same temperature
(sampling, top-k/top-p off):

* ``autoregressive`` -- the target alone (``generate`` without a draft): quality only;
* ``sd``             -- speculative decoding with ``ExactVerifier`` (output distributed as the target's);
* ``diversed``       -- speculative decoding with the head;
* ``static_<w>``     -- the static ensemble with weight w, for reference.

Rows come in the model-card results format of :mod:`diversed_hf.heads.cards`: ``acceptance_rate`` (accepted drafted
tokens / drafted tokens, summed over rounds), ``tokens_per_round``, ``quality`` (the task's metric from
:mod:`diversed_hf.lab.tasks`: exact match, ROUGE-2 F1 or pass@1, as a fraction) and wall-clock
``seconds_per_sample``; plus the ratio of DIVERSED's acceptance to SD's.

A command-layer module (it loads the testbed's pairs by name); the library never imports it.
"""

from __future__ import annotations

import argparse
import copy
import logging
import time

import torch

from .. import DiversedHead, ExactVerifier, StaticEnsembleVerifier, enable_diversed
from ..lab.bench.stats import add_paired_differences
from ..lab.tasks import get_task, load_task_dataset, task_names

logger = logging.getLogger(__name__)

#: Quality metrics that are a 0/1 score per sample (their standard error is binomial).
BINARY_METRICS = ("exact_match", "pass@1")


FAMILIES = {"autoregressive": "target-only", "sd": "sd", "diversed": "diversed"}  # the bench's families


def task_argument(name: str) -> str:
    """argparse ``type`` of ``--task``: a name (or alias) registered in :mod:`diversed_hf.lab.tasks`."""
    try:
        get_task(name)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return name


def task_help() -> str:
    return f"a task of diversed_hf.lab.tasks: one of {', '.join(task_names())} (testbed tasks also as testbed_<name>)"


def check_pair(task: str, target_id: str, head_source: str | None = None) -> None:
    """Refuse, before any model loads, a task or a shipped head that does not fit the pair ``target_id``."""
    import diversed_hf.testbed as testbed

    name = get_task(task).name
    if target_id == "testbed" and name not in testbed.TASKS:
        raise ValueError(
            f"`--task {task}` with `--target testbed`: the testbed pair (tiny models with their own vocabulary) reads "
            f"only its own tasks {list(testbed.TASKS)}; evaluate {name!r} on a real pair, e.g. `--target smollm2`."
        )
    if head_source and head_source.startswith("testbed:") and target_id != "testbed":
        raise ValueError(
            f"`--head {head_source}` is a head of the testbed pair: it reads that pair's hidden states and cannot run "
            f"with `--target {target_id}`. Use `--target testbed`, or a head trained for this pair."
        )


def load_task_data(task: str, split: str, num_examples: int | None, seed: int, **options):
    """``load_task_dataset`` with the ``options`` the task's loader takes; a set option it does not take is logged."""
    spec = get_task(task)
    accepted = {key: value for key, value in options.items() if key in spec.options}
    ignored = sorted(key for key, value in options.items() if key not in spec.options and value not in (None, 0))
    if ignored:
        logger.warning("task %r does not take the options %s; ignoring them", spec.name, ignored)
    return load_task_dataset(task, split=split, num_examples=num_examples, seed=seed, **accepted)


def load_models(target_id: str, draft_id: str | None, dtype: str = "float32", device: str = "cpu"):
    """(target, draft, tokenizer); ``target_id`` ``"testbed"`` / ``"smollm2"`` / ``"smollm2-tuned"`` loads that
    shipped pair (``testbed.load_pair``), with its own draft (``smollm2``: ``draft_id`` names one of its shipped
    drafts, ``testbed.smollm2.DRAFTS``)."""
    if target_id in ("testbed", "smollm2", "smollm2-tuned"):
        import diversed_hf.testbed as testbed
        from diversed_hf.testbed import smollm2

        named = target_id == "smollm2" and draft_id in smollm2.DRAFTS
        if draft_id is not None and not named:
            raise ValueError(
                f"`--draft {draft_id}` with `--target {target_id}`: the shipped pair brings its own draft "
                f"(smollm2: one of {smollm2.DRAFTS}); drop --draft."
            )
        target, draft, tokenizer = testbed.load_pair(
            target_id, torch_dtype=getattr(torch, dtype), device=device, draft=draft_id if named else None
        )
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if draft_id is None:
            raise ValueError(
                f"`--draft` is required with `--target {target_id}`: pass the draft model's id or path (only "
                "`--target testbed` brings its own draft)."
            )
        target = AutoModelForCausalLM.from_pretrained(target_id, dtype=getattr(torch, dtype)).to(device).eval()
        draft = AutoModelForCausalLM.from_pretrained(draft_id, dtype=getattr(torch, dtype)).to(device).eval()
        tokenizer = AutoTokenizer.from_pretrained(target_id)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return enable_diversed(target), draft, tokenizer


def load_any_head(source: str) -> DiversedHead:
    """``testbed:<task>`` (a shipped head), a local directory or a Hub repo id."""
    if source.startswith("testbed:"):
        import diversed_hf.testbed as testbed

        return testbed.load_head(source.split(":", 1)[1])
    return DiversedHead.from_pretrained(source)


def run_method(
    target,
    draft,
    tokenizer,
    prompts: list[str],
    *,
    verifier=None,
    head=None,
    temperature: float,
    num_draft_tokens: int,
    max_new_tokens: int,
    batch_size: int,
    seed: int,
    generate_options: dict | None = None,
) -> tuple[list[str], dict]:
    """Sampled completions of every prompt and totals: drafted / accepted tokens, rounds, tokens, seconds.
    ``generate_options`` go to every speculative ``generate`` call (a token tree's knobs, say)."""
    tokenizer.padding_side = "left"
    completions: list[str] = []
    totals = {"num_drafted": 0, "num_accepted": 0, "num_rounds": 0, "num_generated": 0, "seconds": 0.0}
    generator = torch.Generator(device=target.device).manual_seed(seed)
    for start in range(0, len(prompts), batch_size):
        encoded = tokenizer(prompts[start : start + batch_size], return_tensors="pt", padding=True).to(target.device)
        kwargs = dict(
            do_sample=True,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        began = time.perf_counter()
        with torch.no_grad():
            if verifier is None and head is None:
                torch.manual_seed(seed + start)
                sequences = target.generate(**encoded, **kwargs)
                stats = None
            else:
                extra = {"diversed_head": head} if head is not None else {"verifier": verifier}
                out = target.generate(
                    **encoded,
                    **kwargs,
                    **extra,
                    assistant_model=draft,
                    num_assistant_tokens=num_draft_tokens,
                    return_dict_in_generate=True,
                    generator=generator,
                    **(generate_options or {}),
                )
                sequences, stats = out.sequences, out.speculation
        totals["seconds"] += time.perf_counter() - began
        new_tokens = sequences[:, encoded["input_ids"].shape[1] :]
        completions += tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
        if stats is not None:
            totals["num_drafted"] += stats.total_drafted
            totals["num_accepted"] += stats.total_accepted
            totals["num_rounds"] += stats.total_rounds
            totals["num_generated"] += int(stats.num_generated.sum())
        else:
            totals["num_generated"] += int((new_tokens != tokenizer.pad_token_id).sum())
    return completions, totals


def _method_plan(methods, head: DiversedHead | None, static_weights: tuple[float, ...]) -> list[tuple]:
    """``(method, verifier, head)`` of every method to run, in the order asked (``diversed`` only with a head),
    then one static ensemble per weight."""
    plan = []
    for method in methods:
        if method == "autoregressive":
            plan.append((method, None, None))
        elif method == "sd":
            plan.append((method, ExactVerifier(), None))
        elif method == "diversed":
            if head is not None:
                plan.append((method, None, head))
        else:
            raise ValueError(
                f"`methods` contains {method!r}; use 'autoregressive', 'sd' and 'diversed' (static ensembles come from "
                "`static_weights`)."
            )
    plan += [(f"static_{w:g}", StaticEnsembleVerifier(target_weight=w), None) for w in static_weights]
    return plan


def _sample_method(
    target, draft, tokenizer, prompts: list[str], references: list[str], score, seeds: range, **decoding
) -> tuple[list[float], list[tuple[int, float]], dict]:
    """One method on every prompt once per sampling seed of ``seeds`` (``decoding``: :func:`run_method`'s other
    keywords): the rewards, the same with each one's prompt index, and the totals summed over the seeds."""
    totals = {"num_drafted": 0, "num_accepted": 0, "num_rounds": 0, "num_generated": 0, "seconds": 0.0}
    scores, indexed = [], []
    for sampling_seed in seeds:
        completions, run_totals = run_method(target, draft, tokenizer, prompts, seed=sampling_seed, **decoding)
        run_scores = score(completions, references)
        scores += run_scores
        indexed.extend(enumerate(run_scores))
        totals = {k: totals[k] + run_totals[k] for k in totals}
    return scores, indexed, totals


def _result_row(method: str, metric: str, scores: list[float], totals: dict) -> dict:
    """A method's row in the model-card results format: quality with its standard error, speed, and (when it
    drafted) acceptance and tokens per round."""
    quality = sum(scores) / len(scores)
    row = {
        "method": method,
        "family": FAMILIES.get(method, "static-ensemble"),
        "quality": quality,
        "quality_metric": metric,
        "quality_stderr": (quality * (1 - quality) / len(scores)) ** 0.5
        if metric in BINARY_METRICS
        else (sum((x - quality) ** 2 for x in scores) / max(len(scores) - 1, 1) / len(scores)) ** 0.5,
        "seconds_per_sample": totals["seconds"] / len(scores),
        "tokens_per_second": totals["num_generated"] / max(totals["seconds"], 1e-9),
    }
    if totals["num_drafted"]:
        row["acceptance_rate"] = totals["num_accepted"] / totals["num_drafted"]
        row["tokens_per_round"] = totals["num_generated"] / max(totals["num_rounds"], 1)
    return row


def evaluate(
    task: str,
    target,
    draft,
    tokenizer,
    head: DiversedHead | None,
    prompts: list[str],
    references: list[str],
    *,
    temperature: float = 1.0,
    num_draft_tokens: int = 5,
    max_new_tokens: int = 128,
    batch_size: int = 50,
    seed: int = 0,
    static_weights: tuple[float, ...] = (),
    methods=("autoregressive", "sd", "diversed"),
    num_sampling_seeds: int = 1,
) -> dict:
    """Rows in the model-card results format (see :mod:`diversed_hf.heads.cards`) for each method on the same prompts.

    With ``num_sampling_seeds`` K > 1 every method samples each prompt K times (seeds ``seed .. seed + K - 1``):
    quality is the mean over the K x prompts completions and acceptance pools all rounds, which shrinks the
    sampling noise of the quality comparison (one run of 200 prompts has a standard error of ~3 points).
    """
    spec = get_task(task)
    score, metric = spec.reward, spec.metric
    plan = _method_plan(methods, head, static_weights)
    decoding = dict(
        temperature=temperature, num_draft_tokens=num_draft_tokens, max_new_tokens=max_new_tokens, batch_size=batch_size
    )
    rows = []
    per_prompt: dict[str, list[tuple[int, float]]] = {}  # method -> (prompt index, reward) of every sample
    for method, verifier, method_head in plan:
        scores, indexed, totals = _sample_method(
            target,
            draft,
            tokenizer,
            prompts,
            references,
            score,
            range(seed, seed + num_sampling_seeds),
            verifier=verifier,
            head=method_head,
            **decoding,
        )
        per_prompt.setdefault(method, []).extend(indexed)
        row = _result_row(method, metric, scores, totals)
        rows.append(row)
        logger.info("%s: %s", method, {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()})
    # Quality minus the target distribution's (autoregressive and SD pooled), paired over prompts, 95 % interval.
    add_paired_differences(rows, per_prompt, seed=seed)
    setting = {
        "task": task,
        "temperature": temperature,
        "num_draft_tokens": num_draft_tokens,
        "num_samples": len(prompts),
        "num_sampling_seeds": num_sampling_seeds,
        "max_new_tokens": max_new_tokens,
        "seed": seed,
        "quality_metric": metric,
    }
    by_method = {r["method"]: r for r in rows}
    if "sd" in by_method and "diversed" in by_method:
        setting["acceptance_ratio_diversed_over_sd"] = by_method["diversed"]["acceptance_rate"] / max(
            by_method["sd"]["acceptance_rate"], 1e-12
        )
    if "diversed" in by_method and by_method["diversed"]["quality_delta"] is not None:
        setting["quality_gap_diversed_minus_target"] = by_method["diversed"]["quality_delta"]
    return {"setting": setting, "rows": rows}


def with_offset(head: DiversedHead, offset: float) -> DiversedHead:
    """A copy of ``head`` whose output logit is shifted by ``offset`` (``w = sigmoid(logit + offset)``: > 0 moves
    every ``w`` toward the target), as ``training/calibrate_head.py`` and ``benchmarks/chat_head.py`` calibrate."""
    shifted = copy.deepcopy(head)
    with torch.no_grad():
        shifted.net[-1].bias.add_(offset)
    return shifted


# What a head's training run must say when it taught nothing (train_head.py; the card shows it) -----------------------
#: the share of prompt tokens a tokenizer may not know before training a head on those prompts is refused
MAX_UNKNOWN_SHARE = 0.05
#: the share of logged steps whose rewards did not vary across completions from which a run is said to teach nothing
SILENT_REWARD_SHARE = 0.9


def check_known_tokens(tokenizer, prompts: list[str], where: str, limit: float = MAX_UNKNOWN_SHARE) -> float:
    """The share of ``prompts``' tokens that ``tokenizer`` maps to its unknown token; above ``limit`` a ValueError
    names the tokenizer, the share and an example (a word-level vocabulary, like the testbed's, knows only its own
    tasks' words)."""
    unknown = getattr(tokenizer, "unk_token_id", None)
    if unknown is None or not prompts:
        return 0.0
    encoded = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    total = sum(len(ids) for ids in encoded)
    share = sum(ids.count(unknown) for ids in encoded) / max(total, 1)
    if share > limit:
        example = next(prompt for prompt, ids in zip(prompts, encoded) if unknown in ids)
        name = getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__
        raise ValueError(
            f"{where}: {100 * share:.1f} % of the prompt tokens are unknown to the target's tokenizer ({name}, unknown "
            f"token {tokenizer.unk_token!r}; e.g. in {example[:80]!r}), above {100 * limit:.0f} % "
            "(--max_unknown_share): the models would read mostly unknown tokens and the head learn nothing of your "
            "task. Write the prompts in the tokenizer's vocabulary (the testbed pair knows its tasks' words, in "
            "their 'Question: ...\\nAnswer:' form: docs/your_task.md), or train on a real target (--target_model)."
        )
    return share


def silent_reward(log_history: list[dict]) -> str | None:
    """A warning when the rewards did not vary across completions in at least :data:`SILENT_REWARD_SHARE` of the
    logged steps (``reward_std`` 0: REINFORCE++'s advantages are then 0, and the head learns only the acceptance
    term), else None."""
    stds = [entry["reward_std"] for entry in log_history if entry.get("reward_std") is not None]
    silent = sum(1 for std in stds if std == 0)
    if not stds or silent < SILENT_REWARD_SHARE * len(stds):
        return None
    return (
        f"the reward did not vary across completions in {silent} of {len(stds)} logged steps: the run had (almost) "
        "no task signal, and the head learned only to accept drafts. Check the reward on the target's own answers "
        "first (does it ever score above 0?)."
    )


def unmeasured_quality(results: dict) -> str | None:
    """When target-only decoding scores 0 on the held-out prompts, no method's quality can be told from it: blank
    every row's quality (``None``, shown as '-') and return the warning; else None."""
    target = next((row for row in results["rows"] if row["method"] == "autoregressive"), None)
    if target is None or target["quality"] is None or target["quality"] > 0:
        return None
    for row in results["rows"]:
        row.update(
            dict.fromkeys(("quality", "quality_stderr", "quality_delta", "quality_delta_low", "quality_delta_high"))
        )
    results["setting"].pop("quality_gap_diversed_minus_target", None)
    metric = target["quality_metric"]
    return (
        f"the target scores 0 ({metric}) on the held-out prompts: no method's quality can be measured against it, "
        "so the quality columns are empty. A head is only as good as a task the target can do."
    )
