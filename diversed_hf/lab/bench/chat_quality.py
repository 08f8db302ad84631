"""Quality without references: what a method's text costs, measured against the target itself (docs/real_pair.md,
"Quality on chat prompts").

Everyday chat prompts have no answer to score. Two measures still say whether a relaxed rule changed what the target
would have written, each per prompt and paired with target-only decoding on the same prompts:

- **target log-likelihood**: the mean per-token log-probability the target (at temperature 1) gives the method's
  text. Text the target itself samples scores its own entropy; a draft's wording the target finds unlikely scores
  lower;
- **agreement**: ROUGE-L F1 of the method's text against an independent target-only sample of the same prompt (the
  target-only row is compared with that sample too, so its agreement is the baseline two target samples reach).

:func:`paired` gives a method's mean minus target-only's with a 95 % bootstrap interval over prompts
(:func:`diversed_hf.lab.bench.stats.paired_difference`).
"""

from __future__ import annotations

import torch

from ..tasks.rewards import rouge_l
from .stats import paired_difference

#: the row families whose samples are the target's own (the reference of both measures)
TARGET_FAMILY = "target-only"

__all__ = ["add_chat_quality", "agreement", "paired", "target_log_likelihood"]


@torch.no_grad()
def target_log_likelihood(target, prompt_ids: torch.Tensor, completion_ids: torch.Tensor) -> float:
    """Mean log ``p_target(token | prefix)`` over ``completion_ids`` (1-D) after ``prompt_ids`` ((1, L) or 1-D), at
    temperature 1; NaN for an empty completion."""
    prompt_ids = prompt_ids.reshape(1, -1)
    completion_ids = completion_ids.reshape(1, -1).to(prompt_ids.device)
    if completion_ids.shape[1] == 0:
        return float("nan")
    sequence = torch.cat([prompt_ids, completion_ids], dim=1)  # (1, L + n)
    logits = target(sequence).logits[0, prompt_ids.shape[1] - 1 : -1].float()  # (n, vocab): each token's prediction
    log_probs = logits.log_softmax(dim=-1).gather(1, completion_ids[0, :, None]).squeeze(1)  # (n,)
    return float(log_probs.mean())


def agreement(texts: list[str], target_texts: list[str]) -> list[float]:
    """ROUGE-L F1 of each text against the target's text of the same prompt."""
    return rouge_l(texts, target_texts)


def paired(scores: list[float], target_scores: list[float]) -> dict | None:
    """Mean of ``scores`` minus mean of ``target_scores`` (per prompt, same order), with a 95 % interval; prompts whose
    score is NaN on either side are left out."""
    pairs = [(i, a, b) for i, (a, b) in enumerate(zip(scores, target_scores)) if a == a and b == b]
    if not pairs:
        return None
    return paired_difference([(i, a) for i, a, _ in pairs], [(i, b) for i, _, b in pairs])


def add_chat_quality(
    rows: list[dict],
    records: dict[str, list[dict]],
    target,
    tokenizer,
    prompts: list[str],
    num_resamples: int = 2000,
    seed: int = 0,
) -> None:
    """``chat_quality`` on every row of a bench run on prompts without references (``diversed-hf bench``'s chat
    column): the target's mean per-token log-likelihood of the row's texts and their ROUGE-L agreement with a
    target-only sample of the same prompt, each minus target-only's, paired over prompts with a 95 % interval.

    ``records`` are the runner's per-sample records (``index``, ``sample``, ``completion``, ``ids``). Sample ``s`` of a
    row is compared with target-only's sample ``s + 1`` (cyclically), so target-only's own agreement is that of two
    independent target samples; with one sample per prompt there is no independent one and agreement is left out.
    Nothing is added without a target-only row.
    """
    base = next((row["method"] for row in rows if row["family"] == TARGET_FAMILY), None)
    if base is None:
        return
    samples = sorted({record["sample"] for record in records[base]})
    reference_text = {(record["sample"], record["index"]): record["completion"] for record in records[base]}
    prompt_ids: dict[int, torch.Tensor] = {}
    scores = {}
    for row in rows:
        likelihood, agree = [], []
        for record in records[row["method"]]:
            index = record["index"]
            if index not in prompt_ids:
                prompt_ids[index] = tokenizer(prompts[index], return_tensors="pt")["input_ids"].to(target.device)
            value = target_log_likelihood(target, prompt_ids[index], torch.tensor(record["ids"], dtype=torch.long))
            if value == value:
                likelihood.append((index, value))
        if len(samples) > 1:
            following = {s: samples[(k + 1) % len(samples)] for k, s in enumerate(samples)}
            found = [r for r in records[row["method"]] if (following.get(r["sample"]), r["index"]) in reference_text]
            texts = [reference_text[following[r["sample"]], r["index"]] for r in found]
            agree = list(zip([r["index"] for r in found], agreement([r["completion"] for r in found], texts)))
        scores[row["method"]] = (likelihood, agree)
    for row in rows:
        likelihood, agree = scores[row["method"]]
        quality = {"log_likelihood": _mean(likelihood), "agreement": _mean(agree) if agree else None}
        for key, mine, theirs in (
            ("log_likelihood_delta", likelihood, scores[base][0]),
            ("agreement_delta", agree, scores[base][1]),
        ):
            quality[key] = (
                paired_difference(mine, theirs, num_resamples=num_resamples, seed=seed) if mine and theirs else None
            )
        row["chat_quality"] = quality


def _mean(pairs: list[tuple[int, float]]) -> float | None:
    return sum(value for _, value in pairs) / len(pairs) if pairs else None
