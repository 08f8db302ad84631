"""The numbers of a bench row, from per-prompt records: quality and its standard error, acceptance,
tokens per round (measured, the estimators of :mod:`diversed_hf.verifiers.theory`, the i.i.d. prediction),
predicted and relative speedups, and where a method stands against the static-ensemble front.

Pure functions of plain records (dicts of Python values and CPU tensors) and rows (JSON-ready dicts).
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING, Any, Sequence

import torch

from ...verifiers import theory

if TYPE_CHECKING:
    from .config import BenchConfig, BenchTask
    from .methods import Method

__all__ = [
    "add_block_differences",
    "add_paired_differences",
    "add_relative_speedups",
    "front_comparison",
    "method_row",
    "paired_difference",
    "quality_with_stderr",
    "verify_cost",
]

#: the methods whose samples are exact samples of the target distribution p (pooled as its quality)
EXACT_FAMILIES = ("target-only", "sd")


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
        raise ValueError(
            f"`rewards` has {len(rewards)} entries but `prompt_indices` {len(prompt_indices)}; pass one each."
        )
    values = torch.tensor(list(rewards), dtype=torch.float64)  # (num_prompts * num_samples,)
    per_prompt: dict[int, list[float]] = {}
    for index, reward in zip(prompt_indices, values.tolist()):
        per_prompt.setdefault(index, []).append(reward)
    prompt_means = torch.tensor(
        [statistics.mean(v) for v in per_prompt.values()], dtype=torch.float64
    )  # (num_prompts,)
    stderr = float(prompt_means.std() / math.sqrt(len(prompt_means))) if len(prompt_means) > 1 else None
    return float(values.mean()), stderr, len(per_prompt)


def paired_difference(
    method: Sequence[tuple[int, float]],
    reference: Sequence[tuple[int, float]],
    num_resamples: int = 2000,
    seed: int = 0,
) -> dict | None:
    """A method's quality minus a reference's, paired over prompts, with a 95 % bootstrap interval.

    ``method`` and ``reference`` are ``(prompt index, reward)`` pairs (several samples of a prompt allowed).
    Per prompt both score: ``d_i = mean reward of the method - mean reward of the reference``; the estimate
    is the mean of ``d_i`` and the interval the 2.5 and 97.5 percentiles of that mean over ``num_resamples``
    resamples of the prompts (with replacement). Pairing removes the prompts' difficulty from the noise:
    the interval is much narrower than two independent standard errors. ``None`` without a common prompt.
    """

    def by_prompt(pairs):
        sums: dict[int, list[float]] = {}
        for index, reward in pairs:
            sums.setdefault(int(index), []).append(float(reward))
        return {index: statistics.mean(values) for index, values in sums.items()}

    ours, theirs = by_prompt(method), by_prompt(reference)
    common = sorted(set(ours) & set(theirs))
    if not common:
        return None
    differences = torch.tensor([ours[i] - theirs[i] for i in common], dtype=torch.float64)  # (prompts,)
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(common), (num_resamples, len(common)), generator=generator)  # (resamples, prompts)
    means = differences[picks].mean(dim=1) if num_resamples else differences.mean()[None]  # (resamples,)
    low, high = torch.quantile(means, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return {"delta": float(differences.mean()), "low": low, "high": high, "num_prompts": len(common)}


def add_paired_differences(
    rows: list[dict], rewards: dict[str, list[tuple[int, float]]], num_resamples: int = 2000, seed: int = 0
) -> None:
    """``quality_delta`` (with ``quality_delta_low`` / ``_high``, a 95 % interval, and ``quality_delta_prompts``):
    each row's quality minus the **target distribution's**, paired over prompts (:func:`paired_difference`).

    The target distribution's quality pools every sample of target-only decoding and lossless SD, which are
    both exact samples of ``p``; for those two rows the reference is the other one (their difference is the
    check that SD is lossless). ``quality_reference`` names what a row was compared with.
    """
    exact = [row["method"] for row in rows if row["family"] in EXACT_FAMILIES and row["method"] in rewards]
    for row in rows:
        reference = [name for name in exact if name != row["method"]]
        result = None
        if reference:
            pooled = [pair for name in reference for pair in rewards[name]]
            result = paired_difference(rewards[row["method"]], pooled, num_resamples, seed)
        row["quality_reference"] = " + ".join(reference) if result else None
        row["quality_delta"] = None if result is None else result["delta"]
        row["quality_delta_low"] = None if result is None else result["low"]
        row["quality_delta_high"] = None if result is None else result["high"]
        row["quality_delta_prompts"] = None if result is None else result["num_prompts"]


def add_block_differences(
    rows: list[dict],
    rewards: dict[str, list[tuple[int, float]]],
    records: dict[str, list[dict]],
    num_resamples: int = 2000,
    seed: int = 0,
) -> None:
    """For each block-verified row (``paired_with`` set): block minus its token-wise method, paired over prompts
    (:func:`paired_difference`, 95 % bootstrap interval), as ``block_<what>_delta`` / ``_low`` / ``_high``:

    - ``quality``: the task's quality (block verification keeps the law, so this must not move);
    - ``tokens_per_round``: measured ``(accepted + rounds) / rounds`` per sample;
    - ``expected_tokens``: the unbiased estimator of ``E[T_N]`` per sample (:func:`theory.expected_tokens_per_round`:
      the uniform draws of verification averaged out, so its interval is the tighter one).
    """

    def per_sample(name: str) -> dict[str, list[tuple[int, float]]]:
        measured, estimated = [], []
        for record in records[name]:
            if not record.get("num_rounds"):
                continue
            measured.append((record["index"], (record["num_accepted"] + record["num_rounds"]) / record["num_rounds"]))
            if record.get("drafted_acceptance") is not None:
                value = theory.expected_tokens_per_round(record["position_acceptance"], record["drafted_acceptance"])
                estimated.append((record["index"], float(value)))
        return {"quality": rewards[name], "tokens_per_round": measured, "expected_tokens": estimated}

    names = {row["method"] for row in rows}
    for row in rows:
        partner = row.get("paired_with")
        if partner is None or partner not in names or row["method"] not in records or partner not in records:
            continue
        ours, theirs = per_sample(row["method"]), per_sample(partner)
        for what in ours:
            result = (
                paired_difference(ours[what], theirs[what], num_resamples, seed)
                if ours[what] and theirs[what]
                else None
            )
            for key in ("delta", "low", "high"):
                row[f"block_{what}_{key}"] = None if result is None else result[key]


def verify_cost(costs: dict, num_drafts: float) -> float:
    """``c_verify(n)``: a verification pass over ``n + 1`` tokens in target-token units, from the passes
    ``measure_cost`` timed (``verify_pass_seconds_<n + 1>``).

    Between two timed lengths it is interpolated linearly in ``n``; below the shortest it is the shortest's.
    Past the longest it grows from the longest at the least-squares slope of every timed pass, clamped at
    ``>= 0``: a pass over more tokens never costs less. (Extrapolating the last two points instead goes
    negative when timing noise on a busy machine makes the longer pass the faster one.) The result is never
    below the cheapest timed pass; NaN when nothing was timed.
    """
    measured = sorted(
        (int(key.rsplit("_", 1)[1]) - 1, value / costs["target_token_seconds"])
        for key, value in costs.items()
        if key.startswith("verify_pass_seconds_")
    )
    if not measured:  # only the pass at N + 1, or none (NaN)
        return costs.get("verify_pass_seconds", float("nan")) / costs["target_token_seconds"]
    if len(measured) == 1 or num_drafts <= measured[0][0]:
        return measured[0][1]
    for (n0, c0), (n1, c1) in zip(measured, measured[1:]):
        if num_drafts <= n1:
            return c0 + (c1 - c0) * (num_drafts - n0) / (n1 - n0)
    lengths, values = [n for n, _ in measured], [c for _, c in measured]  # past the longest timed pass
    mean_n, mean_c = statistics.fmean(lengths), statistics.fmean(values)
    slope = sum((n - mean_n) * (c - mean_c) for n, c in measured) / sum((n - mean_n) ** 2 for n in lengths)
    return values[-1] + max(slope, 0.0) * (num_drafts - lengths[-1])


def method_row(
    method: Method,
    records: list[dict],
    timings: list[float],
    timed_tokens: int | None,
    task: BenchTask,
    config: BenchConfig,
    costs: dict,
    rewards: Sequence[float] | None = None,
) -> dict:
    """One row of the results: ``records`` are the quality pass's per-sample records of ``method`` (see
    :mod:`diversed_hf.lab.bench.runner`), ``timings`` the timed runs' seconds, ``costs`` the measured seconds per
    token (``target_token_seconds``, ``<draft>_token_seconds``) and per verification pass; ``rewards`` the
    records' rewards when already computed."""
    if rewards is None:
        rewards = task.reward([r["completion"] for r in records], [task.references[r["index"]] for r in records])
    quality, quality_stderr, num_prompts = quality_with_stderr(rewards, [r["index"] for r in records])
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
        "num_draft_tokens": _draft_bound(method, config),
        "schedule": method.schedule.label if method.schedule else "constant",
        "head_task": (method.head_task or task.name) if method.family == "diversed" else None,
        "temperature": config.temperature,
    }
    if method.paired_with is not None:
        row["paired_with"] = method.paired_with  # block verification: its token-wise method
    if method.verifier is None:
        row.update(
            acceptance_rate=None,
            tokens_per_round=1.0,
            emitted_tokens_per_round=1.0,
            expected_tokens_per_round=1.0,
            iid_tokens_per_round=1.0,
            mean_beta=None,
            estimator=None,
            position_acceptance=[],
            position_reach=[],
            position_beta=[],
            cost_ratio=0.0,
            predicted_speedup=1.0,
            verify_cost=1.0,
            predicted_speedup_measured_verify=1.0,
            mean_draft_length=0.0,
            mean_target_weight=None,
        )
        return row
    cost_ratio = costs[f"{method.draft}_token_seconds"] / costs["target_token_seconds"]
    row.update(
        _speculation_fields(records, num_generated, _draft_bound(method, config), cost_ratio, config.temperature)
    )
    # The speed model with the verification pass's measured cost (docs/method.md §6): a round of n drafts
    # costs n c + c_verify(n) target tokens, where the accelerator idealisation takes c_verify = 1.
    mean_draft = row["mean_draft_length"]
    row["verify_cost"] = _nan_to_none(verify_cost(costs, mean_draft))
    row["predicted_speedup_measured_verify"] = (
        None
        if row["verify_cost"] is None
        else (row["expected_tokens_per_round"] / (mean_draft * cost_ratio + row["verify_cost"]))
    )
    weights = [r["mean_target_weight"] for r in records if r.get("mean_target_weight") is not None]
    row["mean_target_weight"] = statistics.mean(weights) if weights else None
    return row


