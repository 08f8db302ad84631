"""The ``diversed-hf bench`` subcommand, and the loaders of models, fine-tuned drafts and heads it uses.

Its flags are the fields of two dataclasses, parsed by ``transformers.HfArgumentParser``:
:class:`BenchArguments` (what to run on: models, tasks, heads, where results go) and
:class:`~diversed_hf.lab.bench.config.BenchConfig` (how to run and time it). A field ``num_prompts`` is the flag
``--num-prompts`` (``--num_prompts`` works too).

This is the only module of the bench that imports :mod:`diversed_hf.testbed`: without ``--target`` /
``--draft`` the command runs on the testbed pair, with the testbed's heads and fine-tuned drafts.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
import time
from dataclasses import dataclass, field
from typing import Literal

import torch
from transformers import HfArgumentParser

from ..lab.bench import models
from ..lab.bench.config import BenchConfig, load_task
from ..lab.bench.methods import parse_methods
from ..lab.bench.partial import clear_partial, partial_dir
from ..lab.bench.report import markdown_table, write_results, write_results_page
from ..lab.bench.runner import end_processes, process_state, run_bench
from ..lab.cli_utils import DefaultsHelpFormatter, check_output_dir, check_output_file

logger = logging.getLogger(__name__)

#: the real pair's shipped drafts (``diversed_hf.testbed.smollm2.DRAFTS``; the first is its default)
DRAFT_NAMES = ("eagle", "eagle-tasks", "self")

__all__ = [
    "BenchArguments",
    "build_parser",
    "load_finetuned_draft",
    "load_head",
    "load_models",
    "main",
    "register",
    "run",
]


@dataclass
class BenchArguments:
    """The command's own arguments: models, tasks, heads, output. How to decode and time is :class:`BenchConfig`."""

    pair: Literal["testbed", "smollm2", "smollm2-tuned"] = field(
        default="testbed",
        metadata={
            "help": "Shipped pair to run without --target/--draft: testbed (the 9M pair), smollm2 (the real pair: "
            "SmolLM2-135M-Instruct and its EagleDraft by default; --draft picks another of its drafts) or "
            "smollm2-tuned (that target with its task-tuning adapter merged, and its own EagleDraft)."
        },
    )
    target: str | None = field(
        default=None, metadata={"help": "Target model path or Hub id (default: the --pair pair's target)."}
    )
    draft: str | None = field(
        default=None,
        metadata={
            "help": "Draft model path or Hub id (with --target); with --pair smollm2, one of its shipped drafts: "
            + ", ".join(DRAFT_NAMES)
            + f" (default: {DRAFT_NAMES[0]}, the EagleDraft distilled on everyday chat and the tasks)."
        },
    )
    finetuned_draft: str | None = field(
        default=None,
        metadata={
            "help": "Fine-tuned draft for 'sd-ft': a directory, or 'task=dir,task=dir' "
            "(default: the testbed's, if it ships one for the task)."
        },
    )
    head: str | None = field(
        default=None,
        metadata={"help": "DIVERSED head directory, or 'task=dir,task=dir' (default: the shipped pair's heads)."},
    )
    judge: str | None = field(
        default=None,
        metadata={"help": "Judge for 'judge:T,...': a directory, or 'task=dir,task=dir' (default: the shipped ones)."},
    )
    task: list[str] = field(
        default_factory=lambda: ["arith"],
        metadata={
            "help": "Task(s) by registered name (listed above); the paper's gsm8k, cnn_dailymail, xsum and mbpp "
            "read the Hub or --data-files."
        },
    )
    data_files: list[str] | None = field(
        default=None, metadata={"help": "Local files in the Hub schema (one task only)."}
    )
    num_shots: int = field(default=0, metadata={"help": "Few-shot exemplars for Hub tasks."})
    split: str = field(default="test", metadata={"help": "Split of the task to evaluate on."})
    dtype: Literal["float32", "bfloat16", "float16"] = field(
        default="float32", metadata={"help": "Model weights dtype."}
    )
    threads: int = field(default=0, metadata={"help": "torch threads per process (0: as many as torch chooses)."})
    output_dir: str = field(default="runs/bench", metadata={"help": "Where results.json, tables and plots go."})
    results_page: str | None = field(
        default=None, metadata={"help": "Also write a Markdown results page here (e.g. RESULTS.md)."}
    )
    page_command: str | None = field(
        default=None, metadata={"help": "How the results page says to regenerate it (default: this command line)."}
    )
    no_plots: bool = field(default=False, metadata={"help": "Skip the PNG/HTML output (no matplotlib needed)."})
    no_progress: bool = field(default=False, metadata={"help": "Hide progress bars."})
    resume: bool = field(
        default=False,
        metadata={
            "help": "Make the run resumable: each finished method's records are kept in <output-dir>/partial/ until "
            "the results are written, and a run started again with --resume and the same settings reuses them "
            "(an interruption costs only the methods it was in)."
        },
    )

    def __post_init__(self):
        if isinstance(self.task, str):
            self.task = [self.task]
        if not self.task:
            raise ValueError("`task` is empty; name at least one task, e.g. --task arith.")
        for name in ("num_shots", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"`{name}` must be a non-negative integer, got {value!r}.")
        if self.data_files and len(self.task) != 1:
            raise ValueError(f"`--data-files` gives the data of one task, but --task lists {self.task}; pass one task.")
        if self.target is not None and self.pair != "testbed":
            raise ValueError(
                f"`--pair {self.pair}` and `--target {self.target}` both name the models; pass one of them."
            )
        named_draft = self.target is None and self.pair == "smollm2" and self.draft in DRAFT_NAMES
        if (self.target is None) != (self.draft is None) and not named_draft:
            raise ValueError(
                f"`--target` is {self.target!r} but `--draft` is {self.draft!r}; pass both (paths or Hub ids), or "
                "neither for the testbed pair."
            )


