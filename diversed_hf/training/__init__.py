"""Training DIVERSED heads (docs/method.md §5): ``DiversedConfig`` (a TRL ``GRPOConfig``) / ``DiversedTrainer``.

Needs the ``train`` extra (TRL, in the tested range ``diversed_hf.compat.TESTED_TRL``, checked on import):
``pip install "diversed_hf[train]"``. ``import diversed_hf`` never imports this package.
"""

try:
    import trl  # noqa: F401
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        'diversed_hf.training needs TRL: install the training extra with `pip install "diversed_hf[train]"`.'
    ) from error

from ..compat import check_trl_version

check_trl_version()

from . import objective  # noqa: E402
from .checkpoint import load_head, save_head  # noqa: E402
from .config import DiversedConfig  # noqa: E402
from .trainer import DiversedTrainer  # noqa: E402

__all__ = ["DiversedConfig", "DiversedTrainer", "load_head", "objective", "save_head"]