def _draft_bound(method: Method, config: BenchConfig) -> int:
    """N: the constant draft length, or the bound of an adaptive policy."""
    return method.schedule.num_tokens or config.num_draft_tokens if method.schedule else config.num_draft_tokens


def _speculation_fields(
    records: list[dict], num_generated: int, num_draft_tokens: int, cost_ratio: float, temperature: float
) -> dict:
    """Acceptance, tokens per round (measured and estimated), acceptance by position and the predicted speedup
    (the accelerator idealisation ``E[T] / (n c + 1)`` with ``n`` the mean draft length)."""
    drafted = sum(r["num_drafted"] for r in records)
    accepted = sum(r["num_accepted"] for r in records)
    rounds = sum(r["num_rounds"] for r in records)
    # An adaptive policy drafts more in some calls than in others: pad every record to the longest draft
    # (NaN: not drafted), as SpeculationStats pads the rounds of one call.
    width = max(r["position_acceptance"].shape[1] for r in records)  # N_max

    def padded(matrix: torch.Tensor) -> torch.Tensor:  # (rounds, n) -> (rounds, N_max)
        return torch.nn.functional.pad(matrix, (0, width - matrix.shape[1]), value=float("nan"))

    betas = torch.cat([padded(r["position_acceptance"]) for r in records], dim=0)  # (total_rounds, N_max)
    exact = all("drafted_acceptance" in r for r in records)
    drafted_acceptance = (
        torch.cat([padded(r["drafted_acceptance"]) for r in records], dim=0) if exact else None
    )  # (total_rounds, N_max)
    if temperature == 0 and exact:
        # Greedy drafting is deterministic given the prefix, so beta_t = a_t(x_t) (1 or 0); the verifier's beta is
        # the sampling rule's and does not apply.
        betas = drafted_acceptance
    if exact:  # unbiased: 1 + sum_k prod_{t<k} a_t(x_t) beta_k
        expected = float(theory.expected_tokens_per_round(betas, drafted_acceptance))
    else:  # records without a_t(x_t): the (biased) beta product 1 + sum_k prod_{t<=k} beta_t
        expected = float(theory.beta_product_tokens_per_round(betas))
    mean_beta = min(max(float(betas.nanmean()), 0.0), 1.0) if (~betas.isnan()).any() else 0.0

    def counts(key: str) -> torch.Tensor:  # (N_max,) summed over records
        return torch.tensor([r[key] + [0] * (width - len(r[key])) for r in records]).sum(dim=0)

    drafted_per_position, accepted_per_position = counts("drafted_per_position"), counts("accepted_per_position")
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
        iid_tokens_per_round=theory.iid_tokens_per_round(mean_beta, num_draft_tokens),
        # P(first k accepted) per drafted round, and acceptance at k among rounds that examined k.
        position_reach=(accepted_per_position.double() / drafted_per_position.clamp(min=1).double()).tolist(),
        position_acceptance=(accepted_per_position.double() / examined.clamp(min=1).double()).tolist(),
        position_beta=[_nan_to_none(v) for v in theory.position_acceptance(betas).tolist()],
        cost_ratio=cost_ratio,
        mean_draft_length=drafted / max(rounds, 1),
        predicted_speedup=expected / (drafted / max(rounds, 1) * cost_ratio + 1.0),
    )


def add_relative_speedups(rows: list[dict]) -> None:
    """``speedup_vs_target`` / ``speedup_vs_sd``: the baseline's seconds per sample over this row's (as
    ``diversed_hf.heads.cards`` defines them); ``throughput_speedup_vs_target``: tokens/s over target-only tokens/s,
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
