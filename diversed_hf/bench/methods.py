"""The bench's decoding methods: :class:`Method` and the short specs :func:`parse_methods` reads.

A spec is a method kind, optionally followed by ``:`` and the swept values (``static:0,0.5``); the
package docstring of :mod:`diversed_hf.bench` lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from ..verifiers import (
    CASCADE_RULES,
    ExactVerifier,
    HeadVerifier,
    LenientVerifier,
    SpecCascadeVerifier,
    StaticEnsembleVerifier,
    TypicalAcceptanceVerifier,
    Verifier,
)

if TYPE_CHECKING:
    from ..head import DiversedHead

__all__ = ["DEFAULT_METHODS", "FAMILIES", "Method", "parse_methods"]

FAMILIES = ("target-only", "sd", "lossy-sd", "static-ensemble", "speccascade", "typical", "sd-finetuned", "diversed")
DEFAULT_METHODS = (
    "target",
    "sd",
    "lossy:0.3,0.6",
    "static:0,0.25,0.5,0.75",
    "cascade:0.2",
    "sd-ft",
    "diversed",
)


@dataclass(frozen=True)
class Method:
    """One decoding method of the bench: a verifier (``None`` = target-only) and which draft it uses."""

    name: str  # label in tables and plots
    family: str  # one of FAMILIES
    verifier: Verifier | None = None  # None: target-only decoding
    param: float | None = None  # the swept value: w, lenience, alpha or the typical threshold
    draft: str = "draft"  # "draft" or "finetuned"

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"`family` must be one of {FAMILIES}, got {self.family!r}.")
        if self.draft not in ("draft", "finetuned"):
            raise ValueError(f"`draft` must be 'draft' or 'finetuned', got {self.draft!r}.")


def _parse_values(spec: str, values: str) -> list[float]:
    try:
        parsed = [float(v) for v in values.split(",") if v.strip()]
    except ValueError:
        parsed = []
    if not parsed:
        raise ValueError(f"Method spec {spec!r}: expected numbers after ':' (e.g. 'static:0.25,0.5'), got {values!r}.")
    return parsed


def _fmt(value: float) -> str:
    return f"{value:g}"


def parse_methods(
    specs: Sequence[str], head: DiversedHead | None = None, has_finetuned_draft: bool = False
) -> tuple[list[Method], list[str]]:
    """Methods from short specs (see the :mod:`diversed_hf.bench` docstring); returns ``(methods, notes)``.

    ``diversed`` needs ``head`` (a :class:`~diversed_hf.head.DiversedHead`) and ``sd-ft`` a fine-tuned
    draft: without them they are skipped and a note says why.
    """
    if isinstance(specs, str):
        raise TypeError(f"`specs` must be a list of method specs, got the string {specs!r}; pass [{specs!r}].")
    methods: list[Method] = []
    notes: list[str] = []
    for spec in specs:
        kind, _, values = spec.strip().partition(":")
        kind = kind.lower()
        if kind in ("target", "target-only"):
            methods.append(Method("target-only", "target-only"))
        elif kind == "sd":
            methods.append(Method("SD", "sd", ExactVerifier(), 1.0))
        elif kind == "lossy":
            for lenience in _parse_values(spec, values):
                methods.append(Method(f"lossy SD l={_fmt(lenience)}", "lossy-sd", LenientVerifier(lenience), lenience))
        elif kind == "static":
            for weight in _parse_values(spec, values):
                methods.append(
                    Method(f"static w={_fmt(weight)}", "static-ensemble", StaticEnsembleVerifier(weight), weight)
                )
        elif kind == "cascade" or kind.startswith("cascade-"):
            rules = CASCADE_RULES if kind == "cascade" else (kind[len("cascade-") :],)
            for rule in rules:
                if rule not in CASCADE_RULES:
                    raise ValueError(f"Method spec {spec!r}: unknown cascade rule {rule!r}; use one of {CASCADE_RULES}.")
                for alpha in _parse_values(spec, values):
                    methods.append(
                        Method(f"cascade {rule} a={_fmt(alpha)}", "speccascade", SpecCascadeVerifier(rule, alpha), alpha)
                    )
        elif kind == "typical":
            for threshold in _parse_values(spec, values):
                verifier = TypicalAcceptanceVerifier(posterior_threshold=threshold)
                methods.append(Method(f"typical eps={_fmt(threshold)}", "typical", verifier, threshold))
        elif kind in ("sd-ft", "sd-finetuned"):
            if has_finetuned_draft:
                methods.append(Method("SD (fine-tuned draft)", "sd-finetuned", ExactVerifier(), 1.0, draft="finetuned"))
            else:
                notes.append("SD with a fine-tuned draft: skipped, no fine-tuned draft was given or found.")
        elif kind == "diversed":
            if head is not None:
                methods.append(Method("DIVERSED", "diversed", HeadVerifier(head)))
            else:
                notes.append("DIVERSED: skipped, no trained head was given or found for this task.")
        else:
            raise ValueError(
                f"Unknown method spec {spec!r}. Use target, sd, lossy:L,..., static:W,..., cascade[-RULE]:A,..., "
                "typical:EPS,..., sd-ft or diversed."
            )
    names = [m.name for m in methods]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"Methods {duplicates} are listed twice; list each method once.")
    return methods, notes
