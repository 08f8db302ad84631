"""Other features for a collection already made: the target reads each stored sequence again and keeps the hidden
states another draft reads, beside the same tokens and soft labels.

A collection (:mod:`.eagle_data`) keeps one feature per position, the one its draft reads: the last hidden state
for an EAGLE-1-style draft, or an EAGLE-3 draft's fused layers. Decoding is what costs (the target answers one token
at a time); reading a sequence that exists is one batched forward pass, several times cheaper per token. So an EAGLE-3
draft is distilled on the same answers as an EAGLE-1 one by :func:`featurize`: every sequence of ``source`` is fed to
the target (all but its last token, left-padded in batches, no cache), the ``hidden_states`` at ``feature_layers``
are stacked as its features, and the shard is written to ``directory`` with the source's ids, prompt lengths and soft
labels unchanged. The manifest records the source's settings with the new ``feature_layers`` and where it came from;
shard by shard, so a run that stops resumes, and a directory made from another source or layers is refused.
:func:`with_layers` does it for the collections a distillation is given whose features are not the draft's.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors.torch import save_file

from .data_parallel import Processes
from .eagle_data import _open_shard, claim_directory

logger = logging.getLogger(__name__)

__all__ = ["featurize", "stored_layers", "with_layers"]

_COPIED = ("ids", "offsets", "prompt_lengths", "top_ids", "top_logprobs")


def stored_layers(data_dir: str | Path, num_layers: int) -> tuple[int, ...]:
    """The ``hidden_states`` indices the collection in ``data_dir`` keeps per position (its manifest's
    ``feature_layers``; none recorded: the last, ``num_layers``)."""
    manifest_file = Path(data_dir) / "manifest.json"
    if not manifest_file.is_file():
        raise FileNotFoundError(f"{data_dir} is not a collection (no manifest.json): name a data directory.")
    layers = json.loads(manifest_file.read_text())["settings"].get("feature_layers")
    return (num_layers,) if layers is None else tuple(layers)


@torch.no_grad()
def featurize(
    target,
    source: str | Path,
    directory: str | Path,
    feature_layers: tuple[int, ...],
    *,
    shards: list[str] | None = None,
    batch_size: int = 8,
    progress: bool = True,
    processes: Processes | None = None,
) -> Path:
    """Write ``source``'s shards (all, or the file names in ``shards``) into ``directory`` with the target's
    ``hidden_states`` at ``feature_layers`` stacked as each position's feature; returns ``directory``.

    ``target`` must be the one that answered (the manifest's ``source`` names it; the caller loads it): the soft labels
    are copied, not recomputed. A shard already in ``directory`` is kept. Under ``accelerate launch`` (``processes``)
    each process writes every ``world``-th shard.
    """
    source, directory = Path(source), Path(directory)
    num_layers = target.config.get_text_config().num_hidden_layers
    had = stored_layers(source, num_layers)  # refuses a directory that is no collection
    layers = tuple(int(i) for i in feature_layers)
    if not layers or min(layers) < 0 or max(layers) > num_layers:
        raise ValueError(
            f"`feature_layers` {layers} must be hidden-state indices in [0, {num_layers}] of this target (the "
            f"embeddings and its {num_layers} layers)."
        )
    manifest = json.loads((source / "manifest.json").read_text())
    record = {
        **manifest,
        "settings": {**manifest["settings"], "feature_layers": list(layers)},
        "featurized_from": {"directory": str(source.resolve()), "feature_layers": list(had)},
    }
    names = sorted(p.name for p in source.glob("shard-*.safetensors")) if shards is None else list(shards)
    missing = [name for name in names if not (source / name).is_file()]
    if missing:
        raise FileNotFoundError(f"`shards` names files that are not in {source}: {', '.join(missing)}.")
    processes = processes or Processes()
    with processes.main_first():  # the main process claims the directory, the others check its claim
        claim_directory(directory, "manifest.json", record, "another collection's or other layers' features")
    from tqdm.auto import tqdm

    for index, name in enumerate(tqdm(names, desc="features", disable=not progress or not processes.is_main)):
        path = directory / name
        if index % processes.world != processes.rank or path.is_file():
            continue
        stat = (source / name).stat()
        data = _open_shard(str(source / name), (stat.st_mtime_ns, stat.st_size))
        tensors = {key: data.get_tensor(key) for key in _COPIED}
        tensors["hidden"] = _features(target, tensors, layers, batch_size)
        staging = path.with_suffix(".tmp")
        save_file(tensors, str(staging))
        staging.replace(path)  # a shard exists only once it is whole
    processes.wait()
    logger.info("features %s of %d shards of %s in %s", layers, len(names), source, directory)
    return directory


def with_layers(
    target, data_dirs: list[Path], feature_layers: tuple[int, ...], root: Path, processes: Processes | None = None
) -> list[Path]:
    """``data_dirs`` with every collection whose features are not ``feature_layers`` replaced by its featurized copy
    in ``root / "features-<i>"`` (made, or resumed, here)."""
    num_layers = target.config.get_text_config().num_hidden_layers
    wanted = tuple(feature_layers)
    return [
        Path(d)
        if stored_layers(d, num_layers) == wanted
        else featurize(target, d, Path(root) / f"features-{i}", wanted, processes=processes)
        for i, d in enumerate(data_dirs)
    ]


def _features(target, tensors: dict, layers: tuple[int, ...], batch_size: int) -> torch.Tensor:
    """``(positions, len(layers) x d)`` float16: for each sequence, the stacked states at every position but the last
    (position ``i`` is what predicts token ``i + 1``, as the collection keeps them)."""
    ids, offsets = tensors["ids"].long(), tensors["offsets"].tolist()
    fed = [ids[offsets[i] : offsets[i + 1] - 1] for i in range(len(offsets) - 1)]  # all but the last token
    order = sorted(range(len(fed)), key=lambda i: fed[i].numel())  # similar lengths together: less padding
    device, features = target.device, [None] * len(fed)
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        width = max(fed[i].numel() for i in rows)
        if width == 0:  # one-token sequences: no position predicts anything
            for i in rows:
                features[i] = torch.zeros(0, dtype=torch.float16)
            continue
        input_ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for row, i in enumerate(rows):
            n = fed[i].numel()
            input_ids[row, width - n :], mask[row, width - n :] = fed[i], 1
        input_ids, mask = input_ids.to(device), mask.to(device)
        out = target(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(dim=1) - 1).clamp(min=0),
            output_hidden_states=True,
            use_cache=False,
            logits_to_keep=1,
        )
        stacked = torch.cat([out.hidden_states[i] for i in layers], dim=-1).to(torch.float16).cpu()  # (B, W, k d)
        for row, i in enumerate(rows):
            features[i] = stacked[row, width - fed[i].numel() :]
    size = len(layers) * target.config.get_text_config().hidden_size
    return torch.cat([f.reshape(-1, size) for f in features]).contiguous()
