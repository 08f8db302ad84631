"""Reading a bench run: the Markdown table per task, :func:`write_results` (JSON files, tables and
pictures) and the results page (:func:`write_results_page`, e.g. ``RESULTS.md``)."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Sequence

from ..tasks import metric_label
from .schema import BenchResult, write_json_results
from .stats import front_comparison

logger = logging.getLogger(__name__)

__all__ = [
    "block_table",
    "markdown_table",
    "policy_table",
    "quality_label",
    "quality_table",
    "speed_table",
    "transfer_table",
    "write_results",
    "write_results_page",
]

#: How tables and plots name a quality metric (values shown x 100): :func:`diversed_hf.lab.tasks.metric_label`.
quality_label = metric_label


def _cell(value, spec: str, scale: float = 1.0, suffix: str = "") -> str:
    """``value * scale`` formatted with ``spec`` and its unit ``suffix`` (``"x"``, ``" %"``); ``–`` for a missing or
    NaN value, ``∞`` / ``-∞`` without the unit for an unbounded one (a ratio over a zero time or cost)."""
    if value is None or value != value:  # None or NaN
        return "–"
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    return f"{value * scale:{spec}}{suffix}"


def _ratio(measured, predicted) -> float | None:
    return measured / predicted if measured is not None and predicted else None


def _delta_cell(row: dict) -> str:
    """Quality minus the target distribution's, x 100, with its 95 % interval: ``-1.2 [-2.3, -0.1]``."""
    if row.get("quality_delta") is None:
        return "–"
    return (
        f"{100 * row['quality_delta']:+.1f} [{100 * row['quality_delta_low']:+.1f}, "
        f"{100 * row['quality_delta_high']:+.1f}]"
    )


def _name(row: dict) -> str:
    return (
        f"**{row['method']}**"
        if row["family"] == "diversed" and row.get("head_task") in (None, row.get("task"))
        else row["method"]
    )


