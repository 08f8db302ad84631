"""The public EAGLE checkpoint formats, read into and written from :class:`~diversed_hf.drafting.eagle.EagleDraft`
(docs/eagle.md, "Drafts in the public EAGLE formats").

Read from the formats' public sources (the EAGLE repository's checkpoints, SpecForge's and vLLM's ``llama_eagle3.py``
/ ``llama_eagle.py``); no code is copied. A directory (or Hub repo) holds ``config.json`` and the weights
(``model.safetensors`` or ``pytorch_model.bin``):

**EAGLE-3** (the EAGLE authors' and SpecForge's layout): ``config.json`` a one-layer ``LlamaConfig`` with
``architectures: ["LlamaForCausalLMEagle3"]`` (vLLM also names it ``Eagle3LlamaForCausalLM``), ``draft_vocab_size``,
optionally ``target_hidden_size`` and ``eagle_config.eagle_aux_hidden_state_layer_ids`` (else the layers
``(2, L // 2, L - 3)`` of the target's ``L``); weights ``fc.weight`` (``[H, k * H_target]``),
``midlayer.{input_layernorm, hidden_norm, self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.*}``, ``norm.weight``,
``lm_head.weight`` (``[draft_vocab_size, H]``), ``d2t`` (draft id ``i`` is target id ``i + d2t[i]``), ``t2d`` (a mask
over the target's ids) and, in some checkpoints, ``embed_tokens.weight``.

**EAGLE-1** (the EAGLE authors' layout, and vLLM's ``eagle`` export): ``config.json`` a ``LlamaConfig`` of the draft's
layers, optionally ``bias``; weights ``fc.weight`` (``[H, 2 H]``, optionally ``fc.bias``) and ``layers.<i>.*`` (the
first without ``input_layernorm``), optionally ``embed_tokens.weight``; the target's LM head.

A checkpoint of neither format is refused, naming what is missing; so are variants this reader does not build
(``norm_before_fc``, per-layer ``fc`` norms, parallel drafting, several EAGLE-3 layers).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .. import compat
from .._version import __version__
from ..heads import hub
from .tree import TREE_KNOBS

__all__ = [
    "DRAFTING_KNOBS",
    "EAGLE3_ARCHITECTURES",
    "check_state",
    "load_state",
    "detect_format",
    "read_public",
    "restore_drafting_knobs",
    "save_eagle3",
]

#: the ``architectures`` names an EAGLE-3 checkpoint's config carries
EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
#: EAGLE-3 config switches for variants this reader does not build (vLLM's names)
_EAGLE3_VARIANTS = ("norm_before_fc", "norm_before_residual", "norm_output", "parallel_drafting")
RECORD_FORMAT = "eagle3"


def _fetch(path, filename: str, **hub_kwargs) -> Path | None:
    """``filename`` of a local directory or a Hub repo, or None when it has none."""
    local = Path(path).expanduser()
    if local.is_dir():
        return local / filename if (local / filename).is_file() else None
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import EntryNotFoundError

    try:
        return Path(hf_hub_download(str(path), filename, **hub_kwargs))
    except EntryNotFoundError:
        return None
    except HFValidationError as error:
        raise ValueError(
            f"{str(path)!r} is neither a local directory nor a Hub repo id ({error}): pass the directory a draft was "
            "saved in, or an id such as 'org/draft'."
        ) from None


def read_config(path, **hub_kwargs) -> dict | None:
    """The checkpoint's ``config.json`` as a dict, or None when there is none."""
    found = _fetch(path, "config.json", **hub_kwargs)
    if found is None:
        return None
    try:
        config = json.loads(found.read_text())
    except (UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"{str(found)!r} is not valid JSON ({error}): the checkpoint's config is damaged.") from None
    if not isinstance(config, dict):
        raise ValueError(f"{str(found)!r} holds {type(config).__name__}, not a JSON object: it is no model config.")
    return config


