"""Benchmark results as model cards carry them: the ``results.json`` schema, its checks, and the rows, selection and
goal as the card template shows them. Part of :mod:`diversed_hf.heads.cards` (which re-exports the public names)."""

from __future__ import annotations

import logging
import math
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Mapping

from . import hub
from .metrics import canonical_metric, metric_unit

logger = logging.getLogger(__name__)

__all__ = ["RESULT_FIELDS", "SD_METHODS", "TARGET_ONLY_METHODS", "goal_text", "load_results", "write_results"]


def _finite_or_symbol(value: float, pattern: str) -> str:
    """``pattern`` filled with ``value``; infinity as ``∞`` and NaN as ``–`` (never ``infx``), as the bench's tables."""
    if isinstance(value, float) and math.isinf(value):
        return "∞" if value > 0 else "-∞"
    if isinstance(value, float) and math.isnan(value):
        return "–"
    return pattern.format(value)


#: numeric row fields: (valid range low, high) - None for open
RESULT_FIELDS: dict[str, tuple[float, float | None]] = {
    "acceptance_rate": (0.0, 1.0),
    "quality": (0.0, 1.0),
    "seconds_per_sample": (0.0, None),
    "tokens_per_second": (0.0, None),
    "tokens_per_round": (1.0, None),
    "speedup_vs_target": (0.0, None),
    "speedup_vs_sd": (0.0, None),
    # quality minus the target distribution's, paired over prompts, and its 95 % interval (fractions)
    "quality_delta": (-1.0, 1.0),
    "quality_delta_low": (-1.0, 1.0),
    "quality_delta_high": (-1.0, 1.0),
}
TARGET_ONLY_METHODS = ("autoregressive", "target", "target-only", "target_only")
SD_METHODS = ("sd", "speculative_decoding", "speculative-decoding", "exact")


# Results -------------------------------------------------------------------------------------------


def load_results(source: Any) -> dict:
    """Validate benchmark results (a path, a list of rows or ``{"setting", "rows"}``) -> ``{"setting", "rows"}``.

    Rows come back with every field of :data:`RESULT_FIELDS` (``None`` where absent) plus ``method``
    and ``quality_metric``, and with missing speedups derived from the baselines' times.
    """
    where = "results"
    if isinstance(source, (str, os.PathLike)):
        where = str(source)
        if not Path(source).is_file():
            raise FileNotFoundError(f"Results file {where} not found.")
        source = hub.read_json(Path(source), "Results file")
    if isinstance(source, list):
        setting, raw_rows = {}, source
    elif isinstance(source, dict) and isinstance(source.get("rows"), list):
        setting, raw_rows = source.get("setting") or {}, source["rows"]
        if not isinstance(setting, dict):
            raise ValueError(f"{where}: `setting` must be a JSON object, got {type(setting).__name__}.")
    else:
        raise ValueError(
            f'{where} must be a list of result rows or an object {{"setting": {{...}}, "rows": [...]}}; '
            "see the format in the diversed_hf.heads.cards docstring."
        )
    rows = []
    for index, raw in enumerate(raw_rows):
        if not isinstance(raw, dict):
            raise ValueError(f"{where}: row {index} must be a JSON object, got {raw!r}.")
        method = raw.get("method")
        if not isinstance(method, str) or not method:
            raise ValueError(
                f'{where}: row {index} needs a non-empty string `method` (e.g. "sd", "diversed"), got {method!r}.'
            )
        family = raw.get("family")
        row: dict[str, Any] = {"method": method, "family": family if isinstance(family, str) else None}
        for name, (low, high) in RESULT_FIELDS.items():
            value = raw.get(name)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
                    raise ValueError(
                        f"{where}: row {index} ({method}) `{name}` must be a number or null, got {value!r}."
                    )
                if value < low or (high is not None and value > high):
                    interval = f"[{low}, {high}]" if high is not None else f">= {low}"
                    hint = " Write fractions: 72.6 % is 0.726, ROUGE-2 7.09 is 0.0709." if high == 1.0 else ""
                    raise ValueError(
                        f"{where}: row {index} ({method}) `{name}` = {value!r} is outside {interval}.{hint}"
                    )
                value = float(value)
            row[name] = value
        metric = raw.get("quality_metric")
        if metric is not None and not isinstance(metric, str):
            raise ValueError(f"{where}: row {index} ({method}) `quality_metric` must be a string, got {metric!r}.")
        row["quality_metric"] = metric
        head_task = raw.get("head_task")
        row["head_task"] = head_task if isinstance(head_task, str) else None
        rows.append(row)
    if not rows:
        raise ValueError(f"{where} has no result rows.")
    _derive_speedups(rows)
    loaded = {"setting": setting, "rows": rows}
    if isinstance(source, dict) and source.get("selection") is not None:
        loaded["selection"] = _check_selection(source["selection"], where)
    return loaded


