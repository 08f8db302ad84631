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

from ..drafting.protocol import capabilities_of
from ..generation.outputs import lengths_to_end
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


def _left_padded(rows: list[torch.Tensor], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, attention_mask)``, both ``(len(rows), longest)``: ``rows`` of token ids padded on the left."""
    longest = max(len(row) for row in rows)
    ids = torch.full((len(rows), longest), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), longest, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, longest - len(row) :] = row
        mask[i, longest - len(row) :] = 1
    return ids, mask


def _until_end(tokens: torch.Tensor, eos: set[int]) -> torch.Tensor:
    """``tokens`` up to and including the first end of sequence (as generate stops a lone sequence)."""
    return tokens[: int(lengths_to_end(tokens[None], sorted(eos))[0])]


@torch.no_grad()
def _greedy(target, rows: list[torch.Tensor], lengths: list[int], pad: int, eos: set[int], *, hidden: bool = False):
    """Each row's greedy continuation, at most ``lengths[i]`` tokens (cut after its end of sequence), in one batch;
    with ``hidden`` also the target's last hidden state after each row's last token ``(len(rows), d)``: what its LM
    head reads first (``output_hidden_states`` would keep every layer's states of every step instead)."""
    ids, mask = _left_padded(rows, pad)
    device = target.device
    first = []

    def keep_first(module, inputs):
        if not first:
            first.append(inputs[0][:, -1].float().cpu())  # (batch, d) after the prefix's last token

    handle = target.get_output_embeddings().register_forward_pre_hook(keep_first) if hidden else None
    try:
        sequences = target.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            do_sample=False,
            max_new_tokens=max(lengths),
            pad_token_id=pad,
        )
    finally:
        if handle is not None:
            handle.remove()
    new = sequences[:, ids.shape[1] :].cpu()
    continued = [_until_end(new[i, :length], eos) for i, length in enumerate(lengths)]
    return (continued, first[0]) if hidden else continued


@torch.no_grad()
def _draft_guesses(target, draft, sequence: torch.Tensor, length: int) -> torch.Tensor:
    """The draft's greedy token at each answer slot of ``sequence`` (prompt of ``length`` tokens, then the answer),
    given the true prefix: a token-only draft reads the tokens; a feature draft (an EagleDraft) also reads the
    target's features of the prefix, as the first token it drafts in a round does."""
    ids = sequence[None, :-1].to(target.device)  # (1, L + A - 1)
    if capabilities_of(draft).selects_features:
        states = target(ids, output_hidden_states=True).hidden_states
        features = draft.target_features(states)  # (1, L + A - 1, f): the feature of each column
        before = torch.cat([torch.zeros_like(features[:, :1]), features[:, :-1]], dim=1)  # the column before each
        logits = draft(ids, target_hidden=before).logits
    else:
        logits = draft(ids).logits
    return logits[0, length - 1 :].argmax(dim=-1).cpu()  # (A,)


def _mine_shard(target, draft, tokenizer, prompts, references, reward, settings: MiningSettings, batch_size: int):
    """``(features (n, d), labels (n,))`` of the swapped mismatches of ``prompts``, generated ``batch_size`` rows at
    a time (greedy decoding: a row's text does not depend on its batch)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    eos = target.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    encoded = [torch.tensor(tokenizer(prompt)["input_ids"]) for prompt in prompts]
    answers = []
    for start in range(0, len(encoded), batch_size):
        rows = encoded[start : start + batch_size]
        answers += _greedy(target, rows, [settings.max_new_tokens] * len(rows), pad, eos)
    owns = reward([tokenizer.decode(answer, skip_special_tokens=True) for answer in answers], list(references))
    swaps = []  # (prompt index, prefix ending in the swapped token, tokens left)
    for index, (prompt, answer) in enumerate(zip(encoded, answers)):
        sequence = torch.cat([prompt, answer])
        guesses = _draft_guesses(target, draft, sequence, len(prompt))
        mismatches = (guesses != answer).nonzero().flatten()[: settings.max_swaps].tolist()
        for slot in mismatches:
            prefix = torch.cat([sequence[: len(prompt) + slot], guesses[slot : slot + 1]])
            swaps.append((index, prefix, max(settings.max_new_tokens - slot - 1, 1)))
    if not swaps:
        return None
    features, texts = [], []
    for start in range(0, len(swaps), batch_size):
        group = swaps[start : start + batch_size]
        continued, hidden = _greedy(target, [s[1] for s in group], [s[2] for s in group], pad, eos, hidden=True)
        features.append(hidden)
        for (index, prefix, _), tokens in zip(group, continued):
            texts.append(tokenizer.decode(torch.cat([prefix[len(encoded[index]) :], tokens]), skip_special_tokens=True))
    scores = reward(texts, [references[index] for index, _, _ in swaps])
    labels = torch.tensor([float(score >= owns[index]) for score, (index, _, _) in zip(scores, swaps)])
    return torch.cat(features), labels


def mine_labels(
    target, draft, tokenizer, prompts, references, reward, directory, settings=MiningSettings(), *, batch_size: int = 32
) -> Path:
    """Mine every prompt's labels into ``directory`` (module docstring), skipping the shards already there;
    ``batch_size`` rows are generated at once (the answers, then the swaps' continuations)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"`batch_size` must be a positive integer, got {batch_size!r}.")
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
        end = shard + settings.shard_size
        prompts_here, references_here = prompts[shard:end], references[shard:end]
        mined = _mine_shard(target, draft, tokenizer, prompts_here, references_here, reward, settings, batch_size)
        width = target.config.get_text_config().hidden_size
        tensors = {
            "features": mined[0] if mined else torch.zeros(0, width),
            "labels": mined[1] if mined else torch.zeros(0),
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
