"""A head calibrated by training/calibrate_head.py states its operating point on its card (the offset, the rule
and the training-split table, from calibration.json), and make_real_results can measure one task's head again
while keeping the other task's results."""

from __future__ import annotations

import json

import pytest
import torch
from huggingface_hub import ModelCard
from scripts import load_script
from test_hub import make_head

from diversed_hf.heads import cards
from diversed_hf.lab.bench.schema import BenchResult, write_json_results
from diversed_hf.lab.tasks import task_card

CALIBRATION = {
    "target_quality": 0.1,
    "rows": [
        {"offset": 0.0, "quality": 0.02, "acceptance_rate": 0.9},
        {"offset": 2.0, "quality": 0.095, "acceptance_rate": 0.5},
        {"offset": 4.0, "quality": 0.11, "acceptance_rate": 0.25},
    ],
    "chosen_offset": 2.0,
    "settings": {
        "split": "train",
        "num_examples": 120,
        "num_sampling_seeds": 2,
        "tolerance": 0.01,
        "temperature": 0.7,
        "num_draft_tokens": 3,
    },
}
RESULTS = {
    "setting": {"task": "arith"},
    "rows": [
        {"method": "sd", "family": "sd", "acceptance_rate": 0.2},
        {"method": "DIVERSED", "family": "diversed", "acceptance_rate": 0.5},
    ],
}


def test_card_of_a_calibrated_head_states_its_offset_rule_and_table(tmp_path):
    make_head(task="arith").save_pretrained(
        tmp_path, results=RESULTS, training_config={"task_card": task_card("arith")}
    )
    assert "calibration offset" not in (tmp_path / "README.md").read_text()  # no calibration.json: no section
    (tmp_path / "calibration.json").write_text(json.dumps(CALIBRATION))
    text = ModelCard.load(cards.write_card(tmp_path)).text
    assert "### Operating point: calibration offset" in text and "**`b = 2`**" in text
    assert "120 train-split prompts x\n2 samples" in text
    assert "the highest acceptance whose quality is at least target-only decoding's (10.0 % minus 1 point)" in text
    assert "| offset `b` | exact match (%) | acceptance |" in text
    assert "| **2** | **9.50** | **50.0 %** |" in text and "| 4 | 11.00 | 25.0 %" in text


def test_a_rouge_calibration_is_shown_x100_as_its_label_says():
    """ROUGE-2 is shown x 100 everywhere (its label says so): the calibration table and target figure too."""
    config = make_head(task="synopsis").config
    calibration = dict(CALIBRATION, target_quality=0.042)
    results = dict(RESULTS, setting={"task": "synopsis"})
    text = cards.render_card(config, results=results, calibration=calibration, task_card=task_card("synopsis")).text
    assert "| offset `b` | ROUGE-2 F1 (x100) | acceptance |" in text
    assert "| **2** | **9.50** | **50.0 %** |" in text
    assert "target-only decoding's (4.2 minus 1 point)" in text and "scored\n4.2:" in text


def test_card_says_when_no_offset_reached_the_target():
    missed = dict(CALIBRATION, chosen_offset=4.0, settings=dict(CALIBRATION["settings"], tolerance=0.0))
    config = make_head(task="arith").config
    calibration = dict(missed, target_quality=0.2)
    text = cards.render_card(config, results=RESULTS, calibration=calibration, task_card=task_card("arith")).text
    assert "no offset reached target-only decoding's 20.0 %, so the best quality" in text


@pytest.mark.parametrize(
    "calibration, message",
    [
        ({"rows": []}, "non-empty `rows`"),
        (dict(CALIBRATION, chosen_offset=3.0), "`chosen_offset` 3 is not an `offset`"),
        (dict(CALIBRATION, target_quality=None), "needs `target_quality`"),
    ],
)
def test_bad_calibrations_are_refused(calibration, message):
    with pytest.raises(ValueError, match=message):
        cards.render_card(make_head(task="arith").config, results=RESULTS, calibration=calibration)


def _result(task: str, rows: list[dict]) -> BenchResult:
    meta = {
        "config": {"temperature": 0.7, "num_draft_tokens": 3, "max_new_tokens": 8},
        "quality_metric": "exact_match",
        "target": "t",
        "draft": "d",
    }
    return BenchResult(task, [dict(row, num_prompts=2) for row in rows], {}, [], meta)


