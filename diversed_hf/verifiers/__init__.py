"""The verification room: every speculative-decoding method as "verify the drafts against some distribution".

============================ =================================================================================
``rules``                    the ``Verifier`` hook and every rule (exact, lenient, static ensemble, SpecCascade,
                             head, typical acceptance)
``block``                    block verification (Sun et al. 2024): ``BlockVerifier`` and its math
``ops``                      the tensor math of one round: mixture, acceptance, residual, sampling
``checks``                   argument checks of a round and of what a custom rule returns
``distribution_features``    the distribution statistics a head may read (``tv``, entropies, margins)
``theory``                   exact ``E[T_N]``, the speed-up model, the single-step Pareto front
``relaxed``                  the field's relaxed acceptance rules: fuzzy, top-k relaxed, judge decoding
============================ =================================================================================

The rules' names are public here, as they have always been: ``from diversed_hf.verifiers import ExactVerifier``.
They load on first use, so importing one module of the room loads no other (docs/architecture.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import exports

__all__ = [
    "Verifier",
    "VerificationResult",
    "ExactVerifier",
    "LenientVerifier",
    "StaticEnsembleVerifier",
    "SpecCascadeVerifier",
    "HeadVerifier",
    "TypicalAcceptanceVerifier",
    "BlockVerifier",
    "CASCADE_RULES",
    "MIXING_SPACES",
    "check_round_inputs",
    "FuzzyVerifier",
    "TopKRelaxedVerifier",
    "JudgeVerifier",
]

RELAXED = ("FuzzyVerifier", "TopKRelaxedVerifier", "JudgeVerifier")
_HOMES = {"BlockVerifier": ".block", **{name: ".relaxed" for name in RELAXED}}
__getattr__, __dir__ = exports(__name__, {name: _HOMES.get(name, ".rules") for name in __all__})

if TYPE_CHECKING:  # what static tools and IDEs see
    from .block import BlockVerifier
    from .relaxed import FuzzyVerifier, JudgeVerifier, TopKRelaxedVerifier
    from .rules import (
        CASCADE_RULES,
        MIXING_SPACES,
        ExactVerifier,
        HeadVerifier,
        LenientVerifier,
        SpecCascadeVerifier,
        StaticEnsembleVerifier,
        TypicalAcceptanceVerifier,
        VerificationResult,
        Verifier,
        check_round_inputs,
    )
