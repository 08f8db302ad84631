"""The drafting room: everything that proposes tokens for the target to verify.

======================= ===========================================================================================
``candidates``          ``DiversedCandidateGenerator``: a draft model's candidates (transformers'
                        ``CandidateGenerator`` contract), its cache and the per-row budgets
``feature_candidates``  ``FeatureCandidateGenerator``: drafts that read the target's hidden states
``eagle``               ``EagleDraft`` (an EAGLE-style feature draft) and ``eagle_export`` (its vLLM layout)
``drafters``            drafters without a draft model: early exit, prompt lookup
``mtp``                 the checkpoint's multi-token-prediction layer as a draft
``kv_sharing``          the Gemma 4 assistant, drafting from the target's own cache
``dflash``              DFlash block drafts
``translated``          a draft with another tokenizer, re-encoded into the target's tokens
``pairs``               what a (target, draft) pair must share: vocabulary, widths, recorded ids
``length/``             how long each row drafts: the schedules and what a round costs
======================= ===========================================================================================

The public names load on first use (docs/architecture.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import exports

__all__ = [
    "DiversedCandidateGenerator",
    "DraftCandidates",
    "DraftCosts",
    "DraftLengthPolicy",
    "EagleDraft",
    "EagleDraftConfig",
    "EarlyExitDraft",
    "FeatureCandidateGenerator",
    "MtpDraft",
    "PromptLookup",
    "TranslatedDraft",
    "clear_draft_statistics",
    "measured_draft_costs",
]

__getattr__, __dir__ = exports(
    __name__,
    {
        "DiversedCandidateGenerator": ".candidates",
        "DraftCandidates": ".candidates",
        "DraftCosts": ".length.costs",
        "DraftLengthPolicy": ".length.policy",
        "EagleDraft": ".eagle",
        "EagleDraftConfig": ".eagle",
        "EarlyExitDraft": ".drafters",
        "FeatureCandidateGenerator": ".feature_candidates",
        "MtpDraft": ".mtp",
        "PromptLookup": ".drafters",
        "TranslatedDraft": ".translated",
        "clear_draft_statistics": ".length.optimal",
        "measured_draft_costs": ".length.optimal",
    },
)

if TYPE_CHECKING:  # what static tools and IDEs see
    from .candidates import DiversedCandidateGenerator, DraftCandidates
    from .drafters import EarlyExitDraft, PromptLookup
    from .eagle import EagleDraft, EagleDraftConfig
    from .feature_candidates import FeatureCandidateGenerator
    from .length.costs import DraftCosts
    from .length.optimal import clear_draft_statistics, measured_draft_costs
    from .length.policy import DraftLengthPolicy
    from .mtp import MtpDraft
    from .translated import TranslatedDraft
