"""Head-only checkpoints: the head's weights and config, and a record of the (target, draft) pair.

A head in a checkpoint is saved and loaded exactly as any head is, with ``DiversedHead.save_pretrained`` /
``DiversedHead.from_pretrained`` (``config.json``, ``model.safetensors``, ``README.md``; strict loading):
:func:`save_head`, :func:`load_head_state` and :func:`load_head` are thin wrappers for the trainer.
``diversed_pair.json`` records the pair a head was trained for: model ids, hidden sizes, the
shared vocabulary size and a fingerprint of each model's output embeddings (rounded to bf16, so the
dtype a model was loaded in does not change it). Resuming with another pair is refused.

**One run's checkpoints.** ``diversed_run.json`` records what makes the run (:func:`run_record`): the pair, the
head's config, the fields of :data:`RUN_FIELDS` (the rollout batch's layout and sampling, which a checkpoint's
rollout buffer was made with, the objective, the optimisation and the seed), the reward functions' names and the
number of training rows. A run resumes only from its own checkpoints: ``resume_from_checkpoint=True`` takes the
newest complete one whose record matches (a reused ``output_dir`` may hold another run's, skipped with a warning),
and a checkpoint passed by path with another record is refused, naming each field with both values.

**Complete checkpoints.** A ``checkpoint-<step>`` directory counts only when complete. The trainer writes
its own files first (``initial_head/``, ``diversed_run.json``, ``diversed_trainer_state.pt``), then
``transformers.Trainer`` writes the head, the optimizer, scheduler and RNG states and, last, ``trainer_state.json`` --
and only after that rotates older checkpoints away. So a checkpoint holding every file of
:data:`CHECKPOINT_FILES` is complete, and a kill at any point leaves either an incomplete newest
checkpoint (skipped with a warning by ``resume_from_checkpoint=True``, refused by name when passed
explicitly) beside the previous complete one, or a complete one.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import os
import re
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch

from ..common.pairs import hidden_size_of, model_id_of
from ..heads.head import DiversedHead, DiversedHeadConfig

logger = logging.getLogger(__name__)

__all__ = [
    "CHECKPOINT_FILES",
    "PAIR_FILE",
    "RUN_FIELDS",
    "RUN_FILE",
    "check_pair",
    "check_run",
    "check_writable",
    "complete_checkpoints",
    "load_head",
    "load_checkpoint_heads",
    "load_head_state",
    "loop_state_path",
    "missing_checkpoint_files",
    "model_fingerprint",
    "newest_own_checkpoint",
    "pair_record",
    "read_loop_state",
    "read_run",
    "resolve_resume",
    "run_differences",
    "run_record",
    "save_head",
]

PAIR_FILE = "diversed_pair.json"
RUN_FILE = "diversed_run.json"
TRAINER_EXTRA_STATE = "diversed_trainer_state.pt"
REF_HEAD_DIR = "initial_head"
TRAINER_STATE_FILE = "trainer_state.json"  # transformers writes it last
#: every file a complete checkpoint holds, in the order they are written
CHECKPOINT_FILES = (
    f"{REF_HEAD_DIR}/config.json",
    f"{REF_HEAD_DIR}/model.safetensors",
    RUN_FILE,
    TRAINER_EXTRA_STATE,
    "config.json",
    "model.safetensors",
    PAIR_FILE,
    TRAINER_STATE_FILE,
)
_CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")
#: DiversedConfig fields a run is made of; a checkpoint resumes only into a run with the same values. First the
#: rollout batch (its layout and how it was sampled: a checkpoint's buffer is replayed), then the objective, the
#: optimisation and the seed. Not in it: how long to train, logging, saving, evaluation, output and hardware.
RUN_FIELDS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "steps_per_generation",
    "num_generations",
    "num_iterations",
    "max_completion_length",
    "temperature",
    "top_k",
    "top_p",
    "shuffle_dataset",
    "lambda_acceptance",
    "use_group_baseline",
    "beta",
    "kl_estimator",
    "epsilon",
    "epsilon_high",
    "reward_weights",
    "learning_rate",
    "lr_scheduler_type",
    "warmup_steps",
    "weight_decay",
    "optim",
    "max_grad_norm",
    "seed",
)
_MOVING_IDS = ("target_model_id", "draft_model_id")  # paths or Hub ids that move; models compare by fingerprint


def missing_checkpoint_files(checkpoint_dir: str | os.PathLike) -> list[str]:
    """The files of :data:`CHECKPOINT_FILES` that ``checkpoint_dir`` lacks (empty: the checkpoint is complete)."""
    return [name for name in CHECKPOINT_FILES if not Path(checkpoint_dir, name).is_file()]


def complete_checkpoints(output_dir: str | os.PathLike) -> tuple[list[Path], list[Path]]:
    """``(complete, incomplete)`` ``checkpoint-<step>`` directories of ``output_dir``, each sorted by step."""
    found = sorted(
        (int(match.group(1)), path)
        for path in (Path(output_dir).iterdir() if Path(output_dir).is_dir() else ())
        if path.is_dir() and (match := _CHECKPOINT_NAME.match(path.name))
    )
    complete = [path for _, path in found if not missing_checkpoint_files(path)]
    incomplete = [path for _, path in found if missing_checkpoint_files(path)]
    return complete, incomplete


def model_fingerprint(model) -> str:
    """sha256 of the first 4096 output-embedding values, rounded to bf16: tells two models apart cheaply. A model
    without output embeddings of its own (an EagleDraft, which uses the target's) is told apart by its first own
    parameter; a view of another model by its ``fingerprint_extra`` too (an early-exit draft: its layer count); a
    drafter without weights (prompt lookup) by its ``fingerprint_extra`` alone."""
    output = model.get_output_embeddings()
    weight = output.weight if output is not None else next(model.parameters(), None)
    digest = hashlib.sha256()
    if weight is not None:
        values = weight.detach().reshape(-1)[:4096].to(device="cpu", dtype=torch.bfloat16).to(torch.float32)
        digest.update(values.numpy().tobytes())
    digest.update(str(getattr(model, "fingerprint_extra", "")).encode())  # a view of another model (early exit)
    return digest.hexdigest()[:16]


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
        if key in _MOVING_IDS:
            continue  # ids are paths or Hub ids that move; the models themselves are compared by fingerprint
        if then != now:
            differences.append(f"{key}: checkpoint {then!r}, now {now!r}")
    if differences:
        raise ValueError(
            f"The checkpoint {where} was trained for another (target, draft) pair: "
            + "; ".join(differences)
            + ". Resume with the models it was trained with, or start a new run in another `output_dir`."
        )


def run_record(args, pair: dict, head_config: dict, reward_names: list[str], train_rows: int | None) -> dict:
    """What makes a run (see the module docstring), as it reads back from :data:`RUN_FILE`."""
    config = {name: getattr(args, name) for name in RUN_FIELDS}
    record = {
        "config": {name: value.value if isinstance(value, enum.Enum) else value for name, value in config.items()},
        "head": {key: value for key, value in head_config.items() if key not in _MOVING_IDS},
        "pair": pair,
        "reward_funcs": list(reward_names),
        "train_rows": train_rows,
    }
    return json.loads(json.dumps(record, default=str))


def read_run(checkpoint_dir: str | os.PathLike) -> dict | None:
    """The run record of a checkpoint, or None when it has none (not a complete DiversedTrainer checkpoint)."""
    path = Path(checkpoint_dir, RUN_FILE)
    return json.loads(path.read_text()) if path.is_file() else None


def run_differences(recorded: dict, current: dict) -> list[str]:
    """``"<field>: checkpoint <then>, now <now>"`` for every field in which two run records differ (config fields by
    their name, the others as ``head.<key>``, ``pair.<key>``, ``reward_funcs``, ``train_rows``)."""
    differences = []
    for section in ("config", "head", "pair", "reward_funcs", "train_rows"):
        then, now = recorded.get(section), current.get(section)
        if not isinstance(now, dict):
            if then != now:
                differences.append(f"{section}: checkpoint {then!r}, now {now!r}")
            continue
        then = then if isinstance(then, dict) else {}
        for key in sorted(now.keys() | then.keys()):
            if key not in _MOVING_IDS and then.get(key) != now.get(key):
                name = key if section == "config" else f"{section}.{key}"
                differences.append(f"{name}: checkpoint {then.get(key)!r}, now {now.get(key)!r}")
    return differences


def check_run(recorded: dict | None, current: dict, where: str) -> None:
    """Raise unless the checkpoint ``where`` (run record ``recorded``) belongs to the run ``current`` describes."""
    if recorded is None:
        raise ValueError(
            f"The checkpoint {where} has no {RUN_FILE}: it is not a complete DiversedTrainer checkpoint. Pass a "
            "checkpoint-<step> directory written by DiversedTrainer."
        )
    check_pair(recorded.get("pair") or {}, current["pair"], where)
    differences = run_differences(recorded, current)
    if differences:
        raise ValueError(
            f"The checkpoint {where} belongs to another run: " + "; ".join(differences) + ". Its rollout buffer, "
            "optimizer and step belong to that run. Resume with the settings it was written with, or start a new run "
            "in another `output_dir` (a new run may start from its head: `DiversedHead.from_pretrained(checkpoint)`)."
        )


def newest_own_checkpoint(output_dir: str | os.PathLike, run: dict) -> str:
    """The newest complete checkpoint of ``output_dir`` written by the run ``run`` describes (``resume_from_checkpoint=
    True``); newer incomplete ones and other runs' are skipped with a warning, none at all is an error."""
    complete, incomplete = complete_checkpoints(output_dir)
    newest = int(complete[-1].name.rpartition("-")[2]) if complete else -1
    skipped = [str(path) for path in incomplete if int(path.name.rpartition("-")[2]) > newest]
    if skipped:
        logger.warning("Skipping incomplete checkpoints (the run was interrupted while saving them): %s", skipped)
    if not complete:
        raise ValueError(
            f"`resume_from_checkpoint=True` but {str(output_dir)!r} holds no complete checkpoint"
            + (f" (incomplete: {skipped})" if skipped else "")
            + ". Start without `resume_from_checkpoint`, or pass a checkpoint directory."
        )
    others = []
    for path in reversed(complete):
        differences = run_differences(read_run(path) or {}, run)
        if not differences:
            if others:
                logger.warning(
                    "Skipping newer checkpoints of another run in %s: %s",
                    output_dir,
                    "; ".join(f"{name} ({', '.join(diff[:3])})" for name, diff in others),
                )
            return str(path)
        others.append((path.name, differences))
    raise ValueError(
        f"`resume_from_checkpoint=True` but no checkpoint in {str(output_dir)!r} belongs to this run: the newest, "
        f"{complete[-1].name}, differs in " + "; ".join(others[0][1]) + ". Resume with the settings it was written "
        "with, or start this run in another `output_dir`."
    )


def save_head(head: DiversedHead, directory: str | os.PathLike) -> None:
    """``head.save_pretrained(directory)``: a checkpoint's head is a Hub-ready head repo (it leaves the RNG alone)."""
    if not isinstance(head, DiversedHead):
        raise TypeError(f"`head` must be a DiversedHead, got {type(head).__name__}; pass the trainer's head module.")
    head.save_pretrained(directory)


def load_head_state(directory: str | os.PathLike) -> tuple[DiversedHeadConfig, dict[str, torch.Tensor]]:
    """(config, state dict) of the head saved in ``directory``, loaded strictly with
    ``DiversedHead.from_pretrained``."""
    head = load_head(directory)
    return head.config, head.state_dict()


def load_head(directory: str | os.PathLike) -> DiversedHead:
    """``DiversedHead.from_pretrained(directory)``: the head of a checkpoint (strict, in eval mode)."""
    return DiversedHead.from_pretrained(directory)


def check_writable(directory: str) -> None:
    """Fail before training when ``directory`` (``output_dir``) cannot be created or written."""
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".write_test_"):
            pass
    except OSError as error:
        raise ValueError(
            f"`output_dir` {directory!r} is not writable ({error.strerror or error}); checkpoints and the trained "
            "head go there. Pass a directory you can write to."
        ) from error


