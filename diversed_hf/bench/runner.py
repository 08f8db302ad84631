"""``diversed-hf bench``: the paper's evaluation as a tool (SPEC §7).

Every method decodes the **same prompts** of a task with one model pair and is scored on

- acceptance rate (accepted drafted tokens / drafted tokens, summed over rounds) and acceptance by
  draft position;
- quality: exact match (``arith``, GSM8K), ROUGE-2 F1 (``summary``, CNN/DM, XSum), pass@1 (MBPP);
- seconds per sample, tokens/s, speedup vs target-only decoding and vs SD;
- mean tokens per round, measured, next to the estimator of
  :func:`diversed_hf.theory.expected_tokens_per_round` and the i.i.d. prediction
  ``(1 - alpha^(N+1)) / (1 - alpha)`` with ``alpha`` the mean ``beta``; and measured speedup next to
  the model's prediction ``E[T_N] / (N c + 1)`` with the cost ratio ``c`` measured on the pair.

Results (:func:`write_results`): ``results.json`` (one row per task and method, the schema
``diversed_hf.cards`` reads, quality and acceptance as fractions), ``results_<task>.json`` (the same
as ``{"setting", "rows"}``, to put next to a head), ``bench.json`` (everything, for
:func:`read_results`), a Markdown table per task, and the pictures of :mod:`diversed_hf.plots`.

Two passes per method, on the same prompts:

1. **quality pass** (untimed): all ``num_prompts`` prompts, batched (``batch_size``), each sampled
   ``num_samples`` times with different seeds; gives quality (mean over all samples, standard error
   over prompts), acceptance and the per-round statistics;
2. **timing pass**: the first ``num_timing_prompts`` prompts at ``timing_batch_size`` (1 by
   default: per-request latency, what the speedup model describes), after a warm-up of every
   method; ``repeats`` runs with methods interleaved (the order rotates each repeat) and the
   **median** wall-clock time kept.

Each run is seeded the same way for every method. Under ``accelerate launch`` the prompts are split
between processes and results gathered (data parallel); wall-clock time of a timed run is the
slowest process's.

Methods are given as short specs (:func:`parse_methods`)::

    target                  target-only decoding (plain transformers ``generate``)
    sd                      lossless speculative decoding
    lossy:0.3,0.6           lossy SD, one run per lenience
    static:0,0.25,0.5,0.75  static ensemble, one run per target weight w
    cascade:0.1,0.3         SpecCascade, every rule, one run per alpha
    cascade-opt:0.1,0.3     SpecCascade, one rule
    sd-ft                   SD with the fine-tuned draft (skipped when there is none)
    diversed                DIVERSED with the task's head (skipped when there is none)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from . import compat, theory
from .generation import enable_diversed
from .verifiers import (
    CASCADE_RULES,
    ExactVerifier,
    HeadVerifier,
    LenientVerifier,
    SpecCascadeVerifier,
    StaticEnsembleVerifier,
    Verifier,
)

logger = logging.getLogger(__name__)

__all__ = [
    "BenchConfig",
    "BenchResult",
    "BenchTask",
    "DEFAULT_METHODS",
    "Method",
    "front_comparison",
    "load_finetuned_draft",
    "load_head",
    "load_models",
    "load_task",
    "markdown_table",
    "measure_cost",
    "parse_methods",
    "read_results",
    "run_bench",
    "write_results",
    "write_results_page",
]

FAMILIES = ("target-only", "sd", "lossy-sd", "static-ensemble", "speccascade", "sd-finetuned", "diversed")
DEFAULT_METHODS = (
    "target",
    "sd",
    "lossy:0.3,0.6",
    "static:0,0.25,0.5,0.75",
    "cascade:0.2",
    "sd-ft",
    "diversed",
)
# Task -> quality metric, in the vocabulary of diversed_hf.cards (results.json stores quality as a fraction).
QUALITY_METRICS = {
    "arith": "exact_match",
    "summary": "rouge2_f1",
    "gsm8k": "exact_match",
    "cnn_dailymail": "rouge2_f1",
    "xsum": "rouge2_f1",
    "mbpp": "pass@1",
}
QUALITY_LABELS = {"exact_match": "exact match (%)", "rouge2_f1": "ROUGE-2 F1 (x100)", "pass@1": "pass@1 (%)"}


def quality_label(metric: str | None) -> str:
    """How tables and plots name a quality metric (values shown x 100)."""
    return QUALITY_LABELS.get(metric or "", f"{metric or 'quality'} (x100)")


# ------------------------------------------------------------------------------------------------
# Methods


@dataclass(frozen=True)
class Method:
    """One decoding method of the bench: a verifier (``None`` = target-only) and which draft it uses."""

    name: str  # label in tables and plots
    family: str  # one of FAMILIES
    verifier: Verifier | None = None  # None: target-only decoding
    param: float | None = None  # the swept value: w, lenience or alpha
    draft: str = "draft"  # "draft" or "finetuned"

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"`family` must be one of {FAMILIES}, got {self.family!r}.")
        if self.draft not in ("draft", "finetuned"):
            raise ValueError(f"`draft` must be 'draft' or 'finetuned', got {self.draft!r}.")


def _parse_values(spec: str, values: str) -> list[float]:
    try:
        parsed = [float(v) for v in values.split(",") if v.strip()]
    except ValueError:
        parsed = []
    if not parsed:
        raise ValueError(f"Method spec {spec!r}: expected numbers after ':' (e.g. 'static:0.25,0.5'), got {values!r}.")
    return parsed


def _fmt(value: float) -> str:
    return f"{value:g}"


def parse_methods(specs: Sequence[str], head=None, has_finetuned_draft: bool = False) -> tuple[list[Method], list[str]]:
    """Methods from short specs (see the module docstring); returns ``(methods, notes)``.

    ``diversed`` needs ``head`` (a :class:`~diversed_hf.head.DiversedHead`) and ``sd-ft`` a fine-tuned
    draft: without them they are skipped and a note says why.
    """
    methods: list[Method] = []
    notes: list[str] = []
    for spec in specs:
        kind, _, values = spec.strip().partition(":")
        kind = kind.lower()
        if kind in ("target", "target-only"):
            methods.append(Method("target-only", "target-only"))
        elif kind == "sd":
            methods.append(Method("SD", "sd", ExactVerifier(), 1.0))
        elif kind == "lossy":
            for lenience in _parse_values(spec, values):
                methods.append(Method(f"lossy SD l={_fmt(lenience)}", "lossy-sd", LenientVerifier(lenience), lenience))
        elif kind == "static":
            for weight in _parse_values(spec, values):
                methods.append(
                    Method(f"static w={_fmt(weight)}", "static-ensemble", StaticEnsembleVerifier(weight), weight)
                )
        elif kind == "cascade" or kind.startswith("cascade-"):
            rules = CASCADE_RULES if kind == "cascade" else (kind[len("cascade-") :],)
            for rule in rules:
                if rule not in CASCADE_RULES:
                    raise ValueError(f"Method spec {spec!r}: unknown cascade rule {rule!r}; use one of {CASCADE_RULES}.")
                for alpha in _parse_values(spec, values):
                    methods.append(
                        Method(f"cascade {rule} a={_fmt(alpha)}", "speccascade", SpecCascadeVerifier(rule, alpha), alpha)
                    )
        elif kind in ("sd-ft", "sd-finetuned"):
            if has_finetuned_draft:
                methods.append(Method("SD (fine-tuned draft)", "sd-finetuned", ExactVerifier(), 1.0, draft="finetuned"))
            else:
                notes.append("SD with a fine-tuned draft: skipped, no fine-tuned draft was given or found.")
        elif kind == "diversed":
            if head is not None:
                methods.append(Method("DIVERSED", "diversed", HeadVerifier(head)))
            else:
                notes.append("DIVERSED: skipped, no trained head was given or found for this task.")
        else:
            raise ValueError(
                f"Unknown method spec {spec!r}. Use target, sd, lossy:L,..., static:W,..., cascade[-RULE]:A,..., "
                "sd-ft or diversed."
            )
    names = [m.name for m in methods]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"Methods {duplicates} are listed twice; list each method once.")
    return methods, notes


# ------------------------------------------------------------------------------------------------
# Configuration, tasks and models


SAMPLE_SEED_STRIDE = 1_000_003  # seed offset between the quality pass's samples of one prompt


@dataclass
class BenchConfig:
    """What to run and how to time it."""

    methods: tuple[str, ...] = field(default=DEFAULT_METHODS, metadata={"help": "Method specs (see `diversed-hf bench -h`)."})
    num_prompts: int = field(default=64, metadata={"help": "Prompts scored for quality and acceptance."})
    num_samples: int = field(
        default=1, metadata={"help": "Samples per prompt in the quality pass (seeds differ); more shrinks quality's noise."}
    )
    num_timing_prompts: int = field(default=8, metadata={"help": "Of those, how many (the first) are timed."})
    max_new_tokens: int = field(default=96, metadata={"help": "Generation budget per prompt."})
    num_draft_tokens: int = field(default=5, metadata={"help": "Drafted tokens per round, N."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature; 0 means greedy."})
    top_k: int = field(default=0, metadata={"help": "top-k filtering (0: off)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus filtering (1: off)."})
    batch_size: int = field(default=16, metadata={"help": "Batch size of the (untimed) quality pass."})
    timing_batch_size: int = field(default=1, metadata={"help": "Batch size of the timed runs (1: latency)."})
    repeats: int = field(default=2, metadata={"help": "Timed runs per method; the median is kept."})
    seed: int = field(default=0, metadata={"help": "Seed of the prompts (for testbed tasks) and of sampling."})
    cost_tokens: int = field(default=32, metadata={"help": "Single-token forwards timed per model to measure the cost ratio."})
    num_html_examples: int = field(default=4, metadata={"help": "Completions kept per method for the weight view."})

    def __post_init__(self):
        self.methods = tuple(self.methods)
        for name in ("num_prompts", "num_samples", "max_new_tokens", "num_draft_tokens", "batch_size", "timing_batch_size",
                     "repeats"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
        for name in ("num_timing_prompts", "cost_tokens", "num_html_examples", "top_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"`{name}` must be a non-negative integer, got {value!r}.")
        if self.num_timing_prompts > self.num_prompts:
            raise ValueError(
                f"`num_timing_prompts` ({self.num_timing_prompts}) is more than `num_prompts` ({self.num_prompts}); "
                "the timed prompts are the first of the scored ones. Lower it or raise `num_prompts`."
            )
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"`temperature` must be >= 0 (0 = greedy), got {self.temperature!r}.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"`top_p` must be in (0, 1], got {self.top_p!r}.")


@dataclass
class BenchTask:
    """Prompts, references and a sequence reward ``reward(completions, references) -> list[float]`` in [0, 1].

    Rows report ``quality`` as the mean reward (a fraction, as ``diversed_hf.cards`` reads it); tables show it x 100.
    """

    name: str
    prompts: list[str]
    references: list[str]
    reward: Callable[[Sequence[str], Sequence[str]], list[float]]
    quality_metric: str  # "exact_match", "rouge2_f1", "pass@1" or your own name

    def __post_init__(self):
        if len(self.prompts) != len(self.references):
            raise ValueError(
                f"`prompts` has {len(self.prompts)} entries but `references` {len(self.references)}; pass one each."
            )


def load_task(name: str, num_examples: int, seed: int = 0, split: str = "test", num_shots: int = 0,
              data_files=None) -> BenchTask:
    """A task as a :class:`BenchTask`: the testbed's ``arith`` / ``summary`` (also spelled ``testbed_arith`` /
    ``testbed_summary``), or, through :mod:`diversed_hf.data` and :mod:`diversed_hf.rewards`, ``gsm8k``,
    ``cnn_dailymail``, ``xsum`` and ``mbpp`` (from the Hub, or from local ``data_files`` in the Hub schema).

    For anything else build a :class:`BenchTask` from your own prompts, references and reward.
    """
    testbed_name = name.removeprefix("testbed_")
    if testbed_name in ("arith", "summary"):
        from . import testbed

        if num_shots or data_files is not None:
            raise ValueError(f"{name!r} is generated by the testbed: it takes no `num_shots` or `data_files`.")
        data = testbed.load_task(testbed_name, split=split, num_examples=num_examples, seed=seed)
        return BenchTask(
            name=testbed_name,
            prompts=list(data["prompt"]),
            references=list(data["reference"]),
            reward=lambda completions, references: testbed.reward(testbed_name, completions, references),
            quality_metric=QUALITY_METRICS[testbed_name],
        )
    try:
        from . import data as data_module
        from . import rewards as rewards_module
    except ImportError:
        data_module = rewards_module = None
    if data_module is None or name not in data_module.TASKS or name not in rewards_module.TASK_REWARDS:
        known = ["arith", "summary"] + (sorted(data_module.TASKS) if data_module is not None else [])
        raise ValueError(
            f"`task` is {name!r}; the bench knows {known}. For other data build a `BenchTask(prompts, references, "
            "reward, quality_metric)` and call `run_bench` from Python."
        )
    dataset = data_module.load_task_dataset(
        name, split=split, num_examples=num_examples, seed=seed, num_shots=num_shots, data_files=data_files
    )
    return BenchTask(
        name=name,
        prompts=list(dataset["prompt"]),
        references=list(dataset["reference"]),
        reward=rewards_module.TASK_REWARDS[name],
        quality_metric=QUALITY_METRICS[name],
    )


def load_models(target: str | None = None, draft: str | None = None, dtype: torch.dtype = torch.float32,
                device: str = "cpu"):
    """``(target, draft, tokenizer)``: the testbed pair by default, else local paths or Hub ids
    (``AutoModelForCausalLM``; the tokenizer is the target's ``AutoTokenizer``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (target is None) != (draft is None):
        raise ValueError("Pass both `target` and `draft` (paths or Hub ids), or neither for the testbed pair.")
    if target is None:
        from . import testbed

        return testbed.load_pair(torch_dtype=dtype, device=device)
    target_model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype).to(device).eval()
    draft_model = AutoModelForCausalLM.from_pretrained(draft, dtype=dtype).to(device).eval()
    return target_model, draft_model, AutoTokenizer.from_pretrained(target)


