"""The bench's decoding methods: :class:`Method` and the short specs :func:`parse_methods` reads.

A spec is a method kind, optionally followed by ``:`` and the swept values (``static:0,0.5``); the
package docstring of :mod:`diversed_hf.lab.bench` lists them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Sequence

from ...verifiers.block import BlockVerifier
from ...verifiers.relaxed import FuzzyVerifier, JudgeVerifier, TopKRelaxedVerifier
from ...verifiers.rules import (
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
    from ...heads.head import DiversedHead
    from ...heads.judge import JudgeHead

__all__ = ["DEFAULT_METHODS", "FAMILIES", "Method", "Schedule", "parse_methods", "parse_schedules", "with_schedules"]

FAMILIES = (
    "target-only",
    "sd",
    "lossy-sd",
    "static-ensemble",
    "speccascade",
    "typical",
    "fuzzy",
    "topk-relaxed",
    "judge",
    "sd-finetuned",
    "diversed",
    "block",
)
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
    head_task: str | None = None  # DIVERSED: the task its head was trained for (None: the evaluated task's own)
    schedule: Schedule | None = None  # the draft-length policy (None: constant, `num_draft_tokens` per round)
    paired_with: str | None = None  # family "block": the token-wise method it is compared with ("SD")
    base_family: str | None = None  # family "block": that method's family ("sd")

    @property
    def own_head(self) -> bool:
        """DIVERSED with the evaluated task's own head (not a head trained for another task), block-verified or not."""
        return (self.base_family or self.family) == "diversed" and self.head_task is None

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"`family` must be one of {FAMILIES}, got {self.family!r}.")
        if self.draft not in ("draft", "finetuned"):
            raise ValueError(f"`draft` must be 'draft' or 'finetuned', got {self.draft!r}.")


@dataclass(frozen=True)
class Schedule:
    """A draft-length policy as ``generate`` takes it (transformers' knobs; docs/method.md, "Draft length").

    ``num_tokens`` is ``num_assistant_tokens`` (the constant length, the heuristic's start, the optimal
    policy's upper bound; ``None``: the bench's ``num_draft_tokens``), ``name`` the
    ``num_assistant_tokens_schedule`` and ``confidence`` the ``assistant_confidence_threshold``.
    """

    label: str  # as tables show it, e.g. "constant N=8", "heuristic", "confidence 0.4", "optimal N<=12"
    name: str = "constant"
    num_tokens: int | None = None
    confidence: float | None = None

    def generate_kwargs(self, num_draft_tokens: int) -> dict:
        """The keywords this policy adds to ``generate``."""
        kwargs = dict(num_assistant_tokens=self.num_tokens or num_draft_tokens, num_assistant_tokens_schedule=self.name)
        if self.confidence is not None:
            kwargs["assistant_confidence_threshold"] = self.confidence
        return kwargs


def _check_unique(names: list[str], plural: str, singular: str) -> None:
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"{plural} {duplicates} are listed twice; list each {singular} once.")


def _parse_lengths(spec: str, values: str) -> list[int]:
    lengths = _parse_values(spec, values)
    if any(v != int(v) or v < 1 for v in lengths):
        raise ValueError(f"Schedule spec {spec!r}: draft lengths must be positive integers, got {values!r}.")
    return [int(v) for v in lengths]


