"""Old import paths of modules that moved, kept for one release with a ``FutureWarning``.

The lab's modules moved under :mod:`diversed_hf.lab` and the trainer's rollout math under :mod:`diversed_hf.training`
(docs/architecture.md, "Layers"). ``import diversed_hf.tasks`` (and every old name below, submodules included) still
works: this finder, which ``diversed_hf/__init__.py`` puts first on ``sys.meta_path``, answers only for those names
and hands back the module at its new place, so old and new names are one module object.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings

#: the release that removes the old names
REMOVED_IN = "0.3.0"

#: old dotted name -> new one (each old name's submodules move with it)
MOVED = {
    "diversed_hf.tasks": "diversed_hf.lab.tasks",
    "diversed_hf.bench": "diversed_hf.lab.bench",
    "diversed_hf.cli_utils": "diversed_hf.lab.cli_utils",
    "diversed_hf.demo": "diversed_hf.cli.demo",
    "diversed_hf.hub_cli": "diversed_hf.cli.hub",
    "diversed_hf.throughput": "diversed_hf.cli.throughput",
    "diversed_hf.rollout": "diversed_hf.training.rollout",
    # 0.2.0: the core in rooms by concern (docs/architecture.md, "Rooms")
    "diversed_hf.ops": "diversed_hf.verifiers.ops",
    "diversed_hf.checks": "diversed_hf.verifiers.checks",
    "diversed_hf.theory": "diversed_hf.verifiers.theory",
    "diversed_hf.features": "diversed_hf.verifiers.distribution_features",
    "diversed_hf.block": "diversed_hf.verifiers.block",
    "diversed_hf.candidates": "diversed_hf.drafting.candidates",
    "diversed_hf.feature_candidates": "diversed_hf.drafting.feature_candidates",
    "diversed_hf.drafters": "diversed_hf.drafting.drafters",
    "diversed_hf.eagle": "diversed_hf.drafting.eagle",
    "diversed_hf.eagle_export": "diversed_hf.drafting.eagle_export",
    "diversed_hf.mtp": "diversed_hf.drafting.mtp",
    "diversed_hf.dflash": "diversed_hf.drafting.dflash",
    "diversed_hf.kv_sharing": "diversed_hf.drafting.kv_sharing",
    "diversed_hf.translated": "diversed_hf.drafting.translated",
    "diversed_hf.pairs": "diversed_hf.common.pairs",
    "diversed_hf.draft_length": "diversed_hf.drafting.length.policy",
    "diversed_hf.policies": "diversed_hf.drafting.length.optimal",
    "diversed_hf.costs": "diversed_hf.drafting.length.costs",
    "diversed_hf.loop": "diversed_hf.generation.loop",
    "diversed_hf.processors": "diversed_hf.generation.processors",
    "diversed_hf.outputs": "diversed_hf.generation.outputs",
    "diversed_hf.padding": "diversed_hf.generation.padding",
    "diversed_hf.output_scores": "diversed_hf.generation.output_scores",
    "diversed_hf.round_profile": "diversed_hf.common.round_profile",
    "diversed_hf.head": "diversed_hf.heads.head",
    "diversed_hf.head_config": "diversed_hf.heads.config",
    "diversed_hf.hub": "diversed_hf.heads.hub",
    "diversed_hf.official": "diversed_hf.heads.official",
    "diversed_hf.cards": "diversed_hf.heads.cards",
    "diversed_hf.card_results": "diversed_hf.heads.card_results",
    "diversed_hf.metrics": "diversed_hf.heads.metrics",
    # the leaves below drafting, generation, heads and training (docs/architecture.md, "Rooms")
    "diversed_hf.drafting.pairs": "diversed_hf.common.pairs",
    "diversed_hf.generation.round_profile": "diversed_hf.common.round_profile",
    # the commands above the testbed (docs/architecture.md, "Layers")
    "diversed_hf.lab.demo": "diversed_hf.cli.demo",
    "diversed_hf.lab.hub_cli": "diversed_hf.cli.hub",
    "diversed_hf.lab.throughput": "diversed_hf.cli.throughput",
    "diversed_hf.lab.evaluation": "diversed_hf.cli.evaluation",
    "diversed_hf.lab.bench.cli": "diversed_hf.cli.bench",
}


def new_name(name: str) -> str | None:
    """Where module ``name`` lives now, or None when it did not move."""
    for old, new in MOVED.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old) :]
    return None


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves a moved module's old name to the module at its new name."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec] = {}

    def find_spec(self, fullname, path=None, target=None):
        if new_name(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new = new_name(spec.name)
        warnings.warn(
            f"`{spec.name}` moved to `{new}`: import it from there (the old name goes in release {REMOVED_IN}; "
            "CHANGELOG.md lists every moved name).",
            FutureWarning,
            stacklevel=2,
        )
        module = importlib.import_module(new)
        # the import system writes the old name's spec over the module's own after this returns; keep the real one
        # so that exec_module can put it back (importlib.reload and pickling read __spec__.name)
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module) -> None:  # the module at its new name is already executed
        module.__spec__ = self._specs.pop(module.__spec__.name, module.__spec__)


def install() -> None:
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