def resolve_resume(resume_from_checkpoint: str | bool | None, output_dir: str, run: dict) -> str | None:
    """The checkpoint ``Trainer.train(resume_from_checkpoint=...)`` resumes from, checked, or None for a fresh start.

    ``True`` takes the newest complete checkpoint of ``output_dir`` written by ``run`` (:func:`newest_own_checkpoint`);
    an explicit checkpoint that is incomplete, or another run's, is refused naming the missing file or the fields that
    differ.
    """
    if resume_from_checkpoint in (None, False):
        return None
    if resume_from_checkpoint is True:
        return newest_own_checkpoint(output_dir, run)
    where = str(resume_from_checkpoint)
    if Path(where).is_dir():
        missing = missing_checkpoint_files(where)
        if missing == [RUN_FILE]:
            raise ValueError(
                f"`resume_from_checkpoint` {where!r} has no {RUN_FILE}: it was written by an older diversed_hf, "
                "which did not record its run. Start a new run from its head "
                "(`DiversedHead.from_pretrained(checkpoint)`), or resume with the release that wrote it."
            )
        if missing:
            raise ValueError(
                f"`resume_from_checkpoint` {where!r} is incomplete: `{missing[0]}` is missing (the run was "
                "interrupted while saving it). Resume from an earlier checkpoint, or pass "
                "`resume_from_checkpoint=True` to take the newest complete one."
            )
        check_run(read_run(where), run, where)
    return where


