"""The generation room: relaxed speculative decoding inside transformers' ``generate``.

================== ==============================================================================================
``mixin``          the HF boundary: ``DiversedGenerationMixin``, ``enable_diversed``, ``diversed_generate`` (what the
                   ``custom_generate`` repository calls), the argument checks
``loop``           the batched speculative loop: prefill, draft, verify, commit, realign
``target_cache``   the target's cache with holes: rejected drafts masked in place, compacted when too wide
``processors``     logits processors kept per row
``outputs``        ``SpeculationStats`` and the output type carrying it
``output_scores``  the target's scores and logits of every emitted token, as transformers returns them
``padding``        right-padded batches re-laid left-padded for the loop, and back
``round_profile``  wall time per phase of the loop (``bench --profile``)
================== ==============================================================================================

``from diversed_hf.generation import diversed_generate`` (the Hub ``custom_generate`` repository's import) and the
other public names load on first use (docs/architecture.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import exports

__all__ = [
    "CUSTOM_GENERATE_REPO",
    "DiversedGenerateDecoderOnlyOutput",
    "DiversedGenerationMixin",
    "SpeculationStats",
    "diversed_generate",
    "enable_diversed",
    "speculative_decode",
]

__getattr__, __dir__ = exports(
    __name__,
    {
        "CUSTOM_GENERATE_REPO": ".mixin",
        "DiversedGenerateDecoderOnlyOutput": ".outputs",
        "DiversedGenerationMixin": ".mixin",
        "SpeculationStats": ".outputs",
        "diversed_generate": ".mixin",
        "enable_diversed": ".mixin",
        "speculative_decode": ".loop",
    },
)

if TYPE_CHECKING:  # what static tools and IDEs see
    from .loop import speculative_decode
    from .mixin import CUSTOM_GENERATE_REPO, DiversedGenerationMixin, diversed_generate, enable_diversed
    from .outputs import DiversedGenerateDecoderOnlyOutput, SpeculationStats
