"""A head for your own data and reward from the command line (training/train_head.py --dataset ... --reward ...;
diversed_hf.lab.tasks.user_task; docs/your_task.md), on the testbed pair with a dataset and a reward the test writes."""

from __future__ import annotations

import json
import sys

import pytest

from diversed_hf import DiversedHead, testbed

REWARD_MODULE = '''
def agrees(prompts=None, completions=None, reference=None, **columns):
    """1 where the completion's first word is the answer's first word (TRL's reward signature)."""
    return [float(c.split()[:1] == r.split()[:1]) for c, r in zip(completions, reference)]
'''


@pytest.fixture()
def user_data(tmp_path, monkeypatch):
    rows = testbed.load_task("arith", split="train", num_examples=40, seed=3)
    data = tmp_path / "my_problems.jsonl"
    data.write_text(
        "\n".join(json.dumps({"question": p, "answer": a}) for p, a in zip(rows["prompt"], rows["reference"]))
    )
    (tmp_path / "my_rewards.py").write_text(REWARD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)  # each test's own module, not an earlier one's
    return data


def _argv(tmp_path, data, *flags):
    return [
        "--dataset", str(data), "--prompt_column", "question", "--target_model", "testbed",
        "--output_dir", str(tmp_path / "run"), "--num_train_examples", "8", "--max_steps", "2",
        "--max_completion_length", "6", "--eval_num_examples", "3", "--eval_max_new_tokens", "6",
        "--threads", "1", "--disable_tqdm", "true", "--report_to", "none", *flags,
    ]  # fmt: skip


def test_a_users_dataset_and_reward_function_train_a_head_that_loads(tmp_path, user_data):
    import train_head

    train_head.main(_argv(tmp_path, user_data, "--answer_column", "answer", "--reward", "my_rewards:agrees"))
    head_dir = tmp_path / "run" / "head"
    head = DiversedHead.from_pretrained(head_dir)
    assert head.config.task == "dataset:my_problems"
    record = json.loads((head_dir / "training_config.json").read_text())
    assert record["reward"] == "my_rewards:agrees" and record["dataset"] == str(user_data)
    results = json.loads((head_dir / "results.json").read_text())
    assert [row["method"] for row in results["rows"]] == ["autoregressive", "sd", "diversed"]
    log = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert any("rewards/agrees/mean" in entry for entry in log)  # TRL called the user's own function


def test_target_agreement_needs_no_answers(tmp_path, user_data):
    import train_head

    train_head.main(_argv(tmp_path, user_data, "--reward", "target_agreement"))
    results = json.loads((tmp_path / "run" / "head" / "results.json").read_text())
    assert results["setting"]["quality_metric"] == "rouge2_f1"  # agreement with the target's own answers
    assert (tmp_path / "run" / "held_out_target_completions.json").is_file()


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--reward", "exact_match"], r"`--reward exact_match` compares completions with answers: .*--answer_column"),
        (["--reward", "my_rewards:nope"], r"cannot import 'nope' from 'my_rewards'"),
        (["--reward", "nonsense"], r"`--reward nonsense`: use a built-in reward"),
        (["--reward", "task"], r"with --dataset pass one of exact_match"),
        (["--reward", "rouge2", "--answer_column", "answers"], r"`--answer_column answers`: .* has the columns"),
        (["--reward", "rouge2", "--task", "testbed_arith"], r"Pass --task .* or --dataset .*one of them"),
    ],
)
def test_bad_dataset_options_are_refused_by_name_before_the_models_load(tmp_path, user_data, monkeypatch, flags, match):
    import train_head

    from diversed_hf.cli import evaluation

    monkeypatch.setattr(evaluation, "load_models", lambda *a, **k: pytest.fail("the models were loaded"))
    with pytest.raises(ValueError, match=match):
        train_head.main(_argv(tmp_path, user_data, *flags))


def test_the_help_lists_the_tasks_the_error_names_and_stays_short(capsys):
    import train_head

    from diversed_hf.lab.tasks import task_names

    with pytest.raises(SystemExit):
        train_head.parse_arguments(["--help"])
    text = capsys.readouterr().out
    assert len(text.splitlines()) < 200 and "--help-all" in text and "--dataset" in text
    with pytest.raises(ValueError) as error:
        train_head.parse_arguments(["--task", "nope"])
    flat = " ".join(text.split())
    for name in (name for name in task_names() if not name.startswith("dataset:")):  # registered by other tests
        assert name in flat and repr(name) in str(error.value)


def test_the_docs_page_runs_as_written(tmp_path, monkeypatch, capsys):
    """docs/your_task.md, block by block, in a fresh directory: the data, the reward module, the training command (a
    few steps: the page's own flags, then shorter ones), using the head."""
    import re
    import shlex
    from pathlib import Path

    import train_head

    page = (Path(__file__).resolve().parents[1] / "docs" / "your_task.md").read_text()
    blocks = re.findall(r"```(python|bash)\n(.*?)```", page, flags=re.S)
    python = [code for kind, code in blocks if kind == "python"]
    command = next(code for kind, code in blocks if kind == "bash")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)
    exec(python[0], {})  # noqa: S102 - the page's own code
    assert python[1].startswith("# my_rewards.py")
    (tmp_path / "my_rewards.py").write_text(python[1])
    argv = shlex.split(command.replace("\\\n", " "))
    assert argv[:2] == ["python", "training/train_head.py"]
    quick = ["--max_steps", "2", "--num_train_examples", "8", "--max_completion_length", "6"]
    train_head.main([*argv[2:], *quick, "--eval_max_new_tokens", "6", "--threads", "1", "--disable_tqdm", "true"])
    assert (tmp_path / "runs" / "my_head" / "head" / "results.json").is_file()
    exec(python[2], {})  # noqa: S102
    assert capsys.readouterr().out.strip()


