"""Dense rewards for weak targets (docs/training.md, "Rewards for weak targets").

A task's own reward fires rarely when the target itself is weak: SmolLM2-135M-Instruct solves about 9 % of
``arith_chat``, so most groups of ``G`` samples all score 0 and carry no signal. Each mode here is a reward in
TRL's convention that reads columns :func:`add_target_columns` adds to the training set once, from the target's
own greedy completion of every prompt (cached in a JSON file, so a resumed run does not redo it; the file records the
target's fingerprint and the generation settings, and another target's or other settings' file is refused):

``"task"``               the task's reward ``R(x, reference)`` (the paper's);
``"task_minus_target"``  ``R(x, reference) - R(y_target, reference)``: the same ranking within a prompt, centred on
                         what the target reaches there (with ``use_group_baseline`` the per-prompt shift cancels in
                         the advantage; it matters without it, and in the logged reward);
``"target_agreement"``   agreement with the target's own answer ``y_target``: for exact-match tasks 1.0 when the
                         final numbers agree, for ROUGE tasks ROUGE-2 F1 against ``y_target``. It fires on every
                         prompt, and its optimum keeps the target's answers: quality at the target's level.
``"target_likelihood"``  the target's own mean per-token log-likelihood of the completion (temperature 1): any
                         text, no answers and no greedy answers needed; it falls as soon as the mixture writes
                         tokens the target finds unlikely, which ROUGE against one greedy answer hardly sees in
                         sampled chat (:func:`likelihood_reward`; the measure of ``lab.bench.chat_quality``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..cli_utils import write_text_atomic
from .registry import get_task, reward_for_task
from .rewards import exact_match, extract_final_number, rouge2

__all__ = [
    "REWARD_MODES",
    "add_target_columns",
    "dense_reward",
    "likelihood_reward",
    "target_completions",
    "target_fingerprint",
]

logger = logging.getLogger(__name__)

REWARD_MODES = ("task", "task_minus_target", "target_agreement", "target_likelihood")
_AGREEMENT = {"exact_match": "final number", "rouge2_f1": "ROUGE-2 F1"}  # metric -> how agreement is scored


def _key(prompt: str) -> str:
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()


def check_reward_mode(mode: str, task: str) -> None:
    """Refuse an unknown mode, or agreement on a task whose metric has no agreement score (pass@1)."""
    if mode not in REWARD_MODES:
        raise ValueError(f"`reward` is {mode!r}; use one of {REWARD_MODES}.")
    metric = get_task(task).metric
    if mode == "target_agreement" and metric not in _AGREEMENT:
        raise ValueError(
            f"`reward` 'target_agreement' scores agreement by {sorted(_AGREEMENT)}, and task {task!r} is scored by "
            f"{metric!r}; use 'task' or 'task_minus_target' for it."
        )


def target_fingerprint(model) -> str:
    """What tells two targets apart: a digest of the model's class and of every parameter's name, shape, dtype and
    first 64 values (another checkpoint, dtype, or an adapter, attached or merged, changes it)."""
    digest = hashlib.sha256(type(model).__name__.encode())
    for name, parameter in model.named_parameters():
        digest.update(f"{name}:{tuple(parameter.shape)}:{parameter.dtype}".encode())
        values = parameter.detach().reshape(-1)[:64].to(device="cpu", dtype=torch.float32)  # (<= 64,)
        digest.update(values.numpy().tobytes())
    return digest.hexdigest()[:16]


def _cache_key(target, tokenizer, max_new_tokens: int) -> dict:
    """What the cached completions depend on: the target and the greedy generation's settings."""
    generation = target.generation_config
    return {
        "target_fingerprint": target_fingerprint(target),
        "target_dtype": str(target.dtype),
        "max_new_tokens": max_new_tokens,
        "eos_token_id": generation.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "repetition_penalty": generation.repetition_penalty,
        "no_repeat_ngram_size": generation.no_repeat_ngram_size,
        "tokenizer_size": len(tokenizer),
    }