def detect_format(config: dict) -> str:
    """``"diversed"`` (this project's layout), ``"eagle3"`` or ``"eagle"`` from a checkpoint's config; the weights
    are checked when they are read."""
    if config.get("model_type") == "diversed_eagle":
        return "diversed"
    if any(name in EAGLE3_ARCHITECTURES for name in config.get("architectures") or ()):
        return "eagle3"
    if config.get("model_type") == "llama":
        return "eagle"
    raise ValueError(
        f"This checkpoint's config has model_type {config.get('model_type')!r} and architectures "
        f"{config.get('architectures')!r}: it is neither an EagleDraft (model_type 'diversed_eagle'), an EAGLE-3 draft "
        f"(architectures {list(EAGLE3_ARCHITECTURES)}) nor an EAGLE-1 draft (a Llama config with `fc.weight` and "
        "`layers.*`)."
    )


def read_weights(path, **hub_kwargs) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint's weight file, on the CPU."""
    for filename in WEIGHT_FILES:
        found = _fetch(path, filename, **hub_kwargs)
        if found is None:
            continue
        try:
            if filename.endswith(".safetensors"):
                from safetensors.torch import load_file

                return load_file(str(found))
            return torch.load(found, map_location="cpu", weights_only=True)
        except Exception as error:  # safetensors' SafetensorError, torch's unpickling and EOF errors
            raise ValueError(
                f"{str(found)!r} could not be read ({type(error).__name__}: {error}): the file is truncated or not "
                "a weight file. Download or copy it again."
            ) from None
    raise ValueError(f"{str(path)!r} has no weights: an EAGLE checkpoint holds one of {list(WEIGHT_FILES)}.")


def read_public(path, config: dict, *, target=None, **hub_kwargs) -> tuple[dict, dict[str, torch.Tensor]]:
    """The :class:`~diversed_hf.drafting.eagle.EagleDraftConfig` arguments and the state dict (in the draft's names) of
    the ``"eagle3"`` or ``"eagle"`` checkpoint at ``path`` whose ``config.json`` is ``config``; what the format lacks
    or cannot hold is refused by name (``EagleDraft.from_pretrained`` builds the draft, refusing weights left over)."""
    weights = read_weights(path, **hub_kwargs)
    for name, tensor in weights.items():  # maps are ids (d2t offsets, the t2d mask); every other weight a float
        if (name == "d2t" and tensor.is_floating_point()) or (
            name not in ("d2t", "t2d") and not tensor.is_floating_point()
        ):
            kind = "integer offsets" if name == "d2t" else "floating-point values"
            raise ValueError(
                f"{str(path)!r}: `{name}` is {tensor.dtype}, and it holds {kind}: the checkpoint is broken."
            )
    build = _eagle3_config if detect_format(config) == "eagle3" else _eagle1_config
    return build(config, weights, target)


def load_state(draft, state: dict[str, torch.Tensor], path, fmt: str) -> None:
    """Load ``state`` into ``draft``, refusing by name a weight of the wrong shape and weights left over or missing."""
    expected = draft.state_dict()
    wrong = [
        f"`{name}` is {list(tensor.shape)}, the config needs {list(expected[name].shape)}"
        for name, tensor in state.items()
        if name in expected and expected[name] is not None and tuple(expected[name].shape) != tuple(tensor.shape)
    ]
    if wrong:
        raise ValueError(
            f"{str(path)!r} ({fmt}) does not match the draft its config describes: {'; '.join(wrong[:4])}. The "
            "weights belong to another config (or target width)."
        )
    check_state(path, fmt, *draft.load_state_dict(state, strict=False))


def check_state(path, fmt: str, missing, unexpected) -> None:
    """Refuse a checkpoint whose weights do not fill the draft its config describes, naming them."""
    if not missing and not unexpected:
        return
    parts = [f"weights it lacks: {sorted(missing)[:8]}"] if missing else []
    parts += [f"weights this format has no place for: {sorted(unexpected)[:8]}"] if unexpected else []
    raise ValueError(f"{str(path)!r} ({fmt}) does not match the draft its config describes: {'; '.join(parts)}.")


