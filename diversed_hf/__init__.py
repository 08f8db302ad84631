"""diversed_hf: relaxed speculative decoding (DIVERSED and baselines) for Hugging Face Transformers."""

from . import verifiers
from .candidates import DiversedCandidateGenerator
from .compat import check_transformers_version
from .eagle import EagleDraft, EagleDraftConfig
from .feature_candidates import FeatureCandidateGenerator
from .generation import DiversedGenerationMixin, enable_diversed, speculative_decode
from .head import DiversedHead, DiversedHeadConfig
from .outputs import DiversedGenerateDecoderOnlyOutput, SpeculationStats
from .policies import DraftCosts, clear_draft_statistics, measured_draft_costs
from .verifiers import (
    BlockVerifier,
    ExactVerifier,
    HeadVerifier,
    LenientVerifier,
    SpecCascadeVerifier,
    StaticEnsembleVerifier,
    TypicalAcceptanceVerifier,
    Verifier,
)

check_transformers_version()

__version__ = "0.1.0"

__all__ = [
    "BlockVerifier",
    "DiversedCandidateGenerator",
    "DraftCosts",
    "EagleDraft",
    "EagleDraftConfig",
    "FeatureCandidateGenerator",
    "clear_draft_statistics",
    "measured_draft_costs",
    "DiversedGenerationMixin",
    "DiversedGenerateDecoderOnlyOutput",
    "DiversedHead",
    "DiversedHeadConfig",
    "ExactVerifier",
    "HeadVerifier",
    "LenientVerifier",
    "SpecCascadeVerifier",
    "SpeculationStats",
    "StaticEnsembleVerifier",
    "TypicalAcceptanceVerifier",
    "Verifier",
    "enable_diversed",
    "speculative_decode",
    "verifiers",
]
