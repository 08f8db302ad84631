"""training/ablation.py: the head ablation table, including heads moved to another draft (the transfer)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))

from diversed_hf import DiversedHead  # noqa: E402
from tiny_models import make_pair  # noqa: E402


def _row(method, family, acceptance, quality=0.5):
    return {"method": method, "family": family, "acceptance_rate": acceptance, "quality": quality,
            "quality_metric": "exact_match", "quality_delta": None}


def test_a_head_on_the_fine_tuned_draft_is_compared_with_sd_on_that_draft():
    import ablation

    target, draft = make_pair("llama")
    head = DiversedHead.for_pair(target, draft, features=["tv", "draft_top1"], use_hidden_states=False)
    rows = [
        _row("target-only", "target-only", None), _row("SD", "sd", 0.5), _row("SD (fine-tuned draft)", "sd-finetuned", 0.8),
        _row("features", "diversed", 0.75), _row("features" + ablation.FINETUNED, "diversed", 0.96),
    ]
    lines = ablation.table(rows, {"features": (head, {"train_seconds": 60.0})}).splitlines()
    by_name = {line.split(" | ")[0].lstrip("| "): line for line in lines[2:]}
    assert " 1.50x " in by_name["features"]  # 0.75 / SD's 0.5
    assert " 1.20x " in by_name["features (fine-tuned draft)"]  # 0.96 / the fine-tuned draft's SD 0.8
    assert "2 features" in by_name["features (fine-tuned draft)"] and "1.0 min" in by_name["features"]


def test_a_recipe_line_spells_out_the_settings_that_differ_from_the_yaml():
    import ablation
    import yaml

    defaults = yaml.safe_load((ablation.REPO / "training" / "configs" / "testbed_arith.yaml").read_text())
    target, draft = make_pair("llama")
    head = DiversedHead.for_pair(target, draft, features=["tv"])
    training = {"lambda_acceptance": 0.3, "seed": 2, "max_steps": defaults["max_steps"] + 1,
                "num_generations": defaults["num_generations"], "learning_rate": defaults["learning_rate"]}
    line = ablation.recipes("arith", {"h": (head, training)})
    assert f"--max_steps {defaults['max_steps'] + 1} " in line and "--seed 2 " in line and "--head_features tv " in line
    assert "--num_generations" not in line and "--learning_rate" not in line  # as in the YAML: not repeated


def test_a_baseline_that_accepted_nothing_gives_no_ratio_instead_of_a_crash():
    import ablation
    import headroom

    target, draft = make_pair("llama")
    head = DiversedHead.for_pair(target, draft)
    rows = [_row("SD", "sd", 0.0), _row("h#seed0", "diversed", 0.5), _row("h#seed1", "diversed", 0.6)]
    lines = ablation.table(rows, {"h#seed0": (head, {}), "h#seed1": (head, {})}).splitlines()
    assert " 50.0 % | – | " in lines[3] and len(lines) == 5  # no ratio, and no seed summary built on ratios
    assert "| h#seed0 | 50.0 % | – |" in headroom.table([dict(r, mean_target_weight=None) for r in rows])
