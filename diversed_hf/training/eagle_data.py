"""Distillation data for an :class:`~diversed_hf.drafting.eagle.EagleDraft`: the target's own responses, read as it
writes them.

:func:`collect` decodes prompts with the target (batched, left-padded, one KV cache, no speculation) and keeps, at
every position of prompt and response, what the draft learns from, taken from the same forward passes that produce the
response (no second pass over the text):

- ``hidden``: the target's last hidden state (after the final norm: what its LM head reads), the EAGLE *feature*;
- ``top_ids`` / ``top_logprobs``: the target's ``top_k`` log-probabilities of the next token at temperature 1, the soft
  labels.

Shards of ``shard_size`` sequences are written as ``shard-00000.safetensors`` (flat per-token arrays plus per-sequence
offsets) with a ``manifest.json`` of the settings; a rerun with the same settings skips the shards already written, so
an interrupted collection resumes, and other settings are refused rather than mixed in.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .. import compat
from ..common.files import write_text_atomic
from ..verifiers import ops
from ..verifiers.checks import is_integer, is_real
from .data_parallel import Processes

logger = logging.getLogger(__name__)

__all__ = [
    "CollectionSettings",
    "Sequence",
    "StoredSequence",
    "claim_directory",
    "collect",
    "collection_seconds",
    "load_sequences",
    "load_token_ids",
]


@dataclass(frozen=True)
class CollectionSettings:
    """How the target's responses are drawn; recorded in ``manifest.json``."""

    temperature: float = 0.7  # sampling temperature of the responses (the soft labels are kept at temperature 1)
    greedy_fraction: float = 0.25  # prompts answered greedily instead (every 1/fraction-th prompt)
    top_k: int = 32  # log-probabilities kept per position
    batch_size: int = 16  # prompts decoded together
    shard_size: int = 64  # sequences per shard file
    seed: int = 0
    #: the target's hidden states kept as each position's feature: None, the last one (an EAGLE-1-style draft); else
    #: these ``hidden_states`` indices stacked (an EAGLE-3 draft's ``aux_layer_ids``)
    feature_layers: tuple[int, ...] | None = None

    def __post_init__(self):
        if not is_real(self.temperature) or not math.isfinite(self.temperature) or self.temperature <= 0:
            raise ValueError(
                f"`temperature` must be a positive finite number, got {self.temperature!r}: the sampled answers are "
                "drawn at it (temperature 0 divides the logits by zero). Greedy answers come from `greedy_fraction` "
                "(1.0 answers every prompt greedily)."
            )
        if not is_real(self.greedy_fraction) or not 0 <= self.greedy_fraction <= 1:
            raise ValueError(f"`greedy_fraction` must be in [0, 1], got {self.greedy_fraction!r}.")
        if self.feature_layers is not None:
            layers = self.feature_layers
            if not layers or not all(is_integer(i) and i >= 0 for i in layers):
                raise ValueError(
                    f"`feature_layers` must be None (the last hidden state) or hidden-state indices >= 0, got "
                    f"{layers!r}."
                )
            object.__setattr__(self, "feature_layers", tuple(int(i) for i in layers))
        for name in ("top_k", "batch_size", "shard_size"):
            value = getattr(self, name)
            if not is_integer(value) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
        if not is_integer(self.seed):
            raise ValueError(f"`seed` must be an integer, got {self.seed!r}.")


@dataclass
class Sequence:
    """One decoded sequence: ``ids`` ``(n,)``; ``hidden`` ``(n - 1, d)``, ``top_ids`` / ``top_logprobs`` ``(n - 1, k)``
    at positions ``0..n-2`` (position ``i`` predicts token ``i + 1``); ``prompt_length`` real prompt tokens.

    The soft labels of the positions before ``prompt_length - 1`` (they predict prompt tokens, never trained) are
    placeholders, ids 0 and log-probabilities ``-inf``, in collections made since they stopped being computed (the
    LM head over every prompt column was a quarter of the time of a batch of 128 follow-up turns, 192 s against
    145 s on the real pair); a read-only row's are all real."""

    ids: torch.Tensor
    hidden: torch.Tensor
    top_ids: torch.Tensor
    top_logprobs: torch.Tensor
    prompt_length: int


