"""What the measurement scripts share of RESULTS.md: its sections, each written by one script into
``results/<name>.md`` and carried into the page, and the bench runs the scripts start.

Each ``*_SECTION`` is ``(file name under results/, section title)``; :func:`refresh_head_sections` puts every written
one into an existing RESULTS.md, leaving the bench's own sections as they are. :func:`bench_flags` and
:func:`run_bench_argv` run ``diversed-hf bench`` in the script's process; :func:`start_script` is the setup a
script's ``main()`` begins with. Scripts import this module, never each other (``tests/test_architecture.py``).
"""

from __future__ import annotations

import logging
import re
import shlex
import sys
from pathlib import Path

from . import bench as bench_cli

TASKS = ("arith", "summary")  # the testbed's: every bench run and the trained-head sections


#: the repository a checkout runs the scripts from (their results/ and results_quick/)
REPO = Path(__file__).resolve().parents[2]


def script_command(script: str, argv: list[str] | None) -> str:
    """How a run of ``benchmarks/<script>.py`` is shown and rerun: the script with the arguments it was given."""
    given = sys.argv[1:] if argv is None else list(argv)
    return " ".join([f"python benchmarks/{script}.py", shlex.join(given)]).strip()  # quoted where a shell needs it


def start_script(
    script: str, args, argv: list[str] | None, results_name: str, threads: int | None = 1
) -> tuple[Path, str]:
    """The setup a measurement script's ``main()`` begins with: logging at INFO, its output folder (``--output_dir``,
    else ``results/<results_name>``, ``results_quick/`` with ``--quick``) checked before any model loads, ``threads``
    for torch (None: left as it is), and the command that reruns it. Returns ``(output_dir, command)``."""
    from ..lab.cli_utils import check_output_dir

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    folder = "results_quick" if getattr(args, "quick", False) else "results"
    output_dir = Path(getattr(args, "output_dir", None) or REPO / folder / results_name)
    check_output_dir(output_dir, "--output_dir")
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    return output_dir, script_command(script, argv)


def bench_flags(options: dict) -> list[str]:
    """``diversed-hf bench`` flags for ``options`` (``{"num_prompts": 8, "no_plots": True, "methods": [...]}``)."""
    argv = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        else:
            argv += [flag, *map(str, value)] if isinstance(value, list) else [flag, str(value)]
    return argv


def run_bench_argv(argv: list[str]):
    """``(arguments, results)`` of one ``diversed-hf bench`` run with command line ``argv``, in this process."""
    arguments, config = bench_cli.build_parser().parse_args_into_dataclasses(argv)
    return arguments, bench_cli.run(arguments, config)


#: sections of tables that need trained heads: written by benchmarks/ablation.py and benchmarks/headroom.py
HEAD_SECTIONS = (
    ("front", "Acceptance-quality front"),
    ("ablation", "Head ablation"),
    ("headroom", "Headroom by token class"),
)


#: the real pair's section, written by benchmarks/make_real_results.py
REAL_PAIR_SECTION = ("real_pair", "Real pair: SmolLM2-135M-Instruct and its self-draft")


#: the real pair's table with its default draft, the EagleDraft, and the heads shipped for it
REAL_PAIR_EAGLE_SECTION = ("real_pair_eagle", "Real pair: the paper's table with the EagleDraft")


#: block against token-wise verification, written by benchmarks/block_results.py
BLOCK_SECTION = ("block", "Block verification")


#: vLLM against the project's generate, written by benchmarks/vllm_results.py (run in the vLLM environment)
VLLM_SECTION = ("vllm", "Serving with vLLM")


#: the same with the pair's EagleDraft through vLLM's eagle method (benchmarks/vllm_results.py --draft eagle)
VLLM_EAGLE_SECTION = ("vllm_eagle", "Serving with vLLM: the EagleDraft")


#: vLLM's OpenAI server under concurrent load, written by benchmarks/vllm_load.py
VLLM_LOAD_SECTION = ("vllm_load", "Serving with vLLM under load")


#: the same with the real pair's task EagleDraft through vLLM's eagle method (benchmarks/vllm_load.py --pair smollm2)
VLLM_LOAD_EAGLE_SECTION = ("vllm_load_eagle", "Serving with vLLM under load: the EagleDraft")


#: the real pair under lm-evaluation-harness, written by benchmarks/lm_eval_results.py
LM_EVAL_SECTION = ("lm_eval", "lm-evaluation-harness")


#: the real pair's feature draft against its self-draft, written by benchmarks/eagle_results.py
EAGLE_SECTION = ("eagle", "Real pair: feature draft against self-draft")


#: benchmarks/everyday_results.py: the default EagleDraft on held-out everyday prompts and on arith_chat
EVERYDAY_SECTION = ("everyday", "Real pair: the EagleDraft on everyday prompts")


#: benchmarks/overhead_results.py: the loop's per-round overhead (testbed against transformers; the real pair's profile)
OVERHEAD_SECTION = ("overhead", "Per-round overhead")