def _require(weights: dict, names, fmt: str) -> None:
    missing = [name for name in names if name not in weights]
    if missing:
        raise ValueError(f"This {fmt} checkpoint has no {', '.join(f'`{n}`' for n in missing)}: it is not complete.")


def _layer_config(config: dict) -> dict:
    """The checkpoint's Llama config as the draft's layers read it."""
    values = {key: value for key, value in config.items() if not key.startswith("_")}
    for name in ("architectures", "auto_map", "eagle_config", "draft_vocab_size", "target_hidden_size", "bias"):
        values.pop(name, None)
    values["model_type"] = "llama"
    return values


def _eagle3_config(config: dict, weights: dict, target) -> tuple[dict, dict]:
    """EagleDraftConfig arguments and the state dict of an EAGLE-3 checkpoint, refusing what it cannot build."""
    variants = [name for name in _EAGLE3_VARIANTS if config.get(name)]
    if variants or any(name.startswith(("fc_norm", "input_norm", "mask_hidden")) for name in weights):
        raise ValueError(
            f"This EAGLE-3 checkpoint is a variant EagleDraft does not build ({variants or 'norms before fc'}): "
            "it reads the EAGLE authors' and SpecForge's plain layout."
        )
    if int(config.get("num_hidden_layers", 1)) != 1:
        raise ValueError(
            f"This EAGLE-3 checkpoint has num_hidden_layers={config['num_hidden_layers']}; EagleDraft reads the "
            "one-layer layout (`midlayer`)."
        )
    _require(weights, ("fc.weight", "norm.weight", "lm_head.weight", "midlayer.self_attn.q_proj.weight"), "EAGLE-3")
    hidden, vocab = int(config["hidden_size"]), int(config["vocab_size"])
    draft_vocab = int(config.get("draft_vocab_size") or vocab)
    target_hidden = int(config.get("target_hidden_size") or hidden)
    if draft_vocab > vocab:
        raise ValueError(
            f"This EAGLE-3 checkpoint's `draft_vocab_size` ({draft_vocab}) is larger than its target's vocabulary "
            f"(`vocab_size` {vocab}): a draft vocabulary is a subset of the target's ids. The checkpoint is broken."
        )
    from .eagle3 import check_aux_layer_ids, default_aux_layer_ids

    eagle_config = config.get("eagle_config") or {}
    layer_ids = eagle_config.get("eagle_aux_hidden_state_layer_ids") or config.get("eagle_aux_hidden_state_layer_ids")
    layers = None if target is None else target.config.get_text_config().num_hidden_layers
    if not layer_ids:
        if target is None:
            raise ValueError(
                "This EAGLE-3 checkpoint names no target layers (`eagle_config.eagle_aux_hidden_state_layer_ids`): "
                "pass `target=` so the default layers (2, L // 2, L - 3) of its L layers are used."
            )
        layer_ids = default_aux_layer_ids(layers)
    layer_ids = check_aux_layer_ids(layer_ids, layers)  # named with the target's layer count when there is one
    fc = weights["fc.weight"]
    if tuple(fc.shape) != (hidden, len(layer_ids) * target_hidden):
        raise ValueError(
            f"This EAGLE-3 checkpoint's `fc.weight` is {list(fc.shape)}; its config (hidden_size {hidden}, "
            f"{len(layer_ids)} target layers of width {target_hidden}) needs "
            f"{[hidden, len(layer_ids) * target_hidden]}: the fc was trained for another width."
        )
    if tuple(weights["lm_head.weight"].shape) != (draft_vocab, hidden):
        raise ValueError(
            f"This EAGLE-3 checkpoint's `lm_head.weight` is {list(weights['lm_head.weight'].shape)}; its config "
            f"(draft_vocab_size {draft_vocab}, hidden_size {hidden}) needs {[draft_vocab, hidden]}."
        )
    state = {}
    for name, tensor in weights.items():
        if name.startswith("midlayer."):
            state["model.layers.0." + name.removeprefix("midlayer.")] = tensor
        elif name in ("fc.weight", "norm.weight", "lm_head.weight", "embed_tokens.weight"):
            state[name] = tensor
        elif name not in ("d2t", "t2d"):
            state[name] = tensor  # refused as unexpected by load_state_dict, by name
    if draft_vocab < vocab:
        state["draft_vocab_ids"] = _draft_ids(weights, draft_vocab, vocab)
    elif "d2t" in weights and bool(weights["d2t"].ne(0).any()):
        raise ValueError(
            f"This EAGLE-3 checkpoint scores every id (`draft_vocab_size` {draft_vocab} = `vocab_size`) but its `d2t` "
            "is not all zeros: its head's rows are not the target's ids in order. The checkpoint is inconsistent."
        )
    values = dict(
        target_config=_layer_config(config),
        num_layers=1,
        draft_vocab_size=draft_vocab if draft_vocab < vocab else None,
        architecture="eagle3",
        aux_layer_ids=list(layer_ids),
        target_hidden_size=target_hidden,
        own_embeddings="embed_tokens.weight" in weights,
    )
    return values, state


