"""The heads shipped with the testbed load, fit the testbed pair, and carry their measured results."""

from __future__ import annotations

import json

import pytest

import diversed_hf.testbed as testbed
from diversed_hf.features import FEATURE_NAMES
from diversed_hf.pairs import hidden_size_of


# Recorded by training/make_results.py (1,000 held-out prompts x 2 samples, T = 1, N = 5): the head's acceptance
# over SD's, and its quality minus the target distribution's (paired, with its 95 % interval). summary has less
# room than arith (the draft gets facts wrong, so w must stay high on them).
# Measured (RESULTS.md): arith 85.7 % vs 57.0 % (1.50x) at -3.4 [-5.4, -1.3] points of exact match; summary 60.9 %
# vs 48.6 % (1.25x) at -1.1 [-1.5, -0.6] points of ROUGE-2. These bounds guard against a worse head shipping; the
# goals (1.6x / 1.4x within 1 point) are not met yet.
MIN_ACCEPTANCE_RATIO = {"arith": 1.4, "summary": 1.2}
MAX_QUALITY_LOSS = {"arith": 0.04, "summary": 0.02}  # a fraction: 4 points of exact match, 2 of ROUGE-2


@pytest.mark.parametrize("name", ["arith", "summary"])
def test_shipped_head_loads_for_the_testbed_pair(name):
    head = testbed.load_head(name)
    target, draft, _ = testbed.load_pair()
    assert head.config.task == name and head.config.mixing == "probs"
    assert head.config.use_hidden_states and set(head.config.features) <= set(FEATURE_NAMES)
    assert head.config.target_model_id == "diversed_hf/testbed/target" == target.config._name_or_path
    assert (head.config.draft_hidden_size, head.config.target_hidden_size) == (hidden_size_of(draft), hidden_size_of(target))
    results = json.loads((testbed.ASSETS_DIR / "heads" / name / "results.json").read_text())
    assert results["setting"]["task"] == name
    rows = {row["family"]: row for row in results["rows"] if row.get("head_task") in (None, name)}  # its own head
    diversed, sd = rows["diversed"], rows["sd"]
    assert diversed["acceptance_rate"] >= MIN_ACCEPTANCE_RATIO[name] * sd["acceptance_rate"]
    assert diversed["quality_delta_low"] <= diversed["quality_delta"] <= diversed["quality_delta_high"]
    assert diversed["quality_delta"] >= -MAX_QUALITY_LOSS[name]
    assert diversed["num_prompts"] >= 1000


def test_unknown_head_is_an_error():
    with pytest.raises(ValueError, match="shipped heads exist for"):
        testbed.load_head("translation")


def test_shipped_arith_head_accepts_more_than_lossless_sd():
    """The head itself (not its recorded numbers): on 16 held-out prompts it accepts far more drafts."""
    import torch

    from diversed_hf import ExactVerifier, enable_diversed

    target, draft, tokenizer = testbed.load_pair()
    enable_diversed(target)
    tokenizer.padding_side = "left"
    prompts = list(testbed.load_task("arith", split="test", num_examples=16, seed=3)["prompt"])
    inputs = tokenizer(prompts, return_tensors="pt", padding=True)
    rates = {}
    for name, extra in (("sd", {"verifier": ExactVerifier()}), ("head", {"diversed_head": testbed.load_head("arith")})):
        out = target.generate(
            **inputs, **extra, assistant_model=draft, num_assistant_tokens=5, do_sample=True, top_k=0,
            max_new_tokens=40, return_dict_in_generate=True, generator=torch.Generator().manual_seed(0),
        )  # fmt: skip
        rates[name] = out.speculation.total_accepted / out.speculation.total_drafted
    assert rates["head"] >= 1.2 * rates["sd"], rates