def parse_schedules(specs: Sequence[str]) -> list[Schedule]:
    """Draft-length policies from short specs (the bench's ``--schedules``)::

    constant            N = num_draft_tokens every round (the default)
    constant:3,5,8      one run per constant N
    heuristic           transformers' heuristic (+2 after a fully accepted round, else -1), starting at
                        num_draft_tokens and kept from one call to the next, as transformers keeps it
    heuristic_transient the same, reset every call
    confidence:0.4      a row stops drafting after a token whose draft probability is below 0.4
    optimal[:12]        this project's policy: per row, the length in 1..12 (default num_draft_tokens)
                        maximising expected tokens per second
    """
    if isinstance(specs, str):
        raise TypeError(f"`schedules` must be a list of schedule specs, got the string {specs!r}; pass [{specs!r}].")
    schedules: list[Schedule] = []
    for spec in specs:
        kind, _, values = spec.strip().partition(":")
        kind = kind.lower()
        if kind == "constant":
            if values:
                schedules += [Schedule(f"constant N={n}", "constant", n) for n in _parse_lengths(spec, values)]
            else:
                schedules.append(Schedule("constant"))
        elif kind in ("heuristic", "heuristic_transient"):
            for n in _parse_lengths(spec, values) if values else [None]:
                schedules.append(Schedule(kind + (f" N0={n}" if n else ""), kind, n))
        elif kind == "confidence":
            for threshold in _parse_values(spec, values):
                if not 0 < threshold < 1:
                    raise ValueError(
                        f"Schedule spec {spec!r}: a confidence threshold must be in (0, 1), got {threshold:g}."
                    )
                schedules.append(Schedule(f"confidence {threshold:g}", "constant", confidence=threshold))
        elif kind == "optimal":
            for n in _parse_lengths(spec, values) if values else [None]:
                schedules.append(Schedule("optimal" + (f" N<={n}" if n else ""), "optimal", n))
        else:
            raise ValueError(
                f"Unknown schedule spec {spec!r}. Use constant[:N,...], heuristic[:N0], heuristic_transient[:N0], "
                "confidence:T,... or optimal[:N]."
            )
    _check_unique([s.label for s in schedules], "Schedules", "schedule")
    if not schedules:
        raise ValueError("`schedules` is empty; pass at least one, e.g. ['constant'].")
    return schedules


def with_schedules(methods: Sequence[Method], schedules: Sequence[Schedule]) -> list[Method]:
    """Every speculative method once per draft-length policy (``"SD @ heuristic"``); target-only once.

    With the single default schedule (``constant``) the methods are returned unchanged.
    """
    if len(schedules) == 1 and schedules[0] == Schedule("constant"):
        return list(methods)
    expanded = []
    for method in methods:
        if method.verifier is None:
            expanded.append(method)
            continue
        for schedule in schedules:
            paired_with = method.paired_with and f"{method.paired_with} @ {schedule.label}"
            expanded.append(
                replace(method, name=f"{method.name} @ {schedule.label}", schedule=schedule, paired_with=paired_with)
            )
    return expanded


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


def _swept_methods(spec: str, kind: str, values: str) -> list[Method]:
    """The methods of a spec that sweeps one value: ``lossy:L,...``, ``static:W,...``, ``cascade[-RULE]:A,...``,
    ``typical:EPS,...``."""
    if kind == "lossy":
        return [
            Method(f"lossy SD l={_fmt(lenience)}", "lossy-sd", LenientVerifier(lenience), lenience)
            for lenience in _parse_values(spec, values)
        ]
    if kind == "static":
        return [
            Method(f"static w={_fmt(weight)}", "static-ensemble", StaticEnsembleVerifier(weight), weight)
            for weight in _parse_values(spec, values)
        ]
    if kind == "typical":
        return [
            Method(f"typical eps={_fmt(eps)}", "typical", TypicalAcceptanceVerifier(posterior_threshold=eps), eps)
            for eps in _parse_values(spec, values)
        ]
    if kind == "fuzzy":  # fuzzy SD's JS threshold (docs/method.md §9)
        return [
            Method(f"fuzzy T={_fmt(threshold)}", "fuzzy", FuzzyVerifier(threshold), threshold)
            for threshold in _parse_values(spec, values)
        ]
    if kind == "topk":  # top-k relaxed acceptance, top-2, swept over delta (nats)
        return [
            Method(f"top-2 relaxed d={_fmt(delta)}", "topk-relaxed", TopKRelaxedVerifier(2, delta), delta)
            for delta in _parse_values(spec, values)
        ]
    rules = CASCADE_RULES if kind == "cascade" else (kind[len("cascade-") :],)
    methods = []
    for rule in rules:
        if rule not in CASCADE_RULES:
            raise ValueError(f"Method spec {spec!r}: unknown cascade rule {rule!r}; use one of {CASCADE_RULES}.")
        for alpha in _parse_values(spec, values):
            methods.append(
                Method(f"cascade {rule} a={_fmt(alpha)}", "speccascade", SpecCascadeVerifier(rule, alpha), alpha)
            )
    return methods