def _draft_ids(weights: dict, draft_vocab: int, vocab: int) -> torch.Tensor:
    """The target ids of the draft's rows from ``d2t`` (offsets), checked against ``t2d`` when it is there."""
    if "d2t" not in weights:
        raise ValueError(
            f"This EAGLE-3 checkpoint scores {draft_vocab} of the target's {vocab} ids and has no `d2t` (the map from "
            "its ids to the target's): it is not complete."
        )
    d2t = weights["d2t"].long().flatten()
    if d2t.numel() != draft_vocab:
        raise ValueError(f"`d2t` holds {d2t.numel()} offsets; `draft_vocab_size` is {draft_vocab}.")
    ids = torch.arange(draft_vocab) + d2t
    if int(ids.min()) < 0 or int(ids.max()) >= vocab or ids.unique().numel() != draft_vocab:
        raise ValueError(f"`d2t` maps the draft's ids outside [0, {vocab}) or two onto one target id.")
    if "t2d" in weights:
        t2d = weights["t2d"].bool().flatten()
        if t2d.numel() != vocab or int(t2d.sum()) != draft_vocab or not bool(t2d[ids].all()):
            raise ValueError("`t2d` and `d2t` disagree on which target ids the draft scores: the checkpoint is broken.")
    return ids


def _eagle1_config(config: dict, weights: dict, target) -> tuple[dict, dict]:
    """EagleDraftConfig arguments and the state dict of an EAGLE-1 checkpoint."""
    _require(weights, ("fc.weight",), "EAGLE-1")
    hidden = int(config["hidden_size"])
    if tuple(weights["fc.weight"].shape) != (hidden, 2 * hidden):
        raise ValueError(
            f"This EAGLE-1 checkpoint's `fc.weight` is {list(weights['fc.weight'].shape)}; hidden_size {hidden} needs "
            f"{[hidden, 2 * hidden]}: the fc was trained for another width."
        )
    layers = sorted({int(name.split(".")[1]) for name in weights if name.startswith("layers.")})
    if not layers:
        raise ValueError("This EAGLE-1 checkpoint has no `layers.<i>.*` weights: it is not complete.")
    state = {}
    for name, tensor in weights.items():
        state[("model." + name) if name.startswith("layers.") else name] = tensor
    values = dict(
        target_config={**_layer_config(config), "num_hidden_layers": len(layers)},
        num_layers=len(layers),
        fc_bias="fc.bias" in weights,
        input_norm="layers.0.input_layernorm.weight" in weights,
        final_norm="norm.weight" in weights,
        own_embeddings="embed_tokens.weight" in weights,
    )
    if "norm.weight" in weights:
        state["model.norm.weight"] = state.pop("norm.weight")
    return values, state