@pytest.mark.parametrize(
    "content, match",
    [
        ("", r"`--dataset .*bad\.jsonl` is empty"),
        ('{"question": "a"\n{not json\n', r"could not be read as \.jsonl .*JSON lines"),
        ("\n".join(json.dumps({"question": i}) for i in range(12)), r"`--prompt_column question`: .* no prompt text"),
        (
            "\n".join(json.dumps({"question": "" if i == 5 else f"Question: {i}"}) for i in range(30)),
            r"`--prompt_column question`: 1 row\(s\) .* hold no prompt text \(row \d+: ''\)",
        ),
    ],
    ids=["empty", "malformed", "integers", "empty-string"],
)
def test_bad_dataset_files_are_refused_by_name_before_the_models_load(tmp_path, monkeypatch, content, match):
    import train_head

    from diversed_hf.cli import evaluation

    monkeypatch.setattr(evaluation, "load_models", lambda *a, **k: pytest.fail("the models were loaded"))
    data = tmp_path / "bad.jsonl"
    data.write_text(content)
    with pytest.raises(ValueError, match=match):
        train_head.main(_argv(tmp_path, data, "--reward", "target_agreement"))


BAD_REWARDS = """
def strings(prompts=None, completions=None, **columns):
    return ["1" for _ in completions]

def nothing(prompts=None, completions=None, **columns):
    return [None for _ in completions]
"""


@pytest.mark.parametrize("reward", ["strings", "nothing"])
def test_a_reward_of_the_wrong_kind_ends_the_command_in_one_line(tmp_path, user_data, capsys, reward):
    """A reward returning strings or None ends ``train_head.py`` as NaN and wrong lengths do: one line, status 2."""
    import train_head

    from diversed_hf.lab.cli_utils import run_script

    (tmp_path / "bad_rewards.py").write_text(BAD_REWARDS)
    sys.modules.pop("bad_rewards", None)
    argv = _argv(tmp_path, user_data, "--answer_column", "answer", "--reward", f"bad_rewards:{reward}")
    assert run_script(train_head.main, argv, prog="train_head.py") == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("train_head.py:")]
    assert len(lines) == 1 and reward in lines[0]


ZERO_REWARD = """
def never(prompts=None, completions=None, reference=None, **columns):
    return [0.0 for _ in completions]
"""


def test_a_run_that_teaches_nothing_says_so_in_the_log_the_record_and_the_card(tmp_path, caplog, monkeypatch):
    """A reward that never varies, and answers the target never gets: both are said, loudly and in the record; the
    card carries the warnings above its results, the quality columns are empty and no row is highlighted."""
    import train_head

    rows = testbed.load_task("arith", split="train", num_examples=40, seed=3)
    data = tmp_path / "unreachable.jsonl"
    data.write_text("\n".join(json.dumps({"question": p, "answer": "#### 987654"}) for p in rows["prompt"]))
    (tmp_path / "zero_rewards.py").write_text(ZERO_REWARD)
    sys.modules.pop("zero_rewards", None)
    monkeypatch.chdir(tmp_path)  # the reward module imports from the directory the command runs in
    argv = _argv(tmp_path, data, "--answer_column", "answer", "--reward", "zero_rewards:never")
    with caplog.at_level("WARNING"):
        train_head.main(argv)
    record = json.loads((tmp_path / "run" / "head" / "training_config.json").read_text())
    assert len(record["warnings"]) == 2
    assert "did not vary across completions" in record["warnings"][0]
    assert "the target scores 0" in record["warnings"][1]
    assert sum("THIS RUN:" in message for message in caplog.messages) == 2
    results = json.loads((tmp_path / "run" / "head" / "results.json").read_text())
    assert all(row["quality"] is None and row["quality_delta"] is None for row in results["rows"])
    card = (tmp_path / "run" / "head" / "README.md").read_text()
    assert card.count("> **Warning:") == 2 and "**diversed**" not in card and "+0.0" not in card


def test_prompts_mostly_unknown_to_the_tokenizer_are_refused_by_name(tmp_path, monkeypatch):
    import train_head

    data = tmp_path / "words.jsonl"
    data.write_text("\n".join(json.dumps({"question": f"Wie viel ist {i} plus {i}?"}) for i in range(30)))
    with pytest.raises(
        ValueError, match=r"% of the prompt tokens are unknown to the target's tokenizer .*docs/your_task"
    ):
        train_head.main(_argv(tmp_path, data, "--reward", "target_agreement"))


def test_a_reward_module_beside_the_command_imports_without_pythonpath(tmp_path, monkeypatch):
    from diversed_hf.lab.tasks.user_task import resolve_reward

    (tmp_path / "beside_rewards.py").write_text(ZERO_REWARD)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    sys.modules.pop("beside_rewards", None)
    _, name, function = resolve_reward("beside_rewards:never")
    assert name == "never" and function(completions=["a"]) == [0.0]
