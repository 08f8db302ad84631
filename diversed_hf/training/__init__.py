"""Training: DIVERSED heads (docs/method.md §5: ``DiversedConfig``, a TRL ``GRPOConfig``, and ``DiversedTrainer``),
EagleDraft distillation (``eagle_data``, ``eagle_unroll``, ``eagle_distill``, ``eagle_save``, ``eagle_card``,
data-parallel under ``accelerate launch``: ``data_parallel``) and the tuned target's card.

Each name loads its module on first use, so distilling an EagleDraft or loading a head checkpoint never imports TRL;
``DiversedConfig`` / ``DiversedTrainer`` need the ``train`` extra (TRL, in the tested range
``diversed_hf.compat.TESTED_TRL``, checked when they load): ``pip install "diversed_hf[train]"``. ``import diversed_hf``
never imports this package.
"""

import importlib

#: public name -> the submodule that defines it
_EXPORTS = {
    "DiversedConfig": "config",
    "DiversedTrainer": "trainer",
    "load_head": "checkpoint",
    "save_head": "checkpoint",
}

__all__ = ["DiversedConfig", "DiversedTrainer", "load_head", "objective", "save_head"]


def __getattr__(name: str):
    if name == "objective":
        return importlib.import_module(f"{__name__}.objective")
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