#: numeric fields of an entry of ``selection["front"]`` (valid range low, high)
FRONT_FIELDS: dict[str, tuple[float, float | None]] = {
    "lambda_acceptance": (0.0, None),
    "acceptance_rate": (0.0, 1.0),
    "acceptance_ratio_vs_sd": (0.0, None),
    "quality": (0.0, 1.0),
    "quality_delta": (-1.0, 1.0),
    "quality_delta_low": (-1.0, 1.0),
    "quality_delta_high": (-1.0, 1.0),
}


def _check_selection(selection: Any, where: str) -> dict:
    """A results file's ``selection`` (why this head among a sweep's), checked field by field."""
    if not isinstance(selection, dict):
        raise ValueError(f"{where}: `selection` must be a JSON object, got {type(selection).__name__}.")
    for key in ("rule", "chosen"):
        if not isinstance(selection.get(key), str) or not selection[key]:
            raise ValueError(f"{where}: `selection.{key}` must be a non-empty string, got {selection.get(key)!r}.")
    front = selection.get("front")
    if not isinstance(front, list) or not front:
        raise ValueError(f"{where}: `selection.front` must be a non-empty list of the sweep's heads, got {front!r}.")
    entries = []
    for index, raw in enumerate(front):
        if not isinstance(raw, dict) or not isinstance(raw.get("method"), str):
            raise ValueError(
                f"{where}: `selection.front[{index}]` must be an object with a string `method`, got {raw!r}."
            )
        entry = {"method": raw["method"]}
        for name, (low, high) in FRONT_FIELDS.items():
            value = raw.get(name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or math.isnan(value)
                or value < low
                or (high is not None and value > high)
            ):
                raise ValueError(
                    f"{where}: `selection.front[{index}].{name}` = {value!r} must be a number in "
                    f"[{low}, {high if high is not None else 'inf'}] or null (fractions: 72.6 % is 0.726)."
                )
            entry[name] = None if value is None else float(value)
        entries.append(entry)
    if selection["chosen"] not in {entry["method"] for entry in entries}:
        raise ValueError(f"{where}: `selection.chosen` {selection['chosen']!r} is not a `method` of `selection.front`.")
    command = selection.get("command")
    if command is not None and not isinstance(command, str):
        raise ValueError(f"{where}: `selection.command` must be a string, got {command!r}.")
    lam = selection.get("lambda_acceptance")
    if lam is not None and (isinstance(lam, bool) or not isinstance(lam, (int, float))):
        raise ValueError(f"{where}: `selection.lambda_acceptance` must be a number, got {lam!r}.")
    return {
        "rule": selection["rule"],
        "chosen": selection["chosen"],
        "lambda_acceptance": lam,
        "front": entries,
        "command": command,
    }


def _format_selection(selection: dict | None) -> dict | None:
    """The card's "Operating point" section: the rule, the chosen head and the front's rows, formatted."""
    if not selection:
        return None

    def fmt(value, pattern, scale=1.0):
        return "-" if value is None else _finite_or_symbol(scale * value, pattern)

    rows = []
    for entry in selection["front"]:
        delta = fmt(entry["quality_delta"], "{:+.1f}", 100)
        if entry["quality_delta"] is not None and None not in (entry["quality_delta_low"], entry["quality_delta_high"]):
            delta += f" [{100 * entry['quality_delta_low']:+.1f}, {100 * entry['quality_delta_high']:+.1f}]"
        chosen = entry["method"] == selection["chosen"]
        cells = {
            "lambda_acceptance": fmt(entry["lambda_acceptance"], "{:g}"),
            "method": entry["method"],
            "acceptance_rate": fmt(entry["acceptance_rate"], "{:.1f} %", 100),
            "acceptance_ratio_vs_sd": fmt(entry["acceptance_ratio_vs_sd"], "{:.2f}x"),
            "quality": fmt(entry["quality"], "{:.2f}", 100),
            "quality_delta": delta,
        }
        rows.append({key: f"**{value}**" for key, value in cells.items()} if chosen else cells)
    lam = selection["lambda_acceptance"]
    return {
        "rule": selection["rule"],
        "chosen": selection["chosen"],
        "rows": rows,
        "command": selection["command"],
        "lambda_acceptance": None if lam is None else f"{lam:g}",
    }


