"""Model cards of heads: rendered from result files and training configs, task facts from the task registry,
Hub metadata, the testbed's usage snippet, and the card and shipped-cards commands."""

import dataclasses
import json

import pytest
from huggingface_hub import ModelCard
from test_hub import DRAFT_ID, REPO_ID, RESULTS, TARGET_ID, make_head, saved  # noqa: F401 - saved is a fixture
from test_hub_push import run_cli

from diversed_hf import DiversedHead
from diversed_hf.cli import hub as hub_cli
from diversed_hf.heads import cards
from diversed_hf.lab.tasks import get_task, task_card

# Model cards ---------------------------------------------------------------------------------------


def test_card_renders_real_metrics_from_a_result_file(tmp_path):
    head = make_head()
    (tmp_path / "bench.json").write_text(json.dumps(RESULTS))
    head.save_pretrained(
        tmp_path / "head",
        results=tmp_path / "bench.json",
        training_config={"lr": 5e-4, "rl": {"clip": 0.2}, "task_card": task_card("gsm8k")},
    )
    assert json.loads((tmp_path / "head" / "results.json").read_text()) == RESULTS
    card = ModelCard.load(tmp_path / "head" / "README.md")
    text = card.text
    assert (
        "| method | acceptance | exact match (%) | vs target distribution [95 % CI] | time (s / sample) | tokens / s "
        "| tokens / round | speedup vs target | speedup vs SD |"
    ) in text
    assert "| sd | 44.6 % | 67.00 | - | 2.5 | - | 1.90 | 1.60x | 1.00x |" in text
    assert (
        "| **diversed** | **72.6 %** | **66.50** | **-** | **1.6** | **-** | **3.10** | **2.50x** | **1.56x** |" in text
    )
    assert "Setting: task = gsm8k, temperature = 1.0, num_draft_tokens = 5, num_samples = 200." in text
    assert "| `rl.clip` | 0.2 |" in text and "| `lr` | 0.0005 |" in text
    assert "num_assistant_tokens=5" in text
    for section in ("## Model pair", "## Task and training data", "## Usage", "## Limitations", "## Citation"):
        assert section in text
    assert "Task-dependent" in text and "trades bias for acceptance" in text and "arXiv" in text
    assert "openai/gsm8k" in text  # from the training record's task_card, which is no row of the training table
    assert "task_card" not in text


def test_card_reads_the_per_task_file_diversed_hf_bench_writes(tmp_path):
    bench = {
        "setting": {
            "temperature": 1.0,
            "num_draft_tokens": 4,
            "max_new_tokens": 64,
            "task": "arith",
            "quality_metric": "exact_match",
        },
        "rows": [
            {
                "method": "target-only",
                "family": "target-only",
                "quality": 0.9,
                "quality_stderr": 0.02,
                "acceptance_rate": None,
                "seconds_per_sample": 0.8,
                "tokens_per_second": 50.0,
                "tokens_per_round": 1.0,
                "num_prompts": 64,
            },
            {"method": "sd", "family": "sd", "quality": 0.9, "acceptance_rate": 0.5, "seconds_per_sample": 0.5},
            {
                "method": "static:0.5",
                "family": "static-ensemble",
                "quality": 0.8,
                "acceptance_rate": 0.7,
                "seconds_per_sample": 0.4,
            },
            {
                "method": "head",
                "family": "diversed",
                "quality": 0.88,
                "acceptance_rate": 0.8,
                "seconds_per_sample": 0.25,
                "quality_delta": -0.02,
                "quality_delta_low": -0.031,
                "quality_delta_high": -0.0088,
                "head_task": "arith",
            },
            {
                "method": "DIVERSED (summary head)",
                "family": "diversed",
                "quality": 0.7,
                "acceptance_rate": 0.9,
                "quality_delta": -0.2,
                "quality_delta_low": -0.25,
                "quality_delta_high": -0.15,
                "head_task": "summary",
            },
        ],
    }
    text = make_head(task="arith").generate_model_card(results=bench).text
    assert "exact match (%)" in text and "accuracy (%)" not in text  # the task registry's label
    assert "| static:0.5 | 70.0 % | 80.00 | - | 0.4 | - | - | 2.00x | 1.25x |" in text
    assert (
        "| **head** | **80.0 %** | **88.00** | **-2.0 [-3.1, -0.9]** | **0.25** | **-** | **-** | **3.20x** | **2.00x** |"
        in text
    )
    assert (
        "| DIVERSED (summary head) | 90.0 % | 70.00 | -20.0 [-25.0, -15.0] |" in text
    )  # another task's head: not bold
    assert "| target-only | - | 90.00 | - | 0.8 | 50.0 | 1.00 | 1.00x | 0.62x |" in text
    bad = {"rows": [dict(bench["rows"][3], quality_delta=-3.0)]}
    with pytest.raises(ValueError, match="quality_delta"):
        cards.load_results(bad)


