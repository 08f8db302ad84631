"""The processes of a data-parallel run, as ``accelerate launch`` starts them (docs/feature_drafts.md, "Training on
several processes").

:class:`Processes` is accelerate's ``PartialState`` seen from a training loop that is not a ``transformers.Trainer``:
its rank and world size, a sum over processes, a barrier, and the main process's turn to write files. Without
``accelerate launch`` (or without accelerate) it is one process and every call is a no-op, so one code path serves
both. On a CPU the processes talk over gloo.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Processes"]


@dataclass(frozen=True)
class Processes:
    """``rank`` of ``world`` processes; ``state``: accelerate's ``PartialState`` when there are several."""

    rank: int = 0
    world: int = 1
    state: Any = None

    @classmethod
    def current(cls) -> Processes:
        """The processes this one belongs to: accelerate's, when ``accelerate launch`` started several (each on its
        own GPU, or over gloo on a machine without one); else one."""
        try:
            from accelerate import PartialState
        except ImportError:  # accelerate is the train extra's; without it there is one process
            return cls()
        # without a GPU, accelerate joins the launched processes only when asked for the CPU (gloo)
        state = PartialState(cpu=not torch.cuda.is_available())
        if state.num_processes <= 1:
            return cls()
        return cls(rank=state.process_index, world=state.num_processes, state=state)

    @property
    def device(self) -> torch.device:
        """This process's device: its GPU under ``accelerate launch`` on GPUs, else the first GPU or the CPU."""
        if self.state is not None:
            return torch.device(self.state.device)
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over the processes (the same on every one), as a new tensor on ``tensor``'s device (the
        reduction runs on this process's device: NCCL reduces GPU tensors only)."""
        if self.world == 1:
            return tensor.clone()
        total = tensor.detach().to(self.device, copy=True)
        torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.SUM)
        return total.to(tensor.device)

    def wait(self) -> None:
        """Every process waits here for the others."""
        if self.state is not None:
            self.state.wait_for_everyone()

    @contextlib.contextmanager
    def main_first(self):
        """The main process runs the block (it writes files), then the others do (they read them)."""
        if not self.is_main:
            self.wait()
        yield
        if self.is_main:
            self.wait()

    def close(self) -> None:
        """Tear the process group down (gloo's threads would otherwise outlive the interpreter and abort it)."""
        if self.state is not None and torch.distributed.is_initialized():
            self.wait()
            torch.distributed.destroy_process_group()
