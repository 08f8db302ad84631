"""benchmarks/relaxed_results.py's pure parts: each front's verdict against DIVERSED and the judge it ships."""

from scripts import load_script

relaxed_results = load_script("relaxed_results")
operating_judge = relaxed_results.operating_judge
verdict = relaxed_results.verdict


def _row(family, method, acceptance, delta, low, high, param=None):
    return {
        "family": family,
        "method": method,
        "param": param,
        "task": "arith",
        "acceptance_rate": acceptance,
        "quality_delta": delta,
        "quality_delta_low": low,
        "quality_delta_high": high,
    }


ROWS = [
    _row("sd", "SD", 0.50, 0.0, -0.02, 0.02),
    _row("diversed", "DIVERSED", 0.80, -0.005, -0.02, 0.01),
    _row("fuzzy", "fuzzy T=0.1", 0.60, 0.0, -0.01, 0.01, 0.1),
    _row("fuzzy", "fuzzy T=0.2", 0.70, -0.05, -0.08, -0.02, 0.2),
    _row("judge", "judge t=0.99", 0.65, -0.01, -0.03, 0.005, 0.99),
    _row("judge", "judge t=0.9", 0.85, -0.04, -0.06, -0.01, 0.9),
]


def test_each_front_is_read_at_the_targets_quality_and_at_diverseds_acceptance():
    lines = verdict(ROWS)
    assert lines[0].startswith("DIVERSED: 80.0 % accepted")
    fuzzy = next(line for line in lines if line.startswith("fuzzy SD"))
    # the most accepting setting whose interval reaches 0; the front stops short of DIVERSED's acceptance
    assert "at most 60.0 % accepted (fuzzy T=0.1" in fuzzy and "above this front (+20.0 points)" in fuzzy
    assert "No setting accepts as much as DIVERSED (at most 70.0 %)" in fuzzy
    judge = next(line for line in lines if line.startswith("judge decoding"))
    assert "at most 65.0 % accepted (judge t=0.99" in judge
    assert "At DIVERSED's acceptance or more (judge t=0.9, 85.0 %) its quality is -0.040 [-0.060, -0.010]" in judge
    assert "(-0.035 against DIVERSED)" in judge
    assert not any(line.startswith(("static ensemble", "top-2 relaxed")) for line in lines)  # not measured
    assert lines[-1] == "At the target's quality DIVERSED accepts the most of every rule measured."
    short = [ROWS[0], {**ROWS[1], "quality_delta_high": -0.001}, *ROWS[2:]]
    lines = verdict(short)
    assert "(short of the target's quality)" in lines[0]
    assert "DIVERSED, short of the target's quality itself, is not above this front (+20.0 points)" in lines[1]
    assert lines[-1] == (
        "At the target's quality judge t=0.99 accepts the most (65.0 %, quality -0.010 [-0.030, +0.005]); DIVERSED "
        "accepts +15.0 points against it but is short of the target's quality (its interval ends at -0.001)."
    )


def test_a_front_that_never_reaches_the_targets_quality_lies_below_diversed():
    rows = [*ROWS[:2], _row("topk-relaxed", "top-2 relaxed d=4", 0.9, -0.1, -0.2, -0.05, 4.0)]
    line = next(line for line in verdict(rows) if line.startswith("top-2 relaxed"))
    assert "no setting reaches the target's quality; DIVERSED lies above the whole front" in line
    rows[1] = {**rows[1], "quality_delta_high": -0.01}
    line = next(line for line in verdict(rows) if line.startswith("top-2 relaxed"))
    assert "no setting reaches the target's quality, nor does DIVERSED." in line


def test_the_shipped_judge_keeps_the_targets_quality_and_beats_sd():
    assert operating_judge(ROWS)["method"] == "judge t=0.99"
    below_sd = [ROWS[0], _row("judge", "judge t=0.999", 0.45, 0.0, -0.01, 0.01, 0.999)]
    assert operating_judge(below_sd) is None
