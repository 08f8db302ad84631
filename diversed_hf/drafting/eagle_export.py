"""An :class:`~diversed_hf.drafting.eagle.EagleDraft` in the layout vLLM's ``eagle`` method loads (EAGLE-1, Llama
targets).

Read from vLLM 0.32's ``model_executor/models/llama_eagle.py`` and ``transformers_utils/configs/eagle.py``, and
checked by serving an export (tests/vllm_plugin/test_eagle_engine.py). An export directory holds

=========================== ==================================================================================
``config.json``             the target's Llama config with ``num_hidden_layers`` = the draft's layers and
                            ``architectures: ["EagleLlamaForCausalLM"]`` (vLLM's class; its ``EAGLEConfig``
                            keeps a name that starts with ``Eagle``), the whole vocabulary, ``dtype`` the draft's
``model.safetensors``       ``fc.weight`` and ``layers.<i>.*`` in Hugging Face's Llama names: vLLM adds the
                            ``model.`` prefix itself and stacks q/k/v and gate/up as it loads
``diversed_export.json``    what the export came from (marks the directory as an export, so a later one may
                            replace it)
=========================== ==================================================================================

No ``embed_tokens`` and no ``lm_head``: vLLM then shares the target's (``has_own_embed_tokens`` /
``has_own_lm_head`` stay False), as the draft does under transformers. vLLM builds the same network as
:class:`~diversed_hf.drafting.eagle.EagleDraft`: ``fc`` without bias over ``[embedding, feature]``, Llama decoder
layers the first of which has no input norm, and no final norm; a draft built otherwise (``fc_bias``, ``input_norm``,
``final_norm``) is refused. vLLM's EAGLE-1 model scores every id with the target's LM head and takes no id subset:
a draft with ``draft_vocab_ids`` is refused unless ``full_vocab=True`` (docs/eagle.md, "Serving with vLLM's ``eagle``
method", says what that costs).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from transformers import AutoConfig

from .._version import __version__
from ..heads import hub

__all__ = [
    "EXPORT_FILES",
    "VLLM_ARCHITECTURE",
    "check_directory",
    "save_for_vllm",
    "vllm_config",
    "vllm_weights",
    "write_export",
]

VLLM_ARCHITECTURE = "EagleLlamaForCausalLM"
#: the target architectures vLLM's EAGLE-1 Llama draft is built for (its decoder layer is Llama's)
VLLM_TARGET_TYPES = ("llama",)
RECORD_NAME = "diversed_export.json"
RECORD_FORMAT = "vllm-eagle"
EXPORT_FILES = ("config.json", hub.WEIGHTS_NAME, RECORD_NAME)


def save_for_vllm(draft, save_directory: str | os.PathLike, *, full_vocab: bool = False) -> Path:
    """Write ``draft`` into ``save_directory`` as vLLM's ``eagle`` method loads it (module docstring); returns the
    directory. The directory may be new, empty, or an earlier export (replaced); anything else is refused before a
    file is written."""
    check_exportable(draft, full_vocab)
    directory = check_directory(save_directory, RECORD_FORMAT)
    record = {
        "format": RECORD_FORMAT,
        "diversed_hf_version": __version__,
        "target_model_id": draft.config.target_model_id,
        "num_layers": draft.config.num_layers,
        "draft_vocab_size": draft.config.draft_vocab_size,  # None: it scored every id already
        "scored_ids": "all",  # vLLM's EAGLE-1 head: the target's, over the whole vocabulary
    }
    return write_export(directory, vllm_config(draft).save_pretrained, vllm_weights(draft), record)


def write_export(directory: Path, write_config, weights: dict, record: dict) -> Path:
    """An export's files staged beside ``directory`` and moved into place whole: ``config.json`` (``write_config``
    writes it into the staging directory), the weights and the record that marks the directory as an export."""
    staging = hub.new_staging_dir(directory)
    write_config(staging)
    hub.save_weights(weights, staging / hub.WEIGHTS_NAME)
    # safetensors writes its file owner-only; the server reading the export may run as another user
    os.chmod(staging / hub.WEIGHTS_NAME, (staging / "config.json").stat().st_mode & 0o777)
    hub.write_json(staging / RECORD_NAME, record)
    hub.move_into_place(staging, directory)
    return directory


def check_exportable(draft, full_vocab: bool) -> None:
    """Refuse a draft vLLM's EAGLE-1 Llama model would not reproduce, naming what differs and what to do."""
    config = draft.config
    if config.architecture == "eagle3":
        raise ValueError(
            "This is an EAGLE-3 draft; vLLM's `eagle` method loads EAGLE-1 drafts. Save it with "
            "`draft.save_pretrained(path, format='eagle3')` and serve it with `method: 'eagle3'`."
        )
    model_type = config.target_config.get("model_type")
    if model_type not in VLLM_TARGET_TYPES:
        raise ValueError(
            f"`save_for_vllm` writes vLLM's EAGLE-1 Llama draft ({VLLM_ARCHITECTURE}), whose decoder layer is "
            f"Llama's; this draft's target has model_type {model_type!r}. Export drafts of a Llama target "
            f"(model_type in {list(VLLM_TARGET_TYPES)}), or serve this pair with vLLM's `draft_model` method and a "
            "separate small causal LM."
        )
    differs = [name for name in ("fc_bias", "input_norm", "final_norm") if getattr(config, name)]
    if differs:
        raise ValueError(
            f"This EagleDraft has {', '.join(f'{name}=True' for name in differs)}; vLLM's EAGLE-1 Llama draft has "
            "no bias in `fc`, no input norm on its first layer and no final norm, so it would drop those weights. "
            "Export a draft built with the defaults (`EagleDraft.for_target`, training/train_eagle_draft.py)."
        )
    if config.draft_vocab_size is not None and not full_vocab:
        scored, vocab = config.draft_vocab_size, config.vocab_size
        raise ValueError(
            f"This EagleDraft scores {scored} of the target's {vocab} ids (`draft_vocab_ids`); vLLM's eagle method "
            "takes no id subset and scores every id with the target's LM head, so the served draft would give "
            f"mass to ids it was not trained on and its head would cost {vocab / scored:.1f}x more per step. Pass "
            '`full_vocab=True` to export it with the whole head: `draft.save_pretrained(path, format="eagle", '
            'full_vocab=True)` or `draft.save_for_vllm(path, full_vocab=True)` (docs/eagle.md, "Serving with '
            "vLLM's `eagle` method\")."
        )


