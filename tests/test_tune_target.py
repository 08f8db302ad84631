"""``training/tune_target.py`` on a tiny Llama and the word-level tokenizer: a run end to end and its resume, the
options refused before any model loads; and the task-tuned pair's loader without its files (no real model loads)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import yaml

pytest.importorskip("trl")
pytest.importorskip("peft")

import tune_target  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from test_training import tiny_tokenizer  # noqa: E402
from tiny_models import make_model  # noqa: E402

from diversed_hf import testbed  # noqa: E402
from diversed_hf.lab.tasks.chat_prompts import broad_chat_prompts  # noqa: E402
from diversed_hf.testbed import smollm2, smollm2_tuned  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "training" / "configs" / "smollm2_tuned_target.yaml"
FLAGS = ["--num_synopsis", "2", "--num_arith_steps", "2", "--num_chat", "3", "--chat_max_new_tokens", "3"]
FLAGS += ["--generation_batch_size", "2", "--batch_size", "2", "--gradient_accumulation_steps", "1"]
FLAGS += ["--max_length", "256", "--lora_r", "2", "--target_modules", "q_proj", "v_proj", "--save_steps", "1"]
FLAGS += ["--learning_rate", "0.05", "--mixed_precision", "bf16"]


def tiny_target():
    return make_model("llama"), tiny_tokenizer()


def no_model():
    pytest.fail("a model was loaded")


def test_a_run_saves_its_adapter_record_and_card_then_resumes_where_it_stopped(tmp_path, monkeypatch):
    output_dir = tmp_path / "run"
    output_dir.mkdir()
    # what an interrupted run leaves: two answers, then a line cut short
    prompts = broad_chat_prompts(3, seed=0)
    cached = [
        {"prompt": prompts[0], "max_new_tokens": 3, "answer": "t5 t6", "finished": True, "seconds": 1.5},
        {"prompt": prompts[1], "max_new_tokens": 3, "answer": "t7 t8 t9", "finished": False, "seconds": 1.5},
    ]
    answers = output_dir / "chat_answers.jsonl"
    answers.write_text("".join(json.dumps(row) + "\n" for row in cached) + '{"prompt": "<|im_sta')
    argv = ["--output_dir", str(output_dir), *FLAGS, "--max_steps", "1"]
    saved = tune_target.main(argv, load_target=tiny_target)

    assert saved == output_dir / "adapter"
    assert sorted(p.name for p in saved.iterdir()) == sorted(tune_target.SAVED_FILES)
    weights = load_file(saved / "adapter_model.safetensors")
    assert weights and all("lora_" in name and w.dtype == torch.bfloat16 for name, w in weights.items())
    adapter_config = json.loads((saved / "adapter_config.json").read_text())
    assert adapter_config["r"] == 2 and set(adapter_config["target_modules"]) == {"q_proj", "v_proj"}
    record = json.loads((saved / "training.json").read_text())
    assert record["data"]["tasks"] == {"synopsis": 2, "arith_steps": 2}
    # the cached finished answer is used, the cut-off one is not; the third was answered now (and cut off at 3)
    assert record["data"]["chat"] == {"prompts": 3, "used": 1, "cut_off": 2, "empty": 0}
    assert record["data"]["train_pairs"] == 5 and record["seconds"]["chat_answers"] >= 3.0
    assert (record["steps"], record["sessions"], record["resumed_from"], record["seed"]) == (1, 1, None, 0)
    assert record["recipe"] == "python training/tune_target.py " + " ".join(argv)
    assert record["settings"]["lora_r"] == 2 and record["eos_token"] == "t1"
    assert record["lora"]["parameters"] > 0 and record["lora"]["adapter_bytes"] == (
        (saved / "adapter_model.safetensors").stat().st_size
    )
    card = (saved / "README.md").read_text()
    assert "bfloat16 autocast over float32 weights" in card
    assert "rank 2, alpha 32" in card and "| `arith_steps` (train split) | 2 |" in card and record["recipe"] in card
    lines = answers.read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line)["max_new_tokens"] == 3 for line in lines)  # the cut line dropped

    # the same command with more steps: resumes from checkpoint-1 and reuses the answers
    before = answers.read_text()
    argv = ["--output_dir", str(output_dir), *FLAGS, "--max_steps", "2"]
    tune_target.main(argv, load_target=tiny_target)
    resumed = json.loads((saved / "training.json").read_text())
    assert (resumed["steps"], resumed["sessions"], resumed["resumed_from"]) == (2, 2, "checkpoint-1")
    assert [(s["start_step"], s["end_step"]) for s in resumed["session_log"]] == [(0, 1), (1, 2)]
    assert resumed["seconds"]["training"] == pytest.approx(sum(s["seconds"] for s in resumed["session_log"]), abs=0.2)
    assert resumed["seconds"]["training"] >= record["seconds"]["training"]
    assert answers.read_text() == before
    state = json.loads((output_dir / "checkpoints" / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2

    # the adapter merges into its base as the tuned target
    monkeypatch.setattr(smollm2, "load_smollm2_target", lambda *a, **k: tiny_target())
    merged, _ = smollm2_tuned.load_tuned_target(adapter=saved)
    base = make_model("llama")
    assert merged.config._name_or_path == smollm2_tuned.TUNED_MODEL_ID
    assert not torch.equal(merged.model.layers[0].self_attn.q_proj.weight, base.model.layers[0].self_attn.q_proj.weight)
    assert torch.equal(merged.model.layers[0].self_attn.k_proj.weight, base.model.layers[0].self_attn.k_proj.weight)

    # another run's settings are refused before the model loads
    with pytest.raises(ValueError, match=r"checkpoints of a run with other settings \(--lora_r 2 -> 4\)"):
        tune_target.main([*argv, "--lora_r", "4"], load_target=no_model)


def _recipe(tmp_path, text: str) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--learning_rate=-1e-4"], "--learning_rate must be a positive finite number, got -0.0001"),
        (["--learning_rate", "nan"], "--learning_rate must be a positive finite number"),
        (["--lora_r", "0"], "--lora_r must be a positive integer, got 0"),
        (["--lora_dropout", "1"], r"--lora_dropout must be in \[0, 1\), got 1.0"),
        (["--epochs", "0"], "--epochs must be a positive finite number, got 0.0"),
        (["--mixed_precision", "fp16"], "--mixed_precision is 'fp16'; use one of no, bf16"),
        (["--max_steps", "0"], "--max_steps must be a positive integer, got 0"),
        (["--num_chat", "-1"], "--num_chat must be 0 or a positive integer, got -1"),
        (["--num_synopsis", "0", "--num_arith_steps", "0", "--num_chat", "0"], "the training mix is empty"),
        (["--num_synopsis", "5000"], "--num_synopsis is 5000, but synopsis's train split has 1904 pairs"),
        (["--target_modules", "lm_head"], r"--target_modules is \['lm_head'\].*among the Llama layers"),
        (["--config", "no/such/recipe.yaml"], "--config no/such/recipe.yaml: no such file"),
        (["--config", "{tmp}"], r"recipe.yaml: unknown key 'lora_rank'; its keys are the options: .*lora_r"),
    ],
)
def test_bad_options_are_refused_before_any_model_loads(tmp_path, capsys, flags, message):
    recipe = _recipe(tmp_path, "lora_rank: 8\n")
    flags = [recipe if flag == "{tmp}" else flag for flag in flags]
    with pytest.raises(SystemExit) as exit_info:
        tune_target.main(["--output_dir", str(tmp_path / "run"), *flags], load_target=no_model)
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


def test_a_recipe_value_of_the_wrong_kind_is_named(tmp_path, capsys):
    for text, message in (
        ("lora_r: sixteen\n", "`lora_r` is 'sixteen'; it must be an integer"),
        ("learning_rate: true\n", "`learning_rate` is True; it must be a number"),
        ("- lora_r\n", "must hold a mapping of option: value, got list"),
    ):
        with pytest.raises(SystemExit):
            tune_target.parse_args(["--config", _recipe(tmp_path, text)])
        assert message in capsys.readouterr().err


def test_the_recipe_is_valid_and_flags_override_it(capsys):
    with pytest.raises(SystemExit) as exit_info:
        tune_target.parse_args(["--help"])
    assert exit_info.value.code == 0 and "--gradient_accumulation_steps" in capsys.readouterr().out
    args = tune_target.parse_args(["--config", str(RECIPE), "--lora-r", "8"])
    recipe = yaml.safe_load(RECIPE.read_text())
    assert args.lora_r == 8 and args.learning_rate == recipe["learning_rate"] and args.num_chat == recipe["num_chat"]
    assert args.target_modules == list(tune_target.LLAMA_LINEAR) and args.output_dir == "runs/tuned_target"


def test_the_default_adapter_fits_the_20_mb_cap():
    """Rank 16 on every linear layer of SmolLM2-135M's 30 layers: r (in + out) per layer, 2 bytes each (bfloat16)."""
    hidden, intermediate, kv, layers = 576, 1536, 192, 30
    shapes = [(hidden, hidden), (hidden, kv), (hidden, kv), (hidden, hidden)] + [(hidden, intermediate)] * 3
    args = tune_target.parse_args(["--config", str(RECIPE)])
    parameters = layers * sum(args.lora_r * (a + b) for a, b in shapes)
    assert parameters == 4_884_480 and 2 * parameters < 20e6


