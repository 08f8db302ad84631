"""The `synopsis` task: real documents (standard-library docstring bodies) and their human one-line summaries,
shipped with the package; fixed splits; the reward is rouge-score's ROUGE-2 F1. No model runs."""

from __future__ import annotations

import pytest
from rouge_score import rouge_scorer

from diversed_hf.lab.tasks import get_task, load_task_dataset, reward_for_task, synopsis, synopsis_build


def test_the_shipped_pairs_are_deduplicated_and_split_by_module():
    rows = synopsis.synopsis_rows()
    assert len(rows) >= 2000
    assert len({r["summary"].lower() for r in rows}) == len(rows)
    assert len({" ".join(r["document"].lower().split()) for r in rows}) == len(rows)
    splits = {
        split: {r["module"].split(".")[0].lstrip("_") for r in rows if r["split"] == split} for split in synopsis.SPLITS
    }
    assert not splits["train"] & splits["test"] and not splits["train"] & splits["validation"]
    assert not splits["validation"] & splits["test"]
    assert all(r["split"] == synopsis_build.split_of(r["module"]) for r in rows)
    assert all(r["document"].startswith(r["id"] + "\n\n") for r in rows)
    assert (synopsis.DATA_FILE.parent / "synopsis_LICENSE.txt").read_text().startswith("PYTHON SOFTWARE FOUNDATION")


def test_load_task_dataset_gives_chat_prompts_of_fixed_splits():
    test = load_task_dataset("synopsis", split="test")
    validation = load_task_dataset("synopsis", split="validation")
    train = load_task_dataset("synopsis", split="train")
    assert len(test) >= 200 and len(validation) >= 200 and len(train) + len(test) + len(validation) >= 2000
    assert not set(test["id"]) & set(train["id"])
    row = test[0]
    assert row["prompt"].startswith("<|im_start|>system") and row["prompt"].endswith("<|im_start|>assistant\n")
    assert row["document"] in row["prompt"] and row["reference"] not in row["prompt"]
    picked = load_task_dataset("synopsis", num_examples=20, seed=3)
    assert (
        picked["id"]
        == load_task_dataset("synopsis", num_examples=20, seed=3)["id"]
        != load_task_dataset("synopsis", num_examples=20, seed=4)["id"]
    )
    plain = load_task_dataset("synopsis", num_examples=1, chat_template="none")[0]["prompt"]
    assert not plain.startswith("<|im_start|>")
    with pytest.raises(ValueError, match="synopsis has"):
        load_task_dataset("synopsis", split="dev")
    with pytest.raises(ValueError, match="num_examples"):
        load_task_dataset("synopsis", num_examples=10_000)


def test_the_reward_is_rouge_scores_rouge2_f1():
    data = load_task_dataset("synopsis", num_examples=30, seed=1)
    references = list(data["reference"])
    completions = [
        references[0],
        "Return the value.",
        "",
        references[3].upper() + " Extra words here.",
        *[f"{r.split()[0]} the object of {d.split(chr(10))[0]}" for r, d in zip(references[4:], data["document"][4:])],
    ]
    scorer = rouge_scorer.RougeScorer(["rouge2"], use_stemmer=False)
    expected = [scorer.score(r, c)["rouge2"].fmeasure for c, r in zip(completions, references)]
    assert get_task("synopsis").reward(completions, references) == pytest.approx(expected, abs=1e-12)
    assert reward_for_task("synopsis")(completions=completions, reference=references) == pytest.approx(expected)
    assert expected[0] == 1.0 and expected[2] == 0.0
    rouge_l = synopsis.rougeL(completions, references)
    assert rouge_l[0] == 1.0 and all(0.0 <= value <= 1.0 for value in rouge_l)


def test_the_builder_keeps_pep257_pairs_and_rebuilds_the_same_bytes(tmp_path):
    assert synopsis_build.docstring_pairs(
        "Return the sum of the values.\n\n" + "The values are added in order. " * 3
    ) == ("Return the sum of the values.", ("The values are added in order. " * 3).strip())
    assert synopsis_build.docstring_pairs("no capital here, and a summary.\n\n" + "word " * 30) is None
    assert synopsis_build.docstring_pairs("Only a summary line.") is None
    stdlib = tmp_path / "lib"
    (stdlib / "pkg").mkdir(parents=True)
    (stdlib / "pkg" / "mod.py").write_text(
        'def f(a, b=2):\n    """Add two numbers and return the total.\n\n    '
        + "The numbers may be ints or floats. " * 3
        + '\n    """\n'
    )
    rows = [r for r in synopsis_build.build_pairs(stdlib) if r["module"] == "pkg.mod"]
    assert rows == [
        {
            "id": "pkg.mod.f(a, b=2)",
            "module": "pkg.mod",
            "summary": "Add two numbers and return the total.",
            "document": "pkg.mod.f(a, b=2)\n\n" + ("The numbers may be ints or floats. " * 3).strip(),
            "split": synopsis_build.split_of("pkg.mod"),
        }
    ]


@pytest.mark.skipif(
    __import__("platform").python_version() != "3.11.7", reason="the data file was built on CPython 3.11.7"
)
def test_the_data_file_rebuilds_bit_identically(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "synopsis.jsonl.gz"
    subprocess.run(
        [sys.executable, "-m", "diversed_hf.lab.tasks.synopsis_build", "--output", str(out)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert out.read_bytes() == synopsis.DATA_FILE.read_bytes()


def test_bad_arguments_are_refused_before_any_work(tmp_path, monkeypatch):
    for bad in (2.5, "3", True):
        with pytest.raises(ValueError, match=rf"`num_examples` must be a positive integer or None .*got {bad!r}"):
            synopsis.load_synopsis(num_examples=bad)
    monkeypatch.setattr(synopsis_build, "build_pairs", lambda *a, **k: pytest.fail("the standard library was read"))
    with pytest.raises(ValueError, match=r"`--output` .* is a directory; pass the file to write, e.g. .*synopsis"):
        synopsis_build.main(["--output", str(tmp_path)])
