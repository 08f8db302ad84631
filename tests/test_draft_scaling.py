"""``benchmarks/draft_scaling.py``: which shards a scale of the data takes (the measurement itself runs on the real
pair, for hours: RESULTS.md, "Draft data scaling")."""

import json
from pathlib import Path

import pytest
import torch
from scripts import load_script

scaling = load_script("draft_scaling")


def test_a_scale_takes_the_first_shards_that_reach_its_positions(tmp_path):
    first = [(Path("a/shard-0"), 100), (Path("a/shard-1"), 100)]
    second = [(Path("b/shard-0"), 50), (Path("b/shard-1"), 50)]
    assert scaling.select_shards([first, second], 150) == [[Path("a/shard-0"), Path("a/shard-1")], []]
    assert scaling.select_shards([first, second], 250) == [[*(p for p, _ in first)], [Path("b/shard-0")]]
    assert scaling.select_shards([first, second], 301) is None  # not collected yet: the scale is reported, not run


def test_a_view_links_the_chosen_shards_and_the_manifest(tmp_path):
    source = tmp_path / "collection"
    source.mkdir()
    for name in ("shard-00000.safetensors", "shard-00001.safetensors", "manifest.json"):
        (source / name).write_text(name)
    views = scaling.data_view([[source / "shard-00000.safetensors"]], [source], tmp_path / "x1")
    assert [sorted(p.name for p in view.iterdir()) for view in views] == [["manifest.json", "shard-00000.safetensors"]]
    assert all(p.is_symlink() for p in views[0].iterdir())
    assert scaling.data_view([[source / "shard-00000.safetensors"]], [source], tmp_path / "x1") == views  # rerun


def test_eagle3_scales_read_each_chosen_shard_again_once(tmp_path):
    """``--arch eagle3``: the shards a scale takes are featurized for the draft's layers under one folder, each
    once whatever scale first needed it; the section renders both architectures' tables."""
    pytest.importorskip("trl")
    from test_training import tiny_tokenizer
    from tiny_models import make_model

    from diversed_hf.training.eagle_data import CollectionSettings, collect, load_sequences

    target = make_model("llama", num_layers=4)
    prompts = [("t5 t6 t7", 4), ("t8 t9", 3), ("t10 t11", 4), ("t12", 3)]
    source = collect(target, tiny_tokenizer(), prompts, tmp_path / "data", CollectionSettings(shard_size=2, top_k=4))
    shards = sorted(source.glob("shard-*.safetensors"))
    made = scaling.featurized(target, [shards[:1]], [source], tmp_path / "eagle3", (1, 2, 3))
    assert made == [[tmp_path / "eagle3" / "data0" / shards[0].name]]
    assert [s.hidden.shape[1] for s in load_sequences(tmp_path / "eagle3" / "data0")] == [96, 96]
    stamp = made[0][0].stat().st_mtime_ns
    scaling.featurized(target, [shards], [source], tmp_path / "eagle3", (1, 2, 3))  # a larger scale
    assert len(list((tmp_path / "eagle3" / "data0").glob("shard-*"))) == 2 and made[0][0].stat().st_mtime_ns == stamp

    row = {"positions": 1000, "top1_agreement": [0.5, 0.4, 0.3], "acceptance_t1": [0.6], "tokens_per_round": 2.0}
    row.update(tree_acceptance=0.3, minutes=12.0)
    results = {"scales": {"1": row}, "scales_eagle3": {"1": row, "2": {"skipped": "1,000 collected"}}}
    results.update(data=["d"], unit=1000, epochs=2, tree={}, num_prompts=2, aux_layer_ids=[1, 2, 3])
    text = scaling.render(results, "python benchmarks/draft_scaling.py --arch eagle3")
    assert text.count("| 1x | 1,000 | 0.500 / 0.400 / 0.300 | 0.600 | 2.00 | 30.0 % | 12 |") == 2
    results["shipped"] = {k: v for k, v in row.items() if k != "minutes"}
    assert '| shipped (`draft="eagle"`) | 1,000 | 0.500 / 0.400 / 0.300 | 0.600 | 2.00 | 30.0 % | – |' in (
        scaling.render(results, "python benchmarks/draft_scaling.py")
    )
    assert "**EAGLE-3** (`--arch eagle3`: the target's layers [1, 2, 3] fused" in text and "not run: 1,000" in text


def test_the_section_says_what_each_collection_cost(tmp_path):
    """Shards record the seconds their decoding took; the section gives each collection's positions and the rate its
    timed shards show (shards from before the timing count as positions only)."""
    from safetensors.torch import save_file

    source = tmp_path / "collection"
    source.mkdir()
    (source / "manifest.json").write_text(json.dumps({"settings": {"temperature": 0.7, "greedy_fraction": 0.25}}))
    for index, (prompt, total, seconds) in enumerate([(10, 310, "30.0"), (20, 520, "70.0"), (5, 105, None)]):
        tensors = {"offsets": torch.tensor([0, total]), "prompt_lengths": torch.tensor([prompt])}
        metadata = None if seconds is None else {"seconds": seconds}
        save_file(tensors, str(source / f"shard-{index:05d}.safetensors"), metadata=metadata)
    costs = scaling.collection_costs([source])
    assert costs == [
        {"data": str(source), "temperature": 0.7, "greedy_fraction": 0.25, "positions": 900, "timed_positions": 800}
        | {"timed_seconds": 100.0}
        | {"shards": 3, "timed_shards": 2}
    ]
    results = {"scales": {}, "collections": costs, "data": ["d"], "unit": 1000, "epochs": 2, "tree": {}}
    text = scaling.render({**results, "num_prompts": 2}, "python benchmarks/draft_scaling.py")
    assert (
        f"{source} (T = 0.7, 25 % greedy) 900 positions at 8 a second (the 2 of 3 shards that timed their decoding), about 0.0 h"
        in text
    )


