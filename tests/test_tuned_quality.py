"""``benchmarks/tuned_quality.py`` on tiny models: both targets answer the test prompts at temperature 1 and greedily,
the table pairs them, and a rerun scores only what is missing."""

from __future__ import annotations

import json

import pytest
from scripts import load_script
from test_training import tiny_tokenizer
from tiny_models import make_model

tuned_quality = load_script("tuned_quality")


def tiny_targets():
    return {"untuned": make_model("llama", seed=0), "tuned": make_model("llama", seed=1)}, tiny_tokenizer()


def an_adapter(directory, content: bytes):
    directory.mkdir()
    (directory / "adapter_config.json").write_text("{}")
    (directory / "adapter_model.safetensors").write_bytes(content)
    return directory


def test_both_targets_are_scored_on_the_same_prompts_and_a_rerun_resumes(tmp_path):
    adapter = an_adapter(tmp_path / "adapter", b"weights")
    output_dir = tmp_path / "out"
    argv = ["--adapter", str(adapter), "--num_examples", "3", "--samples", "2", "--batch_size", "2"]
    argv += ["--tasks", "arith_steps", "--output_dir", str(output_dir)]
    assert tuned_quality.main(argv, targets=tiny_targets) == 0
    results = json.loads((output_dir / "results.json").read_text())
    assert results["prompts"] == {"arith_steps": 3} and set(results["table"]) == {
        "arith_steps/t1",
        "arith_steps/greedy",
    }
    row = results["table"]["arith_steps/t1"]
    assert row["difference"]["num_prompts"] == 3
    assert row["difference"]["delta"] == pytest.approx(row["tuned"] - row["untuned"])
    records = sorted((output_dir / "records").iterdir())
    key = tuned_quality.adapter_key(adapter)
    assert [p.name for p in records] == sorted(
        f"{who}_bfloat16_{mode}_arith_steps_seed0.jsonl" for who in ("untuned", key) for mode in ("t1", "greedy")
    )
    sampled = [
        json.loads(line) for line in (output_dir / "records" / f"{key}_bfloat16_t1_arith_steps_seed0.jsonl").open()
    ]
    assert sorted((r["index"], r["sample"]) for r in sampled) == [(i, s) for i in range(3) for s in range(2)]
    section = (output_dir / "quality.md").read_text()
    assert "| `arith_steps` | temperature 1 |" in section and ">= 50: missed by" in section

    # a rerun after a kill mid-write: the cut line is answered again, nothing else
    greedy = output_dir / "records" / f"{key}_bfloat16_greedy_arith_steps_seed0.jsonl"
    lines = greedy.read_text().splitlines()
    greedy.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:10])
    assert tuned_quality.main(argv, targets=tiny_targets) == 0
    rows = [json.loads(line) for line in greedy.read_text().splitlines()]  # every line whole again
    assert sorted(r["index"] for r in rows) == [0, 1, 2]
    # another adapter gets records of its own
    other = an_adapter(tmp_path / "other", b"other weights")
    assert tuned_quality.adapter_key(other) != key


def test_a_missing_adapter_is_named_before_any_model_loads(tmp_path):
    def no_model():
        pytest.fail("a model was loaded")

    with pytest.raises(FileNotFoundError, match="no task-tuned adapter"):
        tuned_quality.main(["--adapter", str(tmp_path / "none"), "--output_dir", str(tmp_path)], targets=no_model)


def test_the_cards_quality_section_comes_from_the_measured_table(tmp_path):
    from diversed_hf.training.tuned_card import render_tuned_card

    adapter = an_adapter(tmp_path / "adapter", b"weights")
    output_dir = tmp_path / "out"
    argv = ["--adapter", str(adapter), "--num_examples", "2", "--tasks", "arith_steps", "--output_dir", str(output_dir)]
    tuned_quality.main(argv, targets=tiny_targets)
    results = json.loads((output_dir / "results.json").read_text())
    summary = tuned_quality.summary_line(results)
    row = results["table"]["arith_steps/t1"]
    assert f"`arith_steps` temperature 1: {row['tuned']:.1f} tuned against {row['untuned']:.1f} untuned" in summary
    measured = {"summary": summary, "prompts": "arith_steps: all 2", "metrics": "exact match", "command": "python x"}
    card = render_tuned_card({"measured": measured})
    assert "## Quality" in card and summary in card and "`python x`" in card