def _read_cache(cache: Path, key: dict) -> dict:
    """The cached completions ``{prompt sha256: text}`` of ``cache`` (``{}`` without one), refused when the file is
    damaged or was written for another target or other settings."""
    if not cache.is_file():
        return {}
    fix = "Remove it to generate the target's completions again, or point the cache elsewhere."
    try:
        known = json.loads(cache.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(
            f"The target's completion cache {cache} is not valid JSON ({error}): it was cut short. {fix}"
        ) from error
    if not isinstance(known, dict) or not isinstance(known.get("completions", {}), dict):
        raise ValueError(
            f"The target's completion cache {cache} holds a JSON {type(known).__name__}, not the object "
            f'{{"key": ..., "completions": {{...}}}} this function writes. {fix}'
        )
    if "key" not in known:
        raise ValueError(
            f"The target's completion cache {cache} does not record which target wrote it (an older version's file): "
            f"its answers may be another model's. {fix}"
        )
    cached = known["key"] if isinstance(known["key"], dict) else {}
    differing = [
        f"{name}: cached {cached.get(name)!r}, now {now!r}" for name, now in key.items() if cached.get(name) != now
    ]
    if differing:
        raise ValueError(
            f"The target's completion cache {cache} holds the completions of another target or other generation "
            f"settings ({'; '.join(differing)}). {fix}"
        )
    return known.get("completions", {})


def target_completions(
    target,
    tokenizer,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    batch_size: int = 32,
    cache: str | os.PathLike,
) -> list[str]:
    """The target's greedy completion of every prompt, read from ``cache`` (a JSON object keyed by the prompt's
    SHA-256, recording the target's fingerprint and the generation settings) where it has one and computed for the
    rest, batch by batch, each batch saved before the next. A cache written by another target or with other settings
    is refused, naming the file and what differs."""
    cache = Path(cache)
    key = _cache_key(target, tokenizer, max_new_tokens)
    completions = _read_cache(cache, key)
    todo = sorted({p for p in prompts if _key(p) not in completions})
    if todo:
        logger.info(
            "the target's greedy completions: %d prompts to generate, %d cached", len(todo), len(prompts) - len(todo)
        )
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        for start in range(0, len(todo), batch_size):
            batch = todo[start : start + batch_size]
            encoded = tokenizer(batch, return_tensors="pt", padding=True).to(target.device)
            with torch.no_grad():
                output = target.generate(
                    **encoded, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id
                )
            texts = tokenizer.batch_decode(output[:, encoded["input_ids"].shape[1] :], skip_special_tokens=True)
            completions.update({_key(p): t for p, t in zip(batch, texts)})
            write_text_atomic(cache, json.dumps({"key": key, "completions": completions}))
    finally:
        tokenizer.padding_side = side
    return [completions[_key(p)] for p in prompts]


def add_target_columns(dataset, task: str, completions: Sequence[str]):
    """``dataset`` with ``target_completion`` (the target's greedy completion of the row's prompt) and
    ``target_reward`` (its task reward against the row's ``reference``)."""
    if len(completions) != len(dataset):
        raise ValueError(f"{len(completions)} target completions for {len(dataset)} rows; pass one per row.")
    scores = get_task(task).reward(list(completions), list(dataset["reference"]))
    return dataset.add_column("target_completion", list(completions)).add_column("target_reward", scores)


def dense_reward(task: str, mode: str) -> Callable[..., list[float]]:
    """The reward of ``mode`` (module docstring) for ``task`` in TRL's convention; the modes other than ``"task"``
    read the columns of :func:`add_target_columns`."""
    check_reward_mode(mode, task)
    if mode == "task":
        return reward_for_task(task)
    task_reward = reward_for_task(task)
    metric = get_task(task).metric

    def reward(prompts=None, completions=None, reference=None, target_completion=None, target_reward=None, **columns):
        if target_completion is None or target_reward is None:
            raise ValueError(
                f"the {mode!r} reward reads the columns 'target_completion' and 'target_reward'; add them with "
                "`diversed_hf.lab.tasks.dense_rewards.add_target_columns`."
            )
        if mode == "task_minus_target":
            scores = task_reward(prompts=prompts, completions=completions, reference=reference)
            return [s - float(b) for s, b in zip(scores, target_reward)]
        if metric == "exact_match":  # a target answer without a number: nothing to agree with, 0
            answers = [extract_final_number(t) for t in target_completion]
            return [0.0 if a is None else exact_match([c], [f"#### {a}"])[0] for c, a in zip(completions, answers)]
        return rouge2(completions, list(target_completion))

    reward.__name__ = f"{task}_{mode}"
    return reward


def likelihood_reward(target, tokenizer, task: str = "task") -> Callable[..., list[float]]:
    """``"target_likelihood"`` in TRL's convention: each completion's mean per-token log-probability under ``target``
    (temperature 1) after its prompt; an empty completion scores the lowest log-probability of the batch."""

    @torch.no_grad()
    def reward(prompts=None, completions=None, **columns) -> list[float]:
        if prompts is None or completions is None:
            raise ValueError("the 'target_likelihood' reward needs `prompts` and `completions`.")
        device = next(target.parameters()).device
        scores = []
        for prompt, completion in zip(prompts, completions):
            prompt_ids = tokenizer(prompt, return_tensors="pt")["input_ids"].to(device)  # (1, L)
            completion_ids = tokenizer(completion, add_special_tokens=False, return_tensors="pt")["input_ids"]
            if completion_ids.shape[1] == 0:
                scores.append(float("nan"))
                continue
            sequence = torch.cat([prompt_ids, completion_ids.to(device)], dim=1)  # (1, L + n)
            logits = target(sequence).logits[0, prompt_ids.shape[1] - 1 : -1].float()  # (n, vocab)
            log_probs = logits.log_softmax(dim=-1).gather(1, completion_ids[0, :, None].to(device))  # (n, 1)
            scores.append(float(log_probs.mean()))
        known = [score for score in scores if score == score]
        floor = min(known) if known else 0.0
        return [score if score == score else floor for score in scores]

    reward.__name__ = f"{task}_target_likelihood"
    return reward
