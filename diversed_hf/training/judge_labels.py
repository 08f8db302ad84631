"""Labels and training for a :class:`~diversed_hf.heads.judge.JudgeHead`, mined as AutoJudge mines them (Garipov et
al., 2025; docs/method.md §9, ``training/train_judge.py``).

For each training prompt the target answers greedily. Where the draft's greedy token differs from the target's (a
mismatch the lossless test would reject), the draft's token is swapped in and the target continues greedily from it;
the swap is **harmless** (label 1) when the continued answer scores at least as well under the task's reward as the
target's own, else **harmful** (0). The feature is the target's last hidden state after reading the swapped token:
what :class:`~diversed_hf.verifiers.relaxed.JudgeVerifier` shows the judge at verification. Mining runs in shards of
prompts written as they finish (``labels/shard-*.safetensors`` with a ``manifest.json`` of the settings and the
target's fingerprint), so an interrupted run resumes where it stopped and a folder of another target's labels is
refused.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..heads.judge import JudgeHead
from .checkpoint import model_fingerprint
from .eagle_data import claim_directory

logger = logging.getLogger(__name__)

__all__ = ["MiningSettings", "load_labels", "mine_labels", "train_judge"]


@dataclass(frozen=True)
class MiningSettings:
    max_new_tokens: int = 48  # the target's answer length
    max_swaps: int = 6  # mismatches swapped per prompt (the first ones of the answer)
    shard_size: int = 32  # prompts per shard file

    def __post_init__(self):
        for name in ("max_new_tokens", "max_swaps", "shard_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")


@torch.no_grad()
def _mine_prompt(target, draft, tokenizer, prompt: str, reference: str, reward, settings: MiningSettings):
    """``(features (n, d), labels (n,))`` of one prompt's swapped mismatches."""
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"].to(target.device)  # (1, L)
    length = ids.shape[1]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    answer = target.generate(ids, do_sample=False, max_new_tokens=settings.max_new_tokens, pad_token_id=pad)[0]
    own = reward([tokenizer.decode(answer[length:], skip_special_tokens=True)], [reference])[0]
    guesses = draft(answer[None, :-1]).logits[0, length - 1 :].argmax(dim=-1)  # (A,) the draft's token at each slot
    mismatches = (guesses != answer[length:]).nonzero().flatten()[: settings.max_swaps].tolist()
    if not mismatches:
        return None
    features, labels = [], []
    for slot in mismatches:
        prefix = torch.cat([answer[: length + slot], guesses[slot : slot + 1]])[None]  # (1, L + slot + 1)
        hidden = target(prefix, output_hidden_states=True).hidden_states[-1][0, -1]  # (d,) after the swapped token
        remaining = max(settings.max_new_tokens - slot - 1, 1)
        continued = target.generate(prefix, do_sample=False, max_new_tokens=remaining, pad_token_id=pad)[0]
        swapped = reward([tokenizer.decode(continued[length:], skip_special_tokens=True)], [reference])[0]
        features.append(hidden.float().cpu())
        labels.append(float(swapped >= own))
    return torch.stack(features), torch.tensor(labels)


def mine_labels(target, draft, tokenizer, prompts, references, reward, directory, settings=MiningSettings()) -> Path:
    """Mine every prompt's labels into ``directory`` (module docstring), skipping the shards already there."""
    directory = Path(directory)
    digest = hashlib.sha256(json.dumps([list(prompts), list(references)]).encode()).hexdigest()
    manifest = {
        "settings": asdict(settings),
        "num_prompts": len(prompts),
        "prompts_sha256": digest,
        "target": model_fingerprint(target),
        "draft": model_fingerprint(draft),
    }
    claim_directory(directory, "manifest.json", manifest, "labels mined with other settings, prompts or models")
    for shard in range(0, len(prompts), settings.shard_size):
        path = directory / f"shard-{shard // settings.shard_size:05d}.safetensors"
        if path.is_file():
            continue
        features, labels = [], []
        for prompt, reference in zip(prompts[shard : shard + settings.shard_size], references[shard:]):
            mined = _mine_prompt(target, draft, tokenizer, prompt, reference, reward, settings)
            if mined is not None:
                features.append(mined[0])
                labels.append(mined[1])
        width = target.config.get_text_config().hidden_size
        tensors = {
            "features": torch.cat(features) if features else torch.zeros(0, width),
            "labels": torch.cat(labels) if labels else torch.zeros(0),
        }
        staging = path.with_suffix(".tmp")
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(staging))
        staging.replace(path)  # a shard exists only once it is whole
        logger.info("mined %s: %d swaps", path.name, len(tensors["labels"]))
    return directory


def load_labels(directory) -> tuple[torch.Tensor, torch.Tensor]:
    """Every mined ``(features (n, d), labels (n,))`` of ``directory``."""
    shards = sorted(Path(directory).glob("shard-*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"{directory} holds no mined labels (shard-*.safetensors).")
    loaded = [load_file(str(shard)) for shard in shards]
    return torch.cat([s["features"] for s in loaded]), torch.cat([s["labels"] for s in loaded])


def train_judge(
    judge: JudgeHead, features, labels, *, steps: int = 400, learning_rate: float = 1e-2, held_out: float = 0.2
) -> dict:
    """Fit ``judge`` (logistic regression, classes balanced) on a seeded split; its held-out accuracy, precision and
    recall of 'harmless' at thresholds 0.5 and 0.9 (a false 'harmless' costs quality, so precision matters)."""
    if len(labels) < 10 or labels.min() == labels.max():
        raise ValueError(
            f"{len(labels)} mined swaps with labels {sorted(set(labels.tolist()))}: a judge needs both harmless and "
            "harmful swaps; mine more prompts (--num_train_examples) or more swaps per prompt (--max_swaps)."
        )
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    cut = max(1, int(held_out * len(labels)))
    test, train = order[:cut], order[cut:]
    positive = labels[train].mean().clamp(1e-3, 1 - 1e-3)
    loss_fn = torch.nn.BCEWithLogitsLoss(pos_weight=(1 - positive) / positive)
    optimizer = torch.optim.Adam(judge.parameters(), lr=learning_rate)
    scale = features[train].std(dim=0).mean().clamp(min=1e-6)
    with torch.no_grad():
        judge.linear.weight.zero_()
        judge.linear.bias.zero_()
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_fn(judge.logits(features[train] / scale), labels[train])
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        judge.linear.weight.div_(scale)  # the judge reads raw hidden states
        probability = judge(features[test])
    report = {"num_swaps": len(labels), "harmless_share": round(float(labels.mean()), 4), "held_out": cut}
    for threshold in (0.5, 0.9):
        said = probability >= threshold
        truth = labels[test] > 0.5
        report[f"at_{threshold}"] = {
            "accuracy": round(float((said == truth).float().mean()), 4),
            "precision": round(float((said & truth).sum() / said.sum().clamp(min=1)), 4),
            "recall": round(float((said & truth).sum() / truth.sum().clamp(min=1)), 4),
        }
    return report