def _format_calibration(calibration: Any, where: str, metric: str | None) -> dict | None:
    """The card's calibration section from ``calibration.json`` (written by ``training/calibrate_head.py``): the
    offset folded into the head's output logit, the rule that chose it and the table it was chosen on."""
    if calibration is None:
        return None
    if isinstance(calibration, (str, os.PathLike)):
        calibration = hub.read_json(Path(calibration), "Calibration")
    if not isinstance(calibration, dict) or not isinstance(calibration.get("rows"), list) or not calibration["rows"]:
        raise ValueError(
            f"{where}: a calibration must be an object with non-empty `rows` (training/calibrate_head.py "
            f"writes it), got {calibration!r:.200}."
        )
    settings = calibration.get("settings") or {}
    scale, unit = 100, metric_unit(metric)  # every metric is shown x 100, as its label says
    try:
        target, chosen = float(calibration["target_quality"]), float(calibration["chosen_offset"])
        tolerance = float(settings.get("tolerance") or 0.0)
        rows = [
            (float(row["offset"]), float(row["quality"]), float(row["acceptance_rate"])) for row in calibration["rows"]
        ]
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(
            f"{where}: a calibration needs `target_quality`, `chosen_offset` and rows with `offset`, "
            f"`quality` and `acceptance_rate` (numbers): {error}"
        ) from None
    if chosen not in [offset for offset, _, _ in rows]:
        raise ValueError(f"{where}: `chosen_offset` {chosen:g} is not an `offset` of the rows.")
    points = " point" if scale * tolerance == 1 else " points"
    bar = f"{scale * target:.1f}{unit}" + (f" minus {scale * tolerance:g}{points}" if tolerance else "")
    quality_of = dict((offset, quality) for offset, quality, _ in rows)
    rule = (
        f"the highest acceptance whose quality is at least target-only decoding's ({bar})"
        if quality_of[chosen] >= target - tolerance - 1e-12
        else f"no offset reached target-only decoding's {bar}, so the best quality"
    )
    table = []
    for offset, quality, acceptance in rows:
        cells = [f"{offset:g}", f"{scale * quality:.2f}", f"{100 * acceptance:.1f} %"]
        table.append([f"**{cell}**" for cell in cells] if offset == chosen else cells)
    return {
        "offset": f"{chosen:g}",
        "rule": rule,
        "rows": table,
        "target_quality": f"{scale * target:.1f}{unit}",
        "split": settings.get("split", "train"),
        "num_prompts": settings.get("num_examples", "?"),
        "num_samples": settings.get("num_sampling_seeds", 1),
        "temperature": settings.get("temperature", "?"),
        "num_draft_tokens": settings.get("num_draft_tokens", "?"),
    }


def _derive_speedups(rows: list[dict]) -> None:
    def base_time(names):
        for row in rows:
            if (row["method"].lower() in names or (row["family"] or "").lower() in names) and row["seconds_per_sample"]:
                return row["seconds_per_sample"]
        return None

    for field_name, names in (("speedup_vs_target", TARGET_ONLY_METHODS), ("speedup_vs_sd", SD_METHODS)):
        base = base_time(names)
        for row in rows:
            if row[field_name] is None and base is not None and row["seconds_per_sample"]:
                row[field_name] = base / row["seconds_per_sample"]


def write_results(path: Path, results: Any) -> None:
    """Validate ``results`` (a path or content) and write it to ``path`` as given."""
    load_results(results)
    if isinstance(results, (str, os.PathLike)):
        if Path(results).resolve() != Path(path).resolve():
            shutil.copyfile(results, path)
    else:
        hub.write_json(path, results)


#: the key of ``training_config.json`` that records what a card says of the head's task (its name, aliases,
#: description, metric and Hub datasets): the lab writes it from its task registry when it trains or re-cards a head,
#: so rendering a card never loads a task
TASK_CARD_KEY = "task_card"


def task_facts(task: str | None, recorded: Any) -> SimpleNamespace | None:
    """What a card says of ``task``: ``recorded`` (a ``task_card`` mapping) when it is about ``task`` (by name or
    alias), else None (an unrecorded task, or a record of another task)."""
    if not task or not isinstance(recorded, Mapping) or not isinstance(recorded.get("name"), str):
        return None
    aliases = tuple(recorded.get("aliases") or ())
    if task not in (recorded["name"], *aliases):
        return None
    return SimpleNamespace(
        name=recorded["name"],
        aliases=aliases,
        description=recorded.get("description"),
        metric=recorded.get("metric"),
        hub_datasets=tuple(recorded.get("hub_datasets") or ()),
    )


def _quality_metric(results: dict, facts: SimpleNamespace | None) -> str | None:
    metrics = {
        canonical_metric(row["quality_metric"])
        for row in results["rows"]
        if row["quality_metric"] and row["quality"] is not None
    }
    if len(metrics) > 1:
        raise ValueError(
            f"Result rows mix quality metrics {sorted(metrics)}: one card shows one task. Use the per-task results "
            "file (`diversed-hf bench` writes results_<task>.json) as the head's results.json."
        )
    if metrics:
        return metrics.pop()
    setting_metric = results["setting"].get("quality_metric")
    if isinstance(setting_metric, str):
        return canonical_metric(setting_metric)
    return facts.metric if facts is not None else None