def _shard_path(directory: Path, index: int) -> Path:
    return directory / f"shard-{index:05d}.safetensors"


def _write_shard(path: Path, sequences: list[Sequence], seconds: float) -> None:
    """The shard file, with the ``seconds`` its decoding took in its metadata (what a collection cost survives a run
    that stops)."""
    offsets = [0]
    for sequence in sequences:
        offsets.append(offsets[-1] + sequence.ids.shape[0])
    tensors = {
        "ids": torch.cat([s.ids for s in sequences]).to(torch.int32).contiguous(),
        "offsets": torch.tensor(offsets, dtype=torch.int64),
        "prompt_lengths": torch.tensor([s.prompt_length for s in sequences], dtype=torch.int64),
        "hidden": torch.cat([s.hidden for s in sequences]).to(torch.float16).contiguous(),
        "top_ids": torch.cat([s.top_ids for s in sequences]).to(torch.int32).contiguous(),
        "top_logprobs": torch.cat([s.top_logprobs for s in sequences]).to(torch.float16).contiguous(),
    }
    staging = path.with_suffix(".tmp")
    save_file(tensors, str(staging), metadata={"seconds": f"{seconds:.6f}"})
    staging.replace(path)  # a shard exists only once it is whole


@functools.lru_cache(maxsize=64)
def _open_shard(path: str, stamp: tuple[int, int]):
    """An open shard (memory-mapped by safetensors); ``stamp`` (mtime, size) keeps a rewritten file from being read
    through an old handle."""
    return safe_open(path, framework="pt")


class StoredSequence:
    """A collected sequence whose features stay on disk: ``ids`` and ``prompt_length`` are held, ``hidden``,
    ``top_ids`` and ``top_logprobs`` (as in :class:`Sequence`) are read from the shard each time they are asked for, so
    a distillation over millions of positions holds only its batch's features in memory."""

    __slots__ = ("ids", "prompt_length", "_shard", "_stamp", "_start", "_end")

    def __init__(
        self, ids: torch.Tensor, prompt_length: int, shard: Path, stamp: tuple[int, int], start: int, end: int
    ):
        self.ids, self.prompt_length = ids, prompt_length
        self._shard, self._stamp, self._start, self._end = str(shard), stamp, start, end

    def _read(self, name: str) -> torch.Tensor:
        return _open_shard(self._shard, self._stamp).get_slice(name)[self._start : self._end]

    @property
    def hidden(self) -> torch.Tensor:
        return self._read("hidden")

    @property
    def top_ids(self) -> torch.Tensor:
        return self._read("top_ids")

    @property
    def top_logprobs(self) -> torch.Tensor:
        return self._read("top_logprobs")


def load_sequences(directory: str | Path) -> list[StoredSequence]:
    """Every sequence of the shards in ``directory``, in collection order; their features stay on disk until read
    (:class:`StoredSequence`)."""
    directory = Path(directory)
    shards = sorted(directory.glob("shard-*.safetensors"))
    if not shards:
        manifest = directory / "manifest.json"
        try:
            num_prompts = json.loads(manifest.read_text()).get("num_prompts") if manifest.is_file() else None
        except (ValueError, AttributeError):
            num_prompts = None
        if num_prompts == 0:
            raise ValueError(
                f"The collection in {directory} is empty: it was made from 0 prompts ({manifest}). Collect again "
                "with prompts for the target to answer, into a new directory or after removing this one."
            )
        raise FileNotFoundError(
            f"no shard-*.safetensors in {directory}: run the collection first (train_eagle_draft.py)."
        )
    sequences = []
    for shard in shards:
        stat = shard.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
        data = _open_shard(str(shard), stamp)
        ids = data.get_tensor("ids").long()
        offsets = data.get_tensor("offsets").tolist()
        for i, prompt_length in enumerate(data.get_tensor("prompt_lengths").tolist()):
            start, end = offsets[i], offsets[i + 1]
            feature_start, feature_end = start - i, end - i - 1  # n - 1 feature rows per sequence
            sequences.append(
                StoredSequence(ids[start:end].clone(), prompt_length, shard, stamp, feature_start, feature_end)
            )
    return sequences