def test_make_real_results_task_keeps_the_other_tasks_results(tmp_path):
    make_real_results = load_script("make_real_results")
    earlier_results = make_real_results.earlier_results
    main = make_real_results.main

    with pytest.raises(FileNotFoundError, match="run without --task once first"):
        earlier_results(tmp_path / "bench.json", "arith_chat")
    write_json_results([_result("arith_chat", [{"method": "SD"}])], tmp_path)
    with pytest.raises(ValueError, match="no results for humaneval"):
        earlier_results(tmp_path / "bench.json", "arith_chat")
    humaneval = _result(
        "humaneval", [{"method": "SD"}, {"method": "DIVERSED (arith_chat head)", "head_task": "arith_chat"}]
    )
    synopsis = _result("synopsis", [{"method": "SD"}])
    write_json_results([_result("arith_chat", [{"method": "SD"}]), humaneval, synopsis], tmp_path)
    kept = earlier_results(tmp_path / "bench.json", "arith_chat")
    assert (
        list(kept) == ["humaneval", "synopsis"] and kept["humaneval"].rows[1]["method"] == "DIVERSED (arith_chat head)"
    )
    assert kept["humaneval"].notes == [
        "DIVERSED (arith_chat head): measured by an earlier run with the arith_chat head "
        "shipped then; a later run with `--task arith_chat` measured only arith_chat again."
    ]
    write_json_results(list(kept.values()), tmp_path)  # kept again by a later run: the note is not repeated
    assert len(earlier_results(tmp_path / "bench.json", "arith_chat")["humaneval"].notes) == 1
    with pytest.raises(ValueError, match="no results for arith_chat"):  # that file now holds humaneval only
        earlier_results(tmp_path / "bench.json", "humaneval")
    with pytest.raises(SystemExit):
        main(["--task", "arith_chat", "--section-only"])


def test_calibrate_head_reuses_only_a_calibration_measured_alike(tmp_path):
    from calibrate_head import parse_args, reused_measurements

    argv = [
        "--task",
        "arith_chat",
        "--target",
        "smollm2",
        "--head",
        str(tmp_path),
        "--num-examples",
        "120",
        "--num-sampling-seeds",
        "2",
        "--temperature",
        "0.7",
        "--num-draft-tokens",
        "3",
        "--max-new-tokens",
        "96",
    ]
    args = parse_args(argv + ["--offsets", "0", "2", "5"])
    earlier = tmp_path / "calibration.json"
    settings = vars(parse_args(argv + ["--offsets", "0", "2"]))
    earlier.write_text(json.dumps(dict(CALIBRATION, settings=settings, head_sha256="abc")))
    target, rows = reused_measurements(str(earlier), args, "abc")
    assert target == 0.1 and sorted(rows) == [0.0, 2.0, 4.0] and rows[2.0]["acceptance_rate"] == 0.5
    with pytest.raises(ValueError, match=r"other settings \(temperature: temperature=0.7\)"):
        reused_measurements(
            str(earlier),
            parse_args(argv[:-6] + ["--temperature", "1.0", "--num-draft-tokens", "3", "--max-new-tokens", "96"]),
            "abc",
        )
    # the same path, other weights (the head was calibrated in place since): nothing is reused
    with pytest.raises(ValueError, match=r"other settings \(head weights"):
        reused_measurements(str(earlier), args, "def")


def test_a_heads_weights_digest_changes_with_its_weights_only():
    import torch
    from tiny_models import make_pair

    from diversed_hf import DiversedHead
    from diversed_hf.heads.hub import weights_digest

    target, draft = make_pair()
    head = DiversedHead.for_pair(target, draft)
    same = DiversedHead.for_pair(target, draft)
    same.load_state_dict(head.state_dict())
    assert weights_digest(head) == weights_digest(same)
    with torch.no_grad():
        same.net[-1].bias.add_(1.0)  # what calibrating in place does
    assert weights_digest(head) != weights_digest(same)


