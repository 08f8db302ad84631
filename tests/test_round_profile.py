"""Profiling a round (diversed_hf.common.round_profile): the phases add up to the loop's wall time, outputs are unchanged."""

from __future__ import annotations

import pytest
import torch
from scripts import load_script

from diversed_hf import enable_diversed, testbed
from diversed_hf.common.round_profile import PHASES, profile_rounds
from diversed_hf.verifiers import ExactVerifier


def test_a_profiled_call_keeps_its_output_and_accounts_for_its_rounds():
    target, draft, tokenizer = testbed.load_pair()
    enable_diversed(target)
    inputs = tokenizer(["12+7=", "3*4="], return_tensors="pt", padding=True)
    kwargs = dict(assistant_model=draft, verifier=ExactVerifier(), do_sample=False, max_new_tokens=12)
    reference = target.generate(**inputs, **kwargs, return_dict_in_generate=True)
    with profile_rounds() as profile:
        out = target.generate(**inputs, **kwargs, return_dict_in_generate=True)
    assert torch.equal(out.sequences, reference.sequences)
    assert profile.rounds == int(out.speculation.num_rounds.max()) and profile.wall > 0
    rows = profile.rows()
    assert [name for name, _, _ in rows] == [*PHASES, "outside the phases"]
    assert abs(sum(share for _, _, share in rows) - 1) < 1e-6
    assert profile.seconds["target forward"] > 0 and profile.seconds["draft forward"] > 0
    assert "| **all** (" in profile.table()
    with profile_rounds(), pytest.raises(RuntimeError, match="already active"):
        with profile_rounds():
            pass


def test_the_overhead_section_reports_the_testbed_against_transformers_and_its_goal(tmp_path):
    """benchmarks/overhead_results.py --quick: compare_hf's measurement with identical outputs, rendered with the goal."""
    import json

    overhead_results = load_script("overhead_results")

    assert overhead_results.main(["--quick", "--output_dir", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    lossless = results["testbed"]["lossless"]
    assert lossless["identical"] and lossless["ratio"] == pytest.approx(lossless["ours"] / lossless["transformers"])
    section = (tmp_path / "overhead.md").read_text()
    verdict = "met" if lossless["ratio"] <= 0.80 else f"missed by {lossless['ratio'] - 0.80:.2f}"
    assert f"(lossless): {lossless['ratio']:.2f}x, {verdict}." in section
    assert "| target forward |" in section and "python benchmarks/overhead_results.py --quick" in section
    assert "a loop with no overhead at all would take" in section
    with pytest.raises(SystemExit):
        overhead_results.parse_args(["--repeats", "0"])
