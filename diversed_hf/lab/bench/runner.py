"""Running the bench: :func:`run_bench` decodes a task's prompts with every method and returns a
:class:`~diversed_hf.lab.bench.schema.BenchResult`.

Per task: the cost ratio of the pair (:func:`measure_cost`), then the **quality pass** (every prompt,
batched, untimed; ``num_samples`` seeded samples each) and the **timing pass** (the first
``num_timing_prompts``, an untimed warm-up run then ``repeats`` interleaved runs, median kept); rows come from
:func:`diversed_hf.lab.bench.stats.method_row`. Under ``accelerate launch`` prompts are split between
processes and the records gathered (accelerate is optional: without it, one process).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import time
from typing import Any, Sequence

import torch

from ... import compat
from ...drafting.protocol import capabilities_of
from ...generation.mixin import enable_diversed
from ...verifiers.rules import HeadVerifier
from ..tasks import metric_label
from .chat_quality import add_chat_quality
from .config import SAMPLE_SEED_STRIDE, BenchConfig, BenchTask, draft_length_of
from .methods import Method, parse_schedules, with_schedules
from .partial import PartialRecords, module_digest
from .schema import BenchResult
from .stats import add_block_differences, add_paired_differences, add_relative_speedups, method_row

logger = logging.getLogger(__name__)

__all__ = ["end_processes", "measure_cost", "process_state", "run_bench", "timing_features"]


# ------------------------------------------------------------------------------------------------
# Distributed helpers (accelerate is optional)


class _SingleProcess:
    num_processes, process_index, is_main_process = 1, 0, True
    device = torch.device("cpu")

    def wait_for_everyone(self):
        pass


def process_state():
    """accelerate's ``PartialState`` (under ``accelerate launch``: this process of several), else one process."""
    try:
        from accelerate import PartialState
    except ImportError:  # the `bench` extra is not installed: one process
        return _SingleProcess()
    # Without a GPU, processes started by `accelerate launch --multi_gpu` / `torchrun` talk over gloo.
    return PartialState(cpu=not torch.cuda.is_available())


def end_processes(state) -> None:
    """Under ``accelerate launch``: wait for every process, then close the process group.

    A process that exits with the group still open can abort at interpreter shutdown ("terminate called without an
    active exception": gloo's threads are still running), which fails the whole launch after the work is done.
    """
    if state.num_processes > 1:
        state.wait_for_everyone()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _shard(state, items: list) -> list:
    if state.num_processes == 1:
        return list(items)
    with state.split_between_processes(list(items)) as part:
        return list(part)


def _gather(state, items: list) -> list:
    if state.num_processes == 1:
        return list(items)
    from accelerate.utils import gather_object

    return list(gather_object(list(items)))


# ------------------------------------------------------------------------------------------------
# Measuring


def timing_features(model, width: int, device=None) -> dict:
    """Extra forward inputs for timing ``width`` columns of ``model``: zero features for a draft that reads the
    target's (an EagleDraft; its cost does not depend on their values), nothing for any other model."""
    if not capabilities_of(model).reads_target_features:
        return {}
    return {"target_hidden": torch.zeros(1, width, model.config.hidden_size, device=device)}


