"""What a round strategy (:mod:`.rounds`) reads of the loop, and what it hands back: the round's explicit state.

The loop builds a :class:`RoundContext` once per round (:meth:`_SpeculativeLoop.verify`) and gets a
:class:`RoundOutcome`; a strategy never sees the loop object, so what a round may read and change is this list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["RoundContext", "RoundDecisions", "RoundOutcome"]


@dataclass(frozen=True)
class RoundContext:
    """A round's inputs: the call's models and rules, and the prefix the round drafts after."""

    target: torch.nn.Module
    target_cache: Any  # the target's TargetCache (.cache, .mask), extended by the round's pass (a tree's: by its path)
    verifier: Any  # a diversed_hf.verifiers.Verifier
    candidates: Any  # the candidate generator that drafted the round (a tree round keeps its path in its cache)
    logits_processor: Any  # transformers' LogitsProcessorList
    vocab_size: int  # V: the verification vocabulary
    do_sample: bool
    generator: torch.Generator | None
    recording: bool  # whether the target's scores are recorded (output_scores / output_logits)
    length: int  # L: the prefix's width (loop.seq.shape[1])
    checks: Any = None  # the loop's FiniteMassChecks: the target's distributions checked with the round's decisions

    @property
    def needs_hidden(self) -> bool:
        """Whether the target's pass returns hidden states (the verifier's head, or a draft reading features)."""
        return self.verifier.requires_hidden_states or self.candidates.reads_target_features


@dataclass
class RoundOutcome:
    """A round's outputs: the verification, the target's distributions (and scores when recorded), the round as a
    chain for commit and realignment, the draft's features for the next round, and a tree's node count per row."""

    result: Any  # a VerificationResult
    target_probs: torch.Tensor  # (B, N_r + 1, V)
    target_scores: tuple[torch.Tensor, torch.Tensor] | None  # (processed, raw) when recorded
    chain: Any  # DraftCandidates: what commit and realignment read
    target_hidden: torch.Tensor | None = None  # (B, N_r + 1, d) for a draft reading the target's features
    nodes: int | None = None  # the tree's nodes verified per row (a tree round)


@dataclass(frozen=True)
class RoundDecisions:
    """The host's copy of what a round decided, read from the device in one transfer (the loop's ``decide``): what
    the realignment, the streamer and the next round's shapes are computed from."""

    num_accepted: list[int]  # [B] drafts each row accepted (n_b)
    count: list[int]  # [B] tokens each row keeps this round (after EOS, stopping criteria, its budget)
    finished: list[bool]  # [B] whether the row is done