def _block_methods(spec: str, values: str, inner: list[Method]) -> list[Method]:
    """``block:<spec>``: each token-wise method of ``<spec>`` (already parsed into ``inner``), block-verified."""
    if not values:
        raise ValueError(
            f"Method spec {spec!r}: name the method to block-verify, e.g. 'block:sd' or 'block:static:0.5'."
        )
    methods = []
    for method in inner:
        if method.verifier is None:
            raise ValueError(f"Method spec {spec!r}: target-only decoding drafts nothing to block-verify.")
        if method.family == "block":
            raise ValueError(
                f"Method spec {spec!r}: block verification applies to a token-wise method once; write "
                f"'block:{values.partition(':')[2]}'."
            )
        methods.append(
            replace(
                method,
                name=f"block {method.name}",
                family="block",
                verifier=BlockVerifier(method.verifier),
                paired_with=method.name,
                base_family=method.family,
            )
        )
    return methods


def parse_methods(
    specs: Sequence[str],
    head: DiversedHead | None = None,
    has_finetuned_draft: bool = False,
    other_heads: dict[str, DiversedHead | None] | None = None,
    judge: JudgeHead | None = None,
) -> tuple[list[Method], list[str]]:
    """Methods from short specs (see the :mod:`diversed_hf.lab.bench` docstring); returns ``(methods, notes)``.

    ``diversed`` needs ``head`` (a :class:`~diversed_hf.heads.head.DiversedHead`), ``diversed@TASK`` the head
    trained for ``TASK`` in ``other_heads`` (the transfer experiment) and ``sd-ft`` a fine-tuned draft:
    without them they are skipped and a note says why.
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
        elif kind in ("lossy", "static", "typical", "cascade", "fuzzy", "topk") or kind.startswith("cascade-"):
            methods += _swept_methods(spec, kind, values)
        elif kind == "judge":
            if judge is not None:
                methods += [
                    Method(f"judge t={_fmt(t)}", "judge", JudgeVerifier(judge, threshold=t), t)
                    for t in _parse_values(spec, values)
                ]
            else:
                notes.append("judge decoding: skipped, no judge was given (--judge) or shipped for this task.")
        elif kind in ("sd-ft", "sd-finetuned"):
            if has_finetuned_draft:
                methods.append(Method("SD (fine-tuned draft)", "sd-finetuned", ExactVerifier(), 1.0, draft="finetuned"))
            else:
                notes.append("SD with a fine-tuned draft: skipped, no fine-tuned draft was given or found.")
        elif kind.startswith("diversed@"):
            head_task = spec.strip().partition("@")[2]
            other = (other_heads or {}).get(head_task)
            if other is not None:
                methods.append(
                    Method(f"DIVERSED ({head_task} head)", "diversed", HeadVerifier(other), head_task=head_task)
                )
            else:
                notes.append(
                    f"DIVERSED with the {head_task} head: skipped, no head was given or found for {head_task!r}."
                )
        elif kind == "block":
            inner, inner_notes = parse_methods([values] if values else [], head, has_finetuned_draft, other_heads)
            notes += [f"block verification: {note}" for note in inner_notes]
            methods += _block_methods(spec, values, inner)
        elif kind == "diversed":
            if head is not None:
                methods.append(Method("DIVERSED", "diversed", HeadVerifier(head)))
            else:
                notes.append("DIVERSED: skipped, no trained head was given or found for this task.")
        else:
            raise ValueError(
                f"Unknown method spec {spec!r}. Use target, sd, lossy:L,..., static:W,..., cascade[-RULE]:A,..., "
                "typical:EPS,..., fuzzy:T,..., topk:DELTA,..., judge:T,..., sd-ft, diversed, diversed@TASK, or "
                "block:<one of these> (block verification)."
            )
    _check_unique([m.name for m in methods], "Methods", "method")
    return methods, notes
