"""Distilling an :class:`~diversed_hf.drafting.eagle.EagleDraft` from its target (``docs/eagle.md``, "Training").

The data are the target's own responses with its features and soft labels (:mod:`diversed_hf.training.eagle_data`).
At every response position ``j`` (the positions whose next token the target wrote) the draft, fed ``(h_{j-1}, x_j)``,
predicts the feature ``f_j`` and, through the target's LM head, the next token. The loss at each unrolled step is

    feature_weight * SmoothL1(f_j, h_j)  +  CE(p_j, q_j)  +  tv_weight * TV(p_j, q_j)

with ``p_j`` the target's top-k distribution (temperature 1) restricted to the draft's ids and ``q_j`` the draft's.
The cross-entropy is the soft-label term of EAGLE; the total variation is what lossless SD's acceptance ``1 - TV``
measures, the objective DistillSpec found best for acceptance. **Training-time test**: step ``k >= 1`` feeds every
column the draft's own prediction of step ``k - 1`` at the column before (instead of the target's feature), the input
the draft sees from its second draft token on; step ``k`` weighs ``0.8 ** k``. Column ``j`` at step ``k`` is then the
``k + 1``-th token of a chain drafted after column ``j - k``, and it attends as that draft token does while drafting
(EAGLE-3's training-time test): to the columns up to ``j - k`` as step 0 computed them from the target's features
(the draft's cache at a round's start) and to its chain's own columns of steps 1 to ``k``, not to other chains'
predicted columns.

The draft's ids (FR-Spec): the ``draft_vocab_size`` ids the target writes most often in the training responses, EOS
always among them. Held-out sequences (a seeded split) give ``sum_x min(p, q)`` (temperature 1) and the top-1
agreement per unrolled step, before and after training. Checkpoints (``checkpoint-<step>``: trainable weights,
optimizer, scheduler, RNG, step) are written whole or not at all; a rerun resumes from the newest.

The draft is saved into ``save_to`` (:mod:`diversed_hf.training.eagle_save`: replaced whole; a directory that holds
anything but an earlier draft, or that overlaps the data or the checkpoints, is refused before anything runs). Under
``accelerate launch`` the steps are data-parallel (:mod:`diversed_hf.training.data_parallel`): each process takes its
share of every batch, the gradients are summed, and the main process writes the checkpoints and the draft.
"""

from __future__ import annotations

import json
import logging
import math
import pickle
import random
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .. import compat
from ..common.files import write_text_atomic
from ..drafting.eagle import EagleDraft
from ..verifiers.checks import is_integer, is_real
from .data_parallel import Processes
from .eagle_data import Sequence, claim_directory, load_sequences
from .eagle_features import stored_layers
from .eagle_save import DEFAULT_DRAFTING, check_drafting, check_save_to, save_draft
from .eagle_unroll import UNROLLING, batch_tensors, unrolled_features

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_DRAFTING",
    "DistillSettings",
    "check_drafting",
    "check_save_to",
    "distill",
    "draft_vocabulary",
    "evaluate",
    "eagle_loss",
    "held_out_agreement",
    "save_draft",
    "step_speed",
]

STEP_DECAY = 0.8
MIXED_PRECISION = ("no", "bf16")
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")