def load_token_ids(directory: str | Path) -> list[tuple[list[int], int]]:
    """``(token ids, prompt length)`` of every sequence in ``directory``'s shards, in collection order, without reading
    their features (what a follow-up turn is built from: ``lab.tasks.target_prompts.follow_up_prompts``)."""
    return [(sequence.ids.tolist(), sequence.prompt_length) for sequence in load_sequences(directory)]


def claim_directory(directory: Path, file_name: str, record: dict, holds: str) -> None:
    """Tie ``directory`` to ``record`` (written to ``file_name`` the first time): a directory that holds another
    record is refused, naming the fields that differ (``holds`` says what it holds), so two runs never mix."""
    path = directory / file_name
    if path.is_file():
        existing = json.loads(path.read_text())
        if existing != record:
            differing = sorted(k for k in set(existing) | set(record) if existing.get(k) != record.get(k))
            values = "; ".join(
                f"{k}: {existing.get(k)!r} there, {record.get(k)!r} now" for k in differing if k == "source"
            )
            raise ValueError(
                f"{directory} holds {holds} ({', '.join(differing)} differ{': ' + values if values else ''}): use "
                "another directory, or remove it to start over."
            )
    else:
        directory.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(record, indent=2) + "\n")


def _top_logprobs(logits: torch.Tensor, k: int, span: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest log-probabilities of ``logits`` ``(A, chunk, V)`` and their ids, in float32 ``span``
    positions at a time: a long prefill batch never holds its whole ``(A, chunk, V)`` in float32 (64 rows of 1,000
    tokens over 49k ids would be 12.6 GB a copy)."""
    values, ids = [], []
    for start in range(0, logits.shape[1], span):
        top = logits[:, start : start + span].float().log_softmax(dim=-1).topk(k, dim=-1)
        values.append(top.values)
        ids.append(top.indices)
    return torch.cat(values, dim=1), torch.cat(ids, dim=1)


@torch.no_grad()
def _decode_batch(
    target,
    jobs: list[tuple[list[int], int]],
    settings: CollectionSettings,
    greedy: list[bool],
    eos_ids: set[int],
    pad_id: int,
    generator: torch.Generator,
) -> list[Sequence]:
    """Decode one batch of ``(prompt ids, max new tokens)``; every row keeps its features and soft labels.

    Finished rows leave the batch (their cache rows are dropped), so short answers cost nothing after their end. A
    row with 0 new tokens is **read only** (existing text, prefill): its features and soft labels come from the
    first pass, and every position of it is trained (``prompt_length`` 1).
    """
    device = target.device
    width = max(len(ids) for ids, _ in jobs)
    batch = len(jobs)
    seq = torch.full((batch, width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros(batch, width, dtype=torch.long, device=device)
    for row, (ids, _) in enumerate(jobs):
        seq[row, width - len(ids) :] = torch.tensor(ids, device=device)
        mask[row, width - len(ids) :] = 1
    limits = torch.tensor([n for _, n in jobs], device=device)  # (B,)
    greedy_rows = torch.tensor(greedy, device=device)  # (B,)
    eos = torch.tensor(sorted(eos_ids), device=device)
    active = torch.arange(batch, device=device)  # (A,) original row of each active row
    features = [[] for _ in range(batch)]  # per row: (chunk, d), (chunk, k), (chunk, k) per fed chunk
    new_tokens = [[] for _ in range(batch)]
    cache = compat.new_cache()
    chunk = seq
    # the prompt's soft labels predict prompt tokens, never trained: the prefill scores only its last column (each
    # row's first response position; rows are left-padded) unless a row is read-only, all of whose positions train
    prompt_only_last = all(n > 0 for _, n in jobs)
    for step in range(max(1, int(limits.max()))):  # one pass at least: a read-only row's prefill
        keep = 1 if step == 0 and prompt_only_last else 0
        out = compat.forward_with_cache(target, chunk, mask, cache, logits_to_keep=keep, output_hidden_states=True)
        top_logprobs, top_ids = _top_logprobs(out.logits, settings.top_k)  # (A, kept columns, k) each
        if top_ids.shape[1] < chunk.shape[1]:  # the prompt's other columns: placeholders (Sequence)
            skipped = chunk.shape[1] - top_ids.shape[1]
            top_ids = torch.cat([top_ids.new_zeros(top_ids.shape[0], skipped, top_ids.shape[2]), top_ids], dim=1)
            top_logprobs = torch.cat(
                [top_logprobs.new_full((top_ids.shape[0], skipped, top_ids.shape[2]), float("-inf")), top_logprobs],
                dim=1,
            )
        states = out.hidden_states
        hidden = (
            states[-1]
            if settings.feature_layers is None
            else torch.cat([states[i] for i in settings.feature_layers], -1)
        )
        hidden = hidden.to(torch.float16)  # (A, chunk, d) or (A, chunk, k d): the features the draft will read
        last = out.logits[:, -1].float()  # (A, V)
        sampled = ops.sample((last / settings.temperature).softmax(dim=-1), generator, check=False)
        token = torch.where(greedy_rows[active], last.argmax(dim=-1), sampled)  # (A,)
        for i, row in enumerate(active.tolist()):
            features[row].append((hidden[i], top_ids[i].to(torch.int32), top_logprobs[i].to(torch.float16)))
            if jobs[row][1] > 0:  # a read-only row decodes nothing
                new_tokens[row].append(int(token[i]))
        lengths = torch.tensor([len(new_tokens[row]) for row in active.tolist()], device=device)  # (A,)
        done = torch.isin(token, eos) | (lengths >= limits[active])  # (A,)
        if bool(done.all()):
            break
        if bool(done.any()):
            kept = (~done).nonzero().squeeze(1)
            cache.batch_select_indices(kept)
            active, token, mask = active[kept], token[kept], mask[kept]
        chunk = token[:, None]
        mask = torch.cat([mask, torch.ones_like(chunk)], dim=1)
    sequences = []
    for row, (ids, _) in enumerate(jobs):
        pad = width - len(ids)
        hidden = torch.cat([h for h, _, _ in features[row]])[pad:].cpu()
        top_ids = torch.cat([t for _, t, _ in features[row]])[pad:].cpu()
        top_logprobs = torch.cat([p for _, _, p in features[row]])[pad:].cpu()
        # features exist for the prompt and every new token but the last (never fed to the target)
        n = len(ids) + len(new_tokens[row]) - 1
        sequences.append(
            Sequence(
                ids=torch.tensor(ids + new_tokens[row]),
                hidden=hidden[:n],
                top_ids=top_ids[:n],
                top_logprobs=top_logprobs[:n],
                prompt_length=len(ids) if jobs[row][1] > 0 else 1,  # read-only: every position is trained
            )
        )
    return sequences


def collect(
    target,
    tokenizer,
    prompts: list[tuple[str, int]],
    directory: str | Path,
    settings: CollectionSettings = CollectionSettings(),
    progress: bool = True,
    source: dict | None = None,
    processes=None,
) -> Path:
    """Decode every ``(prompt text, max new tokens)`` with ``target`` into shards in ``directory``; returns it.

    ``processes`` (:class:`~diversed_hf.training.data_parallel.Processes`, under ``accelerate launch``): each process
    decodes every ``world``-th shard with its own copy of the target; the main process claims the directory first.

    ``source`` (e.g. ``{"target": "smollm2", "dtype": "bfloat16"}``) names what answers; it is recorded in
    ``manifest.json`` with the settings and prompts, so a directory holding another target's or dtype's collection is
    refused by name instead of reused (and a distillation's ``run.json`` records it through the manifest).

    Prompts are tokenized as given (``add_special_tokens=False``: chat prompts carry their own markers). Rows stop at
    the tokenizer's EOS (and the model's ``generation_config.eos_token_id``) or their limit. Resumable: shards already
    in ``directory`` (same settings and prompts) are kept and their prompts skipped.
    """
    directory = Path(directory)
    if not isinstance(settings, CollectionSettings):
        raise TypeError(f"`settings` must be a CollectionSettings, got {type(settings).__name__}.")
    if not prompts:
        raise ValueError(
            "`prompts` is empty: the collection needs prompts for the target to answer, (text, max new tokens) pairs "
            "(e.g. diversed_hf.lab.tasks.eagle_prompts.eagle_prompts)."
        )
    digest = hashlib.sha256(json.dumps(prompts).encode()).hexdigest()
    manifest = {"settings": asdict(settings), "num_prompts": len(prompts), "prompts_sha256": digest}
    if source is not None:
        manifest["source"] = dict(source)
    processes = processes or Processes()
    with processes.main_first():  # the main process claims the directory, the others check its claim
        claim_directory(directory, "manifest.json", manifest, "a collection made with other settings")
    eos_ids = set()
    for value in (tokenizer.eos_token_id, getattr(target.generation_config, "eos_token_id", None)):
        eos_ids.update(value if isinstance(value, list) else [value] if value is not None else [])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids)
    every = max(1, round(1 / settings.greedy_fraction)) if settings.greedy_fraction > 0 else 0
    num_shards = (len(prompts) + settings.shard_size - 1) // settings.shard_size
    started = time.time()
    from tqdm.auto import tqdm

    bar = tqdm(total=len(prompts), desc="target responses", disable=not progress or not processes.is_main)
    written = 0
    for shard in range(num_shards):
        begin, end = shard * settings.shard_size, min(len(prompts), (shard + 1) * settings.shard_size)
        if shard % processes.world != processes.rank:  # another process's shard
            continue
        if _shard_path(directory, shard).is_file():
            bar.update(end - begin)
            continue
        written += 1
        shard_started = time.time()
        generator = torch.Generator(device=target.device).manual_seed(settings.seed * 100_003 + shard)
        ids = {i: tokenizer(prompts[i][0], add_special_tokens=False)["input_ids"] for i in range(begin, end)}
        # the shard's prompts in batches of like lengths (less padding in the prefill and the cache), kept in order
        order = sorted(ids, key=lambda i: len(ids[i]))
        decoded = {}
        for batch_start in range(0, len(order), settings.batch_size):
            chosen = order[batch_start : batch_start + settings.batch_size]
            jobs = [(ids[i], prompts[i][1]) for i in chosen]
            greedy = [bool(every) and i % every == 0 for i in chosen]
            decoded |= zip(chosen, _decode_batch(target, jobs, settings, greedy, eos_ids, pad_id, generator))
            bar.update(len(chosen))
        sequences = [decoded[i] for i in range(begin, end)]
        _write_shard(_shard_path(directory, shard), sequences, time.time() - shard_started)
    bar.close()
    processes.wait()  # every shard is written
    timing = directory / "timing.json"  # decoding time summed over the runs that wrote shards (a resumed run adds)
    spent = time.time() - started
    written = int(processes.sum(torch.tensor(written)))  # by any process
    if written and processes.is_main:
        total = spent + (json.loads(timing.read_text())["seconds"] if timing.is_file() else 0.0)
        write_text_atomic(timing, json.dumps({"seconds": round(total, 1)}) + "\n")
    logger.info("collected %d sequences into %s in %.0f s", len(prompts), directory, spent)
    return directory


def collection_seconds(directory: str | Path) -> float | None:
    """Seconds the collection in ``directory`` took to decode (every run that wrote shards), if recorded."""
    timing = Path(directory) / "timing.json"
    return json.loads(timing.read_text())["seconds"] if timing.is_file() else None
