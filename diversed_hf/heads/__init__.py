"""The heads room: the ensemble head, its files and its cards.

================= ============================================================================================
``head``          ``DiversedHead``: the network that picks ``w_t``; save, load and push through huggingface_hub
``config``        ``DiversedHeadConfig`` and the layers it describes
``hub``           Hub file plumbing: finding a head's files, offline handling, config digests, staged saves
``official``      reading checkpoints of the official DIVERSED code
``cards``         model cards rendered from ``templates/``, and ``card_results`` (the ``results.json`` schema)
``metrics``       the quality metrics' canonical names and labels
``judge``         ``JudgeHead``: judge decoding's classifier on the target's hidden state
================= ============================================================================================

The public names load on first use (docs/architecture.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import exports

__all__ = ["DiversedHead", "DiversedHeadConfig", "JudgeHead"]

__getattr__, __dir__ = exports(
    __name__, {"DiversedHead": ".head", "DiversedHeadConfig": ".config", "JudgeHead": ".judge"}
)

if TYPE_CHECKING:  # what static tools and IDEs see
    from .config import DiversedHeadConfig
    from .head import DiversedHead
    from .judge import JudgeHead