@dataclass(frozen=True)
class DistillSettings:
    #: "eagle3": fc over the collection's stacked layers and its own head (diversed_hf.drafting.eagle3)
    architecture: str = "eagle"
    aux_layer_ids: tuple[int, ...] | None = None  # "eagle3": the target layers the collection stacked
    num_layers: int = 1
    draft_vocab_size: int | None = 8192  # None: every id
    unroll: int = 3  # steps: 1 + training-time-test steps on the draft's own features
    epochs: int = 4
    batch_size: int = 8
    learning_rate: float = 1e-3  # train_eagle_draft.py's and the shipped drafts'
    warmup_fraction: float = 0.05
    feature_weight: float = 1.0
    tv_weight: float = 1.0
    max_grad_norm: float = 1.0
    held_out: float = 0.05
    save_steps: int = 200
    seed: int = 0
    #: True: batches of like lengths (``transformers``' length-grouped order: shuffled, sorted within mega-batches of
    #: 50 batches), which pad less; False: batches drawn uniformly (RESULTS.md "Distillation speed" weighs the two)
    group_by_length: bool = False
    #: "bf16": the loss under bfloat16 autocast over float32 weights and optimizer; "no": float32 throughout
    mixed_precision: str = "no"

    def __post_init__(self):
        if self.mixed_precision not in MIXED_PRECISION:
            raise ValueError(
                f"`mixed_precision` must be one of {', '.join(map(repr, MIXED_PRECISION))}, got "
                f"{self.mixed_precision!r}: 'bf16' trains under bfloat16 autocast (faster where the hardware has "
                "bfloat16), 'no' in float32."
            )
        if not isinstance(self.group_by_length, bool):
            raise ValueError(f"`group_by_length` must be True or False, got {self.group_by_length!r}.")
        if self.architecture not in ("eagle", "eagle3"):
            raise ValueError(f"`architecture` must be 'eagle' or 'eagle3', got {self.architecture!r}.")
        if (self.architecture == "eagle3") != (self.aux_layer_ids is not None):
            raise ValueError(
                "`aux_layer_ids` names the target layers an EAGLE-3 draft fuses: set it with architecture='eagle3' "
                f"and only then (got architecture={self.architecture!r}, aux_layer_ids={self.aux_layer_ids!r})."
            )
        for name in ("num_layers", "unroll", "epochs", "batch_size", "save_steps"):
            value = getattr(self, name)
            if not is_integer(value) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
        if self.draft_vocab_size is not None and (not is_integer(self.draft_vocab_size) or self.draft_vocab_size < 1):
            raise ValueError(
                f"`draft_vocab_size` must be a positive integer or None (every id), got {self.draft_vocab_size!r}."
            )
        if not is_integer(self.seed):
            raise ValueError(f"`seed` must be an integer, got {self.seed!r}.")
        for name, low, closed in (
            ("learning_rate", 0.0, False),
            ("max_grad_norm", 0.0, False),
            ("feature_weight", 0.0, True),
            ("tv_weight", 0.0, True),
        ):
            value = getattr(self, name)
            if not is_real(value) or not math.isfinite(value) or value < low or (value == low and not closed):
                bound = ">= 0" if closed else "> 0"
                raise ValueError(f"`{name}` must be a finite number {bound}, got {value!r}.")
        if not is_real(self.warmup_fraction) or not 0 <= self.warmup_fraction <= 1:
            raise ValueError(f"`warmup_fraction` must be in [0, 1], got {self.warmup_fraction!r}.")
        if not is_real(self.held_out) or not 0 < self.held_out < 1:
            raise ValueError(
                f"`held_out` must be in (0, 1) (the fraction of sequences kept out to measure acceptance), got "
                f"{self.held_out!r}."
            )


def draft_vocabulary(sequences: list[Sequence], size: int, vocab_size: int, always: list[int]) -> torch.Tensor:
    """The ``size`` ids most frequent among the responses' tokens (ties by id), ``always`` included."""
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for sequence in sequences:
        counts += torch.bincount(sequence.ids[sequence.prompt_length :], minlength=vocab_size).double()[:vocab_size]
    counts[torch.tensor(always, dtype=torch.long)] = float("inf")
    order = sorted(range(vocab_size), key=lambda i: (-counts[i].item(), i))
    return torch.tensor(sorted(order[:size]))