def test_a_collected_shard_records_its_decoding_time(tmp_path):
    pytest.importorskip("trl")
    from safetensors import safe_open
    from test_training import tiny_tokenizer
    from tiny_models import make_model

    from diversed_hf.training.eagle_data import CollectionSettings, collect

    directory = collect(make_model("llama"), tiny_tokenizer(), [("t5 t6", 3)], tmp_path / "d", CollectionSettings())
    with safe_open(str(directory / "shard-00000.safetensors"), "pt") as data:
        assert float(data.metadata()["seconds"]) > 0


def test_every_scale_is_distilled_with_the_shipped_drafts_settings():
    """The recipe is the shipped EAGLE-1-style draft's (its training.json: learning rate, batch, seed...) with the
    benchmark's epochs and precision, in batches of like lengths; the section says so."""
    from diversed_hf.testbed.smollm2 import EAGLE_DIR
    from diversed_hf.training.eagle_distill import DistillSettings

    shipped = json.loads((EAGLE_DIR / "training.json").read_text())["settings"]
    recipe = scaling.recipe(scaling.parse_args(["--data", "d", "--epochs", "1"]))
    assert (recipe["learning_rate"], recipe["batch_size"], recipe["seed"]) == (
        shipped["learning_rate"],
        shipped["batch_size"],
        shipped["seed"],
    )
    assert (recipe["epochs"], recipe["mixed_precision"], recipe["group_by_length"]) == (1, "bf16", True)
    DistillSettings(**recipe)  # every key is a setting
    args = scaling.parse_args(["--data", "d", "--learning_rate", "3e-4", "--mixed_precision", "no"])
    assert (scaling.recipe(args)["learning_rate"], scaling.recipe(args)["mixed_precision"]) == (3e-4, "no")
    text = scaling._recipe({"recipe": recipe, "epochs": 1})
    assert f"learning rate {shipped['learning_rate']:g}, bfloat16 autocast" in text


def test_a_second_depth_has_its_own_runs_and_table():
    """``--num_layers 2``: the recipe's depth, its own results key (EAGLE-1 style or EAGLE-3) and table; the recipe the
    section states is the one every table shares."""
    args = scaling.parse_args(["--data", "d", "--num_layers", "2"])
    assert scaling.recipe(args)["num_layers"] == 2 and scaling.results_key(args) == "scales_2layers"
    assert scaling.results_key(scaling.parse_args(["--data", "d", "--arch", "eagle3", "--num_layers", "2"])) == (
        "scales_eagle3_2layers"
    )
    assert scaling.results_key(scaling.parse_args(["--data", "d"])) == "scales"
    for arch, layers in (("eagle", 1), ("eagle3", 1), ("eagle", 2), ("eagle3", 2)):  # a key names its table's options
        argv = ["--data", "d", "--arch", arch, "--num_layers", str(layers)]
        assert scaling.key_settings(scaling.results_key(scaling.parse_args(argv))) == (arch, layers)
    row = {"top1_agreement": [0.5, 0.4, 0.3], "acceptance_t1": [0.4], "positions": 10, "tokens_per_round": 2.0}
    results = {"data": ["d"], "unit": 10, "epochs": 2, "tree": {}, "num_prompts": 1, "scales": {"1": row}}
    results["scales_2layers"] = {"1": {**row, "tree_acceptance": 0.3}}
    results["scales"]["1"]["tree_acceptance"] = 0.2
    text = scaling.render(results, "python benchmarks/draft_scaling.py")
    assert "**2 decoder layers** (EAGLE-1 style, `--num_layers 2`" in text and text.count("| 1x |") == 2


def test_each_table_has_the_command_that_rebuilds_its_rows():
    """The section's tables come from runs with different ``--arch`` / ``--num_layers`` / ``--scales``: the opening
    gives one command per table, with every scale it shows, whichever run wrote the section last."""
    row = {"top1_agreement": [0.5], "acceptance_t1": [0.4], "positions": 10, "tokens_per_round": 2.0}
    results = {"scales": {"1": row, "0.5": row, "8": {"skipped": "the collections hold 5x"}}}
    results |= {"scales_eagle3": {"1": row}, "scales_2layers": {"2": row}, "scales_eagle3_2layers": {}}
    last = "python benchmarks/draft_scaling.py --data a 'b c' --scales 1 --arch eagle3 --runs_dir r"
    assert scaling.table_commands(results, last) == [
        "python benchmarks/draft_scaling.py --data a 'b c' --runs_dir r --scales 0.5 1",
        "python benchmarks/draft_scaling.py --data a 'b c' --runs_dir r --scales 1 --arch eagle3",
        "python benchmarks/draft_scaling.py --data a 'b c' --runs_dir r --scales 2 --num_layers 2",
    ]
    assert scaling.table_commands({"scales": {}}, last) == [last]  # nothing measured yet: the run itself