#: the training record's list of what a run did not teach (train_head.py): shown above the card's results, whose
#: DIVERSED row is then not highlighted as a result
WARNINGS_KEY = "warnings"


def _format_rows(results: dict, highlight: bool = True) -> list[dict]:
    def fmt(value, pattern):
        return "-" if value is None else _finite_or_symbol(value, pattern)

    def delta(row):  # x 100 with its interval: "-0.4 [-1.3, +0.5]"
        if row["quality_delta"] is None:
            return "-"
        if row["quality_delta_low"] is None or row["quality_delta_high"] is None:
            return f"{100 * row['quality_delta']:+.1f}"
        return (
            f"{100 * row['quality_delta']:+.1f} [{100 * row['quality_delta_low']:+.1f}, "
            f"{100 * row['quality_delta_high']:+.1f}]"
        )

    task = results["setting"].get("task")
    formatted = []
    for row in results["rows"]:
        cells = {
            "method": row["method"],
            "acceptance_rate": fmt(
                None if row["acceptance_rate"] is None else 100 * row["acceptance_rate"], "{:.1f} %"
            ),
            "quality": fmt(None if row["quality"] is None else 100 * row["quality"], "{:.2f}"),
            "seconds_per_sample": fmt(row["seconds_per_sample"], "{:.3g}"),
            "tokens_per_second": fmt(row["tokens_per_second"], "{:.1f}"),
            "tokens_per_round": fmt(row["tokens_per_round"], "{:.2f}"),
            "speedup_vs_target": fmt(row["speedup_vs_target"], "{:.2f}x"),
            "speedup_vs_sd": fmt(row["speedup_vs_sd"], "{:.2f}x"),
            "quality_delta": delta(row),
        }
        own_head = row["head_task"] is None or task is None or row["head_task"] == task
        if highlight and (row["family"] == "diversed" or row["method"].lower().startswith("diversed")) and own_head:
            cells = {key: f"**{value}**" for key, value in cells.items()}
        formatted.append(cells)
    return formatted


def goal_text(training: dict | None, results: dict | None) -> str | None:
    """Whether the head's own results meet the goal recorded with its training (``goal_acceptance_ratio``,
    ``goal_max_quality_loss``), and by how much they miss it; ``None`` without a goal or without both rows."""
    if not training or training.get("goal_acceptance_ratio") is None or not results:
        return None
    try:
        ratio, allowed = float(training["goal_acceptance_ratio"]), float(training.get("goal_max_quality_loss") or 0.0)
    except (TypeError, ValueError):
        raise ValueError(
            f"The training configuration's goal is not numeric: goal_acceptance_ratio="
            f"{training['goal_acceptance_ratio']!r}, goal_max_quality_loss={training.get('goal_max_quality_loss')!r}. "
            "Record numbers (e.g. 1.6 and 0.01) in training_config.json."
        ) from None
    task = results["setting"].get("task")
    # the bench's rows name their family; eval_head.py's rows are named "sd" / "diversed"
    rows = {row.get("family") or row["method"]: row for row in results["rows"] if row.get("head_task") in (None, task)}
    head, sd = rows.get("diversed"), rows.get("sd")
    if head is None or sd is None or not sd.get("acceptance_rate") or head.get("quality_delta") is None:
        return None
    measured = head["acceptance_rate"] / sd["acceptance_rate"]
    delta = 100 * head["quality_delta"]
    interval = ""
    if head.get("quality_delta_low") is not None and head.get("quality_delta_high") is not None:
        interval = f" [{100 * head['quality_delta_low']:+.1f}, {100 * head['quality_delta_high']:+.1f}]"
    short = []
    if measured < ratio:
        short.append(f"acceptance {ratio - measured:.2f}x short")
    if delta < -100 * allowed:
        short.append(f"quality {-100 * allowed - delta:.1f} points beyond the allowed loss")
    high = head.get("quality_delta_high")
    if high is not None and high < 0:
        short.append(f"the paired interval {-100 * high:.1f} points below 0")
    verdict = "**met**" if not short else "**missed**: " + ", ".join(short)
    return (
        f"Goal (recorded with the training configuration): acceptance at least {ratio:g}x lossless SD's with "
        f"quality within {100 * allowed:g} point{'s' if allowed != 0.01 else ''} of the target distribution and "
        "its paired 95 % interval reaching 0. "
        f"Measured above: {measured:.2f}x at {delta:+.1f}{interval} points: {verdict}."
    )