def eagle_loss(draft: EagleDraft, batch: dict, settings: DistillSettings, id_to_draft: torch.Tensor):
    """The loss of one batch and, per unrolled step, the sums of ``sum_x min(p, q)`` and of top-1 agreement over its
    response positions (their count last): ``(loss, overlap (unroll,), agree (unroll,), positions)``."""
    ids, mask, hidden, loss_mask = batch["ids"], batch["mask"], batch["hidden"], batch["loss_mask"]
    positions = loss_mask.nonzero(as_tuple=True)
    count = positions[0].numel()
    target_probs = batch["top_logprobs"][positions].exp()  # (P, k)
    draft_ids = id_to_draft[batch["top_ids"][positions]]  # (P, k): index in the draft's ids, -1 outside
    inside = draft_ids >= 0
    target_probs = target_probs * inside  # mass the draft cannot propose counts for nothing
    target_top1 = draft_ids[:, 0]  # (P,) the target's most likely id (top-k is sorted), -1 when outside
    total, overlaps, agreements = 0.0, [], []
    for step, predicted in enumerate(unrolled_features(draft, ids, mask, hidden, settings.unroll)):
        chosen = predicted[positions]  # (P, d)
        if chosen.shape[-1] == hidden.shape[-1]:  # EAGLE-1 style: the feature regresses onto the target's
            feature_loss = torch.nn.functional.smooth_l1_loss(chosen, hidden[positions], reduction="mean")
        else:  # EAGLE-3: the fused layers are no target for the draft's feature; tokens alone teach it
            feature_loss = chosen.new_zeros(())
        log_q = draft.draft_logits(chosen).float().log_softmax(dim=-1)  # (P, V_draft)
        log_q_top = log_q.gather(1, draft_ids.clamp(min=0)) * inside  # (P, k)
        cross_entropy = -(target_probs * log_q_top).sum(dim=1).mean()
        overlap = torch.minimum(target_probs, log_q_top.exp() * inside).sum(dim=1)  # (P,) sum_x min(p, q) on top-k
        tv = (1 - overlap).mean()
        loss = settings.feature_weight * feature_loss + cross_entropy + settings.tv_weight * tv
        total = total + STEP_DECAY**step * loss
        overlaps.append(overlap.detach().sum())
        agreements.append(((log_q.argmax(dim=1) == target_top1) & (target_top1 >= 0)).float().sum().detach())
    return total, torch.stack(overlaps), torch.stack(agreements), count


@torch.no_grad()
def evaluate(draft: EagleDraft, sequences: list[Sequence], settings: DistillSettings, id_to_draft, device) -> dict:
    """Held-out ``sum_x min(p, q)`` (lossless SD's acceptance at temperature 1, over the target's top-k) and top-1
    agreement (greedy acceptance), per unrolled step."""
    draft.eval()
    overlap, agree, count = 0.0, 0.0, 0
    sequences = sorted(sequences, key=lambda s: s.ids.shape[0])  # batches of like lengths: the sums are the same
    for start in range(0, len(sequences), settings.batch_size):
        batch = batch_tensors(sequences[start : start + settings.batch_size], device)
        _, o, a, n = eagle_loss(draft, batch, settings, id_to_draft)
        overlap, agree, count = overlap + o, agree + a, count + n
    draft.train()
    return {
        "acceptance_t1": [round(float(x) / count, 4) for x in overlap],
        "top1_agreement": [round(float(x) / count, 4) for x in agree],
        "positions": count,
    }


@torch.no_grad()
def held_out_agreement(draft: EagleDraft, target, data_dir, settings: DistillSettings | None = None) -> dict:
    """:func:`evaluate` of a trained ``draft`` on every sequence of the collection in ``data_dir`` (a fixed
    held-out set several drafts are compared on): top-1 agreement and ``sum min(p, q)`` per unrolled step."""
    settings = settings or DistillSettings(architecture=draft.config.architecture, aux_layer_ids=_aux(draft))
    sequences = load_sequences(data_dir)
    _check_features(draft, sequences, [Path(data_dir)], target.config.get_text_config().num_hidden_layers)
    id_to_draft = _id_to_draft(draft, target.config.get_text_config().vocab_size, target.device)
    training = draft.training
    scores = evaluate(draft, sequences, settings, id_to_draft, target.device)
    draft.train(training)  # evaluate leaves it training
    return scores


def _aux(draft: EagleDraft) -> tuple[int, ...] | None:
    ids = draft.config.aux_layer_ids
    return None if ids is None else tuple(ids)


def _check_features(draft: EagleDraft, sequences: list[Sequence], data_dirs: list[Path], num_layers: int) -> None:
    """Refuse a collection whose features are not the ones the draft reads (the target's last hidden state, or an
    EAGLE-3 draft's fused layers), by the layers its manifest records and by width."""
    wanted = (num_layers,) if draft.config.aux_layer_ids is None else tuple(draft.config.aux_layer_ids)
    for directory in data_dirs:
        had = stored_layers(directory, num_layers)
        if had != wanted:
            raise ValueError(
                f"The collection in {directory} keeps the target's hidden states {list(had)} per position; a draft "
                f"of architecture {draft.config.architecture!r} reads {list(wanted)}. Featurize it for this draft "
                "(diversed_hf.training.eagle_features.featurize; train_eagle_draft.py does it for --extra_data), or "
                "collect with the same `--arch` as you distil."
            )
    width = sequences[0].hidden.shape[1] if sequences else draft.config.target_feature_size
    if width != draft.config.target_feature_size:
        raise ValueError(
            f"The collection in {', '.join(map(str, data_dirs))} keeps features of width {width}; a draft of "
            f"architecture {draft.config.architecture!r} reads {draft.config.target_feature_size}. Collect with the "
            "same `--arch` as you distil (an EAGLE-3 draft reads its target layers stacked)."
        )