@torch.no_grad()
def measure_cost(model, input_ids: torch.Tensor, num_tokens: int = 32, chunk: int = 1, repeats: int = 3) -> float:
    """Median seconds of one forward of ``chunk`` new tokens on a KV cache holding ``input_ids`` (1, L).

    Each timed forward is undone (the cache is cropped back), so every call sees the same context. A draft that reads
    the target's features (an EagleDraft) gets zero features of the right shape: the cost does not depend on them.
    """
    if num_tokens == 0:
        return float("nan")
    length = input_ids.shape[1]
    mask = torch.ones(1, length + chunk, dtype=torch.long, device=input_ids.device)  # (1, L + chunk)
    tokens = input_ids[:, -1:].repeat(1, chunk)  # (1, chunk)
    prompt_inputs = timing_features(model, length, input_ids.device)
    step_inputs = timing_features(model, chunk, input_ids.device)  # built once, outside the timed loop
    times = []
    for _ in range(repeats):
        cache = compat.new_cache()
        compat.forward_with_cache(
            model,
            input_ids,
            mask[:, :length],
            cache,
            logits_to_keep=1,
            output_hidden_states=False,
            **prompt_inputs,
        )
        compat.forward_with_cache(
            model,
            tokens,
            mask,
            cache,
            logits_to_keep=chunk,
            output_hidden_states=False,
            **step_inputs,
        )  # warm-up
        compat.crop_cache(cache, length)
        start = time.perf_counter()
        for _ in range(num_tokens):
            compat.forward_with_cache(
                model,
                tokens,
                mask,
                cache,
                logits_to_keep=chunk,
                output_hidden_states=False,
                **step_inputs,
            )
            compat.crop_cache(cache, length)
        times.append((time.perf_counter() - start) / num_tokens)
    return statistics.median(times)


