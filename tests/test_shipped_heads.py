"""The heads shipped with the testbed load, fit the testbed pair, and carry their measured results."""

from __future__ import annotations

import json

import pytest

import diversed_hf.testbed as testbed
from diversed_hf.head import hidden_size_of


@pytest.mark.parametrize("name", ["arith", "summary"])
def test_shipped_head_loads_for_the_testbed_pair(name):
    head = testbed.load_head(name)
    target, draft, _ = testbed.load_pair()
    assert head.config.task == name and head.config.mixing == "probs"
    assert (head.config.draft_hidden_size, head.config.target_hidden_size) == (hidden_size_of(draft), hidden_size_of(target))
    results = json.loads((testbed.ASSETS_DIR / "heads" / name / "results.json").read_text())
    rates = {row["method"]: row.get("acceptance_rate") for row in results["rows"]}
    assert rates["diversed"] >= 1.3 * rates["sd"]


def test_unknown_head_is_an_error():
    with pytest.raises(ValueError, match="shipped heads exist for"):
        testbed.load_head("translation")