def _trainable(draft: EagleDraft) -> dict[str, torch.nn.Parameter]:
    return {name: p for name, p in draft.named_parameters() if p.requires_grad}


def _save_checkpoint(directory: Path, step: int, draft, optimizer, scheduler, keep: int = 2) -> None:
    final = directory / f"checkpoint-{step}"
    staging = directory / f".staging-{step}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    state = {
        "step": step,
        "weights": {k: v.detach().clone() for k, v in _trainable(draft).items()},
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
    }
    torch.save(state, staging / "state.pt")
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)  # whole or not at all
    for _, old in _checkpoints(directory)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def _checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of the ``checkpoint-<step>`` folders of ``directory``, oldest first (other names ignored)."""
    found = []
    for path in directory.glob("checkpoint-*"):
        match = _CHECKPOINT.fullmatch(path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path))
    return sorted(found)


def _latest_checkpoint(directory: Path) -> Path | None:
    found = [path for _, path in _checkpoints(directory) if (path / "state.pt").is_file()]
    return found[-1] if found else None


def _draft_ids(target, training: list, settings: DistillSettings) -> torch.Tensor | None:
    """The ids the draft scores (``settings.draft_vocab_size`` most frequent in the training responses, EOS always),
    or ``None`` for the whole vocabulary."""
    if settings.draft_vocab_size is None:
        return None
    eos = target.generation_config.eos_token_id
    always = [i for i in (eos if isinstance(eos, list) else [eos]) if i is not None]
    return draft_vocabulary(training, settings.draft_vocab_size, target.config.get_text_config().vocab_size, always)


def _id_to_draft(draft: EagleDraft, vocab_size: int, device) -> torch.Tensor:  # (vocab,) draft row of each id, or -1
    id_to_draft = torch.full((vocab_size,), -1, dtype=torch.long, device=device)
    kept_ids = draft.draft_vocab_ids if draft.draft_vocab_ids is not None else torch.arange(vocab_size, device=device)
    id_to_draft[kept_ids] = torch.arange(kept_ids.numel(), device=device)
    return id_to_draft


def _split(sequences: list, settings: DistillSettings, data_dir: Path) -> tuple[list, list]:
    """``(held out, training)``: a seeded split of the collection, each in collection order."""
    num_held_out = max(1, round(settings.held_out * len(sequences)))
    if len(sequences) - num_held_out < 1:
        raise ValueError(
            f"The collection in {data_dir} holds {len(sequences)} sequence(s): too few for a held-out split "
            f"(held_out={settings.held_out} keeps {num_held_out} out and leaves none to train on). Collect more "
            "prompts: at least 2, a few hundred for a useful draft."
        )
    order = list(range(len(sequences)))
    random.Random(f"eagle-split/{settings.seed}").shuffle(order)
    return [sequences[i] for i in sorted(order[:num_held_out])], [sequences[i] for i in sorted(order[num_held_out:])]


def _optimizer(draft: EagleDraft, settings: DistillSettings, total_steps: int):
    """AdamW on the draft's own weights, linear warm-up then cosine decay."""
    optimizer = torch.optim.AdamW(_trainable(draft).values(), lr=settings.learning_rate, weight_decay=0.0)
    warmup = max(1, int(settings.warmup_fraction * total_steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, 0.5 * (1 + math.cos(math.pi * min(1.0, s / total_steps))))
    )
    return optimizer, scheduler


