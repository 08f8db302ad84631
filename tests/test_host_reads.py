"""A round of the batched loop reads the device at most twice (docs/generation.md, "Device reads"): the draft length
``N_r`` when drafting, then one transfer of the round's decisions (accepted drafts, kept tokens, finished rows and the
deferred checks that every distribution has mass) that the realignment runs on.

Every way a tensor's value reaches Python (``item``, ``tolist``, ``bool``, ``int``, ``float``, ``index``) is counted
while a round runs, on the CPU; what transformers' own model code reads (its attention-mask shortcut,
``masking_utils``) is the models', not the loop's, and is reported apart.
"""

from __future__ import annotations

import collections
import traceback

import pytest
import torch
from tiny_models import left_padded_batch, make_pair

from diversed_hf import EagleDraft, enable_diversed
from diversed_hf.generation import loop as loop_module
from diversed_hf.verifiers import ExactVerifier, StaticEnsembleVerifier

READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")
MODEL_CODE = ("transformers/masking_utils.py", "transformers/models/", "transformers/modeling_")


def count_reads(monkeypatch, run) -> tuple[int, collections.Counter, collections.Counter]:
    """``run()`` with every device read counted while a round runs: (rounds, the loop's reads by site, the models')."""
    state = {"in_round": False, "rounds": 0}
    ours, models = collections.Counter(), collections.Counter()
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            if state["in_round"]:
                stack = traceback.extract_stack()[:-1]
                if any(part in frame.filename for frame in stack for part in MODEL_CODE):
                    models[_name] += 1
                else:
                    site = next(f for f in reversed(stack) if "diversed_hf" in f.filename or "tests" in f.filename)
                    ours[f"{_name} {site.filename.rsplit('/', 2)[-1]}:{site.lineno}"] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    draft, realign = loop_module._SpeculativeLoop.draft, loop_module._SpeculativeLoop.realign

    def drafting(self):
        state["in_round"], state["rounds"] = True, state["rounds"] + 1
        return draft(self)

    def realigning(self, *args, **kwargs):
        try:
            return realign(self, *args, **kwargs)
        finally:
            state["in_round"] = False

    monkeypatch.setattr(loop_module._SpeculativeLoop, "draft", drafting)
    monkeypatch.setattr(loop_module._SpeculativeLoop, "realign", realigning)
    run()
    return state["rounds"], ours, models


@pytest.mark.parametrize("drafter", ["draft model", "EagleDraft"])
@pytest.mark.parametrize("do_sample", [False, True])
@pytest.mark.parametrize("verifier", [ExactVerifier(), StaticEnsembleVerifier(0.5)], ids=["exact", "static"])
def test_a_chain_round_reads_the_device_at_most_twice(monkeypatch, drafter, do_sample, verifier):
    target, draft = make_pair()
    enable_diversed(target)
    if drafter == "EagleDraft":
        draft = EagleDraft.for_target(target).eval()
    _, input_ids, attention_mask = left_padded_batch([5, 7, 4, 6])
    torch.manual_seed(0)

    def run():
        target.generate(
            input_ids,
            attention_mask=attention_mask,
            assistant_model=draft,
            verifier=verifier,
            num_assistant_tokens=3,
            max_new_tokens=16,
            do_sample=do_sample,
        )

    rounds, ours, _ = count_reads(monkeypatch, run)
    assert rounds >= 3
    assert sum(ours.values()) <= 2 * rounds, f"{sum(ours.values())} reads in {rounds} rounds: {dict(ours)}"


@pytest.mark.parametrize("drafter", ["draft model", "EagleDraft"])
@pytest.mark.parametrize("do_sample", [False, True])
def test_a_tree_round_reads_the_device_at_most_twice(monkeypatch, drafter, do_sample):
    """A tree round: the tree's level sizes (its layout's one read, which also says whether any row may draft), then
    the round's decisions; the walk runs every level masked, with no read."""
    target, draft = make_pair(noise=0.6)
    enable_diversed(target)
    if drafter == "EagleDraft":
        draft = EagleDraft.for_target(target).eval()
    _, input_ids, attention_mask = left_padded_batch([5, 7, 4, 6])
    torch.manual_seed(0)

    def run():
        target.generate(
            input_ids,
            attention_mask=attention_mask,
            assistant_model=draft,
            verifier=ExactVerifier(),
            num_assistant_tokens=3,
            assistant_tree_top_k=2,
            assistant_tree_size=6,
            max_new_tokens=16,
            do_sample=do_sample,
        )

    rounds, ours, _ = count_reads(monkeypatch, run)
    assert rounds >= 3
    assert sum(ours.values()) <= 2 * rounds, f"{sum(ours.values())} reads in {rounds} rounds: {dict(ours)}"


def test_the_counter_sees_a_read_the_loop_would_add(monkeypatch):
    """A ``bool(tensor)`` added to a round is counted (the count above can fail)."""
    target, draft = make_pair()
    enable_diversed(target)
    _, input_ids, attention_mask = left_padded_batch([5, 7])
    commit = loop_module._SpeculativeLoop.commit

    def commit_and_read(self, *args, **kwargs):
        emitted, count, finished = commit(self, *args, **kwargs)
        bool(finished.any())  # the read a careless edit would add
        return emitted, count, finished

    monkeypatch.setattr(loop_module._SpeculativeLoop, "commit", commit_and_read)
    rounds, ours, _ = count_reads(
        monkeypatch,
        lambda: target.generate(
            input_ids,
            attention_mask=attention_mask,
            assistant_model=draft,
            verifier=ExactVerifier(),
            num_assistant_tokens=3,
            max_new_tokens=8,
        ),
    )
    assert sum(ours.values()) == 3 * rounds
