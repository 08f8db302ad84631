"""A bench run's result, :class:`BenchResult`, and its JSON files.

- ``results.json``: every row of every task (a list; the rows ``diversed_hf.heads.cards`` reads);
- ``results_<task>.json``: one task's rows as ``{"setting", "rows"}``, to copy next to a head as its
  ``results.json`` (:func:`diversed_hf.heads.cards.load_results` reads it);
- ``bench.json``: everything (:meth:`BenchResult.to_json` of each task), which :func:`read_results` reads back.

Quality and acceptance are fractions in every file.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

logger = logging.getLogger(__name__)

__all__ = ["BenchResult", "read_results", "task_setting", "write_json_results"]


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


def task_setting(result: BenchResult) -> dict:
    """The ``setting`` of ``results_<task>.json``: how the rows were measured, in the cards' vocabulary."""
    config = result.meta["config"]
    setting = {key: config[key] for key in ("temperature", "num_draft_tokens", "max_new_tokens")}
    setting.update(
        task=result.task,
        quality_metric=result.meta["quality_metric"],
        num_samples=result.rows[0]["num_prompts"] if result.rows else 0,
        num_sampling_seeds=config.get("num_samples", 1),
        target=result.meta["target"],
        draft=result.meta["draft"],
    )
    return setting


def _json_default(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, torch.dtype):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _write_json(path: Path, content) -> Path:
    path.write_text(json.dumps(content, indent=2, default=_json_default) + "\n")
    return path


def write_json_results(results: Sequence[BenchResult], output_dir: str | Path) -> dict[str, Path]:
    """Write ``results.json``, ``bench.json`` and one ``results_<task>.json`` per task into ``output_dir``.

    Returns the paths under the keys ``results``, ``bench`` and ``<task>_results``.
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    rows = [row for result in results for row in result.rows]
    paths = {
        "results": _write_json(output_dir / "results.json", rows),
        "bench": _write_json(output_dir / "bench.json", [r.to_json() for r in results]),
    }
    for result in results:
        # One file per task in the form diversed_hf.heads.cards reads: copy it next to a head as results.json.
        content = {"setting": task_setting(result), "rows": result.rows}
        paths[f"{result.task}_results"] = _write_json(output_dir / f"results_{result.task}.json", content)
    logger.info("wrote %s", ", ".join(str(p) for p in paths.values()))
    return paths


def read_results(path: str | Path) -> list[BenchResult]:
    """The :class:`BenchResult` list saved in a ``bench.json`` by :func:`~diversed_hf.lab.bench.write_results` (to
    re-plot or re-page)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"`path` {str(path)!r} is not a file; pass the bench.json a bench run wrote.")
    items = json.loads(path.read_text())
    if not isinstance(items, list) or not all(isinstance(item, dict) and "rows" in item for item in items):
        raise ValueError(
            f"{path} is not a bench.json (a list of task results); results.json and results_<task>.json hold rows "
            "only: pass the bench.json next to them."
        )
    return [BenchResult(**item) for item in items]
