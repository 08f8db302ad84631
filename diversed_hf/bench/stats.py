"""The numbers of a bench row, from per-prompt records: quality and its standard error, acceptance,
tokens per round (measured, the estimators of :mod:`diversed_hf.theory`, the i.i.d. prediction),
predicted and relative speedups, and where a method stands against the static-ensemble front.

Pure functions of plain records (dicts of Python values and CPU tensors) and rows (JSON-ready dicts).
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING, Any, Sequence

import torch

from .. import theory

if TYPE_CHECKING:
    from .config import BenchConfig, BenchTask
    from .methods import Method

__all__ = ["add_relative_speedups", "front_comparison", "method_row", "quality_with_stderr"]


def _nan_to_none(value):
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


def quality_with_stderr(rewards: Sequence[float], prompt_indices: Sequence[int]) -> tuple[float, float | None, int]:
    """``(mean reward, standard error, number of prompts)``.

    Samples of one prompt are correlated, so the standard error is over per-prompt means (``None`` for one prompt).
    """
    if len(rewards) != len(prompt_indices):
        raise ValueError(f"`rewards` has {len(rewards)} entries but `prompt_indices` {len(prompt_indices)}; pass one each.")
    values = torch.tensor(list(rewards), dtype=torch.float64)  # (num_prompts * num_samples,)
    per_prompt: dict[int, list[float]] = {}
    for index, reward in zip(prompt_indices, values.tolist()):
        per_prompt.setdefault(index, []).append(reward)
    prompt_means = torch.tensor([statistics.mean(v) for v in per_prompt.values()], dtype=torch.float64)  # (num_prompts,)
    stderr = float(prompt_means.std() / math.sqrt(len(prompt_means))) if len(prompt_means) > 1 else None
    return float(values.mean()), stderr, len(per_prompt)


def method_row(method: Method, records: list[dict], timings: list[float], timed_tokens: int | None, task: BenchTask,
               config: BenchConfig, costs: dict) -> dict:
    """One row of the results: ``records`` are the quality pass's per-sample records of ``method`` (see
    :mod:`diversed_hf.bench.runner`), ``timings`` the timed runs' seconds, ``costs`` the measured seconds per
    token (``target_token_seconds``, ``<draft>_token_seconds``)."""
    completions = [r["completion"] for r in records]
    references = [task.references[r["index"]] for r in records]
    quality, quality_stderr, num_prompts = quality_with_stderr(
        task.reward(completions, references), [r["index"] for r in records]
    )
    num_generated = sum(r["num_generated"] for r in records)
    seconds = statistics.median(timings) if timings else None
    row: dict[str, Any] = {
        "task": task.name,
        "method": method.name,
        "family": method.family,
        "param": method.param,
        "quality": quality,
        "quality_stderr": quality_stderr,
        "quality_metric": task.quality_metric,
        "num_prompts": num_prompts,
        "num_samples": len(records) // max(num_prompts, 1),
        "num_generated": num_generated,
        "mean_new_tokens": num_generated / max(len(records), 1),  # per sample
        "num_timing_prompts": config.num_timing_prompts,
        "seconds_per_sample": None if seconds is None else seconds / config.num_timing_prompts,
        "tokens_per_second": None if not seconds else timed_tokens / seconds,
        "seconds_repeats": timings,
        "num_draft_tokens": config.num_draft_tokens,
        "temperature": config.temperature,
    }
    if method.verifier is None:
        row.update(acceptance_rate=None, tokens_per_round=1.0, emitted_tokens_per_round=1.0, expected_tokens_per_round=1.0,
                   iid_tokens_per_round=1.0, mean_beta=None, estimator=None, position_acceptance=[], position_reach=[],
                   position_beta=[], cost_ratio=0.0, predicted_speedup=1.0, mean_target_weight=None)
        return row
    cost_ratio = costs[f"{method.draft}_token_seconds"] / costs["target_token_seconds"]
    row.update(_speculation_fields(records, num_generated, config, cost_ratio))
    weights = [r["mean_target_weight"] for r in records if r.get("mean_target_weight") is not None]
    row["mean_target_weight"] = statistics.mean(weights) if weights else None
    return row


def _speculation_fields(records: list[dict], num_generated: int, config: BenchConfig, cost_ratio: float) -> dict:
    """Acceptance, tokens per round (measured and estimated), acceptance by position and the predicted speedup."""
    drafted = sum(r["num_drafted"] for r in records)
    accepted = sum(r["num_accepted"] for r in records)
    rounds = sum(r["num_rounds"] for r in records)
    betas = torch.cat([r["position_acceptance"] for r in records], dim=0)  # (total_rounds, N)
    exact = all("drafted_acceptance" in r for r in records)
    drafted_acceptance = torch.cat([r["drafted_acceptance"] for r in records], dim=0) if exact else None  # (total_rounds, N)
    if config.temperature == 0 and exact:
        # Greedy drafting is deterministic given the prefix, so beta_t = a_t(x_t) (1 or 0); the verifier's beta is
        # the sampling rule's and does not apply.
        betas = drafted_acceptance
    if exact:  # unbiased: 1 + sum_k prod_{t<k} a_t(x_t) beta_k
        expected = float(theory.expected_tokens_per_round(betas, drafted_acceptance))
    else:  # records without a_t(x_t): the (biased) beta product 1 + sum_k prod_{t<=k} beta_t
        expected = float(theory.beta_product_tokens_per_round(betas))
    mean_beta = min(max(float(betas.nanmean()), 0.0), 1.0) if (~betas.isnan()).any() else 0.0
    drafted_per_position = torch.tensor([r["drafted_per_position"] for r in records]).sum(dim=0)  # (N,)
    accepted_per_position = torch.tensor([r["accepted_per_position"] for r in records]).sum(dim=0)  # (N,)
    examined = torch.minimum(
        torch.cat([drafted_per_position[:1], accepted_per_position[:-1]]), drafted_per_position
    )  # (N,) rounds in which the draft at k was examined (all before it accepted)
    return dict(
        acceptance_rate=accepted / max(drafted, 1),
        # T_N = accepted + 1 per round, what the estimators predict; EOS can cut a round's last tokens, so
        # the tokens kept per round (emitted_tokens_per_round) can be lower.
        tokens_per_round=(accepted + rounds) / max(rounds, 1),
        emitted_tokens_per_round=num_generated / max(rounds, 1),
        expected_tokens_per_round=expected,
        estimator="exact" if exact else "beta-product",
        # Leviathan et al.'s alpha is E[beta], the mean acceptance probability of a drafted position, not the
        # acceptance rate (which also counts drafts never examined after a rejection).
        mean_beta=mean_beta,
        iid_tokens_per_round=theory.iid_tokens_per_round(mean_beta, config.num_draft_tokens),
        # P(first k accepted) per drafted round, and acceptance at k among rounds that examined k.
        position_reach=(accepted_per_position.double() / drafted_per_position.clamp(min=1).double()).tolist(),
        position_acceptance=(accepted_per_position.double() / examined.clamp(min=1).double()).tolist(),
        position_beta=[_nan_to_none(v) for v in theory.position_acceptance(betas).tolist()],
        cost_ratio=cost_ratio,
        predicted_speedup=float(theory.predicted_speedup(expected, config.num_draft_tokens, cost_ratio)),
    )


def add_relative_speedups(rows: list[dict]) -> None:
    """``speedup_vs_target`` / ``speedup_vs_sd``: the baseline's seconds per sample over this row's (as
    ``diversed_hf.cards`` defines them); ``throughput_speedup_vs_target``: tokens/s over target-only tokens/s,
    the per-token quantity the speedup model predicts (the two differ when methods emit different lengths)."""
    bases = {family: next((r for r in rows if r["family"] == family), None) for family in ("target-only", "sd")}
    for row in rows:
        for key, family in (("speedup_vs_target", "target-only"), ("speedup_vs_sd", "sd")):
            base = bases[family]
            ok = base is not None and base["seconds_per_sample"] and row["seconds_per_sample"]
            row[key] = base["seconds_per_sample"] / row["seconds_per_sample"] if ok else None
        base = bases["target-only"]
        ok = base is not None and base["tokens_per_second"] and row["tokens_per_second"]
        row["throughput_speedup_vs_target"] = row["tokens_per_second"] / base["tokens_per_second"] if ok else None


def front_comparison(rows: list[dict], method: str = "DIVERSED") -> dict | None:
    """Where ``method`` stands against the static-ensemble front (static sweep + SD as w = 1).

    Returns the front's quality interpolated (piecewise linearly) at the method's acceptance rate
    and at its seconds per sample, and the method's quality minus each; ``None`` where the method or
    the front is missing or the method lies outside the front's range.
    """
    point = next((r for r in rows if r["method"] == method), None)
    front = [r for r in rows if r["family"] in ("static-ensemble", "sd")]
    if point is None or len(front) < 2:
        return None
    result = {"method": method, "quality": point["quality"]}
    for axis in ("acceptance_rate", "seconds_per_sample"):
        pairs = sorted((r[axis], r["quality"]) for r in front if r[axis] is not None)
        x = point[axis]
        front_quality = None
        if x is not None and pairs and pairs[0][0] <= x <= pairs[-1][0]:
            for (x0, y0), (x1, y1) in zip(pairs, pairs[1:]):
                if x0 <= x <= x1:
                    front_quality = y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
                    break
        result[f"front_quality_at_{axis}"] = front_quality
        result[f"quality_minus_front_at_{axis}"] = None if front_quality is None else point["quality"] - front_quality
    return result
