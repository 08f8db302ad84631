"""The training recipes end to end on tiny models: train_head.py (head repo with card) and distill_draft.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("peft")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))

from test_training import tiny_tokenizer  # noqa: E402
from tiny_models import make_pair  # noqa: E402


@pytest.fixture()
def tiny_pair_dirs(tmp_path):
    target, draft = make_pair(noise=0.5)
    tokenizer = tiny_tokenizer()
    paths = []
    for name, model in (("target", target), ("draft", draft)):
        path = tmp_path / name
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths.append(str(path))
    return paths


def test_train_head_recipe_writes_a_hub_ready_head(tmp_path, tiny_pair_dirs):
    import train_head

    target, draft = tiny_pair_dirs
    out = tmp_path / "run"
    train_head.main([
        "--config", str(Path(__file__).resolve().parents[1] / "training" / "configs" / "testbed_arith.yaml"),
        "--target_model", target, "--draft_model", draft, "--output_dir", str(out), "--head_dir", str(out / "head"),
        "--num_train_examples", "16", "--max_steps", "2", "--save_steps", "1", "--max_completion_length", "6",
        "--eval_num_examples", "4", "--eval_max_new_tokens", "6", "--threads", "1", "--disable_tqdm", "true", "--logging_steps", "1",
    ])  # fmt: skip
    head_files = {p.name for p in (out / "head").iterdir()}
    assert {"config.json", "model.safetensors", "training_config.json", "results.json"} <= head_files
    results = json.loads((out / "head" / "results.json").read_text())
    assert [row["method"] for row in results["rows"]] == ["autoregressive", "sd", "diversed"]
    assert len((out / "train_log.jsonl").read_text().splitlines()) >= 2
    from diversed_hf.training import load_head

    assert load_head(out / "head").config.task == "arith"


def test_distill_draft_recipe_saves_a_merged_draft(tmp_path, tiny_pair_dirs):
    import distill_draft
    from transformers import AutoModelForCausalLM

    target, draft = tiny_pair_dirs
    merged = distill_draft.main([
        "--task", "testbed_arith", "--target_model", target, "--draft_model", draft, "--output_dir", str(tmp_path / "d"),
        "--num_train_examples", "8", "--max_new_tokens", "6", "--max_steps", "2", "--per_device_train_batch_size", "4",
        "--report_to", "none", "--bf16", "false", "--save_strategy", "no", "--disable_tqdm", "true",
    ])  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(merged)
    assert not any("lora" in name for name, _ in model.named_parameters())


def test_calibration_picks_the_most_accepting_offset_within_tolerance():
    from calibrate_head import choose_offset

    rows = [
        {"offset": 0.0, "quality": 0.70, "acceptance_rate": 0.85},
        {"offset": 3.0, "quality": 0.79, "acceptance_rate": 0.80},
        {"offset": 5.0, "quality": 0.81, "acceptance_rate": 0.76},
        {"offset": 8.0, "quality": 0.82, "acceptance_rate": 0.60},
    ]
    assert choose_offset(0.80, rows, tolerance=0.01)["offset"] == 3.0
    assert choose_offset(0.80, rows, tolerance=0.0)["offset"] == 5.0
    assert choose_offset(0.90, rows, tolerance=0.01)["offset"] == 8.0  # none qualifies: best quality


def test_calibrate_head_recipe_saves_the_shifted_head(tmp_path, tiny_pair_dirs):
    import calibrate_head
    import torch
    from transformers import AutoModelForCausalLM

    from diversed_hf import DiversedHead

    target, draft = tiny_pair_dirs
    head = DiversedHead.for_pair(AutoModelForCausalLM.from_pretrained(target), AutoModelForCausalLM.from_pretrained(draft))
    head.save_pretrained(tmp_path / "raw", training_config={"lambda_acceptance": 0.1, "calibration_logit_offset": 1.0})
    out = tmp_path / "calibrated"
    summary = calibrate_head.main([
        "--task", "testbed_arith", "--head", str(tmp_path / "raw"), "--target", target, "--draft", draft,
        "--offsets", "0", "2", "--tolerance", "1.0", "--num-examples", "3", "--max-new-tokens", "4", "--output-dir", str(out),
    ])  # fmt: skip
    assert [row["offset"] for row in summary["rows"]] == [0.0, 2.0]
    chosen = summary["chosen_offset"]
    saved = DiversedHead.from_pretrained(out)
    torch.testing.assert_close(saved.net[-1].bias, head.net[-1].bias + chosen)
    record = json.loads((out / "training_config.json").read_text())
    assert record["calibration_logit_offset"] == 1.0 + chosen and record["lambda_acceptance"] == 0.1
    assert json.loads((out / "calibration.json").read_text())["chosen_offset"] == chosen
    with pytest.raises(SystemExit):
        calibrate_head.parse_args(["--task", "testbed_arith", "--head", "x", "--tolerance", "-1"])


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--goal_acceptance_ratio", "1.6"], "a goal needs both"),
        (["--goal_acceptance_ratio", "0", "--goal_max_quality_loss", "0.01"], "must be > 0"),
        (["--goal_acceptance_ratio", "1.6", "--goal_max_quality_loss", "1"], "a fraction in \\[0, 1\\)"),
    ],
)
def test_train_head_refuses_a_half_or_impossible_goal(flags, message):
    import train_head

    with pytest.raises(ValueError, match=message):
        train_head.parse_arguments(["--task", "testbed_arith", *flags])


def test_the_recipes_record_their_goal():
    import train_head

    config = str(Path(__file__).resolve().parents[1] / "training" / "configs" / "testbed_summary.yaml")
    script, _ = train_head.parse_arguments(["--config", config])
    assert (script.goal_acceptance_ratio, script.goal_max_quality_loss) == (1.4, 0.01)