def quality_table(rows: list[dict]) -> str:
    """Acceptance, quality (± its standard error), quality minus the target distribution's with its paired
    95 % interval, and tokens per round (measured / estimator / i.i.d.)."""
    metric = quality_label(rows[0]["quality_metric"]) if rows else "quality"
    lines = [
        f"| method | acceptance | {metric} | vs target distribution [95 % CI] | prompts x samples | tokens/round "
        "| E[T] estimator | i.i.d. |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        quality = _cell(row["quality"], ".1f", 100)
        if row.get("quality_stderr") is not None:
            quality += f" ± {row['quality_stderr'] * 100:.1f}"
        lines.append(
            f"| {_name(row)} | {_cell(row['acceptance_rate'], '.1f', 100, ' %')} | {quality} | {_delta_cell(row)} "
            f"| {row.get('num_prompts', '–')} x {row.get('num_samples', '–')} "
            f"| {_cell(row['tokens_per_round'], '.2f')} | {_cell(row['expected_tokens_per_round'], '.2f')} "
            f"| {_cell(row['iid_tokens_per_round'], '.2f')} |"
        )
    return "\n".join(lines)


def speed_table(rows: list[dict]) -> str:
    """Time, tokens/s and speedups, next to both speed models' predictions and measured / predicted."""
    lines = [
        "| method | s / sample | tokens/s | speedup vs target | tokens/s speedup | predicted, c_verify = 1 "
        "| measured / predicted | predicted, measured c_verify | measured / predicted |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        measured = row.get("throughput_speedup_vs_target")
        ideal, real = row.get("predicted_speedup"), row.get("predicted_speedup_measured_verify")
        lines.append(
            f"| {_name(row)} | {_cell(row['seconds_per_sample'], '.3f')} | {_cell(row['tokens_per_second'], '.0f')} "
            f"| {_cell(row['speedup_vs_target'], '.2f', suffix='x')} | {_cell(measured, '.2f', suffix='x')} "
            f"| {_cell(ideal, '.2f', suffix='x')} | {_cell(_ratio(measured, ideal), '.2f')} "
            f"| {_cell(real, '.2f', suffix='x')} | {_cell(_ratio(measured, real), '.2f')} |"
        )
    return "\n".join(lines)


def chat_table(rows: list[dict]) -> str | None:
    """Quality without references (rows with ``chat_quality``, a task without answers): the target's log-likelihood
    of each method's texts and their ROUGE-L agreement with a target-only sample, each against target-only's with its
    paired 95 % interval; ``None`` when no row has them."""
    if not any(row.get("chat_quality") for row in rows):
        return None

    def interval(delta: dict | None, scale: float) -> str:
        if delta is None:
            return "–"
        return f"{delta['delta'] * scale:+.3f} [{delta['low'] * scale:+.3f}, {delta['high'] * scale:+.3f}]"

    lines = [
        "| method | target log-likelihood / token | vs target-only [95 % CI] | ROUGE-L agreement with a target sample "
        "| vs target-only [95 % CI] |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        chat = row.get("chat_quality") or {}
        lines.append(
            f"| {_name(row)} | {_cell(chat.get('log_likelihood'), '.3f')} "
            f"| {interval(chat.get('log_likelihood_delta'), 1.0)} | {_cell(chat.get('agreement'), '.3f')} "
            f"| {interval(chat.get('agreement_delta'), 1.0)} |"
        )
    return "\n".join(lines)


def markdown_table(rows: list[dict]) -> str:
    """The paper's table in two parts: :func:`quality_table` and :func:`speed_table`; on a task without answers,
    :func:`chat_table` between them."""
    chat = chat_table(rows)
    return quality_table(rows) + ("\n\n" + chat if chat else "") + "\n\n" + speed_table(rows)


def policy_table(results_by_batch: dict[int, Sequence[BenchResult]]) -> str:
    """Draft-length policies side by side: per task, method and policy, the acceptance, mean draft length and
    tokens per round of the quality pass, and tokens/s at each timed batch size (``{batch size: results}``)."""
    sizes = sorted(results_by_batch)
    lines = [
        "| task | method | policy | acceptance | mean draft length | tokens/round | "
        + " | ".join(f"tokens/s, batch {b}" for b in sizes)
        + " |",
        "|---|---|---|---:|---:|---:|" + "---:|" * len(sizes),
    ]
    first = results_by_batch[sizes[0]]
    speeds = {(result.task, row["method"]): {} for result in first for row in result.rows}
    for size in sizes:
        for result in results_by_batch[size]:
            for row in result.rows:
                speeds.setdefault((result.task, row["method"]), {})[size] = row.get("tokens_per_second")
    for result in first:
        best = {}  # the fastest policy per method at the smallest batch, in bold
        for row in result.rows:
            base = row["method"].split(" @ ")[0]
            value = speeds[(result.task, row["method"])].get(sizes[0])
            if value is not None and value > best.get(base, (None, -1.0))[1]:
                best[base] = (row["method"], value)
        for row in result.rows:
            base, _, policy = row["method"].partition(" @ ")
            cells = []
            for size in sizes:
                value = speeds[(result.task, row["method"])].get(size)
                cell = _cell(value, ".0f")
                if size == sizes[0] and best.get(base, (None,))[0] == row["method"]:
                    cell = f"**{cell}**"
                cells.append(cell)
            lines.append(
                f"| {result.task} | {base} | {policy or row.get('schedule', 'constant')} "
                f"| {_cell(row['acceptance_rate'], '.1f', 100, ' %')} | {_cell(row.get('mean_draft_length'), '.2f')} "
                f"| {_cell(row['tokens_per_round'], '.2f')} | " + " | ".join(cells) + " |"
            )
    return "\n".join(lines)


def _interval(row: dict, what: str, scale: float, spec: str) -> str:
    if row.get(f"block_{what}_delta") is None:
        return "–"
    low, delta, high = (row[f"block_{what}_{key}"] * scale for key in ("low", "delta", "high"))
    return f"{delta:{spec}} [{low:{spec}}, {high:{spec}}]"


def block_table(results: Sequence[BenchResult]) -> str | None:
    """Block verification against token-wise, per task and method: acceptance, tokens per round and its estimator,
    tokens/s and quality, each ``token-wise → block``, with block minus token-wise paired over prompts (95 %
    bootstrap intervals; ``stats.add_block_differences``). ``None`` without a block-verified row."""
    lines = [
        "| task | method | acceptance | tokens/round | Δ tokens/round [95 % CI] | Δ E[T] estimator [95 % CI] "
        "| tokens/s | quality | Δ quality [95 % CI] | prompts x samples |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        rows = {row["method"]: row for row in result.rows}
        for row in result.rows:
            base = rows.get(row.get("paired_with"))
            if base is None:
                continue

            def pair(key, spec, scale=1.0, suffix=""):
                return f"{_cell(base.get(key), spec, scale, suffix)} → {_cell(row.get(key), spec, scale, suffix)}"

            lines.append(
                f"| {result.task} | {base['method']} | {pair('acceptance_rate', '.1f', 100, ' %')} "
                f"| {pair('tokens_per_round', '.3f')} | {_interval(row, 'tokens_per_round', 1.0, '+.3f')} "
                f"| {_interval(row, 'expected_tokens', 1.0, '+.3f')} | {pair('tokens_per_second', '.1f')} "
                f"| {pair('quality', '.1f', 100)} | {_interval(row, 'quality', 100.0, '+.1f')} "
                f"| {row.get('num_prompts', '–')} x {row.get('num_samples', '–')} |"
            )
    return "\n".join(lines) if len(lines) > 2 else None


def transfer_table(results: Sequence[BenchResult]) -> str | None:
    """The transfer experiment: on each task, SD, the task's own head and heads trained for other tasks, with
    acceptance and quality against the target distribution (paired 95 % interval); ``None`` without any."""
    if not any(row.get("head_task") not in (None, row["task"]) for result in results for row in result.rows):
        return None
    lines = [
        "| evaluated on | method | head trained on | acceptance | quality | vs target distribution [95 % CI] "
        "| prompts x samples |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for result in results:
        for row in result.rows:
            if row["family"] not in ("sd", "diversed"):
                continue
            quality = _cell(row["quality"], ".1f", 100) + f" ({quality_label(row['quality_metric'])})"
            lines.append(
                f"| {result.task} | {_name(row)} | {row.get('head_task') or '–'} "
                f"| {_cell(row['acceptance_rate'], '.1f', 100, ' %')} | {quality} | {_delta_cell(row)} "
                f"| {row.get('num_prompts', '–')} x {row.get('num_samples', '–')} |"
            )
    return "\n".join(lines)


def write_results(results: Sequence[BenchResult], output_dir: str | Path, plots: bool = True) -> dict[str, Path]:
    """Write ``results.json`` (all rows: the list model cards read), ``results_<task>.json``, ``bench.json``
    (everything; see :mod:`diversed_hf.lab.bench.schema`), a Markdown table per task and, with ``plots``, the PNGs
    and the HTML weight view. Returns the paths."""
    output_dir = Path(output_dir)
    paths = write_json_results(results, output_dir)
    for result in results:
        table = output_dir / f"{result.task}_table.md"
        table.write_text(markdown_table(result.rows) + "\n")
        paths[f"{result.task}_table"] = table
        if plots:
            from .plots import plot_all  # needs matplotlib, which plots=False runs do without

            paths.update(plot_all(result, output_dir))
    return paths


_COLUMNS = (
    "Quality table: *acceptance* = accepted drafted tokens / drafted tokens (all scored prompts); quality ± its "
    "standard error over prompts; *vs target distribution* = this method's quality minus the target distribution's, "
    "paired over the same prompts, with a 95 % bootstrap interval over prompts (the target distribution pools "
    "target-only decoding and lossless SD, both exact samples of `p`; the row of each of those two is compared with "
    "the other); *prompts x samples* = what the row scored; *tokens/round* = (accepted drafts + 1) per round, "
    "measured (tokens after an end of sequence included); *E[T] estimator* = `1 + sum_k prod_{t<k} a_t(x_t) beta_k` "
    "averaged over rounds (unbiased; docs/method.md §6), or the beta product `1 + sum_k prod_{t<=k} beta_t` when the "
    "statistics lack `a_t(x_t)` (field `estimator` in results.json); *i.i.d.* = `(1 - a^(N+1)) / (1 - a)` with `a` "
    "the mean of `beta` over drafted positions (Leviathan et al.'s alpha; not the acceptance rate, which also counts "
    "drafts never examined after a rejection).\n\n"
    "Speed table: *s / sample* and *tokens/s* on the timed prompts; *speedup vs target* = target-only seconds per "
    "sample / this method's; *tokens/s speedup* = this method's tokens/s / target-only tokens/s (the per-token "
    "speedup the models predict; it differs from the former when methods write different lengths). Two speed "
    "models, both `E[T] / (n c + c_verify(n))` with `n` the mean draft length and `c` the measured cost ratio: "
    "*c_verify = 1* is the accelerator idealisation (a verification pass over `n + 1` tokens costs one target token, "
    "true while decoding is memory-bound); *measured c_verify* uses the pass's measured cost on this machine "
    "(interpolated between the timed pass lengths; past the longest, its cost grows at the fitted slope, never "
    "below zero). *measured / predicted* = tokens/s speedup / prediction: what neither model counts (the draft's and "
    "verifier's per-round overhead, sampling, Python). `–`: not measured; `∞`: a ratio over a zero time or cost."
)
_EXACT_ESTIMATOR = (
    "The `E[T]` estimator is the unbiased `1 + sum_k prod_{t<k} a_t(x_t) beta_k` (see `diversed_hf.verifiers.theory`): "
    "it should match the measured column up to sampling noise."
)
_BETA_PRODUCT_ESTIMATOR = (
    "The `E[T]` estimator multiplies the per-position acceptance probabilities `beta_t` along the *drafted* "
    "prefix, as docs/method.md §6 writes it. That is exact when acceptance does not depend on the drafted context "
    "but biased when it does (whether a drafted token is likely to be accepted also changes `beta` at the next "
    "position): see `diversed_hf.verifiers.theory` for a two-token counterexample and the unbiased form "
    "`1 + sum_k prod_{t<k} a_t(x_t) beta_k`, which needs the acceptance probability `a_t(x_t)` of each drafted "
    "token (not yet recorded by `SpeculationStats`)."
)


def write_results_page(
    results: Sequence[BenchResult],
    output_dir: str | Path,
    page: str | Path,
    command: str | None = None,
    seconds: float | None = None,
    sections: Sequence[tuple[str, str]] = (),
) -> Path:
    """Write everything :func:`write_results` writes, and a Markdown page with the tables and plots.

    ``sections`` are extra ``(title, Markdown)`` sections placed after the tasks (e.g. :func:`policy_table`).
    """
    page = Path(page)
    paths = write_results(results, output_dir)
    home = page.resolve().parent

    def relative(path) -> str:  # paths under the page's directory as relative links
        return Path(path).resolve().relative_to(home).as_posix() if _is_under(path, home) else str(path)

    def shown(name):  # local model directories relative to the page, Hub ids as they are
        return relative(name) if name and Path(name).is_dir() else name

    lines = ["# Benchmark results", ""]
    if command:
        lines += ["Regenerate with:", "", "```bash", command, "```", ""]
    first = results[0].meta if results else {}
    config = first.get("config", {})
    lines += [
        f"Target `{shown(first.get('target'))}`, draft `{shown(first.get('draft'))}`"
        + f"; {config.get('num_prompts')} held-out prompts per task"
        + (f" x {config['num_samples']} samples" if config.get("num_samples", 1) > 1 else "")
        + " for quality and acceptance"
        + (
            f" (target-only, SD and DIVERSED with the task's head; the other methods the first "
            f"{config['num_baseline_prompts']})"
            if config.get("num_baseline_prompts", config.get("num_prompts")) != config.get("num_prompts")
            else ""
        )
        + ", the first "
        f"{config.get('num_timing_prompts')} timed at batch size {config.get('timing_batch_size')} (median of "
        f"{config.get('repeats')} interleaved runs after a warm-up); temperature {config.get('temperature')}, "
        f"N = {config.get('num_draft_tokens')} drafts per round, at most {config.get('max_new_tokens')} new tokens; "
        f"{first.get('num_processes')} process(es) x {first.get('torch_threads')} torch thread(s)"
        + (f"; the whole run took {seconds / 60:.1f} min." if seconds else "."),
        "",
        f"Environment: {_environment()}.",
        "",
        _COLUMNS,
        "",
    ]
    for result in results:
        lines += _task_section(result, paths, relative, shown)
    transfer = transfer_table(results)
    if transfer is not None:
        lines += [
            "## Heads on another task",
            "",
            "The paper's transfer experiment: each task's head verifying the other task, next to lossless SD and "
            "the task's own head, on the same prompts (quality against the target distribution with its paired 95 % "
            "interval, as above).",
            "",
            transfer,
            "",
        ]
    for title, body in sections:
        lines += [f"## {title}", "", body, ""]
    estimators = {row.get("estimator") for result in results for row in result.rows} - {None}
    lines += ["## Reading the tokens-per-round columns", ""]
    lines.append(_EXACT_ESTIMATOR if estimators == {"exact"} else _BETA_PRODUCT_ESTIMATOR)
    lines += [
        "",
        "The i.i.d. column assumes every drafted position is accepted with the same probability, the mean `beta`; "
        "the position plots show how far that is from the truth.",
        "",
    ]
    page.write_text("\n".join(lines))
    logger.info("wrote the results page %s", page)
    return page


def _task_section(result: BenchResult, paths: dict[str, Path], relative, shown) -> list[str]:
    meta = result.meta
    lines = [f"## {result.task}", ""]
    lines += [
        f"Cost ratio c = draft / target seconds per token = {meta['cost_ratio']:.3f} "
        f"(target {meta['costs']['target_token_seconds'] * 1e3:.2f} ms/token); one verification pass over "
        f"N + 1 tokens costs c_verify = {meta['verify_cost_ratio']:.2f} target tokens."
        + (f" Fine-tuned draft: `{shown(meta['finetuned_draft'])}`." if meta.get("finetuned_draft") else "")
        + (
            f" DIVERSED head: {meta['head'].get('architecture')} head trained for task `{meta['head'].get('task')}`."
            if meta.get("head")
            else ""
        ),
        "",
        quality_table(result.rows),
        "",
        speed_table(result.rows),
        "",
    ]
    comparison = front_comparison(result.rows)
    if comparison is not None:
        lines += [_front_sentence(comparison, result.rows), ""]
    lines += [f"- {note}" for note in result.notes]
    if result.notes:
        lines.append("")
    for key, caption in (
        ("tradeoffs", "Quality vs time and vs acceptance (line: static-ensemble front)"),
        ("positions", "Acceptance by draft position"),
    ):
        path = paths.get(f"{result.task}_{key}")
        if path is not None:
            lines += [f"![{caption}]({relative(path)})", ""]
    html = paths.get(f"{result.task}_weights")
    if html is not None:
        lines += [
            f"Per-token target weight `w` chosen at each emitted token: [{relative(html)}]({relative(html)}).",
            "",
        ]
    return lines


def _environment() -> str:
    import os
    import platform

    import torch
    import transformers

    return (
        f"Python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), "
        f"{'CUDA ' + torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'}"
    )


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
        f"({100 * delta:+.1f} vs the front at the same acceptance)"
        if delta is not None
        else "(outside the front's acceptance range)"
    )
    delta_time = comparison.get("quality_minus_front_at_seconds_per_sample")
    if delta_time is not None:
        parts.append(f"and {100 * delta_time:+.1f} vs the front at the same time per sample")
    elif point.get("seconds_per_sample") is not None:
        times = [
            r["seconds_per_sample"]
            for r in rows
            if r["family"] in ("static-ensemble", "sd") and r["seconds_per_sample"]
        ]
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
