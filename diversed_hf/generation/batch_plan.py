"""How a draft speculates at each batch size, chosen from measured throughput (SmartSpec's goodput rule, per batch).

A draft's ``generation_config`` may carry ``assistant_batch_plan``: a list of ``[max_rows, choice]`` pairs, bounds
increasing. A call of ``R`` rows takes the first pair whose bound is at least ``R`` (the last pair beyond it), and
``choice`` says what the call does:

- ``null`` -- what the draft's generation config says (its length, its tree): the shape measured best at batch 1;
- ``N >= 1`` -- a chain of ``N`` drafts (no tree);
- ``0`` -- no speculation: the target alone, as plain ``generate`` (``output.speculation.disabled_by_batch_size``
  holds the row count that turned it off).

:func:`plan_from_throughput` builds it from tokens/s measured at each batch size (``benchmarks/batched_rounds.py``
does, on the real pair): at each size, the fastest of target-only, the configured shape and the chains measured,
speculation kept only where it beats target-only by ``margin`` (so the default never runs much below target-only).
The plan generalises ``assistant_disable_by_batch_size`` (``[[K, null], [K + 1, 0]]``); a draft carries one or the
other. It applies where :mod:`.batch_rule`'s does (lossless calls that leave the drafting to the draft) and changes
speed only: each choice samples the target's law.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..verifiers.checks import is_integer
from .batch_rule import rule_value

__all__ = ["AS_CONFIGURED", "PLAN", "BatchPlan", "plan_from_throughput", "plan_of"]

#: the generation-config field and ``generate`` keyword
PLAN = "assistant_batch_plan"
#: the choice that keeps the draft's own configuration
AS_CONFIGURED = None


class BatchPlan:
    """A checked ``assistant_batch_plan`` (module docstring); :meth:`choose` gives a row count's choice."""

    def __init__(self, pairs: Sequence, source: str = f"`{PLAN}`"):
        self.pairs = self._checked(pairs, source)

    @staticmethod
    def _checked(pairs, source: str) -> list[tuple[int, int | None]]:
        fix = (
            "give a list of [max_rows, choice] pairs with increasing max_rows >= 1 and choice null (the draft's own "
            "shape), N >= 1 (a chain of N drafts) or 0 (the target alone), e.g. [[1, null], [4, 2], [8, 0]]"
        )
        if not isinstance(pairs, Sequence) or isinstance(pairs, str) or not pairs:
            raise ValueError(f"{source} is {pairs!r}: {fix}.")
        checked, previous = [], 0
        for pair in pairs:
            if not isinstance(pair, Sequence) or isinstance(pair, str) or len(pair) != 2:
                raise ValueError(f"{source} holds {pair!r}, not a [max_rows, choice] pair: {fix}.")
            bound, choice = pair
            if not is_integer(bound) or bound <= previous:
                raise ValueError(f"{source} has the bound {bound!r} after {previous}: {fix}.")
            if choice is not None and (not is_integer(choice) or choice < 0):
                raise ValueError(f"{source} has the choice {choice!r} for up to {bound} rows: {fix}.")
            checked.append((int(bound), None if choice is None else int(choice)))
            previous = int(bound)
        return checked

    def choose(self, rows: int) -> int | None:
        """The choice for a call of ``rows`` rows: None (as configured), N >= 1 (a chain), 0 (the target alone)."""
        for bound, choice in self.pairs:
            if rows <= bound:
                return choice
        return self.pairs[-1][1]

    def speculates_up_to(self, rows: int) -> int:
        """The largest bound below ``rows`` whose choice speculates (0 for none): what turned a call off."""
        return max((bound for bound, choice in self.pairs if bound < rows and choice != 0), default=0)

    def to_list(self) -> list[list]:
        return [[bound, choice] for bound, choice in self.pairs]


def plan_of(assistant_model, generation_config, given) -> BatchPlan | None:
    """The call's plan: ``given`` (the keyword), else the call's ``generation_config``, else the draft's
    (:func:`~.batch_rule.rule_value`, as the batch limit is found); None for none."""
    value, source = rule_value(PLAN, assistant_model, generation_config, given)
    return None if value is None else BatchPlan(value, source)


def plan_from_throughput(
    measured: Mapping[int, Mapping[str, float]],
    shapes: Mapping[str, int | None],
    margin: float = 0.03,
) -> BatchPlan:
    """The plan from tokens/s measured per batch size: ``measured[rows][name]``, with ``"target-only"`` among the
    names and ``shapes[name]`` the choice each other name stands for (None: the configured shape, N: a chain of N).
    At each size the fastest speculating shape is kept when it beats target-only by ``margin`` (a fraction), else 0;
    neighbouring sizes with one choice merge."""
    if not measured:
        raise ValueError("`measured` is empty: measure tokens/s at one batch size at least.")
    pairs: list[list] = []
    for rows in sorted(measured):
        speeds = measured[rows]
        if "target-only" not in speeds:
            raise ValueError(f"`measured[{rows}]` has no 'target-only' figure to compare with: {sorted(speeds)}.")
        candidates = {name: speed for name, speed in speeds.items() if name != "target-only"}
        unknown = sorted(set(candidates) - set(shapes))
        if unknown:
            raise ValueError(f"`measured[{rows}]` names shapes `shapes` does not map to a choice: {unknown}.")
        best = max(candidates, key=candidates.get, default=None)
        wins = best is not None and candidates[best] >= (1 + margin) * speeds["target-only"]
        choice = shapes[best] if wins else 0
        if pairs and pairs[-1][1] == choice:
            pairs[-1][0] = rows
        else:
            pairs.append([rows, choice])
    return BatchPlan(pairs)
