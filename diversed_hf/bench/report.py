"""Reading a bench run: the Markdown table per task, :func:`write_results` (JSON files, tables and
pictures) and the results page (:func:`write_results_page`, e.g. ``RESULTS.md``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

from ..tasks import metric_label
from .schema import BenchResult, write_json_results
from .stats import front_comparison

logger = logging.getLogger(__name__)

__all__ = ["markdown_table", "quality_label", "write_results", "write_results_page"]

#: How tables and plots name a quality metric (values shown x 100): :func:`diversed_hf.tasks.metric_label`.
quality_label = metric_label


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
    """Write ``results.json`` (all rows: the list model cards read), ``results_<task>.json``, ``bench.json``
    (everything; see :mod:`diversed_hf.bench.schema`), a Markdown table per task and, with ``plots``, the PNGs
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
    "Columns: *acceptance* = accepted drafted tokens / drafted tokens (all scored prompts); quality ± its "
    "standard error over prompts; *s / sample* and *tokens/s* on the timed prompts; *speedup vs target* = "
    "target-only seconds per sample / this method's; *tokens/s speedup* = this method's tokens/s / target-only "
    "tokens/s (the per-token speedup, which differs when methods write different lengths); *predicted* = "
    "`E[T] / (N c + 1)`, the speedup model with the cost ratio `c` measured below; *tokens/round* = (accepted "
    "drafts + 1) per round, measured (tokens after an end of sequence included); *E[T] estimator* = `1 + sum_k "
    "prod_{t<=k} beta_t` averaged over rounds (docs/method.md §6), or the unbiased `1 + sum_k prod_{t<k} a_t(x_t) "
    "beta_k` when the statistics record the acceptance probability `a_t(x_t)` of each drafted token (field "
    "`estimator` in results.json); *i.i.d.* = `(1 - a^(N+1)) / (1 - a)` with `a` the mean of `beta` over drafted "
    "positions (Leviathan et al.'s alpha; not the acceptance rate, which also counts drafts never examined after a "
    "rejection)."
)
_EXACT_ESTIMATOR = (
    "The `E[T]` estimator is the unbiased `1 + sum_k prod_{t<k} a_t(x_t) beta_k` (see `diversed_hf.theory`): "
    "it should match the measured column up to sampling noise."
)
_BETA_PRODUCT_ESTIMATOR = (
    "The `E[T]` estimator multiplies the per-position acceptance probabilities `beta_t` along the *drafted* "
    "prefix, as docs/method.md §6 writes it. That is exact when acceptance does not depend on the drafted context "
    "but biased when it does (whether a drafted token is likely to be accepted also changes `beta` at the next "
    "position): see `diversed_hf.theory` for a two-token counterexample and the unbiased form "
    "`1 + sum_k prod_{t<k} a_t(x_t) beta_k`, which needs the acceptance probability `a_t(x_t)` of each drafted "
    "token (not yet recorded by `SpeculationStats`)."
)


def write_results_page(results: Sequence[BenchResult], output_dir: str | Path, page: str | Path,
                       command: str | None = None, seconds: float | None = None) -> Path:
    """Write everything :func:`write_results` writes, and a Markdown page with the tables and plots."""
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
        + " for quality and acceptance, the first "
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
    estimators = {row.get("estimator") for result in results for row in result.rows} - {None}
    lines += ["## Reading the tokens-per-round columns", ""]
    lines.append(_EXACT_ESTIMATOR if estimators == {"exact"} else _BETA_PRODUCT_ESTIMATOR)
    lines += [
        "",
        "The i.i.d. column assumes every draft is accepted with the same probability, the acceptance rate; the "
        "position plots show how far that is from the truth.",
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
        lines += [_front_sentence(comparison, result.rows), ""]
    lines += [f"- {note}" for note in result.notes]
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
    return lines


def _environment() -> str:
    import os
    import platform

    import torch
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