#: benchmarks/drafter_results.py: transformers' model-free drafters (prompt lookup, early exit) against the EagleDraft
DRAFTERS_SECTION = ("drafters", "Drafters")


#: benchmarks/tuned_quality.py: the task-tuned target beside the untuned one
TUNED_QUALITY_SECTION = ("tuned_quality", "Real pair: the task-tuned target")


#: benchmarks/tuned_draft_results.py: the task-tuned pair's EagleDraft, its draft length and lossless SD's speed
TUNED_DRAFT_SECTION = ("tuned_draft", "Real pair: the task-tuned target's EagleDraft")


#: the task-tuned pair's table (benchmarks/make_real_results.py --draft tuned)
REAL_PAIR_TUNED_SECTION = ("real_pair_tuned", "Real pair: the paper's table on the task-tuned target")


#: the task-tuned pair's heads, first measured with diversed-hf bench (the commands are in the section)
TUNED_HEADS_SECTION = ("tuned_heads", "Real pair: first heads on the task-tuned target")


#: benchmarks/tree_results.py: token trees against chains, and what a verification pass costs
TREES_SECTION = ("trees", "Token trees")


#: benchmarks/tree_heads.py: the shipped heads over token trees against the same heads over chains
TREE_HEADS_SECTION = ("tree_heads", "Token trees: heads")


#: benchmarks/eagle3_results.py: the EAGLE-3 draft against the EAGLE-1-style default
EAGLE3_SECTION = ("eagle3", "EAGLE-3 draft")


#: benchmarks/vllm_eagle3.py (vLLM's environment): the EAGLE-3 draft served by vLLM's eagle3 method
VLLM_EAGLE3_SECTION = ("vllm_eagle3", "EAGLE-3 draft served by vLLM")


#: benchmarks/relaxed_results.py: fuzzy SD and top-k relaxed acceptance against DIVERSED on the testbed tables
RELAXED_SECTION = ("relaxed_rules", "Relaxed rules: testbed")


#: benchmarks/relaxed_results.py --pair smollm2-tuned: the same fronts on the task-tuned pair's synopsis
RELAXED_TUNED_SECTION = ("relaxed_rules_tuned", "Relaxed rules: the task-tuned pair")


#: benchmarks/chat_head.py: a head for everyday chat on the real pair, by the chat measures
CHAT_HEAD_SECTION = ("chat_head", "Real pair: a head for everyday chat")


#: sections written by their own commands, carried over as they are
CARRIED_SECTIONS = (
    CHAT_HEAD_SECTION,
    TREES_SECTION,
    TREE_HEADS_SECTION,
    EAGLE3_SECTION,
    VLLM_EAGLE3_SECTION,
    RELAXED_SECTION,
    RELAXED_TUNED_SECTION,
    TUNED_QUALITY_SECTION,
    TUNED_DRAFT_SECTION,
    TUNED_HEADS_SECTION,
    REAL_PAIR_TUNED_SECTION,
    EVERYDAY_SECTION,
    DRAFTERS_SECTION,
    OVERHEAD_SECTION,
    REAL_PAIR_EAGLE_SECTION,
    REAL_PAIR_SECTION,
    EAGLE_SECTION,
    BLOCK_SECTION,
    VLLM_SECTION,
    VLLM_EAGLE_SECTION,
    VLLM_LOAD_SECTION,
    VLLM_LOAD_EAGLE_SECTION,
    LM_EVAL_SECTION,
)


def trained_head_sections(output_dir: Path) -> list[tuple[str, str]]:
    """``(title, Markdown)`` of every ablation / headroom table written into ``output_dir``, and of the real
    pair's, the block-verification and the vLLM sections when ``benchmarks/make_real_results.py``,
    ``benchmarks/block_results.py`` and ``benchmarks/vllm_results.py`` have written them."""
    sections = []
    for task in TASKS:
        for kind, title in HEAD_SECTIONS:
            written = output_dir / f"{kind}_{task}.md"
            if written.is_file():
                sections.append((f"{title}: {task}", written.read_text().strip()))
    for name, title in CARRIED_SECTIONS:
        written = output_dir / f"{name}.md"
        if written.is_file():
            sections.append((title, written.read_text().strip()))
    return sections


def refresh_head_sections(page: Path, output_dir: Path) -> None:
    """Put the current ablation / headroom tables into an existing results page, leaving the bench's sections as
    they are (those tables come from separate commands: re-running the bench for them is not needed)."""
    if not page.is_file():
        raise FileNotFoundError(f"{page} does not exist: run `python benchmarks/make_results.py` once first.")
    parts = re.split(r"(?m)^(?=## )", page.read_text())
    titles = tuple(f"## {title}: " for _, title in HEAD_SECTIONS) + tuple(
        f"## {title}" for _, title in CARRIED_SECTIONS
    )
    kept = [part for part in parts if not part.startswith(titles)]
    new = [f"## {title}\n\n{body}\n\n" for title, body in trained_head_sections(output_dir)]
    at = next((i for i, part in enumerate(kept) if part.startswith("## Reading")), len(kept))
    page.write_text("".join(kept[:at] + new + kept[at:]))
