"""How rollout batches are drawn and reused: prompts grouped ``G`` at a time, one rollout batch per
``steps_per_generation``.

The same batching as TRL's ``GRPOTrainer`` (its ``RepeatSampler`` and rollout buffer, which TRL does not export, so
they are written out here, a few lines each, and pinned by tests/test_training.py's order checks):

* :class:`GroupedSampler` draws ``prompts_per_batch`` prompts at a time (one permutation of the dataset per epoch,
  seeded) and yields each ``G`` times in a row (the group of a prompt), and the whole draw ``repeat_count`` times
  (``num_iterations * steps_per_generation``: once per micro-step that trains on it). Every process builds the same
  sampler from the same seed; accelerate hands each process its contiguous slice of every batch, so a group may span
  processes and no prompt is sampled twice per draw.
* :class:`RolloutBuffer` turns the first of those ``repeat_count`` dataloader batches into one rollout batch,
  shuffles its rows (with torch's global RNG, which ``Trainer`` checkpoints), splits it into ``steps_per_generation``
  micro-batches, and serves them for ``num_iterations`` passes before the next rollout.
"""

from __future__ import annotations

import functools
from typing import Callable, Sized

import torch
from torch.utils.data import DataLoader, Sampler

__all__ = ["GroupedSampler", "RolloutBuffer", "callable_name", "rows_collator", "rows_loader"]


def callable_name(func: Callable) -> str:
    """The name TRL gives a reward function in its logs: a function's ``__name__`` (through ``functools.partial``),
    else the class name of a callable object."""
    while isinstance(func, functools.partial):
        func = func.func
    return getattr(func, "__name__", type(func).__name__)


def rows_collator(rows: list[dict]) -> list[dict]:
    """Dataset rows reach the rollout as they are (a list of dicts): prompts are tokenized there."""
    return rows


def rows_loader(dataset, sampler: Sampler, batch_size: int, args, accelerator) -> DataLoader:
    """A loader of dataset rows (uncollated) with ``args``' dataloader options (a ``TrainingArguments``), sharded over
    processes by ``accelerator`` as ``Trainer``'s loaders are: each process gets its contiguous slice of each batch."""
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        collate_fn=rows_collator,
        drop_last=args.dataloader_drop_last,
        num_workers=args.dataloader_num_workers,
        pin_memory=args.dataloader_pin_memory,
        persistent_workers=args.dataloader_persistent_workers and args.dataloader_num_workers > 0,
        prefetch_factor=args.dataloader_prefetch_factor,
    )
    return accelerator.prepare(loader)


class GroupedSampler(Sampler):
    """Yield dataset indices in groups of ``group_size`` copies, ``prompts_per_batch`` prompts per draw.

    >>> list(GroupedSampler(range(4), group_size=2, prompts_per_batch=2, repeat_count=2, shuffle=False))
    [0, 0, 1, 1, 0, 0, 1, 1, 2, 2, 3, 3, 2, 2, 3, 3]

    A trailing draw of fewer than ``prompts_per_batch`` prompts is dropped.
    """

    def __init__(
        self,
        data_source: Sized,
        group_size: int,
        prompts_per_batch: int = 1,
        repeat_count: int = 1,
        shuffle: bool = True,
        seed: int | None = None,
    ):
        self.num_samples = len(data_source)
        self.group_size = group_size
        self.prompts_per_batch = prompts_per_batch
        self.repeat_count = repeat_count
        self.shuffle = shuffle
        self.generator = torch.Generator()
        if seed is not None:
            self.generator.manual_seed(seed)

    def __iter__(self):
        if self.shuffle:
            order = torch.randperm(self.num_samples, generator=self.generator).tolist()
        else:
            order = list(range(self.num_samples))
        size = self.prompts_per_batch
        for start in range(0, self.num_samples - size + 1, size):
            for _ in range(self.repeat_count):
                for index in order[start : start + size]:
                    yield from [index] * self.group_size

    def __len__(self) -> int:
        draws = self.num_samples // self.prompts_per_batch
        return draws * self.prompts_per_batch * self.group_size * self.repeat_count


class RolloutBuffer:
    """One rollout batch, split into ``steps_per_generation`` micro-batches and reused for ``num_iterations`` passes.

    ``step`` counts micro-steps (gradient-accumulation steps included); a new rollout is made every
    ``steps_per_generation * num_iterations`` of them, or when the buffer is empty (a run resumed without one).
    """

    def __init__(self, steps_per_generation: int, num_iterations: int):
        self.steps_per_generation = steps_per_generation
        self.num_iterations = num_iterations
        self.step = 0
        self.batches: list[dict[str, torch.Tensor]] | None = None

    def micro_batch(self, rows: list[dict], generate: Callable[[list[dict]], dict]) -> dict[str, torch.Tensor]:
        """The micro-batch of this step, calling ``generate(rows)`` first when a new rollout batch is due."""
        if self.step % (self.steps_per_generation * self.num_iterations) == 0 or self.batches is None:
            batch = shuffle_rows(generate(rows))
            self.batches = split_rows(batch, self.steps_per_generation)
        return self.batches[self.step % self.steps_per_generation]

    def state(self) -> dict:
        """What a checkpoint keeps (the keys are those checkpoints have always had)."""
        return {"step": self.step, "buffered_inputs": self.batches}

    def load_state(self, state: dict) -> None:
        self.step = state["step"]
        self.batches = state["buffered_inputs"]


def shuffle_rows(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Permute the rows of every tensor of ``batch`` alike (``torch.randperm`` on torch's global generator)."""
    num_rows = len(next(iter(batch.values())))
    permutation = torch.randperm(num_rows)  # (B,)
    return {key: value[permutation] if value.ndim else value for key, value in batch.items()}


def split_rows(batch: dict[str, torch.Tensor], num_chunks: int) -> list[dict[str, torch.Tensor]]:
    """``num_chunks`` consecutive row slices of equal size of every tensor of ``batch``."""
    size = len(next(iter(batch.values()))) // num_chunks
    return [
        {key: value[i * size : (i + 1) * size] if value.ndim else value for key, value in batch.items()}
        for i in range(num_chunks)
    ]