def test_front_gap_reads_the_static_front_at_the_heads_acceptance():
    make_real_results = load_script("make_real_results")
    front_gap = make_real_results.front_gap

    rows = [
        {"method": "SD", "family": "sd", "acceptance_rate": 0.2, "quality": 0.05},
        {"method": "static w=0.5", "family": "static-ensemble", "acceptance_rate": 0.6, "quality": 0.03},
        {"method": "static w=0", "family": "static-ensemble", "acceptance_rate": 1.0, "quality": 0.01},
    ]
    result = _result("synopsis", rows)
    assert front_gap(result, {"acceptance_rate": 0.4, "quality": 0.05}) == pytest.approx(1.0)  # front: 4 points there
    assert front_gap(result, {"acceptance_rate": 0.8, "quality": 0.01}) == pytest.approx(-1.0)
    assert front_gap(result, {"acceptance_rate": 0.1, "quality": 0.05}) is None


def test_make_real_results_measures_the_default_draft_at_the_papers_temperature(tmp_path):
    """By default the real pair's table is measured with its default draft (the EagleDraft) on synopsis and
    arith_chat, both at temperature 1 with 200 prompts x 2 samples; a task that draft's table has no place for is
    refused with the tasks it has."""
    make_real_results = load_script("make_real_results")
    SETUPS = make_real_results.SETUPS
    _argv = make_real_results._argv
    main = make_real_results.main

    eagle = SETUPS["eagle-tasks"]
    assert eagle.tasks == ("synopsis", "arith_chat") and eagle.output_name != SETUPS["self"].output_name
    for task in eagle.tasks:
        argv = _argv(task, eagle.full[task], tmp_path, 1, draft="eagle-tasks", methods=["sd"])
        flags = {flag: argv[i + 1] for i, flag in enumerate(argv[:-1]) if flag.startswith("--")}
        assert flags["--draft"] == "eagle-tasks" and float(flags["--temperature"]) == 1.0
        assert (int(flags["--num-prompts"]), int(flags["--num-samples"])) == (200, 2)
    with pytest.raises(SystemExit):
        main(["--task", "humaneval", "--skip-speed"])


def test_make_real_results_measures_the_tuned_pair_with_its_draft_length_and_the_cross_task_row(tmp_path):
    """``--draft tuned``: the task-tuned pair on synopsis and arith_steps at temperature 1, 200 x 2, its EagleDraft's
    N, each task's head on the other task; a head its recipe trained into runs/ is passed to bench by path."""
    make_real_results = load_script("make_real_results")
    SETUPS = make_real_results.SETUPS
    _argv = make_real_results._argv
    head_dir_of = make_real_results.head_dir_of
    from diversed_hf.cli.real_pair_runs import TUNED_DRAFT_LENGTH, TUNED_METHODS

    tuned = SETUPS["tuned"]
    assert tuned.tasks == ("synopsis", "arith_steps")
    assert "diversed@arith_steps" in TUNED_METHODS["synopsis"] and "diversed@synopsis" in TUNED_METHODS["arith_steps"]
    for task in tuned.tasks:
        argv = _argv(task, tuned.full[task], tmp_path, 1, draft="tuned", methods=["sd"])
        flags = {flag: argv[i + 1] for i, flag in enumerate(argv[:-1]) if flag.startswith("--")}
        assert flags["--pair"] == "smollm2-tuned" and "--draft" not in flags
        assert float(flags["--temperature"]) == 1.0 and int(flags["--num-draft-tokens"]) == TUNED_DRAFT_LENGTH
        assert (int(flags["--num-prompts"]), int(flags["--num-samples"])) == (200, 2)
        trained = head_dir_of("tuned", task)
        if (trained / "config.json").is_file() and "runs" in trained.parts:
            assert f"{task}={trained}" in flags["--head"]


def test_make_real_results_task_takes_every_drafts_tasks():
    """``--task`` names a task of the draft measured: the tuned pair's arith_steps too, and no other draft's."""
    make_real_results = load_script("make_real_results")
    parse_args = make_real_results.parse_args

    assert parse_args(["--draft", "tuned", "--task", "arith_steps", "--skip-speed", "--resume"]).task == "arith_steps"
    with pytest.raises(SystemExit):
        parse_args(["--draft", "tuned", "--task", "humaneval", "--skip-speed"])
    with pytest.raises(SystemExit):
        parse_args(["--draft", "eagle-tasks", "--task", "arith_steps", "--skip-speed"])


