"""Reading checkpoints of the official DIVERSED code (docs/method.md §4).

An official checkpoint is a directory with ``ensemble_head.bin`` (a torch state dict: ``summary.weight``
``(2, d_draft + d_target)`` and ``summary.bias`` ``(2,)``; input order ``[h_draft; h_target]``; output 0
weighs the draft, 1 the target) and ``ensemble_config.json`` (both hidden sizes, the model paths). It
mixes logits. :meth:`diversed_hf.DiversedHead.from_official_checkpoint` turns it into an equivalent head.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from . import hub

__all__ = ["OFFICIAL_CONFIG_NAME", "OFFICIAL_WEIGHTS_NAME", "read_official_checkpoint"]

OFFICIAL_WEIGHTS_NAME = "ensemble_head.bin"
OFFICIAL_CONFIG_NAME = "ensemble_config.json"


def read_official_checkpoint(
    path: str | os.PathLike,
) -> tuple[Path, dict[str, int], dict[str, str | None], torch.Tensor, torch.Tensor]:
    """``(directory, hidden sizes, recorded model ids, weight (2, d), bias (2,))`` of an official checkpoint.

    Every problem is an error naming the file and what it should hold; non-finite weights are refused.
    """
    directory = Path(path).expanduser()
    if directory.is_file() and directory.name == OFFICIAL_WEIGHTS_NAME:
        directory = directory.parent
    if not directory.is_dir():
        raise FileNotFoundError(
            f"Official DIVERSED checkpoint directory {str(path)!r} not found; pass the folder that holds "
            f"{OFFICIAL_WEIGHTS_NAME} and {OFFICIAL_CONFIG_NAME}."
        )
    for name in (OFFICIAL_WEIGHTS_NAME, OFFICIAL_CONFIG_NAME):
        if not (directory / name).is_file():
            raise FileNotFoundError(
                f"`{name}` not found in {directory}: an official DIVERSED checkpoint holds {OFFICIAL_WEIGHTS_NAME} "
                f"and {OFFICIAL_CONFIG_NAME}. (A head saved by diversed_hf loads with DiversedHead.from_pretrained.)"
            )
    official_config = hub.read_json(directory / OFFICIAL_CONFIG_NAME, "Official ensemble config")
    if not isinstance(official_config, dict):
        raise ValueError(f"{directory / OFFICIAL_CONFIG_NAME} must hold a JSON object.")
    sizes = {}
    for name in ("draft_hidden_size", "target_hidden_size"):
        value = official_config.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{directory / OFFICIAL_CONFIG_NAME} needs a positive integer `{name}`, got {value!r}.")
        sizes[name] = value
    try:
        state_dict = torch.load(directory / OFFICIAL_WEIGHTS_NAME, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - torch raises many types for a damaged or foreign file
        raise ValueError(
            f"{directory / OFFICIAL_WEIGHTS_NAME} is not a readable torch state dict ({type(error).__name__}: "
            f"{error}); it is corrupted or not an official DIVERSED ensemble head."
        ) from None
    if not isinstance(state_dict, dict) or set(state_dict) != {"summary.weight", "summary.bias"}:
        found = sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict).__name__
        raise ValueError(
            f"{directory / OFFICIAL_WEIGHTS_NAME} must hold exactly `summary.weight` and `summary.bias` (the "
            f"official EnsembleHead), found {found}."
        )
    weight, bias = state_dict["summary.weight"], state_dict["summary.bias"]  # (2, d_q + d_p), (2,)
    input_size = sizes["draft_hidden_size"] + sizes["target_hidden_size"]
    if tuple(weight.shape) != (2, input_size) or tuple(bias.shape) != (2,):
        raise ValueError(
            f"Official head weights have shapes summary.weight {tuple(weight.shape)}, summary.bias "
            f"{tuple(bias.shape)}; {OFFICIAL_CONFIG_NAME} (draft {sizes['draft_hidden_size']}, target "
            f"{sizes['target_hidden_size']}) needs (2, {input_size}) and (2,)."
        )

    def recorded(key: str) -> str | None:
        value = official_config.get(key)
        return value if isinstance(value, str) and value and value != "unknown" else None

    if not bool(torch.isfinite(weight).all()) or not bool(torch.isfinite(bias).all()):
        raise ValueError(
            f"{directory / OFFICIAL_WEIGHTS_NAME} holds NaN or infinite values: the head would verify against garbage. "
            "Re-download the checkpoint."
        )
    ids = {"target": recorded("target_model_path"), "draft": recorded("draft_model_path")}
    return directory, sizes, ids, weight, bias