def _resume(checkpoint_dir: Path, draft, optimizer, scheduler, total_steps: int) -> int:
    """Load the newest checkpoint of ``checkpoint_dir`` (weights, optimizer, scheduler, both RNGs); its step, or 0."""
    latest = _latest_checkpoint(checkpoint_dir)
    if latest is None:
        return 0
    try:
        state = torch.load(latest / "state.pt", weights_only=False)
        missing = [k for k in ("step", "weights", "optimizer", "scheduler", "rng", "python_rng") if k not in state]
    except (RuntimeError, EOFError, pickle.UnpicklingError, TypeError, ValueError) as error:
        missing = [f"unreadable: {error}"]
    if missing:
        raise ValueError(
            f"The checkpoint {latest / 'state.pt'} is truncated or damaged ({'; '.join(map(str, missing))}). Remove "
            f"{latest} to resume from the checkpoint before it (or from the start), then rerun."
        )
    draft.load_state_dict(state["weights"], strict=False)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"])
    random.setstate(state["python_rng"])
    logger.info("resuming from %s (step %d of %d)", latest, state["step"], total_steps)
    return state["step"]


def _epoch_batches(training: list, settings: DistillSettings, epoch: int) -> list[list[int]]:
    """The batches of ``epoch`` (indices into ``training``), seeded by ``settings.seed`` and the epoch: of like lengths
    when ``settings.group_by_length``, else drawn uniformly."""
    if not settings.group_by_length:
        order = list(range(len(training)))
        random.Random(f"eagle-epoch/{settings.seed}/{epoch}").shuffle(order)
    else:
        generator = torch.Generator().manual_seed(settings.seed * 1_000_003 + epoch)
        order = compat.length_grouped_indices([s.ids.shape[0] for s in training], settings.batch_size, generator)
    return [order[i : i + settings.batch_size] for i in range(0, len(order), settings.batch_size)]


def _autocast(settings: DistillSettings, device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=settings.mixed_precision == "bf16")


def _train_step(draft, training, chunk: list[int], settings, id_to_draft, optimizer, processes):
    """One optimizer step on the batch ``chunk`` (indices into ``training``): ``(loss, overlap per step, count)``.

    With several processes each takes every ``world``-th sequence of the batch; its loss (a mean over its positions)
    is weighted by its share of the batch's positions and the gradients are summed over the processes, so the step
    is the one a single process takes on the whole batch."""
    mine = chunk[processes.rank :: processes.world]
    trainable = _trainable(draft)
    optimizer.zero_grad()
    loss, overlap, count = None, torch.zeros(settings.unroll, device=id_to_draft.device), 0
    if mine:
        batch = batch_tensors([training[i] for i in mine], id_to_draft.device)
        with _autocast(settings, id_to_draft.device):
            loss, overlap, _, count = eagle_loss(draft, batch, settings, id_to_draft)
    total = int(processes.sum(torch.tensor(float(count))))
    if loss is not None:
        (loss * (count / total)).backward()  # x 1.0 in one process: the mean over the batch's positions
    if processes.world > 1:
        for parameter in trainable.values():
            grad = parameter.grad if parameter.grad is not None else torch.zeros_like(parameter)
            parameter.grad = processes.sum(grad)
    torch.nn.utils.clip_grad_norm_(trainable.values(), settings.max_grad_norm)
    optimizer.step()
    weighted = loss.detach().float() * count if loss is not None else torch.zeros(())
    return processes.sum(weighted) / total, processes.sum(overlap.float()), total


def step_speed(target, sequences: list, settings: DistillSettings, steps: int | None = None, untimed: int = 2):
    """Train a fresh draft for ``target`` on ``sequences`` as :func:`distill` does under ``settings`` (no held-out
    split, no checkpoints), for ``steps`` steps (default ``settings.epochs`` epochs), timing all but the first
    ``untimed``. Returns ``(speed, draft)``: the padded cells per trained position (a batch's ``ids`` cells, prompt and
    padding included, over its response positions), the trained positions a second, and the draft, trained
    (``benchmarks/distill_speed.py``)."""
    draft = _new_draft(target, sequences, settings)
    id_to_draft = _id_to_draft(draft, target.config.get_text_config().vocab_size, target.device)
    steps_per_epoch = math.ceil(len(sequences) / settings.batch_size)
    steps = steps_per_epoch * settings.epochs if steps is None else steps
    optimizer, scheduler = _optimizer(draft, settings, steps)
    seconds = cells = positions = 0
    batches = {}  # epoch -> its batches, as distill keeps them
    for step in range(steps):
        epoch, index = divmod(step, steps_per_epoch)
        if epoch not in batches:
            batches = {epoch: _epoch_batches(sequences, settings, epoch)}
        chunk = batches[epoch][index]
        started = time.perf_counter()
        _, _, count = _train_step(draft, sequences, chunk, settings, id_to_draft, optimizer, Processes())
        scheduler.step()
        if step >= untimed:
            seconds += time.perf_counter() - started
            cells += len(chunk) * max(sequences[i].ids.shape[0] for i in chunk)
            positions += count
    if not positions:
        raise ValueError(f"`steps` {steps} leaves no timed step after the {untimed} untimed: give more.")
    return {"cells_per_position": cells / positions, "positions_per_second": positions / seconds}, draft


