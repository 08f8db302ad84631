"""diversed_hf: relaxed speculative decoding (DIVERSED and baselines) for Hugging Face Transformers.

The public names below load on first use (PEP 562), so that ``import diversed_hf`` and ``diversed-hf --help`` do not
pay for torch and transformers; :mod:`diversed_hf.compat` checks the transformers version when it loads.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from . import _moved
from ._version import __version__ as __version__

_moved.install()  # old import paths of moved modules (diversed_hf.tasks, diversed_hf.bench, ...), for a release

#: public name -> the submodule that defines it
_EXPORTS = {
    "BlockVerifier": "verifiers.block",
    "DiversedCandidateGenerator": "drafting.candidates",
    "DraftCosts": "drafting.length.costs",
    "EagleDraft": "drafting.eagle",
    "EagleDraftConfig": "drafting.eagle",
    "EarlyExitDraft": "drafting.drafters",
    "FeatureCandidateGenerator": "drafting.feature_candidates",
    "MtpDraft": "drafting.mtp",
    "clear_draft_statistics": "drafting.length.optimal",
    "measured_draft_costs": "drafting.length.optimal",
    "DiversedGenerationMixin": "generation.mixin",
    "DiversedGenerateDecoderOnlyOutput": "generation.outputs",
    "DiversedHead": "heads.head",
    "DiversedHeadConfig": "heads.config",
    "JudgeHead": "heads.judge",
    "ExactVerifier": "verifiers.rules",
    "FuzzyVerifier": "verifiers.relaxed",
    "TopKRelaxedVerifier": "verifiers.relaxed",
    "JudgeVerifier": "verifiers.relaxed",
    "HeadVerifier": "verifiers.rules",
    "LenientVerifier": "verifiers.rules",
    "SpecCascadeVerifier": "verifiers.rules",
    "SpeculationStats": "generation.outputs",
    "StaticEnsembleVerifier": "verifiers.rules",
    "TypicalAcceptanceVerifier": "verifiers.rules",
    "Verifier": "verifiers.rules",
    "check_transformers_version": "compat",
    "enable_diversed": "generation.mixin",
    "speculative_decode": "generation.loop",
}

__all__ = [
    "BlockVerifier",
    "DiversedCandidateGenerator",
    "DiversedGenerateDecoderOnlyOutput",
    "DiversedGenerationMixin",
    "DiversedHead",
    "DiversedHeadConfig",
    "DraftCosts",
    "EagleDraft",
    "EagleDraftConfig",
    "EarlyExitDraft",
    "ExactVerifier",
    "FeatureCandidateGenerator",
    "FuzzyVerifier",
    "HeadVerifier",
    "JudgeHead",
    "JudgeVerifier",
    "LenientVerifier",
    "MtpDraft",
    "SpecCascadeVerifier",
    "SpeculationStats",
    "StaticEnsembleVerifier",
    "TopKRelaxedVerifier",
    "TypicalAcceptanceVerifier",
    "Verifier",
    "clear_draft_statistics",
    "enable_diversed",
    "measured_draft_costs",
    "speculative_decode",
    "verifiers",
]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    elif name == "verifiers":
        value = importlib.import_module(".verifiers", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | {"verifiers"})


if TYPE_CHECKING:  # what static tools and IDEs see
    from . import verifiers
    from .compat import check_transformers_version  # noqa: F401 (public, not in __all__)
    from .drafting.candidates import DiversedCandidateGenerator
    from .drafting.drafters import EarlyExitDraft
    from .drafting.eagle import EagleDraft, EagleDraftConfig
    from .drafting.feature_candidates import FeatureCandidateGenerator
    from .drafting.length.costs import DraftCosts
    from .drafting.length.optimal import clear_draft_statistics, measured_draft_costs
    from .drafting.mtp import MtpDraft
    from .generation import DiversedGenerationMixin, enable_diversed, speculative_decode
    from .generation.outputs import DiversedGenerateDecoderOnlyOutput, SpeculationStats
    from .heads.head import DiversedHead, DiversedHeadConfig
    from .heads.judge import JudgeHead
    from .verifiers.block import BlockVerifier
    from .verifiers.relaxed import FuzzyVerifier, JudgeVerifier, TopKRelaxedVerifier
    from .verifiers.rules import (
        ExactVerifier,
        HeadVerifier,
        LenientVerifier,
        SpecCascadeVerifier,
        StaticEnsembleVerifier,
        TypicalAcceptanceVerifier,
        Verifier,
    )