def test_card_hub_metadata(saved):
    _, directory = saved
    assert ModelCard.load(directory / "README.md").data.datasets is None  # saving reads no task registry
    data = ModelCard.load(cards.write_card(directory, task_card=hub_cli.registered_task_card(directory))).data
    assert data.library_name == "diversed_hf"
    assert data.base_model == [TARGET_ID, DRAFT_ID]
    assert data.datasets == ["openai/gsm8k"]
    assert {"diversed", "speculative-decoding", "gsm8k"} <= set(data.tags)
    assert data.to_dict()["base_model_relation"] == "adapter"


def test_card_without_results_and_for_local_models(tmp_path):
    head = make_head(target_model_id="/models/target", draft_model_id=None, task=None, mixing="logits")
    head.save_pretrained(tmp_path)
    card = ModelCard.load(tmp_path / "README.md")
    assert "No benchmark results were recorded" in card.text
    assert "No training configuration was recorded" in card.text
    assert "`/models/target` (local path)" in card.text and "not recorded" in card.text
    assert "Logit mixing" in card.text
    assert card.data.base_model is None and card.data.datasets is None


def test_card_for_the_testbed_pair_uses_the_testbed_loader(tmp_path):
    from diversed_hf.testbed import ASSETS_DIR

    head = make_head(target_model_id=str(ASSETS_DIR / "target"), draft_model_id=str(ASSETS_DIR / "draft"), task="arith")
    text = head.generate_model_card(repo_id="org/testbed-arith").text
    assert "testbed.load_pair()" in text and 'DiversedHead.from_pretrained("org/testbed-arith")' in text
    assert 'load_task("arith"' in text


def test_card_of_a_shipped_head_loads_it_by_name_not_by_path():
    from diversed_hf.testbed import ASSETS_DIR

    head_dir = ASSETS_DIR / "heads" / "arith"
    head = DiversedHead.from_pretrained(head_dir)
    assert head.config.target_model_id == "diversed_hf/testbed/target"  # what load_pair() records
    text = cards.render_card(head.config, head_source=str(head_dir)).text
    assert 'head = testbed.load_head("arith")' in text and str(ASSETS_DIR) not in text
    assert "testbed.load_pair()" in text and "AutoModelForCausalLM" not in text


@pytest.mark.parametrize(
    "results, message",
    [
        ([{"method": "sd", "acceptance_rate": 44.6}], r"`acceptance_rate` = 44.6 is outside \[0.0, 1.0\].*0.726"),
        ([{"acceptance_rate": 0.4}], r"row 0 needs a non-empty string `method`"),
        ([{"method": "sd", "seconds_per_sample": "fast"}], r"`seconds_per_sample` must be a number or null"),
        ({"rows": []}, r"has no result rows"),
        ({"method": "sd"}, r"must be a list of result rows"),
        (
            [
                {"method": "a", "quality": 0.1, "quality_metric": "exact_match"},
                {"method": "b", "quality": 0.1, "quality_metric": "rouge2_f1"},
            ],
            r"mix quality metrics",
        ),
    ],
)
def test_bad_result_files(tmp_path, results, message):
    with pytest.raises(ValueError, match=message):
        make_head().save_pretrained(tmp_path, results=results)


def test_cli_card_rerenders_with_a_result_file(saved, tmp_path, capsys):
    _, directory = saved
    assert "No benchmark results" in (directory / "README.md").read_text()
    (tmp_path / "bench.json").write_text(json.dumps(RESULTS["rows"]))
    run_cli(["card", str(directory), "--results", str(tmp_path / "bench.json"), "--repo-id", REPO_ID])
    text = (directory / "README.md").read_text()
    assert "72.6 %" in text and f'DiversedHead.from_pretrained("{REPO_ID}")' in text
    assert capsys.readouterr().out.strip() == str(directory / "README.md")
    with pytest.raises(ValueError, match="has no config.json"):
        run_cli(["card", str(tmp_path)])