def _refuse_earlier_unrolling(run_file: Path) -> None:
    """A ``run.json`` written before the unrolling was recorded is refused by name: its training-time test attended
    otherwise (:data:`~diversed_hf.training.eagle_unroll.UNROLLING`). ``claim_directory`` would refuse it too, as
    another run; this says why and what to do."""
    if run_file.is_file() and "unrolling" not in json.loads(run_file.read_text()):
        raise ValueError(
            f"{run_file.parent} holds checkpoints trained before training-time test attended as drafting does (each "
            f"unrolled column saw every predicted column before it; now its own chain's, `unrolling` "
            f"{UNROLLING!r}): resuming them would mix the two. Remove {run_file.parent} to start over, or finish "
            "that run with the diversed_hf release that began it."
        )


def _fill_new_settings(run_file: Path) -> None:
    """A ``run.json`` written before a setting existed gets its default, which is what that run trained with: its
    checkpoints resume under this version (a run with another value is still refused by name)."""
    if not run_file.is_file():
        return
    record = json.loads(run_file.read_text())
    defaults = {name: value for name, value in asdict(DistillSettings()).items() if name not in record["settings"]}
    if defaults:
        record["settings"] = {**record["settings"], **defaults}
        write_text_atomic(run_file, json.dumps(record, indent=2) + "\n")


def _manifests(data_dirs: list[Path]) -> dict | list[dict]:
    """The collections' manifests: one dict for one collection (as before several were allowed), else a list."""
    manifests = [json.loads((d / "manifest.json").read_text()) for d in data_dirs]
    return manifests[0] if len(manifests) == 1 else manifests


def _append_json_line(path: Path, entry: dict) -> None:
    with path.open("a") as log:
        log.write(json.dumps(entry) + "\n")


def _new_draft(target, training: list, settings: DistillSettings) -> EagleDraft:
    """A fresh draft for ``target`` (seeded), in float32 and training mode, scoring the ids of ``training``."""
    torch.manual_seed(settings.seed)
    draft = EagleDraft.for_target(
        target,
        num_layers=settings.num_layers,
        draft_vocab_ids=_draft_ids(target, training, settings),
        architecture=settings.architecture,
        aux_layer_ids=None if settings.aux_layer_ids is None else list(settings.aux_layer_ids),
    )
    return draft.float().train()


def _log_step(checkpoint_dir: Path, bar, step: int, steps_per_epoch: int, loss, overlap, count, scheduler) -> None:
    """One line of ``train_log.jsonl`` (loss, acceptance per unrolled step, learning rate), shown on the bar."""
    entry = {
        "step": step,
        "epoch": round(step / steps_per_epoch, 3),
        "loss": round(loss.item(), 4),
        "acceptance_t1": [round(float(x) / count, 4) for x in overlap],
        "lr": scheduler.get_last_lr()[0],
    }
    _append_json_line(checkpoint_dir / "train_log.jsonl", entry)
    bar.set_postfix(loss=entry["loss"], acc=entry["acceptance_t1"][0])


