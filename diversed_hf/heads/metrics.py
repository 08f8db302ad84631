"""Quality metrics: their canonical names and how tables, plots and cards label them.

The lowest module that needs them: the head's cards (core) read them without loading the task registry, which
re-exports them (:mod:`diversed_hf.lab.tasks`).
"""

from __future__ import annotations

__all__ = ["METRIC_ALIASES", "METRIC_LABELS", "canonical_metric", "metric_label", "metric_unit"]

#: Quality metrics and how tables, plots and cards label them (values are shown x 100).
METRIC_LABELS: dict[str, str] = {
    "exact_match": "exact match (%)",
    "rouge2_f1": "ROUGE-2 F1 (x100)",
    "rougeL_f1": "ROUGE-L F1 (x100)",
    "pass@1": "pass@1 (%)",
}
#: Other spellings of the metrics that results files may carry.
METRIC_ALIASES: dict[str, str] = {
    "accuracy": "exact_match",
    "rouge2": "rouge2_f1",
    "rouge-2": "rouge2_f1",
    "rougeL": "rougeL_f1",
    "rouge-l": "rougeL_f1",
    "pass_at_1": "pass@1",
}


def canonical_metric(metric: str | None) -> str | None:
    """The canonical name of a quality metric (``"accuracy"`` -> ``"exact_match"``); unknown names pass through."""
    if metric is None:
        return None
    return METRIC_ALIASES.get(metric, metric)


def metric_label(metric: str | None) -> str:
    """How tables, plots and cards name a quality metric (values shown x 100)."""
    metric = canonical_metric(metric)
    return METRIC_LABELS.get(metric or "", f"{metric or 'quality'} (x100)")


def metric_unit(metric: str | None) -> str:
    """What follows a metric's value (x 100) in prose: " %" for the percentages (their label says "(%)"), else ""
    (ROUGE-2 F1 x 100 is not a percentage)."""
    return " %" if metric_label(metric).endswith("(%)") else ""