def _per_task(spec: str | None, task: str) -> str | None:
    """``spec`` is one path for every task or ``task=path,task=path``; the entry for ``task`` (None if absent)."""
    if not spec:
        return None
    if "=" not in spec:
        return spec
    paths = dict(part.split("=", 1) for part in spec.split(",") if "=" in part)
    return paths.get(task)


def load_finetuned_draft(spec: str | None, task: str, dtype: torch.dtype = torch.float32, device: str = "cpu",
                         testbed_default: bool = True):
    """The fine-tuned draft for ``task`` (``spec``: a directory or ``task=dir,task=dir``, e.g. the ``merged``
    output of ``training/distill_draft.py``), else (with ``testbed_default``, for the testbed pair) the testbed's
    ``load_finetuned_draft(task)`` if it ships one; ``None`` when there is none."""
    path = _per_task(spec, task)
    if path is not None:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    if spec or not testbed_default:
        return None
    from . import testbed

    try:
        return testbed.load_finetuned_draft(task, torch_dtype=dtype, device=device)
    except (FileNotFoundError, KeyError, ValueError) as error:
        logger.info("no fine-tuned testbed draft for %s: %s", task, error)
        return None


def load_head(spec: str | None, task: str, testbed_default: bool = True):
    """The DIVERSED head for ``task``: from ``spec`` (a directory, or ``task=dir,task=dir``), else (with
    ``testbed_default``, for the testbed pair) the testbed's ``load_head(task)``; ``None`` when there is none."""
    from .head import DiversedHead

    path = _per_task(spec, task)
    if path is not None:
        return DiversedHead.from_pretrained(path)
    if spec or not testbed_default:
        return None
    from . import testbed

    try:
        return testbed.load_head(task)
    except (FileNotFoundError, KeyError, ValueError) as error:
        logger.info("no testbed head for %s: %s", task, error)
        return None