# ------------------------------------------------------------------------------------------------
# Models, fine-tuned drafts and heads (the testbed's by default)


def load_models(
    target: str | None = None,
    draft: str | None = None,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    pair: str = "testbed",
):
    """``(target, draft, tokenizer)``: a shipped pair (``testbed.load_pair(pair)``) by default, else local paths or
    Hub ids (:func:`diversed_hf.lab.bench.models.load_models`)."""
    named = target is None and pair == "smollm2" and draft in DRAFT_NAMES  # the real pair's shipped drafts
    if (target is None) != (draft is None) and not named:
        raise ValueError("Pass both `target` and `draft` (paths or Hub ids), or neither for a shipped pair.")
    if target is None:
        from .. import testbed

        return testbed.load_pair(pair, torch_dtype=dtype, device=device, draft=draft if named else None)
    return models.load_models(target, draft, dtype, device)


def load_finetuned_draft(
    spec: str | None, task: str, dtype: torch.dtype = torch.float32, device: str = "cpu", testbed_default: bool = True
):
    """The fine-tuned draft for ``task`` (``spec``: a directory or ``task=dir,task=dir``, e.g. the ``merged``
    output of ``training/distill_draft.py``), else (with ``testbed_default``, for the testbed pair) the testbed's
    ``load_finetuned_draft(task)`` if it ships one; ``None`` when there is none."""
    if spec or not testbed_default:
        return models.load_finetuned_draft(spec, task, dtype, device)
    from .. import testbed

    try:
        return testbed.load_finetuned_draft(task, torch_dtype=dtype, device=device)
    except (FileNotFoundError, KeyError, ValueError) as error:
        logger.info("no fine-tuned testbed draft for %s: %s", task, error)
        return None


def load_head(
    spec: str | None, task: str, testbed_default: bool = True, pair: str = "testbed", draft: str | None = None
):
    """The DIVERSED head for ``task``: from ``spec`` (a directory, or ``task=dir,task=dir``), else (with
    ``testbed_default``, for a shipped pair) ``testbed.load_head(task, pair, draft)``; ``None`` when there is none."""
    if spec or not testbed_default:
        return models.load_head(spec, task)
    from .. import testbed

    try:
        return testbed.load_head(task, pair=pair, draft=draft)
    except (FileNotFoundError, KeyError, ValueError) as error:
        logger.info("no testbed head for %s: %s", task, error)
        return None


def load_judge(spec: str | None, task: str, testbed_default: bool = True, pair: str = "testbed"):
    """The judge for ``task``: from ``spec``, else (with ``testbed_default``) ``testbed.load_judge(task, pair)``;
    ``None`` when there is none."""
    if spec or not testbed_default:
        return models.load_judge(spec, task)
    from .. import testbed

    try:
        return testbed.load_judge(task, pair=pair)
    except (FileNotFoundError, KeyError, ValueError) as error:
        logger.info("no shipped judge for %s: %s", task, error)
        return None