def load_checkpoint_heads(checkpoint_dir: str, pair: dict, head: DiversedHead, ref_head: DiversedHead) -> None:
    """Load a checkpoint's head into ``head`` and its initial head into ``ref_head`` (strictly), refusing a checkpoint
    of another pair or of a head with another config."""
    pair_path = Path(checkpoint_dir, PAIR_FILE)
    if not pair_path.is_file():
        raise ValueError(
            f"`resume_from_checkpoint` {str(checkpoint_dir)!r} has no {PAIR_FILE}: it is not a DiversedTrainer "
            "checkpoint. Pass a checkpoint-<step> directory written by DiversedTrainer."
        )
    check_pair(json.loads(pair_path.read_text()), pair, str(checkpoint_dir))
    config, state = load_head_state(checkpoint_dir)
    ignored = ("target_model_id", "draft_model_id")
    saved = {k: v for k, v in asdict(config).items() if k not in ignored}
    if saved != {k: v for k, v in asdict(head.config).items() if k not in ignored}:
        raise ValueError(
            f"The head in {checkpoint_dir} has config {asdict(config)}, but the head being trained has "
            f"{asdict(head.config)}. Resume with the same head architecture and options."
        )
    head.load_state_dict(state, strict=True)
    ref_dir = Path(checkpoint_dir, REF_HEAD_DIR)
    if ref_dir.is_dir():
        _, ref_state = load_head_state(ref_dir)
        ref_head.load_state_dict(ref_state, strict=True)


