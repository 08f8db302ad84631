"""Output types: acceptance statistics and transformers' generate output extended with them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

from ..verifiers import theory


def lengths_to_end(new_tokens: torch.Tensor, eos_token_id) -> torch.Tensor:  # (batch, T) -> (batch,)
    """Each row's new tokens up to and including its first end of sequence (all ``T`` where none ends), as
    ``generate`` stops a lone sequence. ``eos_token_id``: an id, a list, a tensor or ``None`` (none ends)."""
    if eos_token_id is None:
        return torch.full(new_tokens.shape[:1], new_tokens.shape[1], dtype=torch.long)
    ends = torch.isin(new_tokens, torch.as_tensor(eos_token_id, device=new_tokens.device).flatten())  # (batch, T)
    first = ends.int().argmax(dim=1)  # (batch,) the first end, 0 where none
    return torch.where(ends.any(dim=1), first + 1, new_tokens.shape[1]).long().cpu()


class RoundRecord(NamedTuple):
    """One round's statistics, as the loop keeps them until the call's :class:`SpeculationStats` are built."""

    rows: torch.Tensor  # (active,) original batch row of each active row
    position_acceptance: torch.Tensor  # (active, N_r) beta_t; NaN where not drafted
    drafted_acceptance: torch.Tensor  # (active, N_r) a_t(x_t); NaN where not drafted
    draft_lengths: torch.Tensor  # (active,) N_b


@dataclass
class SpeculationStats:
    """Acceptance statistics of one speculative ``generate`` call, per row (index = batch row).

    Definitions (docs/method.md §7): acceptance rate = accepted drafted tokens / drafted tokens,
    summed over rounds; a round emits its accepted drafts plus one recovered or bonus token.
    ``position_acceptance`` holds, per round, ``beta_t = sum_x min(q_t(x), pi_t(x))`` for each drafted
    position: the probability that the position accepts, before its token is drawn.
    ``drafted_acceptance`` holds ``a_t(x_t)``, the probability that the token actually drafted
    was kept (1/0 in greedy mode; for block verification the factor ``rho_t / rho_{t-1}`` of its running weight and
    ``beta_t`` given the kept prefix, docs/method.md §2). Together they give the unbiased estimator of the expected
    tokens per round, ``1 + sum_k prod_{t<k} a_t(x_t) beta_k`` (:attr:`expected_tokens_per_round`, docs/method.md §6).
    """

    num_draft_tokens: int  # N, drafts per round
    num_rounds: torch.Tensor  # (batch,) verification rounds (target forward passes; the first also reads the prompt)
    num_drafted: torch.Tensor  # (batch,) drafted tokens
    num_accepted: torch.Tensor  # (batch,) drafted tokens accepted
    num_generated: torch.Tensor  # (batch,) tokens emitted (after EOS / length truncation)
    drafted_per_position: torch.Tensor  # (batch, N') rounds in which position k was drafted; N' the longest draft
    accepted_per_position: torch.Tensor  # (batch, N') rounds in which the draft at position k was accepted
    position_acceptance: list[torch.Tensor]  # per row: (num_rounds, N) beta_t per round; NaN where not drafted
    target_weights: list[torch.Tensor] | None = None  # per row: (num_generated,) w per emitted token; NaN for bonus
    drafted_acceptance: list[torch.Tensor] | None = None  # per row: (num_rounds, N) a_t(x_t); NaN where not drafted
    draft_lengths: list[torch.Tensor] | None = None  # per row: (num_rounds,) drafts each round counted (N_b)
    tree_nodes: torch.Tensor | None = None  # (batch,) tree nodes verified, when rounds draft token trees (else None)
    #: the draft's batch limit when the call decoded with the target alone (:mod:`diversed_hf.generation.batch_rule`)
    disabled_by_batch_size: int | None = None

    @property
    def nodes_per_round(self) -> torch.Tensor | None:  # (batch,)
        """Mean tree nodes the target verified per round (token trees only; a chain verifies its drafts)."""
        return None if self.tree_nodes is None else self.tree_nodes.double() / self.num_rounds.clamp(min=1).double()

    @classmethod
    def of_run(cls, state, num_draft: int) -> SpeculationStats:
        """Per-row statistics of one call of the loop (its run state), on CPU; per-round arrays padded with NaN
        to the longest draft used."""
        batch_size = state.num_rounds.numel()
        widths = [record.position_acceptance.shape[1] for record in state.rounds]
        width = max([num_draft, state.drafted_per_position.shape[1]] + widths)
        per_row = [[] for _ in range(batch_size)]
        per_row_drafted = [[] for _ in range(batch_size)]
        per_row_lengths = [[] for _ in range(batch_size)]
        for rows, betas, drafted, lengths in state.rounds:  # RoundRecord: (active,), (active, N_r) x 2, (active,)
            padded = torch.full((2, rows.numel(), width), float("nan"))
            padded[0, :, : betas.shape[1]] = betas.cpu()
            padded[1, :, : drafted.shape[1]] = drafted.cpu()
            for i, (row, length) in enumerate(zip(rows.tolist(), lengths.tolist())):
                per_row[row].append(padded[0, i])
                per_row_drafted[row].append(padded[1, i])
                per_row_lengths[row].append(length)
        position_acceptance = [torch.stack(r) if r else torch.zeros(0, width) for r in per_row]
        drafted_acceptance = [torch.stack(r) if r else torch.zeros(0, width) for r in per_row_drafted]
        draft_lengths = [torch.tensor(r, dtype=torch.long) for r in per_row_lengths]
        pad = width - state.drafted_per_position.shape[1]
        target_weights = None
        if state.target_weights is not None:
            target_weights = [state.target_weights[b, : int(state.num_generated[b])].cpu() for b in range(batch_size)]
        return cls(
            num_draft_tokens=num_draft,
            num_rounds=state.num_rounds.cpu(),
            num_drafted=state.num_drafted.cpu(),
            num_accepted=state.num_accepted.cpu(),
            num_generated=state.num_generated.cpu(),
            drafted_per_position=torch.nn.functional.pad(state.drafted_per_position, (0, pad)).cpu(),
            accepted_per_position=torch.nn.functional.pad(state.accepted_per_position, (0, pad)).cpu(),
            position_acceptance=position_acceptance,
            target_weights=target_weights,
            drafted_acceptance=drafted_acceptance,
            draft_lengths=draft_lengths,
            tree_nodes=None if state.tree_nodes is None else state.tree_nodes.cpu(),
        )

    @property
    def acceptance_rate(self) -> torch.Tensor:  # (batch,)
        return self.num_accepted.double() / self.num_drafted.clamp(min=1).double()

    @property
    def position_acceptance_rate(self) -> torch.Tensor:  # (batch, N)
        return self.accepted_per_position.double() / self.drafted_per_position.clamp(min=1).double()

    @property
    def tokens_per_round(self) -> torch.Tensor:  # (batch,)
        """Measured mean tokens emitted per round."""
        return self.num_generated.double() / self.num_rounds.clamp(min=1).double()

    @property
    def expected_tokens_per_round(self) -> torch.Tensor:  # (batch,)
        """Unbiased estimate of ``E[T_N]`` per row: :func:`diversed_hf.verifiers.theory.expected_tokens_per_round`
        (docs/method.md §6)."""
        drafted = self.drafted_acceptance or [None] * len(self.position_acceptance)
        values = [
            float(theory.expected_tokens_per_round(betas, kept)) if kept is not None else float("nan")
            for betas, kept in zip(self.position_acceptance, drafted)
        ]
        return torch.tensor(values, dtype=torch.float64)

    # Totals over the batch -------------------------------------------------------------------
    @property
    def total_drafted(self) -> int:
        return int(self.num_drafted.sum())

    @property
    def total_accepted(self) -> int:
        return int(self.num_accepted.sum())

    @property
    def total_acceptance_rate(self) -> float:
        return self.total_accepted / max(self.total_drafted, 1)

    @property
    def total_rounds(self) -> int:
        return int(self.num_rounds.sum())

    def summary(self) -> dict:
        """Totals over the batch as plain numbers (JSON-friendly)."""
        drafted = self.drafted_per_position.sum(dim=0).clamp(min=1).double()  # (N,)
        return {
            "num_draft_tokens": self.num_draft_tokens,
            "num_rows": int(self.num_rounds.numel()),
            "num_rounds": self.total_rounds,
            "num_drafted": self.total_drafted,
            "num_accepted": self.total_accepted,
            "num_generated": int(self.num_generated.sum()),
            "acceptance_rate": self.total_acceptance_rate,
            "tokens_per_round": int(self.num_generated.sum()) / max(self.total_rounds, 1),
            "position_acceptance_rate": (self.accepted_per_position.sum(dim=0) / drafted).tolist(),
            "disabled_by_batch_size": self.disabled_by_batch_size,
        }


@dataclass
class DiversedGenerateDecoderOnlyOutput(GenerateDecoderOnlyOutput):
    """transformers' :class:`GenerateDecoderOnlyOutput` plus ``speculation`` (:class:`SpeculationStats`)."""

    speculation: SpeculationStats | None = None