def test_save_to_holding_other_files_is_refused_before_the_model_loads(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(
        ValueError, match=r"`--save_to` .*mine holds files that are not a tuned adapter's \(notes.txt\)"
    ):
        tune_target.main(["--output_dir", str(tmp_path / "run"), "--save_to", str(mine)], load_target=no_model)
    with pytest.raises(ValueError, match="overlaps the run's own files"):
        tune_target.main(["--output_dir", str(tmp_path / "run"), "--save_to", str(tmp_path)], load_target=no_model)


def test_the_tuned_pair_without_its_files_names_the_directory_and_the_command(tmp_path, monkeypatch):
    monkeypatch.setattr(smollm2_tuned, "TUNED_DIR", tmp_path / "tuned")
    monkeypatch.setattr(smollm2_tuned, "TUNED_EAGLE_DIR", tmp_path / "tuned_eagle")
    monkeypatch.setattr(smollm2, "load_smollm2_target", lambda *a, **k: pytest.fail("the target was loaded"))
    assert "smollm2-tuned" in testbed.PAIRS
    command = re.escape(smollm2_tuned.TUNE_COMMAND)
    with pytest.raises(FileNotFoundError, match=rf"no task-tuned adapter .* at {tmp_path / 'tuned'} .*`{command}`"):
        testbed.load_pair("smollm2-tuned")
    assert "--save_to diversed_hf/testbed/assets/smollm2/tuned" in smollm2_tuned.TUNE_COMMAND
    (tmp_path / "tuned").mkdir()
    for name in smollm2_tuned.ADAPTER_FILES:
        (tmp_path / "tuned" / name).write_text("{}")
    with pytest.raises(FileNotFoundError, match=rf"no EagleDraft .* at {tmp_path / 'tuned_eagle'}.*train_eagle_draft"):
        testbed.load_pair("smollm2-tuned")
    with pytest.raises(ValueError, match=r"`draft` is 'self'; the smollm2-tuned pair's drafts are \('eagle',\)"):
        testbed.load_pair("smollm2-tuned", draft="self")
    with pytest.raises(ValueError, match="No head is shipped for 'arith_steps' on the smollm2-tuned pair: its recipe"):
        testbed.load_head("arith_steps", pair="smollm2-tuned")  # trained, measured, withdrawn
    with pytest.raises(ValueError, match="shipped heads for the smollm2-tuned pair"):
        testbed.load_head("humaneval", pair="smollm2-tuned")
