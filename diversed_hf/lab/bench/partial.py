"""A resumable bench run's finished work (``diversed-hf bench --resume``): each method's quality records, kept as
soon as the method is done, so that an interrupted run started again redoes only the method it was in.

The records live in ``<output_dir>/partial/<task>/`` and go once the task's results are written. A saved method is
reused only when its **fingerprint** matches: the task's prompts and references, every setting that changes what a
method generates (:data:`UNTIMED_FIELDS` are left out: they change the timing pass or the report only), the
method itself (its verifier's settings, and a digest of any head's weights), the models' weights and dtypes, and the
number of processes (which shards the prompts). A run that changes any of them starts that method again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import shutil
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

__all__ = ["PartialRecords", "clear_partial", "module_digest", "partial_dir"]

#: BenchConfig fields that do not change a method's quality records
UNTIMED_FIELDS = frozenset(
    {"methods", "num_timing_prompts", "timing_batch_size", "repeats", "profile", "cost_tokens", "num_bootstrap"}
)


def partial_dir(output_dir: str | Path, task: str) -> Path:
    """Where a run writing to ``output_dir`` keeps ``task``'s finished methods while it lasts."""
    return Path(output_dir) / "partial" / task


def clear_partial(output_dir: str | Path, tasks) -> None:
    """The results of ``tasks`` are written: their saved records go (and the ``partial`` folder, once empty)."""
    for task in tasks:
        directory = partial_dir(output_dir, task)
        if directory.exists():
            shutil.rmtree(directory)
    parent = Path(output_dir) / "partial"
    if parent.is_dir() and not any(parent.iterdir()):
        parent.rmdir()


def module_digest(module: torch.nn.Module | None) -> str | None:
    """A digest of a module's parameters and buffers (names, dtypes, shapes and bytes)."""
    if module is None:
        return None
    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in sorted({**dict(module.named_parameters()), **dict(module.named_buffers())}.items()):
        data = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}:{data.dtype}:{tuple(data.shape)}".encode())
        digest.update(data.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _setting(value) -> str | None:
    """How a verifier's field enters the fingerprint: a module by its weights, anything else by its repr."""
    return module_digest(value) if isinstance(value, torch.nn.Module) else repr(value)


def _verifier_settings(verifier) -> dict | str | None:
    if verifier is None:
        return None
    if dataclasses.is_dataclass(verifier):
        return {f.name: _setting(getattr(verifier, f.name)) for f in dataclasses.fields(verifier)}
    return repr(verifier)


class PartialRecords:
    """The saved quality records of one task's methods (see the module docstring).

    ``directory`` ``None`` keeps nothing; otherwise what an earlier, interrupted run with the same settings kept
    there is reused. ``models`` maps a role ("target", "draft", ...) to its model (or ``None``).
    """

    def __init__(self, directory: str | Path | None, *, task, config, models: dict, num_processes: int):
        self.directory = Path(directory) if directory is not None else None
        if self.directory is None:
            return
        settings = {k: v for k, v in dataclasses.asdict(config).items() if k not in UNTIMED_FIELDS}
        self._common = {
            "task": task.name,
            "prompts": hashlib.sha256(json.dumps([task.prompts, task.references], default=repr).encode()).hexdigest(),
            "settings": settings,
            "models": {
                role: None if model is None else [module_digest(model), str(model.dtype)]
                for role, model in models.items()
            },
            "num_processes": num_processes,
        }

    def _fingerprint(self, method) -> str:
        method_settings = {
            "name": method.name,
            "family": method.family,
            "param": method.param,
            "draft": method.draft,
            "head_task": method.head_task,
            "schedule": repr(method.schedule),
            "verifier": _verifier_settings(method.verifier),
        }
        text = json.dumps({**self._common, "method": method_settings}, sort_keys=True, default=repr)
        return hashlib.sha256(text.encode()).hexdigest()

    def _path(self, method) -> Path:
        slug = re.sub(r"[^A-Za-z0-9._=-]+", "_", method.name)
        return self.directory / f"{slug}-{hashlib.sha256(method.name.encode()).hexdigest()[:8]}.pt"

    def load(self, method) -> list[dict] | None:
        """The records an earlier run saved for ``method`` with the same fingerprint, else ``None``."""
        if self.directory is None:
            return None
        path = self._path(method)
        if not path.is_file():
            return None
        saved = torch.load(path, weights_only=True)
        if saved.get("fingerprint") != self._fingerprint(method):
            logger.info("%s: saved records of %s were made with other settings; running it again", path, method.name)
            return None
        logger.info("%s: reusing the records an earlier run saved (%d)", method.name, len(saved["records"]))
        return saved["records"]

    def save(self, method, records: list[dict]) -> None:
        """Keep ``method``'s records (the main process writes; a write is atomic)."""
        if self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self._path(method)
        scratch = path.with_suffix(".tmp")
        torch.save({"fingerprint": self._fingerprint(method), "method": method.name, "records": records}, scratch)
        scratch.replace(path)
