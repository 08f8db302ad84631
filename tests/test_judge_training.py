"""Training a judge (training/train_judge.py, diversed_hf.training.judge_labels) on the testbed: labels mined as
AutoJudge mines them, resumable and tied to their settings, a judge that loads and runs in JudgeVerifier."""

from __future__ import annotations

import json

import pytest
import torch

from diversed_hf import JudgeHead


def test_a_judge_is_mined_trained_measured_and_saved(tmp_path):
    import train_judge

    argv = ["--task", "testbed_arith", "--output_dir", str(tmp_path / "run"), "--num_train_examples", "30"]
    argv += ["--max_new_tokens", "48", "--eval_num_examples", "4", "--threads", "1"]
    saved = train_judge.main(argv)
    judge = JudgeHead.from_pretrained(saved)
    assert judge.config.task == "arith" and judge.config.hidden_size == 192
    record = json.loads((saved / "training.json").read_text())
    assert record["judge"]["num_swaps"] > 10 and 0 < record["judge"]["harmless_share"] < 1
    assert {"SD", "judge"} <= set(record["measured"]) and "quality_minus_sd" in record["measured"]["judge"]
    shard = next((tmp_path / "run" / "labels").glob("shard-*.safetensors"))
    stamp = shard.stat().st_mtime_ns
    train_judge.main([*argv, "--eval_num_examples", "0"])  # resumed: the mined shard is kept, not mined again
    assert shard.stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="labels mined with other settings"):
        train_judge.main([*argv, "--max_swaps", "2"])


def test_labels_need_both_kinds_of_swap():
    from diversed_hf.training.judge_labels import train_judge

    with pytest.raises(ValueError, match="needs both harmless and harmful swaps"):
        train_judge(JudgeHead(4), torch.randn(20, 4), torch.ones(20))


def test_bad_options_are_refused_by_name(capsys):
    import train_judge

    with pytest.raises(SystemExit):
        train_judge.parse_args(["--task", "testbed_arith", "--output_dir", "x", "--threshold", "-1"])
    assert "--threshold must be a number >= 0" in capsys.readouterr().err
