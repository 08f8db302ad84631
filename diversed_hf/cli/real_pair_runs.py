"""What ``benchmarks/make_real_results.py`` measures on the real pair: tasks, methods, sizes, and one setup per draft.

Kept apart from the script so the numbers that define a run can be read (and tested) on their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the repository the scripts run in

TASKS = ("arith_chat", "humaneval", "synopsis")
METHODS = [
    "target",
    "sd",
    "static:0,0.25,0.5,0.75",
    "cascade-opt:0.2",
    "typical:0.09",
    "diversed",
    "diversed@arith_chat",
]
TASK_METHODS = {"synopsis": METHODS[:-1]}  # the arith_chat head on a summarization task would measure nothing new
SPEED_METHODS = ["target", "sd", "diversed"]
COMMON = dict(
    temperature=0.7, num_draft_tokens=3
)  # N = 3: at the self-draft's acceptance longer drafts cost more than they bring
FULL = {
    "arith_chat": dict(
        num_prompts=80,
        num_baseline_prompts=24,
        num_samples=2,
        num_timing_prompts=4,
        repeats=1,
        max_new_tokens=96,
        batch_size=16,
    ),
    "humaneval": dict(
        num_prompts=20,
        num_baseline_prompts=8,
        num_samples=2,
        num_timing_prompts=2,
        repeats=1,
        max_new_tokens=160,
        batch_size=10,
    ),
    "synopsis": dict(
        num_prompts=200,
        num_baseline_prompts=100,
        num_samples=2,
        num_timing_prompts=4,
        repeats=1,
        max_new_tokens=48,
        batch_size=20,
        temperature=1.0,
    ),
    "speed": dict(
        num_prompts=2,
        num_timing_prompts=2,
        repeats=1,
        max_new_tokens={"arith_chat": 64, "humaneval": 96, "synopsis": 48},
    ),
}
QUICK = {
    "arith_chat": dict(
        num_prompts=4,
        num_baseline_prompts=2,
        num_samples=1,
        num_timing_prompts=1,
        repeats=1,
        max_new_tokens=24,
        batch_size=4,
    ),
    "humaneval": dict(
        num_prompts=2,
        num_baseline_prompts=1,
        num_samples=1,
        num_timing_prompts=1,
        repeats=1,
        max_new_tokens=24,
        batch_size=2,
    ),
    "synopsis": dict(
        num_prompts=2,
        num_baseline_prompts=1,
        num_samples=1,
        num_timing_prompts=1,
        repeats=1,
        max_new_tokens=16,
        batch_size=2,
        temperature=1.0,
    ),
    "speed": dict(
        num_prompts=2,
        num_timing_prompts=2,
        repeats=1,
        max_new_tokens={"arith_chat": 16, "humaneval": 16, "synopsis": 16, "arith_steps": 16},
    ),
}
QUICK["arith_steps"] = QUICK["humaneval"]  # the tuned pair's smoke run: as short as humaneval's
#: runs beside the main ones (``--extra-runs``): (directory under results/smollm2, task, title, sizes); each one's
#: table joins the section under its title
EXTRA_RUNS = (("synopsis_t07", "synopsis", "synopsis at temperature 0.7", dict(FULL["synopsis"], temperature=0.7)),)
SECTION_TITLE = "Real pair: SmolLM2-135M-Instruct and its self-draft"


@dataclass(frozen=True)
class DraftSetup:
    """What ``--draft`` measures: the tasks, their sizes, where the results and the RESULTS.md section go."""

    draft: str
    tasks: tuple[str, ...]
    output_name: str  # results/<output_name>/
    section: str  # results/<section>.md, carried into RESULTS.md by make_results.py
    title: str
    full: dict
    extra_runs: tuple


EAGLE_FULL = {
    "synopsis": FULL["synopsis"],
    "arith_chat": dict(FULL["synopsis"], max_new_tokens=64, batch_size=20),  # 200 x 2 at T = 1, as synopsis
    "speed": FULL["speed"],
}
#: the EagleDraft's runs at temperature 0.7, on half the prompts of the main runs (the headline rows 100 x 2)
EAGLE_EXTRA_RUNS = tuple(
    (
        f"{task}_t07",
        task,
        f"{task} at temperature 0.7",
        dict(EAGLE_FULL[task], temperature=0.7, num_prompts=100, num_baseline_prompts=50),
    )
    for task in ("synopsis", "arith_chat")
)
#: the task-tuned pair (``--draft tuned``): its two tasks at T = 1, 200 prompts x 2 samples each, its EagleDraft's N
TUNED_TASKS = ("synopsis", "arith_steps")
TUNED_CALIBRATED = ("synopsis",)  # its head is measured with the offset its recipe's calibration chose (head_cal)
TUNED_DRAFT_LENGTH = 4  # the tuned EagleDraft's shipped N (its generation_config; benchmarks/tuned_draft_results.py)
TUNED_FULL = {
    "synopsis": dict(FULL["synopsis"], num_draft_tokens=TUNED_DRAFT_LENGTH),
    "arith_steps": dict(FULL["synopsis"], max_new_tokens=192, num_draft_tokens=TUNED_DRAFT_LENGTH),
    # 8 prompts at batch 1 (the other pairs time 2): the speed goal on synopsis is read from these rows
    "speed": dict(
        FULL["speed"], num_prompts=8, num_timing_prompts=8, max_new_tokens={"synopsis": 48, "arith_steps": 96}
    ),
}
#: every method, then each task's head on the other task: the paper's cross-task row
TUNED_METHODS = {
    task: [m for m in METHODS if "@" not in m] + [f"diversed@{other}" for other in TUNED_TASKS if other != task]
    for task in TUNED_TASKS
}
SETUPS = {
    "self": DraftSetup("self", TASKS, "smollm2", "real_pair", SECTION_TITLE, FULL, EXTRA_RUNS),
    "eagle-tasks": DraftSetup(
        "eagle-tasks",
        ("synopsis", "arith_chat"),
        "smollm2_eagle",
        "real_pair_eagle",
        "Real pair: the paper's table with the EagleDraft",
        EAGLE_FULL,
        EAGLE_EXTRA_RUNS,
    ),
    "tuned": DraftSetup(
        "tuned",
        TUNED_TASKS,
        "smollm2_tuned",
        "real_pair_tuned",
        "Real pair: the paper's table on the task-tuned target",
        TUNED_FULL,
        (),
    ),
}


def pair_flags(draft: str, heads: dict[str, str] | None = None) -> list[str]:
    """``diversed-hf bench``'s model flags for ``--draft``: the real pair with that draft, or the task-tuned pair
    with ``heads`` (task -> directory) when its heads do not ship yet."""
    if draft == "tuned":
        spec = ",".join(f"{task}={path}" for task, path in sorted((heads or {}).items()))
        return ["--pair", "smollm2-tuned"] + (["--head", spec] if spec else [])
    return ["--pair", "smollm2", "--draft", draft]


GOAL_RATIO, GOAL_POINTS = 1.5, 1.0  # the goal: >= 1.5x SD's acceptance, quality within 1 point of the target
#: per task where it differs: summarization, where the wording is free, should accept more at a finer tolerance
GOALS = {"synopsis": (2.0, 0.5)}


def run_conditions(jobs: int, resume: bool) -> list[tuple[str, str]]:
    """The results page's section on how a methods run was made, when it differs from one job alone (else none)."""
    conditions = []
    if jobs > 1:
        conditions.append(
            f"The methods runs ran {jobs} at a time, one torch thread each: every tokens/s column below was measured "
            "with another run on the other core, and is indicative only (`--speed-only` times the pair with nothing "
            "else running)."
        )
    if resume:
        conditions.append(
            "The run was resumable (`--resume`): methods an interrupted run had finished were reused, so its "
            "duration is not given."
        )
    return [("How this run was made", " ".join(conditions))] if conditions else []


def head_provenance(result, head_dir: Path) -> str:
    """Whether the head in ``head_dir``, whose calibration and training curve the section shows, is the one a task's
    rows measured (the digest its bench run recorded): "" when it is, else a sentence saying it is not, or that the
    run predates the record. A head retrained from its recipe after the run can differ (``runs/`` is not kept)."""
    from diversed_hf import DiversedHead
    from diversed_hf.lab.bench.partial import module_digest

    if not (head_dir / "config.json").is_file():
        return ""
    measured = result.meta.get("head_digest")
    where = head_dir.relative_to(REPO) if head_dir.is_relative_to(REPO) else head_dir
    if measured is None:
        return (
            f"The `{result.task}` rows above do not record which head weights they measured (a run older than that "
            f"record): the calibration and training curve below are those of the head now in `{where}`."
        )
    if module_digest(DiversedHead.from_pretrained(str(head_dir))) == measured:
        return ""
    return (
        f"The head now in `{where}` is not the one the `{result.task}` rows above measured (its weights differ: "
        f"retrained since): the calibration and training curve below are its own. Run the task's methods again "
        f"(`--task {result.task}`) to measure it."
    )
