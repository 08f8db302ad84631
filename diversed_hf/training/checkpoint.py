"""Head-only checkpoints: the head's weights and config, and a record of the (target, draft) pair.

The head is written with ``DiversedHead.save_pretrained`` when that exists (a Hub-ready repo);
otherwise as ``config.json`` (the head config) plus ``model.safetensors``, the same file names.
``diversed_pair.json`` records the pair a head was trained for: model ids, hidden sizes, the
shared vocabulary size and a fingerprint of each model's output embeddings (rounded to bf16, so the
dtype a model was loaded in does not change it). Resuming with another pair is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from ..head import DiversedHead, DiversedHeadConfig
from ..pairs import hidden_size_of, model_id_of

PAIR_FILE = "diversed_pair.json"
HEAD_CONFIG_FILE = "config.json"
HEAD_WEIGHTS_FILE = "model.safetensors"


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
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if hasattr(head, "save_pretrained"):
        # Rendering the card may build modules (consuming the global RNG): keep the RNG untouched so that saving a
        # checkpoint never changes the run.
        with torch.random.fork_rng(devices=[]):
            head.save_pretrained(str(directory))
        return
    from safetensors.torch import save_file

    (directory / HEAD_CONFIG_FILE).write_text(json.dumps(head.config.to_dict(), indent=2) + "\n")
    state = {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}
    save_file(state, str(directory / HEAD_WEIGHTS_FILE), metadata={"format": "pt"})


def load_head_state(directory: str | os.PathLike) -> tuple[DiversedHeadConfig, dict]:
    """(config, state dict) of a head saved by :func:`save_head` (either format)."""
    directory = Path(directory)
    if hasattr(DiversedHead, "from_pretrained"):
        head = DiversedHead.from_pretrained(str(directory))
        return head.config, head.state_dict()
    from safetensors.torch import load_file

    for name in (HEAD_CONFIG_FILE, HEAD_WEIGHTS_FILE):
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory} has no {name}: it is not a saved DiversedHead.")
    config = DiversedHeadConfig.from_dict(json.loads((directory / HEAD_CONFIG_FILE).read_text()))
    return config, load_file(str(directory / HEAD_WEIGHTS_FILE))


def load_head(directory: str | os.PathLike) -> DiversedHead:
    config, state = load_head_state(directory)
    head = DiversedHead(config)
    head.load_state_dict(state, strict=True)
    return head