def test_the_tuned_pair_has_one_draft_length_story():
    """The table, the heads' recipes and the shipped draft's generation_config name the same N."""
    import json
    from pathlib import Path

    import yaml

    from diversed_hf.cli.real_pair_runs import TUNED_DRAFT_LENGTH
    from diversed_hf.testbed.smollm2_tuned import TUNED_EAGLE_DIR

    shipped = json.loads((TUNED_EAGLE_DIR / "generation_config.json").read_text())["num_assistant_tokens"]
    assert shipped == TUNED_DRAFT_LENGTH
    configs = Path(__file__).resolve().parents[1] / "training" / "configs"
    for task in ("synopsis", "arith_steps"):
        recipe = yaml.safe_load((configs / f"smollm2_tuned_{task}.yaml").read_text())
        assert recipe["num_draft_tokens"] == TUNED_DRAFT_LENGTH and recipe["target_model"] == "smollm2-tuned"


def test_the_tuned_pairs_heads_are_withdrawn_with_their_measured_reason():
    """Neither tuned-pair head is an operating point on the 200 x 2 table: load_head says why, for either draft name."""
    from diversed_hf import testbed

    for draft in (None, "eagle"):
        with pytest.raises(ValueError, match=r"-0\.6 \[-1\.4, \+0\.1\]"):
            testbed.load_head("synopsis", pair="smollm2-tuned", draft=draft)
        with pytest.raises(ValueError, match=r"1\.01x SD's drafts"):
            testbed.load_head("arith_steps", pair="smollm2-tuned", draft=draft)


def test_the_tuned_table_refuses_to_start_without_its_recipes_heads(tmp_path, monkeypatch):
    """runs/ is not in the repository: a fresh clone is told which recipe trains each head, and a synopsis head
    without its calibration (another operating point than the table's) is refused, before any model loads."""
    make_real_results = load_script("make_real_results")

    monkeypatch.setattr(make_real_results, "REPO", tmp_path)
    make_real_results.check_tuned_heads("eagle-tasks")  # shipped heads: nothing to check
    with pytest.raises(
        FileNotFoundError, match=r"train_head.py --config training/configs/smollm2_tuned_synopsis.yaml`"
    ):
        make_real_results.check_tuned_heads("tuned")
    for task in ("synopsis", "arith_steps"):
        make_head(task=task).save_pretrained(tmp_path / "runs" / f"smollm2_tuned_{task}" / "head")
    with pytest.raises(FileNotFoundError, match="synopsis head in runs/smollm2_tuned_synopsis/head is not calibrated"):
        make_real_results.check_tuned_heads("tuned")
    make_head(task="synopsis").save_pretrained(tmp_path / "runs" / "smollm2_tuned_synopsis" / "head_cal")
    make_real_results.check_tuned_heads("tuned")


def test_the_section_says_whether_the_head_beside_the_rows_is_the_one_they_measured(tmp_path, monkeypatch):
    """A head retrained after the run (runs/ is not kept) can differ from the one measured: its calibration and
    training curve are then labelled as its own, and a run older than the digest record says so."""
    from diversed_hf.cli import real_pair_runs as real_pair_runs
    from diversed_hf.lab.bench.partial import module_digest

    monkeypatch.setattr(real_pair_runs, "REPO", tmp_path)
    head = make_head(task="synopsis")
    head.save_pretrained(tmp_path / "runs" / "head")
    measured = _result("synopsis", [{"method": "DIVERSED"}])
    assert real_pair_runs.head_provenance(measured, tmp_path / "nowhere") == ""  # no head there: nothing to label
    assert "do not record which head weights they measured" in real_pair_runs.head_provenance(
        measured, tmp_path / "runs" / "head"
    )
    measured.meta["head_digest"] = module_digest(head)
    assert real_pair_runs.head_provenance(measured, tmp_path / "runs" / "head") == ""
    retrained = make_head(task="synopsis")
    with torch.no_grad():
        next(retrained.parameters()).add_(1.0)
    measured.meta["head_digest"] = module_digest(retrained)
    assert "The head now in `runs/head` is not the one the `synopsis` rows above measured" in (
        real_pair_runs.head_provenance(measured, tmp_path / "runs" / "head")
    )