def distill(
    target,
    data_dir,
    checkpoint_dir,
    save_to,
    settings: DistillSettings = DistillSettings(),
    extra_record: dict | None = None,
    progress: bool = True,
    drafting: dict | None = None,
) -> Path:
    """Train an EagleDraft for ``target`` on the collection in ``data_dir`` (or on several: a list of collections,
    e.g. a second one on new prompts); save it (Hub format, card, record) in ``save_to`` and return that path.
    Resumes from the newest checkpoint in ``checkpoint_dir``. ``drafting``: the knobs the saved draft's generation
    config carries, which ``generate`` reads when the call passes none (default :data:`DEFAULT_DRAFTING`)."""
    from tqdm.auto import tqdm

    started = time.time()
    if not isinstance(settings, DistillSettings):
        raise TypeError(f"`settings` must be a DistillSettings, got {type(settings).__name__}.")
    data_dirs = [Path(d) for d in data_dir] if isinstance(data_dir, (list, tuple)) else [Path(data_dir)]
    if not data_dirs:
        raise ValueError("`data_dir` is an empty list: name at least one collection to distil on.")
    drafting = check_drafting(DEFAULT_DRAFTING if drafting is None else drafting)
    checkpoint_dir = Path(checkpoint_dir)
    for directory in data_dirs:
        save_to = check_save_to(save_to, directory, checkpoint_dir)
    processes = Processes.current()  # several under `accelerate launch`
    sequences = [sequence for directory in data_dirs for sequence in load_sequences(directory)]
    held_out, training = _split(sequences, settings, ", ".join(map(str, data_dirs)))
    run = {"settings": asdict(settings), "num_sequences": len(sequences), "data_manifest": _manifests(data_dirs)}
    run["unrolling"] = UNROLLING
    with processes.main_first():  # the main process claims the directory; the others check the claim
        if processes.is_main:
            _refuse_earlier_unrolling(checkpoint_dir / "run.json")
            _fill_new_settings(checkpoint_dir / "run.json")
        claim_directory(checkpoint_dir, "run.json", run, "checkpoints of another run")
    draft = _new_draft(target, training, settings)
    _check_features(draft, sequences, data_dirs, target.config.get_text_config().num_hidden_layers)
    id_to_draft = _id_to_draft(draft, target.config.get_text_config().vocab_size, target.device)
    steps_per_epoch = math.ceil(len(training) / settings.batch_size)
    total_steps = steps_per_epoch * settings.epochs
    optimizer, scheduler = _optimizer(draft, settings, total_steps)
    step = _resume(checkpoint_dir, draft, optimizer, scheduler, total_steps)
    with processes.main_first():
        if step == 0 and processes.is_main:
            before = evaluate(draft, held_out, settings, id_to_draft, target.device)
            write_text_atomic(checkpoint_dir / "before.json", json.dumps(before) + "\n")
            logger.info("held out, untrained: %s", before)
    before = json.loads((checkpoint_dir / "before.json").read_text())
    bar = tqdm(
        total=total_steps, initial=step, desc="eagle distillation", disable=not progress or not processes.is_main
    )
    batches = {}  # epoch -> its batches
    while step < total_steps:
        epoch, index = divmod(step, steps_per_epoch)
        if epoch not in batches:
            batches = {epoch: _epoch_batches(training, settings, epoch)}
        loss, overlap, count = _train_step(
            draft, training, batches[epoch][index], settings, id_to_draft, optimizer, processes
        )
        scheduler.step()
        step += 1
        bar.update(1)
        if processes.is_main and (step % 10 == 0 or step == total_steps):
            _log_step(checkpoint_dir, bar, step, steps_per_epoch, loss, overlap, count, scheduler)
        if step % settings.save_steps == 0 or step == total_steps:
            with processes.main_first():  # written once, whole, before any process goes on
                if processes.is_main:
                    _save_checkpoint(checkpoint_dir, step, draft, optimizer, scheduler)
    bar.close()
    if not processes.is_main:  # the main process evaluates and saves the draft every process holds
        processes.wait()
        return save_to
    after = evaluate(draft, held_out, settings, id_to_draft, target.device)
    logger.info("held out, trained: %s", after)
    record = {
        "settings": asdict(settings),
        "held_out_before": before,
        "held_out_after": after,
        "num_sequences": {"train": len(training), "held_out": len(held_out)},
        "train_positions": sum(s.ids.shape[0] - s.prompt_length for s in training),
        "steps": total_steps,
        "distill_seconds_this_run": round(time.time() - started),
        **(extra_record or {}),
    }
    for name, value in drafting.items():
        setattr(draft.generation_config, name, value)
    save_draft(draft, save_to, record)
    processes.wait()
    return save_to
