"""The heads shipped with the testbed load, fit the testbed pair, and carry their measured results."""

from __future__ import annotations

import json

import pytest

import diversed_hf.testbed as testbed
from diversed_hf.pairs import hidden_size_of


# Recorded by training/eval_head.py (200 held-out problems x 3 sampling seeds, T = 1, N = 5): arith must
# keep the bar (>= 1.3x SD's acceptance, accuracy within 2 points of target-only); summary has
# less room (the draft gets facts wrong, so w must stay high on them) and is held to >= 1.2x.
MIN_ACCEPTANCE_RATIO = {"arith": 1.3, "summary": 1.2}


@pytest.mark.parametrize("name", ["arith", "summary"])
def test_shipped_head_loads_for_the_testbed_pair(name):
    head = testbed.load_head(name)
    target, draft, _ = testbed.load_pair()
    assert head.config.task == name and head.config.mixing == "probs"
    assert head.config.target_model_id == "diversed_hf/testbed/target" == target.config._name_or_path
    assert (head.config.draft_hidden_size, head.config.target_hidden_size) == (hidden_size_of(draft), hidden_size_of(target))
    results = json.loads((testbed.ASSETS_DIR / "heads" / name / "results.json").read_text())
    rows = {row["method"]: row for row in results["rows"]}
    assert rows["diversed"]["acceptance_rate"] >= MIN_ACCEPTANCE_RATIO[name] * rows["sd"]["acceptance_rate"]
    assert abs(rows["diversed"]["quality"] - rows["autoregressive"]["quality"]) <= 0.02


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