# ------------------------------------------------------------------------------------------------
# Distributed helpers (accelerate is optional)


class _SingleProcess:
    num_processes, process_index, is_main_process = 1, 0, True
    device = torch.device("cpu")

    def wait_for_everyone(self):
        pass


def _process_state():
    try:
        from accelerate import PartialState
    except ImportError:  # the `bench` extra is not installed: one process
        return _SingleProcess()
    # Without a GPU, processes started by `accelerate launch --multi_gpu` / `torchrun` talk over gloo.
    return PartialState(cpu=not torch.cuda.is_available())


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


@torch.no_grad()
def measure_cost(model, input_ids: torch.Tensor, num_tokens: int = 32, chunk: int = 1, repeats: int = 3) -> float:
    """Median seconds of one forward of ``chunk`` new tokens on a KV cache holding ``input_ids`` (1, L).

    Each timed forward is undone (the cache is cropped back), so every call sees the same context.
    """
    if num_tokens == 0:
        return float("nan")
    length = input_ids.shape[1]
    mask = torch.ones(1, length + chunk, dtype=torch.long, device=input_ids.device)  # (1, L + chunk)
    tokens = input_ids[:, -1:].repeat(1, chunk)  # (1, chunk)
    times = []
    for _ in range(repeats):
        cache = compat.new_cache()
        compat.forward_with_cache(model, input_ids, mask[:, :length], cache, logits_to_keep=1, output_hidden_states=False)
        compat.forward_with_cache(model, tokens, mask, cache, logits_to_keep=chunk, output_hidden_states=False)  # warm-up
        compat.crop_cache(cache, length)
        start = time.perf_counter()
        for _ in range(num_tokens):
            compat.forward_with_cache(model, tokens, mask, cache, logits_to_keep=chunk, output_hidden_states=False)
            compat.crop_cache(cache, length)
        times.append((time.perf_counter() - start) / num_tokens)
    return statistics.median(times)


