"""Head-only checkpoints: the head's weights and config, and a record of the (target, draft) pair.

A head in a checkpoint is saved and loaded exactly as any head is, with ``DiversedHead.save_pretrained`` /
``DiversedHead.from_pretrained`` (``config.json``, ``model.safetensors``, ``README.md``; strict loading):
:func:`save_head`, :func:`load_head_state` and :func:`load_head` are thin wrappers for the trainer.
``diversed_pair.json`` records the pair a head was trained for: model ids, hidden sizes, the
shared vocabulary size and a fingerprint of each model's output embeddings (rounded to bf16, so the
dtype a model was loaded in does not change it). Resuming with another pair is refused.

**Complete checkpoints.** A ``checkpoint-<step>`` directory counts only when complete. The trainer writes
its own files first (``initial_head/``, ``diversed_trainer_state.pt``), then ``transformers.Trainer``
writes the head, the optimizer, scheduler and RNG states and, last, ``trainer_state.json`` -- and only
after that rotates older checkpoints away. So a checkpoint holding every file of
:data:`CHECKPOINT_FILES` is complete, and a kill at any point leaves either an incomplete newest
checkpoint (skipped with a warning by ``resume_from_checkpoint=True``, refused by name when passed
explicitly) beside the previous complete one, or a complete one.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import torch

from ..head import DiversedHead, DiversedHeadConfig
from ..pairs import hidden_size_of, model_id_of

__all__ = [
    "CHECKPOINT_FILES",
    "PAIR_FILE",
    "check_pair",
    "complete_checkpoints",
    "load_head",
    "load_head_state",
    "missing_checkpoint_files",
    "model_fingerprint",
    "pair_record",
    "save_head",
]

PAIR_FILE = "diversed_pair.json"
TRAINER_EXTRA_STATE = "diversed_trainer_state.pt"
REF_HEAD_DIR = "initial_head"
TRAINER_STATE_FILE = "trainer_state.json"  # transformers writes it last
#: every file a complete checkpoint holds, in the order they are written
CHECKPOINT_FILES = (
    f"{REF_HEAD_DIR}/config.json",
    f"{REF_HEAD_DIR}/model.safetensors",
    TRAINER_EXTRA_STATE,
    "config.json",
    "model.safetensors",
    PAIR_FILE,
    TRAINER_STATE_FILE,
)
_CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")


def missing_checkpoint_files(checkpoint_dir: str | os.PathLike) -> list[str]:
    """The files of :data:`CHECKPOINT_FILES` that ``checkpoint_dir`` lacks (empty: the checkpoint is complete)."""
    return [name for name in CHECKPOINT_FILES if not Path(checkpoint_dir, name).is_file()]


def complete_checkpoints(output_dir: str | os.PathLike) -> tuple[list[Path], list[Path]]:
    """``(complete, incomplete)`` ``checkpoint-<step>`` directories of ``output_dir``, each sorted by step."""
    found = sorted(
        (int(match.group(1)), path)
        for path in (Path(output_dir).iterdir() if Path(output_dir).is_dir() else ())
        if path.is_dir() and (match := _CHECKPOINT_NAME.match(path.name))
    )
    complete = [path for _, path in found if not missing_checkpoint_files(path)]
    incomplete = [path for _, path in found if missing_checkpoint_files(path)]
    return complete, incomplete


def model_fingerprint(model) -> str:
    """sha256 of the first 4096 output-embedding values, rounded to bf16: tells two models apart cheaply."""
    weight = model.get_output_embeddings().weight
    values = weight.detach().reshape(-1)[:4096].to(device="cpu", dtype=torch.bfloat16).to(torch.float32)
    return hashlib.sha256(values.numpy().tobytes()).hexdigest()[:16]


def pair_record(target, draft, vocab_size: int) -> dict:
    return {
        "target_model_id": model_id_of(target),
        "draft_model_id": model_id_of(draft),
        "target_hidden_size": hidden_size_of(target),
        "draft_hidden_size": hidden_size_of(draft),
        "vocab_size": int(vocab_size),
        "target_fingerprint": model_fingerprint(target),
        "draft_fingerprint": model_fingerprint(draft),
    }


def check_pair(recorded: dict, current: dict, where: str) -> None:
    """Raise a ValueError listing every field in which the recorded pair differs from the current one."""
    differences = []
    for key, now in current.items():
        then = recorded.get(key)
        if key.endswith("_model_id"):
            continue  # ids are paths or Hub ids that move; the models themselves are compared by fingerprint
        if then != now:
            differences.append(f"{key}: checkpoint {then!r}, now {now!r}")
    if differences:
        raise ValueError(
            f"The checkpoint {where} was trained for another (target, draft) pair: " + "; ".join(differences)
            + ". Resume with the models it was trained with, or start a new run in another `output_dir`."
        )


def save_head(head: DiversedHead, directory: str | os.PathLike) -> None:
    """``head.save_pretrained(directory)``: a checkpoint's head is a Hub-ready head repo (it leaves the RNG alone)."""
    if not isinstance(head, DiversedHead):
        raise TypeError(f"`head` must be a DiversedHead, got {type(head).__name__}; pass the trainer's head module.")
    head.save_pretrained(directory)


def load_head_state(directory: str | os.PathLike) -> tuple[DiversedHeadConfig, dict[str, torch.Tensor]]:
    """(config, state dict) of the head saved in ``directory``, loaded strictly with ``DiversedHead.from_pretrained``."""
    head = load_head(directory)
    return head.config, head.state_dict()


def load_head(directory: str | os.PathLike) -> DiversedHead:
    """``DiversedHead.from_pretrained(directory)``: the head of a checkpoint (strict, in eval mode)."""
    return DiversedHead.from_pretrained(directory)
