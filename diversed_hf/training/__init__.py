"""Training DIVERSED heads (SPEC §4): ``DiversedConfig`` / ``DiversedTrainer``, a TRL ``GRPOTrainer`` subclass.

Needs the ``train`` extra (TRL): ``pip install "diversed_hf[train]"``. ``import diversed_hf`` never imports
this package.
"""

try:
    import trl  # noqa: F401
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "diversed_hf.training needs TRL: install the training extra with `pip install \"diversed_hf[train]\"`."
    ) from error

from . import objective
from .checkpoint import load_head, save_head
from .config import DiversedConfig
from .trainer import DiversedTrainer

__all__ = ["DiversedConfig", "DiversedTrainer", "load_head", "objective", "save_head"]
