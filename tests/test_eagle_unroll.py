"""Training-time test sees what drafting sees: an unrolled step's prediction at every column is the one a draft
token gets from the draft cache of the target-fed columns and its own chain (``diversed_hf.training.eagle_unroll``)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_model

from diversed_hf import EagleDraft, compat
from diversed_hf.training.eagle_unroll import chain_attention, unrolled_features


def _drafted(draft, ids, features, origin: int, steps: int) -> torch.Tensor:  # (d,)
    """The feature of the ``steps``-th draft token after column ``origin``, drafted as the candidate generator does:
    the cache takes the columns up to ``origin`` with the target's features, then one column a step, each fed the
    draft's own feature of the step before."""
    cache = compat.new_cache()
    last = draft.features(ids[None, : origin + 1], features[None, : origin + 1], cache=cache, use_cache=True)[:, -1:]
    for column in range(origin + 1, origin + steps + 1):
        position = torch.tensor([[column]])
        last = draft.features(ids[None, column : column + 1], last, position_ids=position, cache=cache, use_cache=True)
    return last[0, 0]


@pytest.mark.parametrize("architecture", ["eagle", "eagle3"])
def test_every_unrolled_column_is_the_draft_token_drafting_would_give(architecture):
    torch.manual_seed(0)
    target = make_model("llama", num_layers=4, seed=1).float()
    aux = [1, 2, 3] if architecture == "eagle3" else None
    draft = EagleDraft.for_target(target, architecture=architecture, aux_layer_ids=aux).float().eval()
    width, lengths = 9, (9, 6)  # the second row right-padded, as a distillation batch
    ids = torch.randint(3, target.config.vocab_size, (2, width))
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
    hidden = torch.randn(2, width, draft.config.target_feature_size)
    with torch.no_grad():
        steps = list(unrolled_features(draft, ids, mask, hidden, 3))
        features = torch.cat([torch.zeros_like(hidden[:, :1]), hidden[:, :-1]], dim=1)
        for row, length in enumerate(lengths):
            for step, predicted in enumerate(steps):
                for column in range(step, length):
                    expected = _drafted(draft, ids[row], features[row], column - step, step)
                    torch.testing.assert_close(predicted[row, column], expected, atol=1e-5, rtol=1e-4)


def test_the_chain_attention_keeps_the_target_fed_context_and_the_chain():
    valid = torch.tensor([[True, True, True, True, False]])
    allowed = chain_attention(valid, 2)  # (1, 5, 15): step 0's keys, then step 1's, then step 2's
    assert allowed.shape == (1, 5, 15)
    assert allowed[0, 3].nonzero().flatten().tolist() == [0, 1, 5 + 2, 10 + 3]  # context <= 1, then its chain
    assert allowed[0, 4].nonzero().flatten().tolist() == [0, 1, 2, 5 + 3, 10 + 4]  # padding's key left out of context
    assert allowed[0, 0].nonzero().flatten().tolist() == [10]  # no context yet: itself