def test_shipped_cards_render_into_model_cards(saved, tmp_path, monkeypatch):
    import diversed_hf.testbed as testbed

    _, directory = saved
    assets = tmp_path / "assets"
    (assets / "tokenizer").mkdir(parents=True)
    (assets / "tokenizer" / "config.json").write_text("{}")
    (assets / "head-arith").mkdir()
    for name in ("config.json", "model.safetensors"):
        (assets / "head-arith" / name).write_bytes((directory / name).read_bytes())
    monkeypatch.setattr(testbed, "ASSETS_DIR", assets)
    assert hub_cli.shipped_head_dirs() == [assets / "head-arith"]
    written = hub_cli.render_shipped_cards(tmp_path / "model_cards")
    assert written == [tmp_path / "model_cards" / "head-arith.md"]
    assert (assets / "head-arith" / "README.md").is_file()
    run_cli(["card", "--shipped", "--output-dir", str(tmp_path / "out")])
    assert (tmp_path / "out" / "head-arith.md").is_file()


def test_template_ships_inside_the_package():
    assert cards.TEMPLATE_PATH.is_file()
    assert cards.TEMPLATE_PATH.parent.name == "templates" and cards.TEMPLATE_PATH.parent.parent.name == "diversed_hf"


def test_task_facts_come_from_the_training_record_or_the_caller_never_from_the_registry(tmp_path):
    """Rendering reads no task: the facts are the head's training record's ``task_card`` (what ``train_head.py``
    writes from the registry), or what the caller passes (``diversed-hf card`` passes the registry's)."""
    spec = get_task("xsum")
    rows = [{"method": "sd", "quality": 0.07, "quality_metric": "rouge2"}, {"method": "diversed", "quality": 0.06}]
    recorded = {"task_card": task_card("xsum")}
    text = make_head(task="xsum").generate_model_card(results=rows, training_config=recorded).text
    assert spec.description in text and spec.metric_label in text
    assert all(dataset in text for dataset in spec.hub_datasets)
    # an alias of the metric is the same metric, and the task's own metric fills in when rows carry none
    assert "mix quality metrics" not in text
    rows[0]["quality_metric"] = "rouge2_f1"
    given = cards.render_card(make_head(task="cnndm").config, results=rows, task_card=task_card("cnndm")).text
    assert spec.metric_label in given and get_task("cnndm").description in given
    bare = make_head(task="xsum").generate_model_card(results=rows).text  # no record: the task's name, no more
    assert "Trained for the task `xsum`." in bare and spec.description not in bare
    other = make_head(task="xsum").generate_model_card(training_config={"task_card": task_card("gsm8k")}).text
    assert "Trained for the task `xsum`." in other  # a record of another task says nothing of this one
    unknown = make_head(task="my_task").generate_model_card(results=[{"method": "sd", "quality": 0.5}]).text
    assert "Trained for the task `my_task`." in unknown and "quality (x100)" in unknown
    assert task_card("my_task") is None and task_card(None) is None


def test_write_card_matches_the_card_save_pretrained_writes(saved, tmp_path):
    head, directory = saved
    saved_card = (directory / "README.md").read_text()
    cards.write_card(directory, output=tmp_path / "again.md")
    assert (tmp_path / "again.md").read_text() == saved_card
    assert f"| parameters | {sum(p.numel() for p in head.parameters()):,} |" in saved_card


def test_render_card_takes_a_config_or_its_json(saved):
    head, directory = saved
    from_json = cards.render_card(
        json.loads((directory / "config.json").read_text()), repo_id=REPO_ID, num_parameters=7
    )
    from_config = cards.render_card(head.config, repo_id=REPO_ID, num_parameters=7)
    assert from_json.content == from_config.content
    with pytest.raises(TypeError, match="`config` must be a DiversedHeadConfig"):
        cards.render_card(["not", "a", "config"])
    with pytest.raises(ValueError, match=r"lacks the head fields \['mixing'\]"):
        cards.render_card({k: v for k, v in dataclasses.asdict(head.config).items() if k != "mixing"})


