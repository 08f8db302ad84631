"""``benchmarks/draft_scaling.py``: which shards a scale of the data takes (the measurement itself runs on the real
pair, for hours: RESULTS.md, "Draft data scaling")."""

from pathlib import Path

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
