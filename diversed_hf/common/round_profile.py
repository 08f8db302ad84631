"""Where a speculative round's time goes: wall-clock time per phase of the batched loop (``docs/profile.md``).

    from diversed_hf.common.round_profile import profile_rounds

    with profile_rounds() as profile:
        target.generate(**inputs, assistant_model=draft, verifier=ExactVerifier())
    print(profile.table())

While a :func:`profile_rounds` block is open, the loop (:mod:`diversed_hf.generation.loop`) and the candidate generators
time their phases with ``time.perf_counter`` (after the device's queued work on CUDA):

- ``prefill``: a feature draft's first target pass over the prompt (once per call, not per round);
- ``draft forward``: the draft model's forwards (the candidate generator's ``draft_forward``);
- ``drafting, rest``: the rest of drafting: processors, softmax, sampling, the draft-length rule;
- ``target forward``: the verification pass;
- ``verification math``: the target's distributions (processors, softmax) and the verifier;
- ``commit``: writing the emitted tokens, statistics, stopping criteria, the streamer;
- ``realign``: cache cropping and realignment (both caches), the draft's features and length policy;
- ``outside the phases``: the rest of the loop's wall time (its own Python between phases, setting up and returning).
  What ``generate`` does before and after the loop (argument checks, building the candidate generator) is not in
  the wall time.

Outside a block every hook is a no-op (one global read), so decoding is not slowed.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch

__all__ = ["PHASES", "TIMED", "RoundProfile", "active", "clock", "phase", "profile_rounds"]

#: the phases, in the order a call runs them
PHASES = ("prefill", "draft forward", "drafting, rest", "target forward", "verification math", "commit", "realign")
#: what the hooks time: drafting as a whole, its forwards within it (``drafting, rest`` is the difference)
TIMED = ("prefill", "drafting", "draft forward", "target forward", "verification math", "commit", "realign")

_ACTIVE: RoundProfile | None = None


@dataclass
class RoundProfile:
    """Seconds per phase, rounds and wall time of the ``generate`` calls made inside one :func:`profile_rounds`."""

    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    rounds: int = 0
    wall: float = 0.0
    device: torch.device | None = None

    def phase_seconds(self) -> dict[str, float]:
        """Seconds per entry of :data:`PHASES`."""
        spent = {name: self.seconds[name] for name in PHASES if name != "drafting, rest"}
        spent["drafting, rest"] = max(0.0, self.seconds["drafting"] - self.seconds["draft forward"])
        return {name: spent[name] for name in PHASES}

    def outside(self) -> float:
        """Wall seconds in no phase."""
        return max(0.0, self.wall - sum(self.phase_seconds().values()))

    def rows(self) -> list[tuple[str, float, float]]:
        """``(phase, ms per round, share of wall time)`` for every phase, then the time outside them."""
        rounds, wall = max(self.rounds, 1), max(self.wall, 1e-12)
        spent = [*self.phase_seconds().items(), ("outside the phases", self.outside())]
        return [(name, 1000 * seconds / rounds, seconds / wall) for name, seconds in spent]

    def table(self) -> str:
        """A Markdown table of :meth:`rows`, with the rounds and wall time it covers."""
        lines = ["| phase | ms / round | share |", "|---|---:|---:|"]
        lines += [f"| {name} | {ms:.2f} | {100 * share:.1f} % |" for name, ms, share in self.rows()]
        lines.append(
            f"| **all** ({self.rounds} rounds, {self.wall:.2f} s) | {1000 * self.wall / max(self.rounds, 1):.2f} | "
            "100 % |"
        )
        return "\n".join(lines)


def clock(device: torch.device | None) -> float:
    """Seconds now, after the device's queued work on CUDA."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@contextlib.contextmanager
def profile_rounds(device: torch.device | str | None = None):
    """Profile every speculative ``generate`` call in the block; yields the :class:`RoundProfile` it fills. Not
    reentrant: one block at a time (a nested one is refused)."""
    global _ACTIVE
    if _ACTIVE is not None:
        raise RuntimeError("profile_rounds() is already active: close the outer block before opening another.")
    profile = RoundProfile(device=torch.device(device) if device is not None else None)
    _ACTIVE = profile
    try:
        yield profile
    finally:
        _ACTIVE = None


def active() -> RoundProfile | None:
    """The open profile, or ``None`` (the loop's hooks check this)."""
    return _ACTIVE


@contextlib.contextmanager
def _timed(profile: RoundProfile, name: str):
    start = clock(profile.device)
    try:
        yield
    finally:
        profile.seconds[name] += clock(profile.device) - start


def phase(name: str):
    """Time the block as ``name`` (one of :data:`TIMED`) when a profile is open; else a no-op context."""
    profile = _ACTIVE
    return contextlib.nullcontext() if profile is None else _timed(profile, name)
