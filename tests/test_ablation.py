"""benchmarks/ablation.py: the head ablation table, including heads moved to another draft (the transfer)."""

from __future__ import annotations

from scripts import load_script
from tiny_models import make_pair

from diversed_hf import DiversedHead


def _row(method, family, acceptance, quality=0.5):
    return {
        "method": method,
        "family": family,
        "acceptance_rate": acceptance,
        "quality": quality,
        "quality_metric": "exact_match",
        "quality_delta": None,
    }


def test_a_head_on_the_fine_tuned_draft_is_compared_with_sd_on_that_draft():
    ablation = load_script("ablation")

    target, draft = make_pair("llama")
    head = DiversedHead.for_pair(target, draft, features=["tv", "draft_top1"], use_hidden_states=False)
    rows = [
        _row("target-only", "target-only", None),
        _row("SD", "sd", 0.5),
        _row("SD (fine-tuned draft)", "sd-finetuned", 0.8),
        _row("features", "diversed", 0.75),
        _row("features" + ablation.FINETUNED, "diversed", 0.96),
    ]
    lines = ablation.table(rows, {"features": (head, {"train_seconds": 60.0})}).splitlines()
    by_name = {line.split(" | ")[0].lstrip("| "): line for line in lines[2:]}
    assert " 1.50x " in by_name["features"]  # 0.75 / SD's 0.5
    assert " 1.20x " in by_name["features (fine-tuned draft)"]  # 0.96 / the fine-tuned draft's SD 0.8
    assert "2 features" in by_name["features (fine-tuned draft)"] and "1.0 min" in by_name["features"]


def test_a_recipe_line_spells_out_the_settings_that_differ_from_the_yaml():
    ablation = load_script("ablation")
    import yaml

    defaults = yaml.safe_load((ablation.REPO / "training" / "configs" / "testbed_arith.yaml").read_text())
    target, draft = make_pair("llama")
    head = DiversedHead.for_pair(target, draft, features=["tv"])
    training = {
        "lambda_acceptance": 0.3,
        "seed": 2,
        "max_steps": defaults["max_steps"] + 1,
        "num_generations": defaults["num_generations"],
        "learning_rate": defaults["learning_rate"],
    }
    line = ablation.recipes("arith", {"h": (head, training)})
    assert f"--max_steps {defaults['max_steps'] + 1} " in line and "--seed 2 " in line and "--head_features tv " in line
    assert "--num_generations" not in line and "--learning_rate" not in line  # as in the YAML: not repeated


def test_a_baseline_that_accepted_nothing_gives_no_ratio_instead_of_a_crash():
    ablation = load_script("ablation")
    headroom = load_script("headroom")

    target, draft = make_pair("llama")
    head = DiversedHead.for_pair(target, draft)
    rows = [_row("SD", "sd", 0.0), _row("h#seed0", "diversed", 0.5), _row("h#seed1", "diversed", 0.6)]
    lines = ablation.table(rows, {"h#seed0": (head, {}), "h#seed1": (head, {})}).splitlines()
    assert " 50.0 % | – | " in lines[3] and len(lines) == 5  # no ratio, and no seed summary built on ratios
    assert "| h#seed0 | 50.0 % | – |" in headroom.table([dict(r, mean_target_weight=None) for r in rows])


def _sweep():
    """Rows of a lambda sweep: target-only, SD and three heads, with their paired intervals (fractions)."""

    def head(method, acceptance, delta, low, high):
        return dict(
            _row(method, "diversed", acceptance), quality_delta=delta, quality_delta_low=low, quality_delta_high=high
        )

    rows = [
        dict(
            _row("target-only", "target-only", None),
            quality_delta=0.0,
            quality_delta_low=-0.02,
            quality_delta_high=0.02,
        ),
        dict(_row("SD", "sd", 0.5), quality_delta=0.0, quality_delta_low=-0.02, quality_delta_high=0.02),
        head("l0.3", 0.86, -0.04, -0.06, -0.01),
        head("l0.1", 0.80, -0.01, -0.04, 0.02),
        head("l0.05", 0.70, 0.01, -0.02, 0.04),
    ]
    return rows


def test_the_front_ships_the_most_accepting_head_whose_interval_reaches_zero():
    ablation = load_script("ablation")

    target, draft = make_pair("llama")
    head = DiversedHead.for_pair(target, draft)
    rows = _sweep()
    heads = {name: (head, {"lambda_acceptance": lam}) for name, lam in (("l0.3", 0.3), ("l0.1", 0.1), ("l0.05", 0.05))}
    assert ablation.operating_point(rows)["method"] == "l0.1"  # l0.3 accepts more, but its interval ends at -1 point
    text = ablation.front_table(rows, heads)
    lines = text.splitlines()
    assert [line.split(" | ")[0] for line in lines[4:7]] == ["| 0.05", "| 0.1", "| 0.3"]  # by lambda
    assert "| 0.1 | **l0.1** (chosen) | 80.0 % | 1.60x |" in text and "| 0.3 | l0.3 | 86.0 % | 1.72x |" in text
    assert lines[6].endswith("| no |") and lines[5].endswith("| yes |")
    assert text.endswith("the head to ship is **l0.1** (lambda = 0.1).")
    assert ablation.operating_point([r for r in rows if r["method"] in ("SD", "l0.3")]) is None


def test_the_front_writes_the_chosen_heads_card_results_with_the_front(tmp_path):
    ablation = load_script("ablation")

    from diversed_hf.heads import cards
    from diversed_hf.lab.bench.schema import BenchResult

    target, draft = make_pair("llama")
    head = DiversedHead.for_pair(target, draft, task="arith")
    heads = {name: (head, {"lambda_acceptance": lam}) for name, lam in (("l0.3", 0.3), ("l0.1", 0.1), ("l0.05", 0.05))}
    meta = {
        "config": {"temperature": 1.0, "num_draft_tokens": 5, "max_new_tokens": 100, "num_samples": 2},
        "quality_metric": "exact_match",
        "target": "t",
        "draft": "d",
    }
    rows = [dict(row, num_prompts=600) for row in _sweep()]
    results = ablation.front_results(
        BenchResult("arith", rows, {}, [], meta), heads, "python benchmarks/ablation.py ..."
    )
    assert [row["method"] for row in results["rows"]] == ["target-only", "SD", "DIVERSED"]
    assert results["rows"][2]["acceptance_rate"] == 0.80 and results["rows"][2]["head_task"] == "arith"
    assert results["selection"]["chosen"] == "l0.1" and results["selection"]["lambda_acceptance"] == 0.1
    assert [entry["lambda_acceptance"] for entry in results["selection"]["front"]] == [0.05, 0.1, 0.3]
    text = head.generate_model_card(results=cards.load_results(results)).text
    assert "### Operating point" in text and "**l0.1** (`lambda_acceptance = 0.1`)" in text
    assert "| **0.1** | **l0.1** | **80.0 %** | **1.60x** | **50.00** | **-1.0 [-4.0, +2.0]** |" in text
    assert "| 0.3 | l0.3 | 86.0 % | 1.72x | 50.00 | -4.0 [-6.0, -1.0] |" in text
