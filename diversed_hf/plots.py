"""Deprecated alias of :mod:`diversed_hf.bench.plots` (the bench's pictures); it goes in the next release.

Import ``from diversed_hf.bench.plots import plot_all`` (or the other names) instead.
"""

import warnings

from .bench.plots import plot_all, plot_position_acceptance, plot_tradeoffs, target_weight_html

__all__ = ["plot_all", "plot_position_acceptance", "plot_tradeoffs", "target_weight_html"]

warnings.warn(
    "`diversed_hf.plots` moved to `diversed_hf.bench.plots`; import it from there (this alias goes in the next release).",
    DeprecationWarning,
    stacklevel=2,
)
