"""Old import paths of modules that moved, kept for one release with a ``FutureWarning``.

The lab's modules moved under :mod:`diversed_hf.lab` and the trainer's rollout math under :mod:`diversed_hf.training`
(docs/architecture.md, "Layers"). ``import diversed_hf.tasks`` (and every old name below, submodules included) still
works: this finder, which ``diversed_hf/__init__.py`` puts first on ``sys.meta_path``, answers only for those names
and hands back the module at its new place, so old and new names are one module object.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

#: old dotted name -> new one (each old name's submodules move with it)
MOVED = {
    "diversed_hf.tasks": "diversed_hf.lab.tasks",
    "diversed_hf.bench": "diversed_hf.lab.bench",
    "diversed_hf.cli_utils": "diversed_hf.lab.cli_utils",
    "diversed_hf.demo": "diversed_hf.lab.demo",
    "diversed_hf.hub_cli": "diversed_hf.lab.hub_cli",
    "diversed_hf.throughput": "diversed_hf.lab.throughput",
    "diversed_hf.rollout": "diversed_hf.training.rollout",
}


def new_name(name: str) -> str | None:
    """Where module ``name`` lives now, or None when it did not move."""
    for old, new in MOVED.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old) :]
    return None


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves a moved module's old name to the module at its new name."""

    def find_spec(self, fullname, path=None, target=None):
        if new_name(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new = new_name(spec.name)
        warnings.warn(
            f"`{spec.name}` moved to `{new}`: import it from there (the old name goes in the next release).",
            FutureWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module) -> None:  # the module at its new name is already executed
        pass


def install() -> None:
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
