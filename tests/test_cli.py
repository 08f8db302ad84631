"""The command line's contract: usage errors as one line with status 2, output paths checked before a run,
files replaced whole, long options in both spellings (``diversed-hf`` and the scripts, through ``cli_utils``)."""

from __future__ import annotations

import json

import pytest
from test_hub import RESULTS, saved  # noqa: F401 - saved is a fixture
from test_hub_push import no_network, no_token  # noqa: F401 - fixtures

from diversed_hf import cli
from diversed_hf.lab import cli_utils


def run(argv, capsys) -> tuple[int, str, str]:
    status = cli.main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def one_line(err: str) -> str:
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


# Exit status 2 for every usage error -------------------------------------------------------------------


def test_card_and_push_usage_errors_exit_2_in_one_line(capsys, tmp_path, saved, no_token, no_network):  # noqa: F811
    _, directory = saved
    status, _, err = run(["card"], capsys)
    assert status == 2 and one_line(err) == "diversed-hf card: give at least one head DIR, or --shipped."
    status, _, err = run(["card", str(tmp_path)], capsys)
    assert status == 2 and "has no config.json" in one_line(err)
    status, _, err = run(["push", str(directory), "--repo-id", "org/name"], capsys)
    assert status == 2 and one_line(err).startswith("diversed-hf push: ") and "needs a write token" in err


# diversed-hf card: everything checked before anything is written ----------------------------------------


def test_card_with_a_bad_training_config_leaves_the_directory_as_it_was(capsys, tmp_path, saved):  # noqa: F811
    _, directory = saved
    before = {path.name: path.read_bytes() for path in directory.iterdir()}
    (tmp_path / "results.json").write_text(json.dumps(RESULTS))  # valid
    (tmp_path / "training.json").write_text("[1, 2]")  # not an object
    status, _, err = run(
        [
            "card",
            str(directory),
            "--results",
            str(tmp_path / "results.json"),
            "--training-config",
            str(tmp_path / "training.json"),
        ],
        capsys,
    )
    assert status == 2 and "training config must be a JSON object" in one_line(err)
    assert {path.name: path.read_bytes() for path in directory.iterdir()} == before  # results.json not copied in


def test_card_writes_results_training_config_and_card_and_no_temporary_files(capsys, tmp_path, saved):  # noqa: F811
    _, directory = saved
    (tmp_path / "results.json").write_text(json.dumps(RESULTS))
    (tmp_path / "training.json").write_text(json.dumps({"lr": 0.001}))
    status, out, _ = run(
        [
            "card",
            str(directory),
            "--results",
            str(tmp_path / "results.json"),
            "--training-config",
            str(tmp_path / "training.json"),
        ],
        capsys,
    )
    assert status == 0 and out.strip() == str(directory / "README.md")
    assert json.loads((directory / "results.json").read_text()) == RESULTS
    assert json.loads((directory / "training_config.json").read_text()) == {"lr": 0.001}
    assert "72.6 %" in (directory / "README.md").read_text()
    assert not [path for path in directory.iterdir() if path.name.startswith(".")]
    status, _, _ = run(["card", str(directory), "--results", str(directory / "results.json")], capsys)  # in place
    assert status == 0 and json.loads((directory / "results.json").read_text()) == RESULTS


def test_card_output_dir_that_is_a_file_is_refused_before_writing(capsys, tmp_path, saved):  # noqa: F811
    _, directory = saved
    card_before = (directory / "README.md").read_text()
    (tmp_path / "cards").write_text("a file")
    status, _, err = run(["card", str(directory), "--output-dir", str(tmp_path / "cards")], capsys)
    assert status == 2 and "is a file, not a directory" in one_line(err)
    assert (directory / "README.md").read_text() == card_before


# Output paths are checked before a run starts ---------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--output-dir", "{file}"], "`--output-dir` {file} is a file, not a directory"),
        (["--output-dir", "{file}/sub"], "`--output-dir` {file}/sub cannot be created: {file} is a file"),
        (["--results-page", "{dir}"], "`--results-page` {dir} is a directory"),
    ],
)
def test_bench_refuses_an_unwritable_output_before_loading_anything(capsys, tmp_path, monkeypatch, flags, message):
    from diversed_hf.cli import bench as bench_cli

    monkeypatch.setattr(bench_cli, "load_models", lambda *a, **k: pytest.fail("the run started"))
    (tmp_path / "file").write_text("x")
    names = {"file": tmp_path / "file", "dir": tmp_path}
    flags = [flag.format(**names) for flag in flags]
    status, _, err = run(["bench", "--no-plots", "--output-dir", str(tmp_path / "out"), *flags], capsys)
    assert status == 2 and one_line(err).startswith("diversed-hf bench: " + message.format(**names))


def test_bench_with_no_method_left_names_what_was_skipped(capsys, tmp_path):
    status, _, err = run(
        [
            "bench",
            "--no-plots",
            "--output-dir",
            str(tmp_path),
            "--task",
            "arith",
            "--num-prompts",
            "1",
            "--methods",
            "block:diversed@nosuch",
        ],
        capsys,
    )
    assert status == 2 and "nothing to run on task 'arith'" in err and "'nosuch'" in err, err
    status, _, err = run(["bench", "--no-plots", "--output-dir", str(tmp_path), "--methods", "block:block:sd"], capsys)
    assert status == 2 and "'block:sd'" in err and "Traceback" not in err, err


