"""The training recipes end to end on tiny models: train_head.py (head repo with card) and distill_draft.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("trl")
pytest.importorskip("peft")

REPO = Path(__file__).resolve().parents[1]

from scripts import load_script  # noqa: E402
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
    train_head.main(
        [  # the head goes to <output_dir>/head: the recipe's own default
            "--config",
            str(REPO / "training" / "configs" / "testbed_arith.yaml"),
            "--target_model",
            target,
            "--draft_model",
            draft,
            "--output_dir",
            str(out),
            "--num_train_examples",
            "16",
            "--max-steps",
            "2",
            "--save_steps",
            "1",
            "--max_completion_length",
            "6",
            "--eval_num_examples",
            "4",
            "--eval-max-new-tokens",
            "6",
            "--threads",
            "1",
            "--disable_tqdm",
            "true",
            "--logging_steps",
            "1",
            "--max_unknown_share",  # tiny random models: their word-level vocabulary is not English
            "1",
        ]
    )
    head_files = {p.name for p in (out / "head").iterdir()}
    assert {"config.json", "model.safetensors", "training_config.json", "results.json"} <= head_files
    results = json.loads((out / "head" / "results.json").read_text())
    assert [row["method"] for row in results["rows"]] == ["autoregressive", "sd", "diversed"]
    assert len((out / "train_log.jsonl").read_text().splitlines()) >= 2
    from diversed_hf.training import load_head

    assert load_head(out / "head").config.task == "arith"
    # the card's task facts travel in the training record, so the head's own card describes its task
    record = json.loads((out / "head" / "training_config.json").read_text())
    assert record["task_card"]["name"] == "arith" and record["task_card"]["description"]
    assert record["task_card"]["description"] in (out / "head" / "README.md").read_text()

    import calibrate_head  # the README's next command reads the head where the recipe wrote it

    summary = calibrate_head.main(
        [
            "--task",
            "testbed_arith",
            "--head",
            str(out / "head"),
            "--target",
            target,
            "--draft",
            draft,
            "--offsets",
            "0",
            "1",
            "--num_examples",
            "2",
            "--max-new-tokens",
            "4",
            "--output-dir",
            str(out / "head_cal"),
        ]
    )
    assert load_head(out / "head_cal").config.task == "arith" and summary["chosen_offset"] in (0.0, 1.0)


def test_distill_draft_recipe_saves_a_merged_draft(tmp_path, tiny_pair_dirs):
    import distill_draft
    from transformers import AutoModelForCausalLM

    target, draft = tiny_pair_dirs
    merged = distill_draft.main(
        [
            "--task",
            "testbed_arith",
            "--target_model",
            target,
            "--draft_model",
            draft,
            "--output_dir",
            str(tmp_path / "d"),
            "--num_train_examples",
            "8",
            "--max_new_tokens",
            "6",
            "--max_steps",
            "2",
            "--per_device_train_batch_size",
            "4",
            "--report_to",
            "none",
            "--bf16",
            "false",
            "--save_strategy",
            "no",
            "--disable_tqdm",
            "true",
        ]
    )
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
    head = DiversedHead.for_pair(
        AutoModelForCausalLM.from_pretrained(target), AutoModelForCausalLM.from_pretrained(draft)
    )
    head.save_pretrained(tmp_path / "raw", training_config={"lambda_acceptance": 0.1, "calibration_logit_offset": 1.0})
    out = tmp_path / "calibrated"
    summary = calibrate_head.main(
        [
            "--task",
            "testbed_arith",
            "--head",
            str(tmp_path / "raw"),
            "--target",
            target,
            "--draft",
            draft,
            "--offsets",
            "0",
            "2",
            "--tolerance",
            "1.0",
            "--num-examples",
            "3",
            "--max-new-tokens",
            "4",
            "--output-dir",
            str(out),
        ]
    )
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
        (["--dtype", "float99"], "`--dtype float99`: the frozen models load in one of float32, bfloat16, float16"),
        (["--num_train_examples", "0"], "`--num_train_examples 0`: it must be at least 1"),
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


# Where the recipes write, and how the scripts fail -------------------------------------------------------


@pytest.mark.parametrize("config", sorted((REPO / "training" / "configs").glob("*.yaml")), ids=lambda path: path.name)
def test_recipes_write_to_runs_and_never_into_the_package(config):
    values = yaml.safe_load(config.read_text())
    assert str(values["output_dir"]).startswith("runs/")
    assert str(values.get("head_dir") or "runs/").startswith("runs/")
    assert not [key for key, value in values.items() if "diversed_hf/" in str(value)]


def test_the_docs_recipe_commands_chain_and_write_to_runs():
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    commands = [
        line.strip()
        for page in pages
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.S)
        for line in block.replace("\\\n", " ").splitlines()
    ]
    assert not [c for c in commands if "diversed_hf/testbed/assets" in c], (
        "a documented command writes into the package"
    )

    def flag(command, name):
        return re.search(rf"{name} (\S+)", command).group(1)

    commands = [  # the recipe chain of "Training heads"
        line.strip()
        for block in re.findall(r"```bash\n(.*?)```", (REPO / "docs" / "training_heads.md").read_text(), flags=re.S)
        for line in block.replace("\\\n", " ").splitlines()
    ]
    train = next(c for c in commands if "train_head.py --config training/configs/testbed_arith.yaml" in c)
    written = yaml.safe_load((REPO / flag(train, "--config")).read_text())["output_dir"] + "/head"
    calibrate = next(c for c in commands if c.startswith("python training/calibrate_head.py"))
    evaluate = next(c for c in commands if c.startswith("python benchmarks/eval_head.py"))
    assert flag(calibrate, "--head") == written  # the head the recipe wrote
    assert flag(evaluate, "--head") == flag(calibrate, "--output-dir")


def test_train_head_checks_where_it_writes_before_loading_the_models(tmp_path, monkeypatch):
    eval_head = load_script("eval_head")
    import train_head

    monkeypatch.setattr(eval_head, "load_models", lambda *args, **kwargs: pytest.fail("the models were loaded"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"`--head_dir` .*file is a file, not a directory"):
        train_head.main(
            [
                "--task",
                "testbed_arith",
                "--output_dir",
                str(tmp_path / "run"),
                "--head_dir",
                str(tmp_path / "file"),
                "--report_to",
                "none",
            ]
        )


def test_scripts_refuse_a_task_or_head_that_does_not_fit_the_pair_before_loading(monkeypatch, capsys):
    import calibrate_head

    eval_head = load_script("eval_head")
    self_draft_costs = load_script("self_draft_costs")

    from diversed_hf.testbed import smollm2

    monkeypatch.setattr(eval_head, "load_models", lambda *args, **kwargs: pytest.fail("the models were loaded"))
    monkeypatch.setattr(smollm2, "load_smollm2_target", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    with pytest.raises(ValueError, match=r"`--task humaneval` with `--target testbed`.*\['arith', 'summary'\]"):
        eval_head.main(["--task", "humaneval", "--head", "testbed:arith"])
    with pytest.raises(ValueError, match=r"`--head testbed:arith` is a head of the testbed pair"):
        eval_head.main(["--task", "arith_chat", "--head", "testbed:arith", "--target", "smollm2"])
    for flags, message in (
        (["--task", "testbed_arith", "--head", "h", "--offsets", "0", "nan"], "--offsets holds \\[nan\\]"),
        (["--task", "humaneval", "--head", "testbed:arith"], "`--task humaneval` with `--target testbed`"),
    ):
        with pytest.raises(SystemExit):
            calibrate_head.parse_args(flags)
        assert re.search(message, capsys.readouterr().err)
    with pytest.raises(SystemExit):
        self_draft_costs.main(["--layers", "0"])
    assert "--layers holds 0" in capsys.readouterr().err


def test_script_options_take_both_spellings():
    import calibrate_head
    import train_head

    script, config = train_head.parse_arguments(
        [
            "--task",
            "testbed_arith",
            "--max-steps",
            "3",
            "--eval_num_examples",
            "0",
            "--eval-seed",
            "2",
            "--lambda-acceptance",
            "0.5",
        ]
    )
    assert (config.max_steps, script.eval_num_examples, script.eval_seed, config.lambda_acceptance) == (3, 0, 2, 0.5)
    args = calibrate_head.parse_args(
        [
            "--task",
            "testbed_arith",
            "--head",
            "h",
            "--num_examples",
            "3",
            "--max_new_tokens",
            "4",
            "--output_dir",
            "out",
        ]
    )
    assert (args.num_examples, args.max_new_tokens, args.output_dir) == (3, 4, "out")


def _script(name: str, *args: str) -> subprocess.CompletedProcess:
    """Run a script of ``training/`` (the recipes) or ``benchmarks/`` (measurements and page writers) by file name."""
    path = next(path for path in (REPO / "training" / name, REPO / "benchmarks" / name) if path.exists())
    return subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=600, cwd=REPO)


def test_a_script_reports_a_bad_argument_in_one_line_with_status_2(tmp_path):
    done = _script("train_head.py", "--task", "testbed_arith", "--goal_acceptance_ratio", "1.6")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("train_head.py: `goal_acceptance_ratio` is 1.6 and ")
    done = _script("eval_head.py", "--task", "testbed_arith", "--head", "testbed:arith", "--output", str(tmp_path))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert (
        done.stderr.strip().splitlines()[-1] == f"eval_head.py: `--output` {tmp_path} is a directory; pass a file "
        f"path, e.g. {tmp_path / 'results.json'}."
    )
    done = _script(
        "eval_head.py", "--task", "testbed_arith", "--head", "testbed:arith", "--output", str(tmp_path), "--debug"
    )
    assert done.returncode == 1 and "Traceback" in done.stderr


@pytest.mark.parametrize("steps", ["0", "-5"])
def test_train_head_refuses_a_non_positive_max_steps_before_loading(tmp_path, monkeypatch, steps):
    """transformers reads max_steps <= 0 as 'train num_train_epochs epochs': said, not done silently."""
    import train_head

    from diversed_hf.cli import evaluation

    monkeypatch.setattr(evaluation, "load_models", lambda *args, **kwargs: pytest.fail("the models were loaded"))
    with pytest.raises(ValueError, match=rf"`--max_steps {steps}`: transformers reads a non-positive value"):
        train_head.main(["--task", "testbed_arith", "--output_dir", str(tmp_path / "run"), "--max_steps", steps])


def test_a_fresh_train_head_run_into_another_runs_folder_is_refused(tmp_path, monkeypatch):
    """A run's checkpoints, log and head are never mixed with another's: continue it with --resume_from_checkpoint,
    or use a new --output_dir."""
    import train_head

    from diversed_hf.cli import evaluation

    run = tmp_path / "run"
    (run / "checkpoint-2").mkdir(parents=True)
    (run / "train_log.jsonl").write_text('{"step": 2}\n')
    monkeypatch.setattr(evaluation, "load_models", lambda *args, **kwargs: pytest.fail("the models were loaded"))
    argv = ["--task", "testbed_arith", "--output_dir", str(run), "--report_to", "none"]
    with pytest.raises(ValueError, match=r"holds a run \(checkpoint-2, train_log.jsonl\).*--resume_from_checkpoint"):
        train_head.main(argv)

    def loaded(*args, **kwargs):
        raise RuntimeError("past the checks")

    monkeypatch.setattr(evaluation, "load_models", loaded)
    with pytest.raises(RuntimeError, match="past the checks"):  # resuming it is allowed
        train_head.main([*argv, "--resume_from_checkpoint", "true"])


def test_calibrate_head_refuses_a_head_of_another_task_before_loading(monkeypatch):
    import calibrate_head

    monkeypatch.setattr(calibrate_head, "load_models", lambda *args, **kwargs: pytest.fail("the models were loaded"))
    with pytest.raises(ValueError, match=r"--head testbed:summary was trained for the task 'summary' and --task is"):
        calibrate_head.main(["--task", "testbed_arith", "--head", "testbed:summary", "--target", "testbed"])
