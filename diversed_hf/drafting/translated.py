"""A draft with another tokenizer (transformers' universal assisted decoding: ``tokenizer=`` and
``assistant_tokenizer=``), verified by any verifier in the batched loop.

Each round, each row's tokens are decoded to text with the target's tokenizer and encoded with the draft's; the draft
continues greedily, its new text is encoded with the target's tokenizer, and the target tokens it adds are the
round's drafts. A translated token was not drawn from a distribution over the target's vocabulary, so its proposal
is a point mass (:class:`~diversed_hf.drafting.drafters.PointMassCandidateGenerator`): lossless SD keeps the target's
law exactly whatever the draft wrote, and a relaxed verifier emits its declared ``w p_t + (1 - w) q_t``.

Where the tokenizations meet: the target's last ``lookbehind`` tokens are decoded and encoded again together with
the draft's new text. The new target tokens are the ones after those tokens, when encoding the joined text gives
those tokens back. When it does not (the draft's text merges into the last token, as ``"Hel" + "lo"``), the row
drafts nothing that round. The draft has no cache across rounds: each round reads the row's whole text again
(``docs/drafters.md``).
"""

from __future__ import annotations

import torch

from .. import compat
from .drafters import PointMassCandidateGenerator
from .protocol import register_drafter

__all__ = ["TranslatedDraft", "TranslatingCandidateGenerator", "translate_continuation"]

#: target tokens re-encoded with the draft's new text, to find where the two tokenizations meet
LOOKBEHIND = 8


class TranslatedDraft:
    """A draft model with a tokenizer other than the target's, as the loop's drafter: what ``generate(...,
    assistant_model=draft, tokenizer=..., assistant_tokenizer=...)`` drafts with when the vocabularies differ."""

    has_hidden_states = False  # re-encoded tokens: point masses without a hidden state

    def __init__(self, model, tokenizer, assistant_tokenizer):
        for name, value in (("tokenizer", tokenizer), ("assistant_tokenizer", assistant_tokenizer)):
            if not (callable(value) and hasattr(value, "decode")):
                raise TypeError(f"`{name}` must be a transformers tokenizer, got {type(value).__name__}.")
        self.model = model
        self.tokenizer, self.assistant_tokenizer = tokenizer, assistant_tokenizer
        self.generation_config = model.generation_config  # the draft-length knobs, as for the model itself
        self.config = model.config

    def __repr__(self) -> str:
        return f"TranslatedDraft({type(self.model).__name__}, {type(self.assistant_tokenizer).__name__})"


def translate_continuation(tokenizer, tokens: list[int], new_text: str, limit: int) -> list[int]:
    """The target tokens ``new_text`` adds after ``tokens`` (at most ``limit``): encode the last :data:`LOOKBEHIND`
    tokens' text with ``new_text``; empty unless that gives those tokens back first."""
    if not new_text or limit <= 0:
        return []
    tail = tokens[-LOOKBEHIND:]
    joined = tokenizer(tokenizer.decode(tail) + new_text, add_special_tokens=False)["input_ids"]
    if joined[: len(tail)] != tail:
        return []
    return joined[len(tail) :][:limit]


class TranslatingCandidateGenerator(PointMassCandidateGenerator):
    """Drafts with a :class:`TranslatedDraft` (module docstring). Arguments as
    :class:`~diversed_hf.drafting.drafters.PointMassCandidateGenerator`; the schedules ``constant``, ``heuristic`` and
    ``heuristic_transient``."""

    drafter_name = "a draft with another tokenizer (`assistant_tokenizer`)"
    schedules = ("constant", "heuristic", "heuristic_transient")

    def __init__(self, input_ids, assistant_model: TranslatedDraft, *args, **kwargs):
        super().__init__(input_ids, assistant_model, *args, **kwargs)
        self.translated = assistant_model

    def propose(self, rows: list[torch.Tensor], limits: list[int]) -> list[torch.Tensor]:
        device = rows[0].device if rows else None
        drafting = [b for b, limit in enumerate(limits) if limit > 0]
        proposed = [torch.zeros(0, dtype=torch.long, device=device) for _ in rows]
        if not drafting:
            return proposed
        tokenizer, assistant_tokenizer = self.translated.tokenizer, self.translated.assistant_tokenizer
        tokens = {b: rows[b].tolist() for b in drafting}
        texts = [tokenizer.decode(tokens[b]) for b in drafting]
        continuations = self._draft(texts, max(limits[b] for b in drafting))  # draft ids per drafting row
        for b, continuation in zip(drafting, continuations):
            new_text = assistant_tokenizer.decode(continuation, skip_special_tokens=True)
            ids = translate_continuation(tokenizer, tokens[b], new_text, limits[b])
            proposed[b] = torch.tensor(ids, dtype=torch.long, device=device)
        return proposed

    @torch.no_grad()
    def _draft(self, texts: list[str], num_tokens: int) -> list[list[int]]:
        """The draft's greedy continuation of each text: ``num_tokens`` of its own tokens, cut at its EOS."""
        model, assistant_tokenizer = self.translated.model, self.translated.assistant_tokenizer
        encoded = [assistant_tokenizer(text, add_special_tokens=False)["input_ids"] or [0] for text in texts]
        width = max(len(ids) for ids in encoded)
        device = model.device
        ids = torch.zeros(len(encoded), width, dtype=torch.long, device=device)  # left-padded
        mask = torch.zeros_like(ids)
        for i, row in enumerate(encoded):
            ids[i, width - len(row) :] = torch.tensor(row, device=device)
            mask[i, width - len(row) :] = 1
        cache, chunk, drafted = compat.new_cache(), ids, []
        for _ in range(num_tokens):
            out = compat.forward_with_cache(model, chunk, mask, cache, logits_to_keep=1, output_hidden_states=False)
            chunk = out.logits[:, -1].argmax(dim=-1, keepdim=True)  # (rows, 1)
            drafted.append(chunk)
            mask = torch.cat([mask, torch.ones_like(chunk)], dim=1)
        drafted = torch.cat(drafted, dim=1).tolist()  # (rows, num_tokens)
        eos = assistant_tokenizer.eos_token_id
        return [row[: row.index(eos)] if eos in row else row for row in drafted]


# re-encoded into the target's ids: point masses without a hidden state, its own candidate generator
register_drafter(
    TranslatedDraft,
    proposes_target_ids=True,
    candidate_generator=TranslatingCandidateGenerator,
    described_as="a draft with another tokenizer",
    built_as="TranslatedDraft(assistant_model, tokenizer, assistant_tokenizer)",
)