def test_throughput_refuses_a_json_path_that_is_a_directory_before_the_run(capsys, tmp_path):
    status, _, err = run(["throughput", "--json", str(tmp_path)], capsys)
    assert status == 2 and one_line(err).startswith(f"diversed-hf throughput: `--json` {tmp_path} is a directory")


def test_output_checks_create_nothing(tmp_path):
    assert cli_utils.check_output_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert cli_utils.check_output_file(tmp_path / "c" / "r.json") == tmp_path / "c" / "r.json"
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="cannot be created: .* is a file"):
        cli_utils.check_output_file(tmp_path / "f" / "r.json")


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "results.json"
    cli_utils.write_text_atomic(path, "old\n")
    with pytest.raises(TypeError):
        cli_utils.write_text_atomic(path, 42)  # fails while writing
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["results.json"]


# Both spellings of long options ---------------------------------------------------------------------------


def test_every_long_option_takes_hyphens_and_underscores():
    parser = cli_utils.ArgumentParser()
    parser.add_argument("--num-examples", type=int, default=1)
    parser.add_argument("--output_dir", default=None)
    group = parser.add_argument_group("more")
    group.add_argument("--max-new-tokens", type=int, default=0)
    args = parser.parse_args(["--num_examples", "3", "--output-dir=x", "--max_new_tokens", "7"])
    assert (args.num_examples, args.output_dir, args.max_new_tokens) == (3, "x", 7)
    args = parser.parse_args(["--num-examples", "4", "--output_dir", "y"])
    assert (args.num_examples, args.output_dir) == (4, "y")
    assert cli_utils.other_spelling("-v") is None and cli_utils.other_spelling("--quick") is None


def test_the_commands_take_both_spellings(capsys):
    status, _, err = run(["demo", "--num_prompts", "0"], capsys)
    assert status == 2 and one_line(err) == "diversed-hf demo: --num-prompts is 0; it must be >= 1."
    status, _, err = run(["throughput", "--num_prompts", "0"], capsys)
    assert status == 2 and one_line(err) == "diversed-hf throughput: --num-prompts is 0; it must be >= 1."


# Scripts: user errors as one line with status 2, bugs with their traceback --------------------------------


def test_run_script_reports_user_errors_in_one_line_and_keeps_tracebacks_for_bugs(capsys):
    def main(argv):
        if argv == ["bad"]:
            raise ValueError("`--x` is bad;\n  pass a good one.")
        if argv == ["missing"]:
            raise FileNotFoundError("no such file: f.json")
        if argv == ["bug"]:
            raise RuntimeError("a bug")
        return {"a": "result"} if argv == ["ok"] else 3

    assert cli_utils.run_script(main, ["bad"], prog="script.py") == 2
    assert capsys.readouterr().err == "script.py: `--x` is bad; pass a good one.\n"
    assert cli_utils.run_script(main, ["missing"], prog="script.py") == 2
    assert capsys.readouterr().err == "script.py: no such file: f.json\n"
    with pytest.raises(ValueError, match="is bad"):
        cli_utils.run_script(main, ["bad", "--debug"], prog="script.py")
    with pytest.raises(RuntimeError, match="a bug"):
        cli_utils.run_script(main, ["bug"], prog="script.py")
    assert cli_utils.run_script(main, ["ok"]) == 0 and cli_utils.run_script(main, []) == 3


def test_top_level_help_lists_every_command_without_loading_torch():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from diversed_hf import cli\n"
        "try:\n"
        "    cli.main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('LOADED', 'torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "LOADED False False" in out
    for name in cli.COMMANDS:
        assert name in out


def test_lazy_command_summaries_match_the_commands_own():
    full = cli.build_parser()  # every module loaded
    lazy = cli.build_parser([])  # none loaded

    def summaries(parser):
        action = next(a for a in parser._actions if a.dest == "command")
        return {choice.dest: choice.help for choice in action._choices_actions}

    assert summaries(lazy) == summaries(full)
    assert list(summaries(full)) == list(cli.COMMANDS)


def test_every_command_has_a_description_and_shows_defaults(capsys):
    for name in (name for name in cli.COMMANDS if name not in cli.PASSTHROUGH):  # lm-eval's help is lm-eval's
        with pytest.raises(SystemExit):
            cli.main([name, "--help"])
        out = capsys.readouterr().out
        description = out.split("\n\n")[1]
        assert description.strip() and not description.startswith(("positional", "options")), name
        assert "``" not in out and ":func:" not in out and ":class:" not in out, name
        for line in out.splitlines():
            assert line.count("(default") <= 1, (name, line)


def test_bench_lists_every_rule_and_names_a_missing_judge_directory(capsys, tmp_path):
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    out = capsys.readouterr().out
    for spelling in ("fuzzy:", "topk:", "judge:"):
        assert f"  {spelling}" in out
    missing = tmp_path / "runs" / "judge_arith"
    argv = ["bench", "--task", "arith", "--methods", "judge:0.9", "--judge", str(missing)]
    argv += ["--output_dir", str(tmp_path)]
    status, _, err = run(argv, capsys)
    assert status == 2 and f"the judge for 'arith', '{missing}', is no directory here" in one_line(err)
