"""The target's cache keeps a round's rejected drafts as masked holes (``diversed_hf.generation.target_cache``): the
same tokens and scores as the compact layout that rolls every row, in chains and trees, with or without compaction;
the compact layout where attention counts columns."""

from __future__ import annotations

import pytest
import torch
from tiny_models import left_padded_batch, make_pair

from diversed_hf import EagleDraft, ExactVerifier, StaticEnsembleVerifier, compat, enable_diversed
from diversed_hf.generation import loop as loop_module
from diversed_hf.generation import target_cache as target_cache_module

LENGTHS = [3, 9, 5, 12, 1, 7, 4, 10]  # a left-padded batch of 8
CHAIN = dict(num_assistant_tokens=4)
TREE = dict(num_assistant_tokens=3, assistant_tree_top_k=2, assistant_tree_size=6)


def watch(monkeypatch) -> dict:
    """Record, for every round's realignment, whether the cache held holes; and count the compactions."""
    seen = {"holes": 0, "rounds": 0, "compactions": 0}
    follow, compact = target_cache_module.TargetCache.follow, target_cache_module.TargetCache.compact

    def following(self, *args, **kwargs):
        follow(self, *args, **kwargs)
        seen["rounds"] += 1
        real = self.mask.bool()
        started = real.long().cumsum(dim=1) > 0  # columns after each row's leading padding
        seen["holes"] += int((started & ~real).any())

    def compacting(self, *args, **kwargs):
        seen["compactions"] += 1
        compact(self, *args, **kwargs)

    monkeypatch.setattr(target_cache_module.TargetCache, "follow", following)
    monkeypatch.setattr(target_cache_module.TargetCache, "compact", compacting)
    return seen


def generate(target, draft, knobs, *, verifier=None, do_sample=False, seed=0):
    _, input_ids, attention_mask = left_padded_batch(LENGTHS)
    torch.manual_seed(seed)
    return target.generate(
        input_ids,
        attention_mask=attention_mask,
        assistant_model=draft,
        verifier=verifier or ExactVerifier(),
        max_new_tokens=32,
        do_sample=do_sample,
        return_dict_in_generate=True,
        output_logits=True,
        **knobs,
    )


def compact_layout(monkeypatch):
    monkeypatch.setattr(loop_module._SpeculativeLoop, "keeps_holes", lambda self: False)


def assert_same(holed, compact):
    assert torch.equal(holed.sequences, compact.sequences)
    for step, (a, b) in enumerate(zip(holed.logits, compact.logits, strict=True)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=f"logits of step {step}")


@pytest.mark.parametrize("knobs", [CHAIN, TREE], ids=["chain", "tree"])
@pytest.mark.parametrize("drafter", ["draft model", "EagleDraft"])
def test_holes_give_the_compact_layouts_tokens_and_logits(monkeypatch, knobs, drafter):
    target, draft = make_pair(noise=0.6)
    enable_diversed(target)
    if drafter == "EagleDraft":
        draft = EagleDraft.for_target(target).eval()
    seen = watch(monkeypatch)
    holed = generate(target, draft, knobs)
    assert seen["holes"] >= 2, "no round left a hole: the test checks nothing"
    with monkeypatch.context() as patch:
        compact_layout(patch)
        compact = generate(target, draft, knobs)
    assert_same(holed, compact)


@pytest.mark.parametrize("knobs", [CHAIN, TREE], ids=["chain", "tree"])
def test_compacting_every_round_changes_nothing(monkeypatch, knobs):
    target, draft = make_pair(noise=0.6)
    enable_diversed(target)
    holed = generate(target, draft, knobs)
    seen = watch(monkeypatch)
    monkeypatch.setattr(target_cache_module, "COMPACT_AT", 0)
    monkeypatch.setattr(target_cache_module, "COMPACT_SHARE", 0.0)
    compacted = generate(target, draft, knobs)
    assert seen["compactions"] >= 2
    assert_same(compacted, holed)


def test_sampled_rows_are_the_same_draws_with_holes(monkeypatch):
    """A seeded sampled batch with a relaxed verifier: the same draws whichever layout the target's cache keeps."""
    target, draft = make_pair(noise=0.6)
    enable_diversed(target)
    verifier = StaticEnsembleVerifier(0.6)
    holed = generate(target, draft, CHAIN, verifier=verifier, do_sample=True, seed=3)
    compact_layout(monkeypatch)
    compact = generate(target, draft, CHAIN, verifier=verifier, do_sample=True, seed=3)
    assert torch.equal(holed.sequences, compact.sequences)


def test_a_sliding_window_target_keeps_the_compact_layout(monkeypatch):
    """A sliding window counts cache columns, so a hole would shrink it: such a target never keeps holes."""
    windowed, draft = make_pair("gemma3", noise=0.6)  # every other layer slides
    assert compat.has_sliding_window(windowed) and not compat.has_sliding_window(make_pair()[0])
    seen = watch(monkeypatch)
    generate(enable_diversed(windowed), draft, CHAIN)
    assert seen["rounds"] >= 3 and seen["holes"] == 0
