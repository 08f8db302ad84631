"""``diversed-hf bench``: the paper's evaluation as a tool (docs/method.md §7).

Every method decodes the **same prompts** of a task with one model pair and is scored on

- acceptance rate (accepted drafted tokens / drafted tokens, summed over rounds) and acceptance by
  draft position;
- quality: exact match (``arith``, GSM8K), ROUGE-2 F1 (``summary``, CNN/DM, XSum), pass@1 (MBPP);
- seconds per sample, tokens/s, speedup vs target-only decoding and vs SD;
- mean tokens per round, measured, next to the estimator of
  :func:`diversed_hf.verifiers.theory.expected_tokens_per_round` and the i.i.d. prediction
  ``(1 - alpha^(N+1)) / (1 - alpha)`` with ``alpha`` the mean ``beta``; and measured speedup next to
  the model's prediction ``E[T_N] / (N c + 1)`` with the cost ratio ``c`` measured on the pair.

Results (:func:`write_results`): ``results.json`` (one row per task and method, the schema
``diversed_hf.heads.cards`` reads, quality and acceptance as fractions), ``results_<task>.json`` (the same
as ``{"setting", "rows"}``, to put next to a head), ``bench.json`` (everything, for
:func:`read_results`), a Markdown table per task, and the pictures of :mod:`diversed_hf.lab.bench.plots`.

Two passes per method, on the same prompts:

1. **quality pass** (untimed): all ``num_prompts`` prompts, batched (``batch_size``), each sampled
   ``num_samples`` times with different seeds; gives quality (mean over all samples, standard error
   over prompts), acceptance and the per-round statistics;
2. **timing pass**: the first ``num_timing_prompts`` prompts at ``timing_batch_size`` (1 by
   default: per-request latency, what the speedup model describes), after one untimed warm-up run of
   every method over the same prompts (kernels, caches, the cross-call state of adaptive draft-length policies);
   ``repeats`` runs with methods interleaved (the order rotates each repeat) and the
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
    typical:0.05,0.09       typical acceptance (Medusa), one run per posterior threshold (alpha 0.3)
    fuzzy:0.05,0.1,0.2      fuzzy SD (FuzzyVerifier), one run per Jensen-Shannon threshold
    topk:0.5,1,2            top-2 relaxed acceptance (TopKRelaxedVerifier), one run per delta in nats
    judge:0.3,0.5,0.7       judge decoding (JudgeVerifier) with the task's judge (--judge, or the shipped one; skipped
                            when there is none), one run per threshold
    sd-ft                   SD with the fine-tuned draft (skipped when there is none)
    diversed                DIVERSED with the task's head (skipped when there is none)
    diversed@summary        DIVERSED with the head trained for another task (the transfer experiment)
    block:sd                block verification (Sun et al. 2024) of any speculative spec above (block:static:0.5,
                            block:diversed): family "block", compared with its token-wise method paired over prompts

Every speculative method runs once per draft-length policy of ``--schedules`` (default ``constant``,
N = ``--num-draft-tokens``; :func:`parse_schedules`)::

    constant:3,5,8          one run per constant N
    heuristic               transformers' heuristic (+2 after a round that kept every draft, else -1),
                            its value kept from call to call as transformers keeps it
    heuristic_transient     the same, reset every call
    confidence:0.4          a row stops drafting after a token the draft gives less than 0.4
    optimal:12              per row, the length in 1..12 with the most expected tokens per second

Quality is also reported against the **target distribution**, paired over prompts with a 95 %
bootstrap interval (:func:`paired_difference`): the target distribution's quality pools target-only
decoding and lossless SD, both exact samples of ``p``. ``--num-baseline-prompts`` scores the other
methods on fewer prompts (the first ones) so that the three methods the comparison is about get many.
"""

# The modules, one job each (none imports this package; only the command, `cli`, imports `diversed_hf.testbed`,
# and this package does not import `cli`: `diversed_hf.cli` lists `diversed_hf.cli.bench` itself):
#   methods  Method, FAMILIES, DEFAULT_METHODS, parse_methods
#   config   BenchConfig, BenchTask, load_task (tasks from diversed_hf.lab.tasks)
#   models   load_models, load_head, load_finetuned_draft from paths or Hub ids
#   runner   run_bench: the quality and timing passes, cost ratio, data parallelism
#   stats    one row per method: quality and its standard error, acceptance, tokens per round, speedups
#   schema   BenchResult and the JSON files (results.json, results_<task>.json, bench.json)
#   report   Markdown tables and the results page; write_results (JSON + tables + plots)
#   plots    trade-off and position plots, the HTML target-weight view (matplotlib)
#   cli      the `diversed-hf bench` subcommand (register, main), and loaders with the testbed's defaults

from .config import SAMPLE_SEED_STRIDE, BenchConfig, BenchTask, load_task
from .methods import DEFAULT_METHODS, FAMILIES, Method, Schedule, parse_methods, parse_schedules, with_schedules
from .models import load_finetuned_draft, load_head, load_models
from .report import (
    block_table,
    markdown_table,
    policy_table,
    quality_label,
    quality_table,
    speed_table,
    transfer_table,
    write_results,
    write_results_page,
)
from .runner import measure_cost, run_bench
from .schema import BenchResult, read_results
from .stats import (
    add_block_differences,
    add_paired_differences,
    add_relative_speedups,
    front_comparison,
    method_row,
    paired_difference,
)

__all__ = [
    "BenchConfig",
    "BenchResult",
    "BenchTask",
    "DEFAULT_METHODS",
    "FAMILIES",
    "Method",
    "SAMPLE_SEED_STRIDE",
    "Schedule",
    "add_block_differences",
    "add_paired_differences",
    "add_relative_speedups",
    "block_table",
    "front_comparison",
    "load_finetuned_draft",
    "load_head",
    "load_models",
    "load_task",
    "markdown_table",
    "measure_cost",
    "method_row",
    "paired_difference",
    "parse_methods",
    "parse_schedules",
    "policy_table",
    "quality_label",
    "quality_table",
    "read_results",
    "run_bench",
    "speed_table",
    "transfer_table",
    "with_schedules",
    "write_results",
    "write_results_page",
]