def vllm_config(draft):
    """The target's config (a ``LlamaConfig``) with the draft's layer count, vLLM's architecture and the draft's
    dtype: what vLLM's ``EAGLEConfig`` wraps and ``EagleLlamaForCausalLM`` reads (layers, sizes, vocabulary)."""
    values = dict(draft.config.target_config)
    model_type = values.pop("model_type")
    for name in ("dtype", "torch_dtype", "_name_or_path", "_model_name_or_path"):
        values.pop(name, None)
    values["num_hidden_layers"] = draft.config.num_layers
    values["architectures"] = [VLLM_ARCHITECTURE]
    config = AutoConfig.for_model(model_type, **values)
    config.dtype = draft.fc.weight.dtype
    return config


def vllm_weights(draft) -> dict[str, torch.Tensor]:
    """The draft's trained weights under vLLM's names: ``fc.weight`` and ``layers.<i>.*`` (``model.`` dropped), in
    the draft's dtype, on the CPU; the ``draft_vocab_ids`` buffer is not a weight vLLM has."""
    weights = {}
    for name, tensor in draft.state_dict().items():
        if name == "draft_vocab_ids":
            continue
        if name.startswith("model."):
            name = name.removeprefix("model.")
        elif not name.startswith(("fc.", "embed_tokens.")):
            raise AssertionError(f"{name!r} is neither `fc` nor part of the decoder layers: vLLM has no such weight")
        weights[name] = tensor.detach().to("cpu").contiguous().clone()
    return weights


def check_directory(save_directory, record_format: str) -> Path:
    """``save_directory`` as a path: new, empty, or an earlier export of ``record_format``; anything else is
    refused."""
    if not isinstance(save_directory, (str, os.PathLike)) or not str(save_directory):
        raise TypeError(f"`save_directory` must be a directory path, got {save_directory!r}.")
    directory = Path(save_directory).expanduser()
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"`save_directory` {str(directory)!r} is a file: pass a directory for the export.")
    if not directory.is_dir() or not any(directory.iterdir()):
        return directory
    foreign = sorted(entry.name for entry in directory.iterdir() if entry.name not in EXPORT_FILES)
    if foreign or _record_format(directory) != record_format:
        what = f"files an export does not write ({', '.join(foreign[:5])})" if foreign else "no earlier export"
        raise ValueError(
            f"`save_directory` {str(directory)!r} holds {what}: an export replaces its files and must not mix with "
            f"another model's. Pass a new or empty directory, or one an earlier {record_format} export wrote."
        )
    return directory


def refuse_export_directory(save_directory) -> None:
    """Refuse to save this project's layout into a directory an EAGLE export wrote (its ``config.json`` would be
    replaced and its record left behind, describing files that are no longer there)."""
    directory = Path(save_directory).expanduser() if isinstance(save_directory, (str, os.PathLike)) else None
    if directory is not None and (directory / RECORD_NAME).is_file():
        raise ValueError(
            f"`save_directory` {str(directory)!r} holds an EAGLE export ({_record_format(directory)} format, "
            f"{RECORD_NAME}): saving this project's layout there would overwrite its config and leave its record "
            "stale. Save into a new directory, or pass the same `format=` to replace the export."
        )


def _record_format(directory: Path) -> str | None:
    try:
        return json.loads((directory / RECORD_NAME).read_text()).get("format")
    except (OSError, ValueError, AttributeError):
        return None
