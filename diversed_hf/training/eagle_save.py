"""Saving a distilled :class:`~diversed_hf.drafting.eagle.EagleDraft` (:mod:`diversed_hf.training.eagle_distill`):
the drafting knobs its generation config carries, and ``save_to``, replaced whole.

:func:`check_save_to` refuses, before anything runs, a ``save_to`` that holds anything but an earlier draft or that
overlaps the data or the checkpoints; :func:`save_draft` writes the draft beside it and swaps it in, so an
interrupted save leaves the earlier draft.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
from pathlib import Path

import torch

from ..drafting.eagle import EagleDraft

__all__ = ["DEFAULT_DRAFTING", "DRAFT_FILES", "check_drafting", "check_save_to", "save_draft"]

#: what a saved draft's directory holds (save_pretrained may shard the weights)
DRAFT_FILES = re.compile(
    r"config\.json|generation_config\.json|model\.safetensors(\.index\.json)?|model-\d+-of-\d+\.safetensors"
    r"|README\.md|training\.json"
)

#: the drafting knobs a distilled draft is saved with: a tree of 3 levels, the 4 best children of each expanded node,
#: the 12 best nodes verified (the shape measured fastest for the real pair's draft on one CPU thread, RESULTS.md
#: "Token trees"; a batch shrinks it, ``TreeSpec.for_batch``)
DEFAULT_DRAFTING = {"num_assistant_tokens": 3, "assistant_tree_top_k": 4, "assistant_tree_size": 12}


def check_drafting(drafting: dict) -> dict:
    """``drafting`` (``num_assistant_tokens`` and, for a tree, ``assistant_tree_top_k`` / ``assistant_tree_size``),
    checked as ``generate`` checks them (:class:`~diversed_hf.drafting.tree.TreeSpec`); ``assistant_tree_top_k=1``
    saves a chain."""
    from ..drafting.tree import TreeSpec
    from ..verifiers.checks import is_integer

    known = {"num_assistant_tokens", "assistant_tree_top_k", "assistant_tree_size"}
    if not isinstance(drafting, dict) or not set(drafting) <= known:
        raise ValueError(f"`drafting` takes the keys {sorted(known)}; got {drafting!r}.")
    depth = drafting.get("num_assistant_tokens", DEFAULT_DRAFTING["num_assistant_tokens"])
    if not is_integer(depth) or depth < 1:
        raise ValueError(f"`num_assistant_tokens` must be a positive integer (the draft length), got {depth!r}.")
    top_k, size = drafting.get("assistant_tree_top_k"), drafting.get("assistant_tree_size")
    if top_k is None or (top_k == 1 and size is None):  # a chain
        if size is not None:
            raise ValueError(f"`assistant_tree_size={size!r}` needs `assistant_tree_top_k` (a tree's width).")
        return {"num_assistant_tokens": int(depth)}
    spec = TreeSpec(depth=int(depth), top_k=top_k, size=size)  # refuses a bad shape, naming the knob
    return {"num_assistant_tokens": spec.depth, "assistant_tree_top_k": spec.top_k, "assistant_tree_size": spec.size}


def check_save_to(save_to, data_dir, checkpoint_dir, flag: str = "save_to") -> Path:
    """``save_to`` as a path, refused (before anything runs) when saving the draft there would delete something: it
    is, holds or lies in ``data_dir`` or ``checkpoint_dir``, or it holds files that are not an earlier draft's
    (:func:`save_draft` replaces the directory whole). ``flag`` names the argument in the messages."""
    save_to = Path(save_to).expanduser()
    if save_to.exists() and not save_to.is_dir():
        raise ValueError(f"`{flag}` {save_to} is a file, not a directory: pass a directory for the draft.")
    where = save_to.resolve()
    for what, path in (("collected data", data_dir), ("checkpoints", checkpoint_dir)):
        path = Path(path).expanduser().resolve()
        if where == path or where in path.parents or path in where.parents:
            raise ValueError(
                f"`{flag}` {save_to} overlaps the {what} in {path}: the draft replaces `{flag}` whole, which would "
                "delete them. Pass a directory of its own (the default is <output_dir>/draft)."
            )
    _check_replaceable(save_to, flag)
    return save_to


def _check_replaceable(save_to: Path, flag: str) -> None:
    """Refuse an existing ``save_to`` that holds anything but an earlier EagleDraft (an empty one is fine)."""
    if not save_to.is_dir():
        return
    entries = sorted(save_to.iterdir())
    if not entries:
        return
    foreign = [p.name for p in entries if not (p.is_file() and DRAFT_FILES.fullmatch(p.name))]
    config = save_to / "config.json"
    try:
        model_type = json.loads(config.read_text()).get("model_type") if config.is_file() else None
    except (ValueError, AttributeError, OSError):
        model_type = None
    if foreign or model_type != EagleDraft.config_class.model_type:
        what = f"files that are not an EagleDraft's ({', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''})"
        if not foreign:
            what = f"another model (config.json's model_type is {model_type!r}, not an EagleDraft's)"
        raise ValueError(
            f"`{flag}` {save_to} holds {what}: saving the draft replaces the directory whole and would delete them. "
            "Pass a new or empty directory, or one holding an earlier draft, or move those files away."
        )


def save_draft(draft: EagleDraft, save_to: Path, record: dict, dtype=torch.bfloat16) -> None:
    """The draft in the Hub format (weights in ``dtype``), ``training.json`` and its card, written whole into
    ``save_to`` (staged beside it, then swapped in: an earlier draft there is replaced at once; a directory holding
    anything else is refused)."""
    from .eagle_card import render_eagle_card

    save_to = Path(save_to)
    _check_replaceable(save_to, "save_to")
    staging = save_to.parent / f".{save_to.name}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    generation_config = draft.generation_config
    copy = EagleDraft(draft.config)
    copy.load_state_dict(draft.state_dict(), strict=False)
    copy.generation_config = generation_config
    copy.to(dtype).save_pretrained(staging)
    (staging / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    (staging / "README.md").write_text(render_eagle_card(draft.config, record))
    _replace_directory(staging, save_to)


def _exchange(first: Path, second: Path) -> bool:
    """Swap two existing paths in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where the system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(first), at_fdcwd, os.fsencode(second), rename_exchange) == 0


def _replace_directory(staging: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Move the complete directory ``staging`` to ``path``, replacing what is there: readers see the old directory or
    the new one, never a part (one exchange where the system has it; else two renames, the old directory kept beside
    as ``.<name>.replaced`` until the new one is in place, and put back if that fails)."""
    staging, path = Path(staging), Path(path)
    if not path.exists():
        staging.rename(path)
        return path
    if _exchange(staging, path):
        shutil.rmtree(staging)  # now the old directory
        return path
    backup = path.parent / f".{path.name}.replaced"
    shutil.rmtree(backup, ignore_errors=True)
    path.rename(backup)
    try:
        staging.rename(path)
    except BaseException:
        backup.rename(path)
        raise
    shutil.rmtree(backup, ignore_errors=True)
    return path