# ------------------------------------------------------------------------------------------------
# Command line


def help_description() -> str:
    """What ``diversed-hf bench --help`` says before the flags: plain text, tasks and pairs from the registries."""
    from ..lab.tasks import task_names

    return f"""Speed and quality of every decoding method on one model pair and task(s).

Every method decodes the same prompts and is scored on acceptance (accepted / drafted tokens, and by
draft position), quality (the task's metric, and paired against the target distribution with a 95 %
bootstrap interval), tokens/s at batch 1 and the speedup over target-only decoding and over SD; tokens
per round next to the theory's prediction. Results go to --output-dir: results.json, one Markdown
table per task and the plots (docs/method.md, "Evaluation").

Models: --pair testbed (the shipped 9M pair, the default), --pair smollm2 (SmolLM2-135M-Instruct; its drafts:
{", ".join(DRAFT_NAMES)}; default {DRAFT_NAMES[0]}), --pair smollm2-tuned (that target with its task-tuning adapter
and its own EagleDraft), or --target and --draft (paths or Hub ids).
Tasks: {", ".join(task_names())}.

Methods (--methods):
  target                  target-only decoding (plain transformers generate)
  sd                      lossless speculative decoding
  lossy:0.3,0.6           lossy SD, one run per lenience
  static:0,0.25,0.5,0.75  static ensemble, one run per target weight w
  cascade:0.1,0.3         SpecCascade, every rule, one run per alpha
  cascade-opt:0.1,0.3     SpecCascade, one rule
  typical:0.05,0.09       typical acceptance (Medusa), one run per posterior threshold
  fuzzy:0.02,0.1          fuzzy SD, one run per Jensen-Shannon threshold (nats)
  topk:0.25,1,4           top-2 relaxed acceptance, one run per delta (nats from the target's top-1)
  judge:0.9,0.99          judge decoding, one run per threshold (--judge, else the task's shipped judge)
  sd-ft                   SD with the fine-tuned draft (skipped when there is none)
  diversed                DIVERSED with the task's head (skipped when there is none)
  diversed@summary        DIVERSED with the head trained for another task (transfer)
  block:sd                block verification of any speculative spec (block:static:0.5, block:diversed)

Draft-length policies (--schedules; every speculative method runs once per policy):
  constant:3,5,8          one run per constant N
  heuristic               transformers' heuristic (+2 after a round that kept every draft, else -1)
  heuristic_transient     the same, reset every call
  confidence:0.4          a row stops drafting after a token the draft gives less than 0.4
  optimal:12              per row, the length in 1..12 with the most expected tokens per second

Example: diversed-hf bench --pair smollm2 --task arith_chat --methods target sd diversed
"""


def build_parser(**kwargs) -> HfArgumentParser:
    """An ``HfArgumentParser`` over :class:`BenchArguments` and :class:`BenchConfig` (``kwargs`` go to argparse)."""
    return HfArgumentParser((BenchArguments, BenchConfig), **kwargs)


def register(subparsers) -> None:
    """Add ``bench`` to the ``diversed-hf`` subcommands: its flags come from :func:`build_parser` as an argparse
    parent."""
    parser = subparsers.add_parser(
        "bench",
        help="Speed and quality of every decoding method on a model pair and task.",
        description=help_description(),
        formatter_class=DefaultsHelpFormatter,
        parents=[build_parser(add_help=False)],
    )
    parser.set_defaults(func=main)