def _generation_kwargs(config: BenchConfig, tokenizer) -> dict:
    kwargs = dict(max_new_tokens=config.max_new_tokens, return_dict_in_generate=True,
                  pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    if config.temperature > 0:
        kwargs.update(do_sample=True, temperature=config.temperature, top_k=config.top_k, top_p=config.top_p)
    else:
        kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    return kwargs


def _run_batch(target, drafts, method: Method, batch: dict, config: BenchConfig, tokenizer, seed: int,
               want_weights: bool = False):
    """One ``generate`` call: ``(new_tokens (B, T), lengths (B,), stats or None)``."""
    kwargs = _generation_kwargs(config, tokenizer)
    prompt_len = batch["input_ids"].shape[1]
    if method.verifier is None:
        torch.manual_seed(seed)
        output = target.generate(**batch, **kwargs)
        new_tokens = output.sequences[:, prompt_len:]  # (B, T)
        full = torch.full((new_tokens.shape[0],), new_tokens.shape[1], dtype=torch.long, device=new_tokens.device)  # (B,)
        if tokenizer.eos_token_id is None:
            return new_tokens, full, None
        is_end = new_tokens == tokenizer.eos_token_id  # (B, T)
        return new_tokens, torch.where(is_end.any(dim=1), is_end.long().argmax(dim=1) + 1, full), None
    output = target.generate(
        **batch, **kwargs, assistant_model=drafts[method.draft], verifier=method.verifier,
        num_assistant_tokens=config.num_draft_tokens, generator=torch.Generator().manual_seed(seed),
        output_target_weights=want_weights,
    )
    stats = output.speculation
    return output.sequences[:, prompt_len:], stats.num_generated, stats


def _records(method: Method, indices: list[int], new_tokens, lengths, stats, tokenizer, keep_tokens: set[int]) -> list[dict]:
    """Per-prompt records (plain Python / CPU tensors, so they pickle for gathering)."""
    records = []
    for row, index in enumerate(indices):
        length = int(lengths[row])
        ids = new_tokens[row, :length].tolist()
        record: dict[str, Any] = {
            "index": index,
            "completion": tokenizer.decode(ids, skip_special_tokens=True),
            "num_generated": length,
        }
        if stats is not None:
            record.update(
                num_rounds=int(stats.num_rounds[row]),
                num_drafted=int(stats.num_drafted[row]),
                num_accepted=int(stats.num_accepted[row]),
                drafted_per_position=stats.drafted_per_position[row].tolist(),
                accepted_per_position=stats.accepted_per_position[row].tolist(),
                acceptance_probs=stats.acceptance_probs[row].clone(),  # (rounds, N)
            )
            drafted_acceptance = getattr(stats, "drafted_acceptance_probs", None)
            if drafted_acceptance is not None:
                record["drafted_acceptance_probs"] = drafted_acceptance[row].clone()  # (rounds, N)
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


@dataclass
class BenchResult:
    """Rows (one per method; JSON-ready) plus what the plots need."""

    task: str
    rows: list[dict]
    examples: dict[str, list[dict]]  # method name -> records with tokens and target weights
    notes: list[str]
    meta: dict

    def to_json(self) -> dict:
        return {"task": self.task, "rows": self.rows, "notes": self.notes, "meta": self.meta, "examples": self.examples}


def run_bench(target, draft, tokenizer, task: BenchTask, methods: Sequence[Method], config: BenchConfig | None = None,
              *, finetuned_draft=None, notes: Sequence[str] = (), progress: bool = False) -> BenchResult:
    """Run every method on ``task`` and return one row per method (see the module docstring).

    Under ``accelerate launch`` every process must call this with the same arguments; prompts are split
    between processes and every process returns the same gathered result.
    """
    from tqdm.auto import tqdm

    config = config or BenchConfig()
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
    state = _process_state()
    enable_diversed(target)
    tokenizer.padding_side = "left"
    drafts = {"draft": draft, "finetuned": finetuned_draft}
    show = progress and state.is_main_process
    prompts = task.prompts[: config.num_prompts]
    keep_tokens = set(range(config.num_html_examples))

    # 1. Cost ratio c = draft token / target token (single-token forwards with a KV cache), and the
    #    verification pass (N + 1 tokens) in target tokens.
    cost_ids = tokenizer(prompts[0], return_tensors="pt")["input_ids"].to(target.device)  # (1, L)
    costs = {"target_token_seconds": measure_cost(target, cost_ids, config.cost_tokens)}
    costs["verify_pass_seconds"] = measure_cost(target, cost_ids, config.cost_tokens, chunk=config.num_draft_tokens + 1)
    for name, model in drafts.items():
        if model is not None:
            costs[f"{name}_token_seconds"] = measure_cost(model, cost_ids, config.cost_tokens)
    costs = {key: statistics.mean(values) for key, values in _merge_dicts(_gather(state, [costs])).items()}

    # 2. Quality pass: every prompt, batched, untimed; sample k of a batch is seeded seed + k * SAMPLE_SEED_STRIDE + first index.
    my_indices = _shard(state, list(range(len(prompts))))
    records: dict[str, list[dict]] = {}
    bar = tqdm(
        total=len(methods) * len(my_indices) * config.num_samples, desc=f"{task.name}: quality", disable=not show,
        unit="prompt",
    )  # fmt: skip
    for method in methods:
        mine = []
        want_weights = method.verifier is not None and method.family not in ("sd", "sd-finetuned")
        for sample in range(config.num_samples):
            for batch_indices in _batches(my_indices, config.batch_size):
                batch = _tokenize(tokenizer, [prompts[i] for i in batch_indices], target.device)
                seed = config.seed + sample * SAMPLE_SEED_STRIDE + batch_indices[0]
                new_tokens, lengths, stats = _run_batch(
                    target, drafts, method, batch, config, tokenizer, seed, want_weights
                )  # fmt: skip
                batch_records = _records(
                    method, batch_indices, new_tokens, lengths, stats, tokenizer, keep_tokens if sample == 0 else set()
                )  # fmt: skip
                mine += [{**record, "sample": sample} for record in batch_records]
                bar.update(len(batch_indices))
        records[method.name] = sorted(_gather(state, mine), key=lambda r: (r["sample"], r["index"]))
    bar.close()

    # 3. Timing: warm-up, then interleaved repeats; wall time of a run = the slowest process's.
    timing_indices = _shard(state, list(range(config.num_timing_prompts)))
    timings: dict[str, list[float]] = {m.name: [] for m in methods}
    timed_tokens: dict[str, int] = {}
    if config.num_timing_prompts:
        bar = tqdm(total=len(methods) * (config.repeats + 1), desc=f"{task.name}: timing", disable=not show, unit="run")
        warmup = _tokenize(tokenizer, [prompts[0]], target.device)
        for method in methods:
            _run_batch(target, drafts, method, warmup, dataclasses.replace(config, max_new_tokens=8), tokenizer, config.seed)
            bar.update(1)
        for repeat in range(config.repeats):
            shift = repeat % len(methods)
            for method in methods[shift:] + methods[:shift]:
                state.wait_for_everyone()
                tokens = 0
                start = time.perf_counter()
                for batch_indices in _batches(timing_indices, config.timing_batch_size):
                    batch = _tokenize(tokenizer, [prompts[i] for i in batch_indices], target.device)
                    _, lengths, _ = _run_batch(target, drafts, method, batch, config, tokenizer, config.seed + batch_indices[0])
                    tokens += int(lengths.sum())
                seconds = time.perf_counter() - start
                gathered = _gather(state, [(seconds, tokens)])
                timings[method.name].append(max(s for s, _ in gathered))
                timed_tokens[method.name] = sum(t for _, t in gathered)
                bar.update(1)
        bar.close()

    # 4. Rows.
    rows = [
        _row(method, records[method.name], timings[method.name], timed_tokens.get(method.name), task, config, costs)
        for method in methods
    ]
    _add_relative_speedups(rows)
    examples = {
        method.name: [r for r in records[method.name] if "tokens" in r]
        for method in methods
        if any("tokens" in r for r in records[method.name])
    }
    for method_examples in examples.values():
        for record in method_examples:
            record["prompt"] = prompts[record["index"]]
            record.pop("acceptance_probs", None)
            record.pop("drafted_acceptance_probs", None)
    meta = {
        "task": task.name,
        "quality_metric": task.quality_metric,
        "quality_label": quality_label(task.quality_metric),
        "target": _model_name(target),
        "draft": _model_name(draft),
        "finetuned_draft": _model_name(finetuned_draft) if finetuned_draft is not None else None,
        "num_processes": state.num_processes,
        "torch_threads": torch.get_num_threads(),
        "costs": costs,
        "cost_ratio": costs.get("draft_token_seconds", float("nan")) / costs["target_token_seconds"],
        "verify_cost_ratio": costs["verify_pass_seconds"] / costs["target_token_seconds"],
        "config": dataclasses.asdict(config),
        "head": next(
            (m.verifier.head.config.to_dict() for m in methods if isinstance(m.verifier, HeadVerifier)), None
        ),
    }
    return BenchResult(task.name, rows, examples, list(notes), meta)


def _merge_dicts(dicts: list[dict]) -> dict[str, list[float]]:
    merged: dict[str, list[float]] = {}
    for item in dicts:
        for key, value in item.items():
            merged.setdefault(key, []).append(value)
    return merged


def _model_name(model) -> str:
    return str(getattr(model.config, "_name_or_path", "") or type(model).__name__)


def _nan_to_none(value):
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


def _row(method: Method, records: list[dict], timings: list[float], timed_tokens: int | None, task: BenchTask,
         config: BenchConfig, costs: dict) -> dict:
    completions = [r["completion"] for r in records]
    references = [task.references[r["index"]] for r in records]
    rewards = torch.tensor(task.reward(completions, references), dtype=torch.float64)  # (num_prompts * num_samples,)
    quality = float(rewards.mean())
    # Samples of one prompt are correlated: the standard error is over per-prompt means.
    per_prompt: dict[int, list[float]] = {}
    for record, reward in zip(records, rewards.tolist()):
        per_prompt.setdefault(record["index"], []).append(reward)
    prompt_means = torch.tensor([statistics.mean(v) for v in per_prompt.values()], dtype=torch.float64)  # (num_prompts,)
    quality_stderr = float(prompt_means.std() / math.sqrt(len(prompt_means))) if len(prompt_means) > 1 else None
    num_generated = sum(r["num_generated"] for r in records)
    seconds = statistics.median(timings) if timings else None
    row: dict[str, Any] = {
        "task": task.name,
        "method": method.name,
        "family": method.family,
        "param": method.param,
        "quality": quality,
        "quality_stderr": quality_stderr,
        "quality_metric": task.quality_metric,
        "num_prompts": len(per_prompt),
        "num_samples": len(records) // max(len(per_prompt), 1),
        "num_generated": num_generated,
        "mean_new_tokens": num_generated / max(len(records), 1),  # per sample
        "num_timing_prompts": config.num_timing_prompts,
        "seconds_per_sample": None if seconds is None else seconds / config.num_timing_prompts,
        "tokens_per_second": None if not seconds else timed_tokens / seconds,
        "seconds_repeats": timings,
        "num_draft_tokens": config.num_draft_tokens,
        "temperature": config.temperature,
    }
    if method.verifier is None:
        row.update(acceptance_rate=None, tokens_per_round=1.0, emitted_tokens_per_round=1.0, expected_tokens_per_round=1.0,
                   iid_tokens_per_round=1.0, mean_beta=None, estimator=None, position_acceptance=[], position_reach=[], position_beta=[],
                   cost_ratio=0.0, predicted_speedup=1.0, mean_target_weight=None)
        return row
    drafted = sum(r["num_drafted"] for r in records)
    accepted = sum(r["num_accepted"] for r in records)
    rounds = sum(r["num_rounds"] for r in records)
    acceptance_rate = accepted / max(drafted, 1)
    betas = torch.cat([r["acceptance_probs"] for r in records], dim=0)  # (total_rounds, N)
    exact = all("drafted_acceptance_probs" in r for r in records)
    drafted_acceptance = torch.cat([r["drafted_acceptance_probs"] for r in records], dim=0) if exact else None
    if config.temperature == 0 and exact:
        # Greedy drafting is deterministic given the prefix, so beta_t = a_t(x_t) (1 or 0); the verifier's beta is
        # the sampling rule's and does not apply.
        betas = drafted_acceptance
    expected = float(theory.expected_tokens_per_round(betas, drafted_acceptance))
    mean_beta = min(max(float(betas.nanmean()), 0.0), 1.0) if (~betas.isnan()).any() else 0.0
    drafted_per_position = torch.tensor([r["drafted_per_position"] for r in records]).sum(dim=0)  # (N,)
    accepted_per_position = torch.tensor([r["accepted_per_position"] for r in records]).sum(dim=0)  # (N,)
    examined = torch.minimum(
        torch.cat([drafted_per_position[:1], accepted_per_position[:-1]]), drafted_per_position
    )  # (N,) rounds in which the draft at k was examined (all before it accepted)
    cost_ratio = costs[f"{method.draft}_token_seconds"] / costs["target_token_seconds"]
    weights = [r["mean_target_weight"] for r in records if r.get("mean_target_weight") is not None]
    row.update(
        acceptance_rate=acceptance_rate,
        # T_N = accepted + 1 per round, what the estimators predict; EOS can cut a round's last tokens, so
        # the tokens kept per round (emitted_tokens_per_round) can be lower.
        tokens_per_round=(accepted + rounds) / max(rounds, 1),
        emitted_tokens_per_round=num_generated / max(rounds, 1),
        expected_tokens_per_round=expected,
        estimator="exact" if exact else "beta-product",
        # Leviathan et al.'s alpha is E[beta], the mean acceptance probability of a drafted position, not the
        # acceptance rate (which also counts drafts never examined after a rejection).
        mean_beta=mean_beta,
        iid_tokens_per_round=theory.iid_tokens_per_round(mean_beta, config.num_draft_tokens),
        # P(first k accepted) per drafted round, and acceptance at k among rounds that examined k.
        position_reach=(accepted_per_position.double() / drafted_per_position.clamp(min=1).double()).tolist(),
        position_acceptance=(accepted_per_position.double() / examined.clamp(min=1).double()).tolist(),
        position_beta=[_nan_to_none(v) for v in theory.position_acceptance(betas).tolist()],
        cost_ratio=cost_ratio,
        predicted_speedup=float(theory.predicted_speedup(expected, config.num_draft_tokens, cost_ratio)),
        mean_target_weight=statistics.mean(weights) if weights else None,
    )
    return row


def _add_relative_speedups(rows: list[dict]) -> None:
    """``speedup_vs_target`` / ``speedup_vs_sd``: the baseline's seconds per sample over this row's (as
    ``diversed_hf.cards`` defines them); ``throughput_speedup_vs_target``: tokens/s over target-only tokens/s,
    the per-token quantity the speedup model predicts (the two differ when methods emit different lengths)."""
    bases = {family: next((r for r in rows if r["family"] == family), None) for family in ("target-only", "sd")}
    for row in rows:
        for key, family in (("speedup_vs_target", "target-only"), ("speedup_vs_sd", "sd")):
            base = bases[family]
            ok = base is not None and base["seconds_per_sample"] and row["seconds_per_sample"]
            row[key] = base["seconds_per_sample"] / row["seconds_per_sample"] if ok else None
        base = bases["target-only"]
        ok = base is not None and base["tokens_per_second"] and row["tokens_per_second"]
        row["throughput_speedup_vs_target"] = row["tokens_per_second"] / base["tokens_per_second"] if ok else None


# ------------------------------------------------------------------------------------------------
# Reporting


def front_comparison(rows: list[dict], method: str = "DIVERSED") -> dict | None:
    """Where ``method`` stands against the static-ensemble front (static sweep + SD as w = 1).

    Returns the front's quality interpolated (piecewise linearly) at the method's acceptance rate
    and at its seconds per sample, and the method's quality minus each; ``None`` where the method or
    the front is missing or the method lies outside the front's range.
    """
    point = next((r for r in rows if r["method"] == method), None)
    front = [r for r in rows if r["family"] in ("static-ensemble", "sd")]
    if point is None or len(front) < 2:
        return None
    result = {"method": method, "quality": point["quality"]}
    for axis in ("acceptance_rate", "seconds_per_sample"):
        pairs = sorted((r[axis], r["quality"]) for r in front if r[axis] is not None)
        x = point[axis]
        front_quality = None
        if x is not None and pairs and pairs[0][0] <= x <= pairs[-1][0]:
            for (x0, y0), (x1, y1) in zip(pairs, pairs[1:]):
                if x0 <= x <= x1:
                    front_quality = y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
                    break
        result[f"front_quality_at_{axis}"] = front_quality
        result[f"quality_minus_front_at_{axis}"] = None if front_quality is None else point["quality"] - front_quality
    return result


def _cell(value, spec: str, scale: float = 1.0, suffix: str = "") -> str:
    return "–" if value is None else f"{value * scale:{spec}}{suffix}"


def markdown_table(rows: list[dict]) -> str:
    """The paper's table: acceptance, quality, time, tokens/s, speedup vs target-only, and tokens per round
    (measured / estimator / i.i.d.), with measured per-token speedup next to the speedup model's prediction."""
    metric = quality_label(rows[0]["quality_metric"]) if rows else "quality"
    lines = [
        f"| method | acceptance | {metric} | s / sample | tokens/s | speedup vs target | tokens/s speedup "
        "| predicted | tokens/round | E[T] estimator | i.i.d. |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        quality = _cell(row["quality"], ".1f", 100)
        if row.get("quality_stderr") is not None:
            quality += f" ± {row['quality_stderr'] * 100:.1f}"
        name = f"**{row['method']}**" if row["family"] == "diversed" else row["method"]
        lines.append(
            f"| {name} | {_cell(row['acceptance_rate'], '.1f', 100, ' %')} | {quality} "
            f"| {_cell(row['seconds_per_sample'], '.3f')} | {_cell(row['tokens_per_second'], '.0f')} "
            f"| {_cell(row['speedup_vs_target'], '.2f', suffix='x')} "
            f"| {_cell(row.get('throughput_speedup_vs_target'), '.2f', suffix='x')} "
            f"| {_cell(row['predicted_speedup'], '.2f', suffix='x')} "
            f"| {_cell(row['tokens_per_round'], '.2f')} | {_cell(row['expected_tokens_per_round'], '.2f')} "
            f"| {_cell(row['iid_tokens_per_round'], '.2f')} |"
        )
    return "\n".join(lines)


def write_results(results: Sequence[BenchResult], output_dir: str | Path, plots: bool = True) -> dict[str, Path]:
    """Write ``results.json`` (all rows: the list model cards read), ``bench.json`` (everything), a
    Markdown table per task and, with ``plots``, the PNGs and the HTML weight view. Returns the paths."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = {"results": output_dir / "results.json", "bench": output_dir / "bench.json"}
    rows = [row for result in results for row in result.rows]
    paths["results"].write_text(json.dumps(rows, indent=2, default=_json_default) + "\n")
    paths["bench"].write_text(json.dumps([r.to_json() for r in results], indent=2, default=_json_default) + "\n")
    for result in results:
        # One file per task in the form diversed_hf.cards reads: copy it next to a head as results.json.
        setting = {key: result.meta["config"][key] for key in ("temperature", "num_draft_tokens", "max_new_tokens")}
        setting.update(task=result.task, quality_metric=result.meta["quality_metric"],
                       num_samples=result.rows[0]["num_prompts"] if result.rows else 0,
                       num_sampling_seeds=result.meta["config"].get("num_samples", 1),
                       target=result.meta["target"], draft=result.meta["draft"])
        task_results = output_dir / f"results_{result.task}.json"
        task_results.write_text(json.dumps({"setting": setting, "rows": result.rows}, indent=2, default=_json_default) + "\n")
        paths[f"{result.task}_results"] = task_results
        table = output_dir / f"{result.task}_table.md"
        table.write_text(markdown_table(result.rows) + "\n")
        paths[f"{result.task}_table"] = table
        if plots:
            from . import plots as plotting

            paths.update(plotting.plot_all(result, output_dir))
    return paths


def read_results(path: str | Path) -> list[BenchResult]:
    """The :class:`BenchResult` list saved in a ``bench.json`` by :func:`write_results` (to re-plot or re-page)."""
    return [BenchResult(**item) for item in json.loads(Path(path).read_text())]


def _json_default(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, torch.dtype):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def write_results_page(results: Sequence[BenchResult], output_dir: str | Path, page: str | Path,
                       command: str | None = None, seconds: float | None = None) -> Path:
    """Write everything :func:`write_results` writes, and a Markdown page with the tables and plots."""
    page = Path(page)
    paths = write_results(results, output_dir)
    relative = lambda p: Path(p).resolve().relative_to(page.resolve().parent).as_posix() if _is_under(p, page.resolve().parent) else str(p)
    lines = ["# Benchmark results", ""]
    if command:
        lines += ["Regenerate with:", "", "```bash", command, "```", ""]
    first = results[0].meta if results else {}
    config = first.get("config", {})
    def shown(name):  # local model directories relative to the page, Hub ids as they are
        return relative(name) if name and Path(name).is_dir() else name

    lines += [
        f"Target `{shown(first.get('target'))}`, draft `{shown(first.get('draft'))}`"
        + f"; {config.get('num_prompts')} held-out prompts per task"
        + (f" x {config['num_samples']} samples" if config.get("num_samples", 1) > 1 else "")
        + " for quality and acceptance, the first "
        f"{config.get('num_timing_prompts')} timed at batch size {config.get('timing_batch_size')} (median of "
        f"{config.get('repeats')} interleaved runs after a warm-up); temperature {config.get('temperature')}, "
        f"N = {config.get('num_draft_tokens')} drafts per round, at most {config.get('max_new_tokens')} new tokens; "
        f"{first.get('num_processes')} process(es) x {first.get('torch_threads')} torch thread(s)"
        + (f"; the whole run took {seconds / 60:.1f} min." if seconds else "."),
        "",
        f"Environment: {_environment()}.",
        "",
        "Columns: *acceptance* = accepted drafted tokens / drafted tokens (all scored prompts); quality ± its "
        "standard error over prompts; *s / sample* and *tokens/s* on the timed prompts; *speedup vs target* = "
        "target-only seconds per sample / this method's; *tokens/s speedup* = this method's tokens/s / target-only "
        "tokens/s (the per-token speedup, which differs when methods write different lengths); *predicted* = "
        "`E[T] / (N c + 1)`, the speedup model with the cost ratio `c` measured below; *tokens/round* = (accepted "
        "drafts + 1) per round, measured (tokens after an end of sequence included); *E[T] estimator* = `1 + sum_k prod_{t<=k} beta_t` averaged over rounds "
        "(SPEC §6), or the unbiased `1 + sum_k prod_{t<k} a_t(x_t) beta_k` when the statistics record the acceptance "
        "probability `a_t(x_t)` of each drafted token (field `estimator` in results.json); *i.i.d.* = `(1 - a^(N+1)) / (1 - a)` with `a` the mean of `beta` over drafted positions (Leviathan et al.'s "
        "alpha; not the acceptance rate, which also counts drafts never examined after a rejection).",
        "",
    ]
    for result in results:
        meta = result.meta
        lines += [f"## {result.task}", ""]
        lines += [
            f"Cost ratio c = draft / target seconds per token = {meta['cost_ratio']:.3f} "
            f"(target {meta['costs']['target_token_seconds'] * 1e3:.2f} ms/token); one verification pass over "
            f"N + 1 tokens costs {meta['verify_cost_ratio']:.2f} target tokens."
            + (f" Fine-tuned draft: `{shown(meta['finetuned_draft'])}`." if meta.get("finetuned_draft") else "")
            + (f" DIVERSED head: {meta['head'].get('architecture')} head trained for task "
               f"`{meta['head'].get('task')}`." if meta.get("head") else ""),
            "",
            markdown_table(result.rows),
            "",
        ]
        comparison = front_comparison(result.rows)
        if comparison is not None:
            lines.append(_front_sentence(comparison, result.rows))
            lines.append("")
        for note in result.notes:
            lines.append(f"- {note}")
        if result.notes:
            lines.append("")
        for key, caption in (("tradeoffs", "Quality vs time and vs acceptance (line: static-ensemble front)"),
                             ("positions", "Acceptance by draft position")):
            path = paths.get(f"{result.task}_{key}")
            if path is not None:
                lines += [f"![{caption}]({relative(path)})", ""]
        html = paths.get(f"{result.task}_weights")
        if html is not None:
            lines += [f"Per-token target weight `w` chosen at each emitted token: [{relative(html)}]({relative(html)}).", ""]
    estimators = {row.get("estimator") for result in results for row in result.rows} - {None}
    lines += ["## Reading the tokens-per-round columns", ""]
    if estimators == {"exact"}:
        lines.append(
            "The `E[T]` estimator is the unbiased `1 + sum_k prod_{t<k} a_t(x_t) beta_k` (see `diversed_hf.theory`): "
            "it should match the measured column up to sampling noise."
        )
    else:
        lines.append(
            "The `E[T]` estimator multiplies the per-position acceptance probabilities `beta_t` along the *drafted* "
            "prefix, as SPEC §6 writes it. That is exact when acceptance does not depend on the drafted context but "
            "biased when it does (whether a drafted token is likely to be accepted also changes `beta` at the next "
            "position): see `diversed_hf.theory` for a two-token counterexample and the unbiased form "
            "`1 + sum_k prod_{t<k} a_t(x_t) beta_k`, which needs the acceptance probability `a_t(x_t)` of each drafted "
            "token (not yet recorded by `SpeculationStats`)."
        )
    lines += [
        "",
        "The i.i.d. column assumes every draft is accepted with the same probability, the acceptance rate; the "
        "position plots show how far that is from the truth.",
        "",
    ]
    page.write_text("\n".join(lines))
    return page


def _environment() -> str:
    import os
    import platform

    import transformers

    return (f"Python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, "
            f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), "
            f"{'CUDA ' + torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'}")


def _is_under(path, directory: Path) -> bool:
    try:
        Path(path).resolve().relative_to(directory)
        return True
    except ValueError:
        return False


def _front_sentence(comparison: dict, rows: list[dict]) -> str:
    sd = next((r for r in rows if r["family"] == "sd"), None)
    point = next(r for r in rows if r["method"] == comparison["method"])
    parts = [f"**{comparison['method']} vs the static-ensemble front:** quality {100 * point['quality']:.1f}"]
    if point.get("acceptance_rate") is not None:
        parts.append(f"at acceptance {point['acceptance_rate']:.1%}")
    delta = comparison.get("quality_minus_front_at_acceptance_rate")
    parts.append(
        f"({100 * delta:+.1f} vs the front at the same acceptance)" if delta is not None else "(outside the front's acceptance range)"
    )
    delta_time = comparison.get("quality_minus_front_at_seconds_per_sample")
    if delta_time is not None:
        parts.append(f"and {100 * delta_time:+.1f} vs the front at the same time per sample")
    elif point.get("seconds_per_sample") is not None:
        times = [r["seconds_per_sample"] for r in rows if r["family"] in ("static-ensemble", "sd") and r["seconds_per_sample"]]
        if times:
            parts.append(
                f"at {point['seconds_per_sample']:.3f} s per sample, outside the front's "
                f"{min(times):.3f}-{max(times):.3f} s"
            )
    if sd is not None and sd.get("acceptance_rate") is not None and point.get("acceptance_rate") is not None:
        parts[-1] += ";"
        parts.append(
            f"SD: quality {100 * sd['quality']:.1f} at acceptance {sd['acceptance_rate']:.1%} "
            f"({(point['acceptance_rate'] - sd['acceptance_rate']) * 100:+.1f} points of acceptance for DIVERSED)"
        )
    return " ".join(parts) + "."


# ------------------------------------------------------------------------------------------------
# Command line


def _add_config_arguments(parser: argparse.ArgumentParser) -> None:
    for item in dataclasses.fields(BenchConfig):
        option = "--" + item.name.replace("_", "-")
        help_text = item.metadata.get("help", "")
        if item.name == "methods":
            parser.add_argument(option, nargs="+", default=list(item.default), help=f"{help_text} Default: %(default)s.")
        else:
            parser.add_argument(option, type=type(item.default), default=item.default, help=f"{help_text} Default: %(default)s.")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="Speed/quality benchmark of every decoding method on a model pair and task.",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--target", default=None, help="Target model path or Hub id (default: the testbed pair).")
    parser.add_argument("--draft", default=None, help="Draft model path or Hub id (with --target).")
    parser.add_argument("--finetuned-draft", default=None,
                        help="Fine-tuned draft for 'sd-ft': a directory, or 'task=dir,task=dir' (default: the testbed's, if any).")
    parser.add_argument("--head", default=None, help="DIVERSED head directory, or 'task=dir,task=dir' (default: testbed heads).")
    parser.add_argument("--task", nargs="+", default=["arith"],
                        help="Task(s): the testbed's arith, summary; gsm8k, cnn_dailymail, xsum, mbpp (Hub or --data-files).")
    parser.add_argument("--data-files", nargs="+", default=None, help="Local files in the Hub schema (one task only).")
    parser.add_argument("--num-shots", type=int, default=0, help="Few-shot exemplars for Hub tasks.")
    parser.add_argument("--split", default="test", help="Split of the task to evaluate on.")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="Model weights dtype.")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per process (0: torch's default).")
    parser.add_argument("--output-dir", default="bench_results", help="Where results.json, tables and plots go.")
    parser.add_argument("--results-page", default=None, help="Also write a Markdown results page here (e.g. RESULTS.md).")
    parser.add_argument("--page-command", default=None,
                        help="How the results page says to regenerate it (default: this command line).")
    parser.add_argument("--no-plots", action="store_true", help="Skip the PNG/HTML output (no matplotlib needed).")
    parser.add_argument("--no-progress", action="store_true", help="Hide progress bars.")
    _add_config_arguments(parser)
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    import shlex
    import sys

    started = time.perf_counter()
    if args.threads:
        torch.set_num_threads(args.threads)
    config = BenchConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(BenchConfig)})
    state = _process_state()
    dtype = getattr(torch, args.dtype)
    target, draft, tokenizer = load_models(args.target, args.draft, dtype, state.device)
    if args.data_files and len(args.task) != 1:
        raise ValueError(f"`--data-files` gives the data of one task, but --task lists {args.task}; pass one task.")
    tasks = [
        load_task(name, config.num_prompts, config.seed, args.split, args.num_shots, args.data_files) for name in args.task
    ]
    results = []
    for task in tasks:
        on_testbed = args.target is None  # the testbed's heads and drafts only fit the testbed pair
        head = load_head(args.head, task.name, testbed_default=on_testbed)
        finetuned = load_finetuned_draft(args.finetuned_draft, task.name, dtype, state.device, testbed_default=on_testbed)
        methods, notes = parse_methods(config.methods, head=head, has_finetuned_draft=finetuned is not None)
        results.append(
            run_bench(target, draft, tokenizer, task, methods, config, finetuned_draft=finetuned, notes=notes,
                      progress=not args.no_progress)
        )
    if not state.is_main_process:
        return 0
    seconds = time.perf_counter() - started
    if args.results_page:
        command = args.page_command or "diversed-hf " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        write_results_page(results, args.output_dir, args.results_page, command=command, seconds=seconds)
    else:
        write_results(results, args.output_dir, plots=not args.no_plots)
    for result in results:
        print(f"## {result.task} (cost ratio c = {result.meta['cost_ratio']:.3f})")
        print(markdown_table(result.rows))
        for note in result.notes:
            print(f"- {note}")
        print()
    print(f"Wrote {args.output_dir}/results.json" + (f" and {args.results_page}" if args.results_page else "")
          + f" in {seconds:.0f} s.")
    return 0
