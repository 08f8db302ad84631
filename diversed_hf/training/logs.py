"""What the trainer logs: metrics averaged between two ``log`` calls, and the completions table.

Reward functions get TRL's two logging callbacks as keyword arguments (TRL's ``GRPOTrainer`` convention):

* ``log_metric(name, value)``: a scalar, averaged over the rollout batches (and processes) of a logging step and
  logged beside the trainer's own metrics (``eval_``-prefixed in evaluation);
* ``log_extra(column, values)``: one value per completion of the batch, a column of the completions table.

The completions table (``log_completions=True``) holds this process's latest rollout rows: prompt, completion, each
reward function's reward, the extra columns and the sequence's advantage. At each log it is written to
``<output_dir>/completions/completions_<step>.parquet``, its first ``num_completions_to_print`` rows are logged at
INFO level, and it is sent to Weights & Biases / Trackio when ``report_to`` names them.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
from collections import defaultdict, deque

import torch

logger = logging.getLogger(__name__)

__all__ = ["CompletionLog", "MetricLog"]

MODES = ("train", "eval")


class MetricLog:
    """Per mode, the values of each metric since the last log; :meth:`averages` reports and clears them."""

    def __init__(self):
        self.values = {mode: defaultdict(list) for mode in MODES}
        self.pending: dict[str, list[float]] = defaultdict(list)  # from reward functions, until :meth:`flush_pending`

    def __getitem__(self, mode: str) -> defaultdict:
        """``{name: [values]}`` of ``mode``: append one value per rollout batch or loss call."""
        return self.values[mode]

    def log_metric(self, name: str, value: float) -> None:
        """The ``log_metric`` a reward function receives: record one scalar for this batch."""
        if not isinstance(name, str):
            raise TypeError(
                f"`log_metric` takes a metric name (a str) first, got {name!r}: call log_metric('name', value)."
            )
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise TypeError(
                f"`log_metric({name!r}, {value!r})`: the value must be a real number (a float, int or 0-d tensor)."
            ) from None
        self.pending[name].append(number)

    def flush_pending(self, accelerator, mode: str) -> None:
        """Average what reward functions logged over every process (all must call it, once per rollout batch)."""
        from accelerate.utils import gather_object

        for name in sorted(set(gather_object(list(self.pending)))):  # the same names, in the same order, everywhere
            values = self.pending.get(name, [])
            local = torch.tensor([sum(values), len(values)], dtype=torch.float64, device=accelerator.device)
            total, count = accelerator.gather(local).view(-1, 2).sum(dim=0).tolist()
            self.values[mode][name].append(total / count)
        self.pending.clear()

    def averages(self, mode: str) -> dict[str, float | None]:
        """The mean of each metric since the last call, NaN values left out (None when none is left); then clear."""
        means = {}
        for name, values in self.values[mode].items():
            valid = [v for v in values if not math.isnan(v)]
            means[name] = sum(valid) / len(valid) if valid else None
        self.values[mode].clear()
        return means


class CompletionLog:
    """The latest ``size`` rollout rows of this process, with their rewards, extra columns and advantages."""

    def __init__(self, size: int):
        self.size = size
        self.columns: dict[str, deque] = {name: deque(maxlen=size) for name in ("prompt", "completion", "advantage")}
        self.rewards: dict[str, deque] = {}
        self.extra: dict[str, deque] = {}
        self.pending: dict[str, list] = defaultdict(list)  # from reward functions, until :meth:`record`

    def log_extra(self, column: str, values: list) -> None:
        """The ``log_extra`` a reward function receives: one value per completion of the batch."""
        if not isinstance(column, str) or isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
            raise TypeError(
                f"`log_extra({column!r}, {values!r})` takes a column name (a str) and a list of values, one per "
                "completion: call log_extra('name', [value, ...])."
            )
        self.pending[column].extend(values)

    def record(self, prompts: list, completions: list[str], rewards: dict[str, list], advantages: list) -> None:
        """Add one rollout batch; the extra columns reward functions logged for it are checked and added too."""
        rows = len(prompts)
        pending, self.pending = dict(self.pending), defaultdict(list)
        for column, values in pending.items():
            if len(values) != rows:
                raise ValueError(
                    f"A reward function logged {len(values)} values in the column {column!r} for a batch of {rows} "
                    "completions: `log_extra(column, values)` takes one value per completion, in order."
                )
        filled = len(self.columns["prompt"])
        self._extend(self.rewards, rewards, filled, rows)
        self._extend(self.extra, pending, filled, rows)
        self.columns["prompt"].extend(prompts)
        self.columns["completion"].extend(completions)
        self.columns["advantage"].extend(advantages)

    def _extend(self, group: dict[str, deque], new: dict[str, list], filled: int, rows: int) -> None:
        """Append ``new``'s columns to ``group``: a new column starts with None for earlier rows, a column this batch
        lacks gets None for its rows, so every column stays as long as the prompts'."""
        for name in new.keys() - group.keys():
            group[name] = deque([None] * filled, maxlen=self.size)
        for name, column in group.items():
            column.extend(new.get(name, [None] * rows))

    def table(self, step: int):
        """The rows as a ``pandas.DataFrame``: step, prompt, completion, one column per reward, extra columns,
        advantage."""
        import pandas as pd

        rows = len(self.columns["prompt"])
        return pd.DataFrame(
            {
                "step": [step] * rows,
                "prompt": list(self.columns["prompt"]),
                "completion": list(self.columns["completion"]),
                **{name: list(values) for name, values in self.rewards.items()},
                **{name: list(values) for name, values in self.extra.items()},
                "advantage": list(self.columns["advantage"]),
            }
        )

    def write(self, output_dir: str, step: int, *, num_to_print: int | None, report_to, unique_prompts: bool) -> None:
        """Write the table as parquet, log its first rows, and send it to the trackers of ``report_to``."""
        frame = self.table(step)
        folder = os.path.join(output_dir, "completions")
        os.makedirs(folder, exist_ok=True)
        frame.to_parquet(os.path.join(folder, f"completions_{step:05d}.parquet"))
        if num_to_print:
            logger.info("Completions at step %d:\n%s", step, frame.head(num_to_print).to_string(max_colwidth=200))
        shown = frame[~frame["prompt"].astype(str).duplicated()] if unique_prompts else frame
        for name in ("wandb", "trackio"):
            if name not in (report_to or []):
                continue
            backend = importlib.import_module(name)
            if name == "wandb" and backend.run is None:
                continue
            backend.log({"completions": backend.Table(dataframe=shown)})