def test_card_refuses_results_of_another_task(tmp_path):
    from diversed_hf import DiversedHead
    from diversed_hf.heads import cards

    head = DiversedHead(draft_hidden_size=4, target_hidden_size=6, task="gsm8k")
    results = {"setting": {"task": "xsum"}, "rows": [{"method": "sd", "acceptance_rate": 0.5, "quality": 0.07}]}
    with pytest.raises(ValueError, match="measured on task 'xsum' but the head was trained for 'gsm8k'"):
        cards.render_card(head.config, results=results)
    same = {"setting": {"task": "gsm8k"}, "rows": results["rows"]}
    assert "gsm8k" in cards.render_card(head.config, results=same).content


def _with_delta(delta, low, high):
    results = json.loads(json.dumps(RESULTS))
    results["rows"][2].update(quality_delta=delta, quality_delta_low=low, quality_delta_high=high)
    return results


@pytest.mark.parametrize(
    "goal, delta, verdict",
    [
        ((1.6, 0.01), -0.004, "1.63x at -0.4 [-1.0, +0.2] points: **met**."),
        ((1.7, 0.01), -0.004, "**missed**: acceptance 0.07x short."),
        (
            (1.6, 0.01),
            -0.025,
            "**missed**: quality 1.5 points beyond the allowed loss, the paired interval 1.9 points ",
        ),
        ((1.7, 0.02), -0.025, "**missed**: acceptance 0.07x short, quality 0.5 points beyond the allowed loss, the "),
        ((1.6, 0.03), -0.025, "**missed**: the paired interval 1.9 points below 0."),
    ],
)
def test_card_says_whether_the_results_meet_the_goal_recorded_with_training(goal, delta, verdict):
    training = {"goal_acceptance_ratio": goal[0], "goal_max_quality_loss": goal[1]}
    text = cards.render_card(
        make_head().config, results=_with_delta(delta, delta - 0.006, delta + 0.006), training_config=training
    ).text
    assert f"acceptance at least {goal[0]:g}x lossless SD's" in text and verdict in text  # 0.726 / 0.446 = 1.63x


def test_card_without_a_goal_says_nothing_about_one():
    text = cards.render_card(
        make_head().config, results=_with_delta(-0.004, -0.01, 0.002), training_config={"lr": 1}
    ).text
    assert "Goal" not in text and "\n\n\n" not in text


def test_card_refuses_a_goal_that_is_not_a_number():
    with pytest.raises(ValueError, match="goal_acceptance_ratio='fast'"):
        cards.render_card(
            make_head().config,
            results=_with_delta(-0.004, -0.01, 0.002),
            training_config={"goal_acceptance_ratio": "fast", "goal_max_quality_loss": 0.01},
        )


@pytest.mark.parametrize(
    "selection, message",
    [
        ("lambda 0.1", r"`selection` must be a JSON object"),
        ({"rule": "r", "front": [{"method": "a"}]}, r"`selection.chosen` must be a non-empty string"),
        ({"rule": "r", "chosen": "b", "front": [{"method": "a"}]}, r"'b' is not a `method` of `selection.front`"),
        (
            {"rule": "r", "chosen": "a", "front": [{"method": "a", "acceptance_rate": 83.0}]},
            r"front\[0\].acceptance_rate",
        ),
        ({"rule": "r", "chosen": "a", "front": []}, r"non-empty list"),
    ],
)
def test_bad_selections_are_refused(selection, message):
    with pytest.raises(ValueError, match=message):
        cards.load_results({"rows": [{"method": "sd"}], "selection": selection})


def test_card_without_a_selection_has_no_operating_point_section():
    text = (
        make_head(task="arith").generate_model_card(results={"rows": [{"method": "sd", "acceptance_rate": 0.5}]}).text
    )
    assert "Operating point" not in text


def test_shipped_drafts_and_adapters_cards_match_their_training_records():
    """The drafts' and the adapter's cards come from the same template system as the heads' and from their
    ``training.json``: the shipped ``README.md`` and ``model_cards/`` copies are what rendering gives
    (``diversed-hf card --shipped`` rewrites them)."""
    from pathlib import Path

    from diversed_hf.cli import hub as hub_cli

    rendered = hub_cli.shipped_model_cards()
    assert rendered, "the real pair ships EagleDrafts with cards"
    model_cards = Path(__file__).resolve().parents[1] / "model_cards"
    for directory, name, card in rendered:
        assert (directory / "README.md").read_text() == card, directory
        assert (model_cards / name).read_text() == card, name
