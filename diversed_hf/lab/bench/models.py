"""Loading what the bench runs: the model pair, a fine-tuned draft and a DIVERSED head, from paths or Hub ids.

These load only what they are given. The testbed's pair, heads and drafts are the defaults of the
``diversed-hf bench`` command (:mod:`diversed_hf.cli.bench`), not of the library.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

__all__ = ["load_finetuned_draft", "load_head", "load_judge", "load_models", "per_task"]


def load_models(target: str, draft: str, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """``(target, draft, tokenizer)`` from local paths or Hub ids (``AutoModelForCausalLM``, in eval mode on
    ``device``; the tokenizer is the target's ``AutoTokenizer``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not target or not draft:
        raise ValueError(
            f"`target` is {target!r} and `draft` is {draft!r}; pass both (paths or Hub ids). For the testbed pair use "
            "`diversed_hf.testbed.load_pair()` or `diversed_hf.cli.bench.load_models()`."
        )
    logger.info("loading target %s and draft %s (%s, %s)", target, draft, dtype, device)
    target_model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype).to(device).eval()
    draft_model = AutoModelForCausalLM.from_pretrained(draft, dtype=dtype).to(device).eval()
    return target_model, draft_model, AutoTokenizer.from_pretrained(target)


def per_task(spec: str | None, task: str) -> str | None:
    """``spec`` is one path for every task or ``task=path,task=path``; the entry for ``task`` (None if absent)."""
    if not spec:
        return None
    if "=" not in spec:
        return spec
    paths = dict(part.split("=", 1) for part in spec.split(",") if "=" in part)
    return paths.get(task)


def load_finetuned_draft(spec: str | None, task: str, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """The fine-tuned draft for ``task`` from ``spec`` (a directory or ``task=dir,task=dir``, e.g. the ``merged``
    output of ``training/distill_draft.py``); ``None`` when ``spec`` names none for ``task``."""
    path = per_task(spec, task)
    if path is None:
        return None
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()


def load_head(spec: str | None, task: str):
    """The DIVERSED head for ``task`` from ``spec`` (a directory, or ``task=dir,task=dir``); ``None`` when
    ``spec`` names none for ``task``."""
    path = per_task(spec, task)
    if path is None:
        return None
    from ...heads.head import DiversedHead

    return DiversedHead.from_pretrained(path)


def load_judge(spec: str | None, task: str):
    """The judge (``JudgeHead``) for ``task`` from ``spec`` (a directory, or ``task=dir,task=dir``); ``None`` when
    ``spec`` names none for ``task``."""
    path = per_task(spec, task)
    if path is None:
        return None
    from ...heads.judge import JudgeHead

    local = Path(path).expanduser()
    looks_local = local.is_absolute() or path.startswith((".", "~")) or local.parent not in (Path("."), local)
    if not local.is_dir() and looks_local and (local.is_absolute() or local.parent.is_dir()):
        raise FileNotFoundError(
            f"`--judge {spec}`: the judge for {task!r}, {path!r}, is no directory here: pass the folder "
            "training/train_judge.py saved (its --output_dir/judge), or a Hub repo id."
        )
    return JudgeHead.from_pretrained(path).eval()