def loop_state_path(checkpoint_dir: str, process_index: int) -> str:
    """Process 0's loop state is ``TRAINER_EXTRA_STATE``; process ``i > 0`` of several writes its own file."""
    if process_index == 0:
        return os.path.join(checkpoint_dir, TRAINER_EXTRA_STATE)
    stem, suffix = os.path.splitext(TRAINER_EXTRA_STATE)
    return os.path.join(checkpoint_dir, f"{stem}_{process_index}{suffix}")


def read_loop_state(checkpoint_dir: str, process_index: int, num_processes: int) -> dict | None:
    """This process's rollout-loop state in a checkpoint (``step``, ``buffered_inputs``, ``rollout_generator``,
    ``total_train_tokens``), on the CPU; None without one; only ``total_train_tokens`` when another number of
    processes wrote it (every process decides alike, from process 0's file, and all generate afresh together)."""
    path = os.path.join(checkpoint_dir, TRAINER_EXTRA_STATE)
    if not os.path.isfile(path):
        return None
    extra = torch.load(path, weights_only=False, map_location="cpu")
    saved_processes = extra.get("num_processes", 1)
    if saved_processes != num_processes:
        logger.warning(
            "The checkpoint %s was written by %d process(es), this run has %d: its rollout buffer and sampling RNG "
            "are dropped (a fresh rollout batch is generated); the head, optimizer, scheduler and global step are "
            "restored.",
            checkpoint_dir,
            saved_processes,
            num_processes,
        )
        return {"total_train_tokens": extra["total_train_tokens"]}
    if process_index > 0:
        own = loop_state_path(checkpoint_dir, process_index)
        if not os.path.isfile(own):
            raise ValueError(
                f"`resume_from_checkpoint` {str(checkpoint_dir)!r} lacks {os.path.basename(own)}, the rollout state of "
                f"process {process_index} (the run was interrupted while saving it). Resume from an earlier checkpoint."
            )
        extra = {
            **torch.load(own, weights_only=False, map_location="cpu"),
            "total_train_tokens": extra["total_train_tokens"],
        }
    return extra