def run(arguments: BenchArguments, config: BenchConfig) -> list:
    """Load the task(s), models, heads and drafts the arguments name and run the bench on each task; returns the
    :class:`~diversed_hf.lab.bench.schema.BenchResult` list (the same on every process under ``accelerate launch``).
    Where the results go is checked first: a path that cannot be written fails before the evaluation, not after."""
    check_output_dir(arguments.output_dir, "--output-dir")
    if arguments.results_page:
        check_output_file(arguments.results_page, "--results-page")
    if not arguments.no_plots:
        try:  # before the evaluation, not after it
            import matplotlib  # noqa: F401
        except ImportError:
            raise ImportError(
                'the plots need matplotlib, which is not installed: `pip install "diversed_hf[bench]"`, or pass '
                "--no-plots for the tables and JSON alone."
            ) from None
    if arguments.threads:
        torch.set_num_threads(arguments.threads)
    state = process_state()
    dtype = getattr(torch, arguments.dtype)
    tasks = [  # first: a wrong task or data file fails before any model loads
        load_task(name, config.num_prompts, config.seed, arguments.split, arguments.num_shots, arguments.data_files)
        for name in arguments.task
    ]
    target, draft, tokenizer = load_models(arguments.target, arguments.draft, dtype, state.device, arguments.pair)
    results = []
    shipped = arguments.target is None  # a shipped pair's heads and drafts only fit that pair
    pair = arguments.pair
    named_draft = arguments.draft if shipped and pair == "smollm2" else None  # the real pair's 'eagle' / 'self'
    # Heads of other tasks, for the transfer specs `diversed@TASK`.
    head_tasks = {
        spec.strip().partition("@")[2] for spec in config.methods if spec.strip().lower().startswith("diversed@")
    }
    other_heads = {
        name: load_head(arguments.head, name, testbed_default=shipped, pair=pair, draft=named_draft)
        for name in sorted(head_tasks)
    }
    for task in tasks:
        head = load_head(arguments.head, task.name, testbed_default=shipped, pair=pair, draft=named_draft)
        finetuned = load_finetuned_draft(
            arguments.finetuned_draft, task.name, dtype, state.device, testbed_default=shipped and pair == "testbed"
        )
        methods, notes = parse_methods(
            [
                spec for spec in config.methods if spec.strip().lower() != f"diversed@{task.name}"
            ],  # its own head: `diversed`
            head=head,
            has_finetuned_draft=finetuned is not None,
            other_heads=other_heads,
            judge=load_judge(arguments.judge, task.name, testbed_default=shipped, pair=pair)
            if any(spec.strip().lower().startswith("judge") for spec in config.methods)
            else None,
        )
        if not methods:
            raise ValueError(f"`methods`: nothing to run on task {task.name!r}: " + " ".join(notes))
        results.append(
            run_bench(
                target,
                draft,
                tokenizer,
                task,
                methods,
                config,
                finetuned_draft=finetuned,
                notes=notes,
                progress=not arguments.no_progress,
                partial_dir=_partial_dir(arguments, task.name),
            )
        )
    return results


def _partial_dir(arguments: BenchArguments, task: str):
    """Where a ``--resume`` run keeps the task's finished methods (``None``: not resumable). Without ``--resume``,
    says so when an interrupted run left some there (this run does them again)."""
    directory = partial_dir(arguments.output_dir, task)
    if arguments.resume:
        return directory
    if directory.is_dir() and any(directory.glob("*.pt")):
        logger.warning(
            "%s holds methods an interrupted --resume run finished; this run does them again (pass --resume to "
            "reuse them).",
            directory,
        )
    return None


def main(args: argparse.Namespace) -> int:
    """Run ``diversed-hf bench`` on parsed arguments (a namespace holding every field of both dataclasses)."""
    started = time.perf_counter()
    arguments, config = build_parser().parse_dict(vars(args), allow_extra_keys=True)
    results = run(arguments, config)
    state = process_state()
    if state.is_main_process:
        _report(results, arguments, started)
    end_processes(state)
    return 0


def _report(results: list, arguments, started: float) -> None:
    """The main process writes the results (JSON, tables, plots or the results page) and prints the tables."""
    seconds = time.perf_counter() - started
    if arguments.results_page:
        command = arguments.page_command or "diversed-hf " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        write_results_page(results, arguments.output_dir, arguments.results_page, command=command, seconds=seconds)
    else:
        write_results(results, arguments.output_dir, plots=not arguments.no_plots)
    clear_partial(arguments.output_dir, [result.task for result in results])
    for result in results:
        print(f"## {result.task} (cost ratio c = {result.meta['cost_ratio']:.3f})")
        print(markdown_table(result.rows))
        for note in result.notes:
            print(f"- {note}")
        print()
        for method, profile in result.meta.get("profile", {}).items():
            print(f"### Where a round's time goes: {method} ({result.task}; docs/profile.md)\n")
            print(profile["table"] + "\n")
    print(
        f"Wrote {arguments.output_dir}/results.json"
        + (f" and {arguments.results_page}" if arguments.results_page else "")
        + f" in {seconds:.0f} s."
    )