def _generation_kwargs(config: BenchConfig, tokenizer) -> dict:
    kwargs = dict(
        max_new_tokens=config.max_new_tokens,
        return_dict_in_generate=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    if config.temperature > 0:
        kwargs.update(do_sample=True, temperature=config.temperature, top_k=config.top_k, top_p=config.top_p)
    else:
        kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    return kwargs


def _run_batch(
    target,
    drafts,
    method: Method,
    batch: dict,
    config: BenchConfig,
    tokenizer,
    seed: int,
    want_weights: bool = False,
    heuristic_state: dict | None = None,
):
    """One ``generate`` call: ``(new_tokens (B, T), lengths (B,), stats or None)``.

    ``heuristic_state`` (method name -> draft length) carries the ``"heuristic"`` schedule's value from one
    call to the next, as transformers keeps it on the assistant's ``generation_config``; the assistant's
    own value is restored after the call so that no other method sees it.
    """
    kwargs = _generation_kwargs(config, tokenizer)
    prompt_len = batch["input_ids"].shape[1]
    if method.verifier is None:
        torch.manual_seed(seed)
        output = target.generate(**batch, **kwargs)
        new_tokens = output.sequences[:, prompt_len:]  # (B, T)
        full = torch.full(
            (new_tokens.shape[0],), new_tokens.shape[1], dtype=torch.long, device=new_tokens.device
        )  # (B,)
        if tokenizer.eos_token_id is None:
            return new_tokens, full, None
        is_end = new_tokens == tokenizer.eos_token_id  # (B, T)
        return new_tokens, torch.where(is_end.any(dim=1), is_end.long().argmax(dim=1) + 1, full), None
    schedule = method.schedule
    policy = (
        schedule.generate_kwargs(config.num_draft_tokens)
        if schedule
        else dict(num_assistant_tokens=config.num_draft_tokens, num_assistant_tokens_schedule="constant")
    )
    policy["assistant_tree_top_k"] = 1  # the bench measures chains, whatever tree a draft's generation config carries
    draft = drafts[method.draft]
    persistent = schedule is not None and schedule.name == "heuristic" and heuristic_state is not None
    if persistent:
        policy["num_assistant_tokens"] = heuristic_state.get(method.name, policy["num_assistant_tokens"])
        saved = draft.generation_config.num_assistant_tokens
    output = target.generate(
        **batch,
        **kwargs,
        **policy,
        assistant_model=draft,
        verifier=method.verifier,
        generator=torch.Generator().manual_seed(seed),
        output_target_weights=want_weights,
    )
    if persistent:
        heuristic_state[method.name] = draft.generation_config.num_assistant_tokens
        draft.generation_config.num_assistant_tokens = saved
    stats = output.speculation
    return output.sequences[:, prompt_len:], stats.num_generated, stats


def _records(
    method: Method, indices: list[int], new_tokens, lengths, stats, tokenizer, keep_tokens: set[int]
) -> list[dict]:
    """Per-prompt records (plain Python / CPU tensors, so they pickle for gathering): ``index``, ``completion``,
    ``num_generated`` and, for speculative methods, the round counts, per-position counts, ``position_acceptance``
    (beta_t, (rounds, N)), ``drafted_acceptance`` (a_t(x_t), (rounds, N)) and the target weights."""
    records = []
    for row, index in enumerate(indices):
        length = int(lengths[row])
        ids = new_tokens[row, :length].tolist()
        record: dict[str, Any] = {
            "index": index,
            "completion": tokenizer.decode(ids, skip_special_tokens=True),
            "ids": ids,  # what the chat measures score (chat_quality)
            "num_generated": length,
        }
        if stats is not None:
            record.update(
                num_rounds=int(stats.num_rounds[row]),
                num_drafted=int(stats.num_drafted[row]),
                num_accepted=int(stats.num_accepted[row]),
                drafted_per_position=stats.drafted_per_position[row].tolist(),
                accepted_per_position=stats.accepted_per_position[row].tolist(),
                position_acceptance=stats.position_acceptance[row].clone(),  # (rounds, N)
            )
            drafted_acceptance = stats.drafted_acceptance
            if drafted_acceptance is not None:
                record["drafted_acceptance"] = drafted_acceptance[row].clone()  # (rounds, N)
            if stats.target_weights is not None:
                weights = stats.target_weights[row]  # (num_generated,)
                record["mean_target_weight"] = float(weights.nanmean()) if (~weights.isnan()).any() else None
                if index in keep_tokens:
                    record["tokens"] = [tokenizer.decode([i]) for i in ids]
                    record["target_weights"] = [None if math.isnan(w) else float(w) for w in weights.tolist()]
        records.append(record)
    return records


def _batches(indices: list[int], size: int):
    for start in range(0, len(indices), size):
        yield indices[start : start + size]


def _tokenize(tokenizer, prompts: list[str], device) -> dict:
    return {key: value.to(device) for key, value in tokenizer(prompts, return_tensors="pt", padding=True).items()}


@dataclasses.dataclass
class _Run:
    """What every step of one :func:`run_bench` call reads: the models, the prompts, the config, the processes."""

    target: Any
    drafts: dict
    tokenizer: Any
    config: BenchConfig
    state: Any
    prompts: list[str]
    show: bool
    heuristic_state: dict = dataclasses.field(default_factory=dict)
    profiles: dict = dataclasses.field(default_factory=dict)  # --profile: per speculative method
    partial: PartialRecords | None = None  # each finished method's quality records, kept while the run lasts

    def run_batch(self, method: Method, batch_indices: list[int], seed: int, want_weights: bool = False):
        batch = _tokenize(self.tokenizer, [self.prompts[i] for i in batch_indices], self.target.device)
        return _run_batch(
            self.target,
            self.drafts,
            method,
            batch,
            self.config,
            self.tokenizer,
            seed,
            want_weights,
            heuristic_state=self.heuristic_state,
        )


def run_bench(
    target,
    draft,
    tokenizer,
    task: BenchTask,
    methods: Sequence[Method],
    config: BenchConfig | None = None,
    *,
    finetuned_draft=None,
    notes: Sequence[str] = (),
    progress: bool = False,
    partial_dir=None,
) -> BenchResult:
    """Run every method on ``task`` and return one row per method (see the :mod:`diversed_hf.lab.bench` docstring).

    Under ``accelerate launch`` every process must call this with the same arguments; prompts are split
    between processes and every process returns the same gathered result. With ``partial_dir``, each method's
    quality records are kept there as soon as it is done, and those an interrupted run with the same settings kept
    there are reused (:mod:`~diversed_hf.lab.bench.partial`; the caller removes them once the results are written).
    """
    config = config or BenchConfig()
    if config.num_draft_tokens is None:  # the draft's own length
        config = dataclasses.replace(config, num_draft_tokens=draft_length_of(draft))
    methods = list(methods)
    if not methods:
        raise ValueError("`methods` is empty; pass at least one method, e.g. parse_methods(['target', 'sd'])[0].")
    if len(task.prompts) < config.num_prompts:
        raise ValueError(
            f"task {task.name!r} has {len(task.prompts)} prompts but `num_prompts` is {config.num_prompts}; lower it."
        )
    if any(m.draft == "finetuned" for m in methods) and finetuned_draft is None:
        raise ValueError("A method uses the fine-tuned draft but `finetuned_draft` is None; pass the model.")
    if tokenizer.pad_token_id is None:
        raise ValueError("The tokenizer has no pad token; set `tokenizer.pad_token = tokenizer.eos_token` first.")
    methods = with_schedules(methods, parse_schedules(config.schedules))
    state = process_state()
    enable_diversed(target)
    tokenizer.padding_side = "left"
    run = _Run(
        target,
        {"draft": draft, "finetuned": finetuned_draft},
        tokenizer,
        config,
        state,
        task.prompts[: config.num_prompts],
        show=progress and state.is_main_process,
    )
    run.partial = PartialRecords(
        partial_dir,
        task=task,
        config=config,
        models={"target": target, "draft": draft, "finetuned": finetuned_draft},
        num_processes=state.num_processes,
    )
    costs = _measure_costs(run, methods)
    records = _quality_pass(run, task, methods)
    timings, timed_tokens = _timing_pass(run, task, methods)

    # 4. Rows, and each method's quality against the target distribution, paired over prompts.
    rewards = {
        method.name: task.reward(
            [r["completion"] for r in records[method.name]], [task.references[r["index"]] for r in records[method.name]]
        )
        for method in methods
    }
    rows = [
        method_row(
            method,
            records[method.name],
            timings[method.name],
            timed_tokens.get(method.name),
            task,
            config,
            costs,
            rewards=rewards[method.name],
        )
        for method in methods
    ]
    add_relative_speedups(rows)
    paired_rewards = {
        m.name: [(r["index"], reward) for r, reward in zip(records[m.name], rewards[m.name])] for m in methods
    }
    add_paired_differences(rows, paired_rewards, num_resamples=config.num_bootstrap, seed=config.seed)
    add_block_differences(rows, paired_rewards, records, num_resamples=config.num_bootstrap, seed=config.seed)
    if not any(task.references[: config.num_prompts]):  # no answers to score: quality against the target itself
        add_chat_quality(rows, records, target, tokenizer, run.prompts, config.num_bootstrap, config.seed)
    examples = _examples(run, methods, records)
    meta = _meta(run, task, methods, costs, draft, finetuned_draft)
    return BenchResult(task.name, rows, examples, list(notes), meta)


def _measure_costs(run: _Run, methods: list[Method]) -> dict[str, float]:
    """1. Cost ratio c = draft token / target token (single-token forwards with a KV cache), and the verification
    pass over n + 1 tokens, for one drafted token and for each policy's length bound."""
    config, target = run.config, run.target
    cost_ids = run.tokenizer(run.prompts[0], return_tensors="pt")["input_ids"].to(target.device)  # (1, L)
    costs = {"target_token_seconds": measure_cost(target, cost_ids, config.cost_tokens)}
    costs["verify_pass_seconds"] = measure_cost(target, cost_ids, config.cost_tokens, chunk=config.num_draft_tokens + 1)
    bounds = {1, config.num_draft_tokens} | {
        m.schedule.num_tokens for m in methods if m.schedule is not None and m.schedule.num_tokens
    }
    for n in sorted(bounds):
        costs[f"verify_pass_seconds_{n + 1}"] = (
            costs["verify_pass_seconds"]
            if n == config.num_draft_tokens
            else measure_cost(target, cost_ids, config.cost_tokens, chunk=n + 1)
        )
    for name, model in run.drafts.items():
        if model is not None:
            costs[f"{name}_token_seconds"] = measure_cost(model, cost_ids, config.cost_tokens)
    return {key: statistics.mean(values) for key, values in _merge_dicts(_gather(run.state, [costs])).items()}


def by_length(tokenizer, prompts: list[str], indices: list[int]) -> list[int]:
    """``indices`` ordered by their prompt's length in tokens (ties by index): consecutive batches then pad little,
    which matters for long prompts (a batch's prefill costs its longest prompt's length per row)."""
    lengths = [len(ids) for ids in tokenizer([prompts[i] for i in indices])["input_ids"]]
    return [index for _, index in sorted(zip(lengths, indices))]


def _quality_pass(run: _Run, task: BenchTask, methods: list[Method]) -> dict[str, list[dict]]:
    """2. Quality pass: batched, untimed, each process's prompts batched in order of length (:func:`by_length`);
    sample k of a batch is seeded seed + k * SAMPLE_SEED_STRIDE + its first index. Target-only, SD and the task's
    DIVERSED get every prompt (the paired quality comparison needs them), the other methods the first
    `num_baseline_prompts`."""
    from tqdm.auto import tqdm

    config = run.config

    def scored(method: Method) -> int:
        every = (method.base_family or method.family) in ("target-only", "sd") or method.own_head  # block: as its pair
        return len(run.prompts) if every else config.num_baseline_prompts

    keep_tokens = set(range(config.num_html_examples))
    shards = {
        count: by_length(run.tokenizer, run.prompts, _shard(run.state, list(range(count))))
        for count in {scored(m) for m in methods}
    }
    records: dict[str, list[dict]] = {}
    bar = tqdm(
        total=sum(len(shards[scored(m)]) for m in methods) * config.num_samples,
        desc=f"{task.name}: quality",
        disable=not run.show,
        unit="prompt",
    )
    for method in methods:
        saved = run.partial.load(method)
        if saved is not None:
            records[method.name] = saved
            bar.update(len(shards[scored(method)]) * config.num_samples)
            continue
        mine = []
        want_weights = method.verifier is not None and method.family not in ("sd", "sd-finetuned")
        for sample in range(config.num_samples):
            for batch_indices in _batches(shards[scored(method)], config.batch_size):
                seed = config.seed + sample * SAMPLE_SEED_STRIDE + batch_indices[0]
                new_tokens, lengths, stats = run.run_batch(method, batch_indices, seed, want_weights)
                batch_records = _records(
                    method,
                    batch_indices,
                    new_tokens,
                    lengths,
                    stats,
                    run.tokenizer,
                    keep_tokens if sample == 0 else set(),
                )
                mine += [{**record, "sample": sample} for record in batch_records]
                bar.update(len(batch_indices))
        records[method.name] = sorted(_gather(run.state, mine), key=lambda r: (r["sample"], r["index"]))
        if run.state.is_main_process:
            run.partial.save(method, records[method.name])
    bar.close()
    return records


def _timing_pass(run: _Run, task: BenchTask, methods: list[Method]) -> tuple[dict[str, list[float]], dict[str, int]]:
    """3. Timing: a warm-up (one untimed run of the timing prompts per method: kernels, caches, and the state a
    draft-length policy keeps across calls), then interleaved repeats; wall time of a run = the slowest process's."""
    from tqdm.auto import tqdm

    config, state = run.config, run.state
    timing_indices = _shard(state, list(range(config.num_timing_prompts)))
    timings: dict[str, list[float]] = {m.name: [] for m in methods}
    timed_tokens: dict[str, int] = {}
    if not config.num_timing_prompts:
        return timings, timed_tokens

    def timed_run(method: Method) -> tuple[float, int]:  # seconds, tokens of one run over this process's prompts
        tokens = 0
        start = time.perf_counter()
        for batch_indices in _batches(timing_indices, config.timing_batch_size):
            _, lengths, _ = run.run_batch(method, batch_indices, config.seed + batch_indices[0])
            tokens += int(lengths.sum())
        return time.perf_counter() - start, tokens

    bar = tqdm(total=len(methods) * (config.repeats + 1), desc=f"{task.name}: timing", disable=not run.show, unit="run")
    for method in methods:
        timed_run(method)
        bar.update(1)
    for repeat in range(config.repeats):
        shift = repeat % len(methods)
        for method in methods[shift:] + methods[:shift]:
            state.wait_for_everyone()
            seconds, tokens = timed_run(method)
            gathered = _gather(state, [(seconds, tokens)])
            timings[method.name].append(max(s for s, _ in gathered))
            timed_tokens[method.name] = sum(t for _, t in gathered)
            bar.update(1)
    bar.close()
    if config.profile:
        run.profiles = _profile_pass(run, methods, timed_run)
    return timings, timed_tokens


def _profile_pass(run: _Run, methods: list[Method], timed_run) -> dict[str, dict]:
    """``--profile``: one more run of the timing prompts per speculative method, its rounds profiled
    (:mod:`diversed_hf.common.round_profile`); this process's rows per method."""
    from ...common.round_profile import profile_rounds

    profiles = {}
    for method in methods:
        if method.verifier is None:
            continue
        with profile_rounds(run.target.device) as profile:
            timed_run(method)
        profiles[method.name] = {
            "rounds": profile.rounds,
            "seconds": profile.wall,
            "table": profile.table(),
            "rows": [{"phase": name, "ms_per_round": ms, "share": share} for name, ms, share in profile.rows()],
        }
    return profiles


def _examples(run: _Run, methods: list[Method], records: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """The records kept with their tokens (the first ``num_html_examples`` prompts), with their prompt."""
    examples = {
        method.name: [r for r in records[method.name] if "tokens" in r]
        for method in methods
        if any("tokens" in r for r in records[method.name])
    }
    for method_examples in examples.values():
        for record in method_examples:
            record["prompt"] = run.prompts[record["index"]]
            record.pop("position_acceptance", None)
            record.pop("drafted_acceptance", None)
    return examples


def _meta(run: _Run, task: BenchTask, methods: list[Method], costs: dict, draft, finetuned_draft) -> dict:
    own_head = next((m.verifier.head for m in methods if m.own_head and isinstance(m.verifier, HeadVerifier)), None)
    return {
        "task": task.name,
        "quality_metric": task.quality_metric,
        "quality_label": metric_label(task.quality_metric),
        "target": _model_name(run.target),
        "draft": _model_name(draft),
        "finetuned_draft": _model_name(finetuned_draft) if finetuned_draft is not None else None,
        "num_processes": run.state.num_processes,
        "torch_threads": torch.get_num_threads(),
        "costs": costs,
        "cost_ratio": costs.get("draft_token_seconds", float("nan")) / costs["target_token_seconds"],
        "verify_cost_ratio": costs["verify_pass_seconds"] / costs["target_token_seconds"],
        "config": dataclasses.asdict(run.config),
        "head": dataclasses.asdict(own_head.config) if own_head is not None else None,
        "head_digest": module_digest(own_head),  # which weights the rows measured (a head retrained later differs)
        **({"profile": run.profiles} if run.profiles else {}),
    }


def _merge_dicts(dicts: list[dict]) -> dict[str, list[float]]:
    merged: dict[str, list[float]] = {}
    for item in dicts:
        for key, value in item.items():
            merged.setdefault(key, []).append(value)
    return merged


def _model_name(model) -> str:
    return str(getattr(model.config, "_name_or_path", "") or type(model).__name__)