def save_eagle3(draft, save_directory) -> Path:
    """Write an EAGLE-3 ``draft`` in the EAGLE-3 layout (module docstring), which vLLM's ``eagle3`` method loads;
    returns the directory (new, empty, or an earlier export of this format)."""
    from .eagle_export import check_directory, write_export

    if draft.config.architecture != "eagle3":
        raise ValueError(
            "`format='eagle3'` writes an EAGLE-3 draft; this one is EAGLE-1 style (architecture 'eagle'). Save it with "
            "`format='eagle'`, or train an EAGLE-3 draft (training/train_eagle_draft.py --arch eagle3)."
        )
    if draft.config.num_layers != 1:
        raise ValueError(
            f"`format='eagle3'` writes EAGLE-3's one `midlayer`; this draft has {draft.config.num_layers} layers "
            "(`num_layers`). Save it in this project's format (`format='diversed'`), which keeps every layer."
        )
    directory = check_directory(save_directory, RECORD_FORMAT)
    config = dict(draft.config.target_config)
    for name in ("dtype", "torch_dtype", "_name_or_path", "transformers_version"):
        config.pop(name, None)
    vocab = draft.config.vocab_size
    ids = draft.draft_vocab_ids
    config.update(
        architectures=[EAGLE3_ARCHITECTURES[0]],
        num_hidden_layers=1,
        draft_vocab_size=vocab if ids is None else int(ids.numel()),
        eagle_config={"eagle_aux_hidden_state_layer_ids": list(draft.config.aux_layer_ids)},
        torch_dtype=str(draft.fc.weight.dtype).removeprefix("torch."),
    )
    if draft.config.target_hidden_size != draft.config.hidden_size:
        config["target_hidden_size"] = draft.config.target_hidden_size
    weights = {}
    for name, tensor in draft.state_dict().items():
        if name == "draft_vocab_ids":
            continue
        weights[name.replace("model.layers.0.", "midlayer.")] = tensor.detach().to("cpu").contiguous().clone()
    if ids is not None:
        ids = ids.detach().to("cpu").long()
        weights["d2t"] = ids - torch.arange(ids.numel())
        weights["t2d"] = torch.zeros(vocab, dtype=torch.bool).index_fill_(0, ids, True)
    record = {
        "format": RECORD_FORMAT,
        "diversed_hf_version": __version__,
        "target_model_id": draft.config.target_model_id,
    }
    return write_export(directory, lambda staging: hub.write_json(staging / "config.json", config), weights, record)


#: the generation-config keys a draft carries for the target's ``generate``: the draft length, the token tree and the
#: batch size above which lossless calls decode with the target alone (``diversed_hf.generation.batch_rule``), or the
#: per-batch plan (``diversed_hf.generation.batch_plan``)
DRAFTING_KNOBS = (
    "num_assistant_tokens",
    "num_assistant_tokens_schedule",
    "assistant_confidence_threshold",
    *TREE_KNOBS,
    "assistant_disable_by_batch_size",
    "assistant_batch_plan",
)


def restore_drafting_knobs(draft, path, **hub_kwargs) -> None:
    """Give ``draft`` the drafting knobs its saved ``generation_config.json`` holds. A file saved with transformers'
    ``_from_model_config`` mark (every draft saved before this release did) loads without the keys GenerationConfig
    does not know: the tree (``assistant_tree_top_k``, ``assistant_tree_size``, ``assistant_tree``) was dropped."""
    found = _fetch(path, "generation_config.json", **hub_kwargs)
    if found is None:
        return
    saved = json.loads(found.read_text())
    config = compat.standalone_generation_config(draft.generation_config)
    for name in DRAFTING_KNOBS:
        if name in saved and getattr(config, name, None) is None:
            setattr(config, name, saved[name])
    draft.generation_config = config
