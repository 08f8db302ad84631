"""The real pair with a task-tuned target: SmolLM2-135M-Instruct with a shipped LoRA adapter merged in.

    from diversed_hf import testbed
    target, draft, tokenizer = testbed.load_pair("smollm2-tuned")

**Target.** The pair's target (:func:`diversed_hf.testbed.smollm2.load_smollm2_target`) with the LoRA adapter in
:data:`TUNED_DIR` merged into its weights. The adapter comes from ``training/tune_target.py``: supervised fine-tuning
on the training splits of ``synopsis`` and ``arith_steps`` mixed with the target's own greedy answers to everyday chat
requests, so it learns the tasks and stays an instruct model (docs/real_pair.md, "The task-tuned target"). Its
``config._name_or_path`` is :data:`TUNED_MODEL_ID`, which heads record and cards recognise.

**Draft.** An :class:`~diversed_hf.drafting.eagle.EagleDraft` distilled from the tuned target, in
:data:`TUNED_EAGLE_DIR`.

Both directories are checked before any model loads: a missing one is a ``FileNotFoundError`` naming it and the
command that makes it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from . import smollm2

logger = logging.getLogger(__name__)

__all__ = [
    "TUNED_DIR",
    "TUNED_DRAFTS",
    "TUNED_EAGLE_DIR",
    "TUNED_EAGLE_MODEL_ID",
    "TUNED_MODEL_ID",
    "TUNE_COMMAND",
    "check_tuned_files",
    "load_tuned_pair",
    "load_tuned_target",
]

TUNED_DIR = smollm2.DRAFT_DIR.parent / "tuned"
TUNED_EAGLE_DIR = smollm2.DRAFT_DIR.parent / "tuned_eagle"
TUNED_MODEL_ID = smollm2.MODEL_IDS["tuned"]
TUNED_EAGLE_MODEL_ID = smollm2.MODEL_IDS["tuned-eagle"]
#: the tuned pair's drafts (one so far)
TUNED_DRAFTS = ("eagle",)
#: the command that makes the shipped adapter (hours on a CPU; resumable: rerun it to continue)
TUNE_COMMAND = (
    "python training/tune_target.py --config training/configs/smollm2_tuned_target.yaml "
    "--save_to diversed_hf/testbed/assets/smollm2/tuned"
)
#: the command that distils the tuned target's EagleDraft (its tasks' training prompts and everyday requests)
TUNED_EAGLE_COMMAND = (
    "python training/train_eagle_draft.py --target smollm2-tuned --output_dir runs/tuned_eagle "
    "--num_synopsis 1000 --num_arith_steps 1000 --num_arith 0 --code_samples 0 --num_docstrings 0"
)
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def check_tuned_files(adapter: Path | str = TUNED_DIR, eagle: Path | str | None = TUNED_EAGLE_DIR) -> None:
    """Raise a ``FileNotFoundError`` naming the directory and the command that makes it when the adapter (or, unless
    ``eagle`` is ``None``, the EagleDraft) is missing. Reads no model."""
    adapter = Path(adapter)
    missing = [name for name in ADAPTER_FILES if not (adapter / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"no task-tuned adapter for SmolLM2-135M-Instruct at {adapter} (missing {', '.join(missing)}): make it "
            f"with `{TUNE_COMMAND}` (resumable: rerun the same command to continue), or reinstall the package."
        )
    if eagle is not None and not (Path(eagle) / "config.json").is_file():
        raise FileNotFoundError(
            f"no EagleDraft for the task-tuned target at {eagle} (missing config.json): distil one from the tuned "
            f"target with `{TUNED_EAGLE_COMMAND} --save_to {eagle}`, or reinstall the package."
        )


def load_tuned_target(torch_dtype=None, device: str = "cpu", download: bool = True, adapter: Path | str = TUNED_DIR):
    """``(target, tokenizer)``: SmolLM2-135M-Instruct with the LoRA adapter in ``adapter`` merged, in eval mode
    (float32 by default), ``config._name_or_path`` :data:`TUNED_MODEL_ID`; and its tokenizer."""
    check_tuned_files(adapter, eagle=None)
    smollm2._require("peft")
    from peft import PeftModel

    target, tokenizer = smollm2.load_smollm2_target(torch_dtype, device, download)
    # the adapter is stored in bfloat16: peft loads it into float32 LoRA weights and merges into the target's dtype
    merged = PeftModel.from_pretrained(target, str(adapter)).merge_and_unload()
    merged.config._name_or_path = TUNED_MODEL_ID
    return merged.eval(), tokenizer


def load_tuned_pair(torch_dtype=None, device: str = "cpu", download: bool = True, draft: str | None = None):
    """``(target, draft, tokenizer)``: the task-tuned target (:func:`load_tuned_target`), its EagleDraft
    (:data:`TUNED_EAGLE_DIR`, ``config._name_or_path`` :data:`TUNED_EAGLE_MODEL_ID`) and the tokenizer.

    ``draft``: ``"eagle"`` (the default and only one).
    """
    draft = TUNED_DRAFTS[0] if draft is None else draft
    if draft not in TUNED_DRAFTS:
        raise ValueError(f"`draft` is {draft!r}; the smollm2-tuned pair's drafts are {TUNED_DRAFTS}.")
    check_tuned_files(TUNED_DIR, TUNED_EAGLE_DIR)  # both, before the target loads
    if logger.isEnabledFor(logging.INFO):  # progress bars and transformers' notices only when asked for
        return _load_pair(torch_dtype, device, download)
    from .. import compat

    with compat.quiet_loading():
        return _load_pair(torch_dtype, device, download)


def _load_pair(torch_dtype, device: str, download: bool):
    target, tokenizer = load_tuned_target(torch_dtype, device, download, TUNED_DIR)
    return target, smollm2.load_eagle_draft(target, TUNED_EAGLE_DIR, TUNED_EAGLE_MODEL_ID), tokenizer
