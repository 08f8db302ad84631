"""``output_scores`` / ``output_logits`` of the speculative loop: the target's scores per emitted token.

transformers' assisted decoding returns, for every token it emits, the target's processed scores at that position
(``scores``: the logits after the logits processors) and its raw logits (``logits``), one ``(batch, vocab)`` tensor
per new token. The loop scores ``N_r + 1`` positions per round in one target pass and emits a prefix of them, so
:class:`TargetScoreRecorder` keeps each round's emitted positions and lays them out the same way at the end.

For a relaxed verifier these are still **the target's** scores (``p_t``'s logits), not the verification
distribution ``nu_t`` that drew a drafted position's token: the same numbers transformers returns under
``assistant_ensemble_weight``. With ``ExactVerifier`` and greedy decoding they equal transformers' own
(``tests/test_generate_features.py``). In a batch, positions after a row's last token hold NaN (the loop scores
nothing there; transformers' plain loop would score its padding).
"""

from __future__ import annotations

import torch

__all__ = ["TargetScoreRecorder"]


class TargetScoreRecorder:
    """Collects the target's processed scores and/or raw logits of every emitted token, round by round."""

    def __init__(self, *, scores: bool, logits: bool):
        self.want_scores = scores
        self.want_logits = logits
        self.rounds: list[
            tuple
        ] = []  # per round: rows (K,), columns (K,), scores (K, vocab) or None, logits (K, V') or None

    def record(
        self,
        rows: torch.Tensor,  # (K,) original batch row of each emitted token
        columns: torch.Tensor,  # (K,) its index among the row's new tokens
        processed: torch.Tensor,  # (K, vocab) the target's processed scores at its position
        raw: torch.Tensor,  # (K, model_vocab) the target's raw logits there
    ) -> None:
        self.rounds.append((rows, columns, processed if self.want_scores else None, raw if self.want_logits else None))

    def assemble(
        self,
        batch_size: int,
        num_new_tokens: int,
    ) -> tuple[tuple[torch.Tensor, ...] | None, tuple[torch.Tensor, ...] | None]:  # each: num_new_tokens x (batch, V)
        """``(scores, logits)`` as transformers returns them: one ``(batch, vocab)`` tensor per new token, NaN where
        a row had already ended; ``None`` for what was not asked for."""
        return (
            self._assemble(2, batch_size, num_new_tokens) if self.want_scores else None,
            self._assemble(3, batch_size, num_new_tokens) if self.want_logits else None,
        )

    def _assemble(self, which: int, batch_size: int, num_new_tokens: int) -> tuple[torch.Tensor, ...]:
        if not self.rounds:
            return ()
        first = self.rounds[0][which]  # (K, V)
        out = first.new_full((batch_size, num_new_tokens, first.shape[-1]), float("nan"))  # (batch, num_new, V)
        for entry in self.rounds:
            rows, columns, values = entry[0], entry[1], entry[which]
            out[rows, columns] = values
        return tuple(out[:, t] for t in range(num_new_tokens))
