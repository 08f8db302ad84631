"""lm-evaluation-harness over every verifier (diversed_hf.lab.harness, docs/lm_eval.md), offline: a local harness
task written here (a YAML over a .jsonl, ``generate_until``, exact match) on the testbed pair."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("lm_eval", reason='lm-eval is the eval extra: pip install -e ".[eval]"')

import lm_eval  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from diversed_hf import testbed  # noqa: E402
from diversed_hf.lab import harness  # noqa: E402  (registers "diversed")

TASK = "toy_arith"
TARGET, DRAFT, TOKENIZER = (str(testbed.ASSETS_DIR / name) for name in ("target", "draft", "tokenizer"))


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("harness")
    rows = testbed.load_task("arith", split="test", num_examples=8, seed=0)
    data = directory / "arith.jsonl"
    data.write_text(
        "\n".join(json.dumps({"prompt": p, "answer": a}) for p, a in zip(rows["prompt"], rows["reference"]))
    )
    (directory / "toy.yaml").write_text(
        f"task: {TASK}\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\n"
        "output_type: generate_until\n"
        'doc_to_text: "{{prompt}}"\n'
        'doc_to_target: "{{answer}}"\n'
        'generation_kwargs:\n  until: ["####"]\n  max_gen_toks: 24\n  do_sample: false\n'
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n"
    )
    return directory


@pytest.fixture(scope="module")
def task_manager(task_dir):
    return TaskManager(include_path=str(task_dir))


def _evaluate(task_manager, model: str, **model_args):
    args = dict(pretrained=TARGET, tokenizer=TOKENIZER, device="cpu", dtype="float32", batch_size=4, **model_args)
    return lm_eval.simple_evaluate(
        model=model, model_args=args, tasks=[TASK], task_manager=task_manager, log_samples=True
    )


def _answers(results) -> list[str]:
    return [sample["resps"][0][0] for sample in sorted(results["samples"][TASK], key=lambda s: s["doc_id"])]


@pytest.fixture(scope="module")
def plain(task_manager):
    return _evaluate(task_manager, "hf")


def test_lossless_greedy_gives_the_plain_hf_models_answers_and_the_statistics(task_manager, plain):
    results = _evaluate(task_manager, "diversed", assistant_model=DRAFT, verifier="exact", num_assistant_tokens=4)
    assert _answers(results) == _answers(plain)
    assert results["results"][TASK]["exact_match,none"] == plain["results"][TASK]["exact_match,none"]
    stats = results["config"]["speculation"][TASK]
    assert 0 < stats["acceptance_rate"] <= 1 and stats["tokens_per_round"] > 1 and stats["tokens_per_second"] > 0
    assert results["config"]["assistant_model"] and results["config"]["drafting"] == {"num_assistant_tokens": 4}


def test_a_static_weight_changes_the_answers_and_a_head_runs(task_manager, plain):
    draft_only = _evaluate(task_manager, "diversed", assistant_model=DRAFT, verifier="static:0")
    assert _answers(draft_only) != _answers(plain)  # w = 0: the draft's own greedy text
    assert draft_only["config"]["speculation"][TASK]["acceptance_rate"] == 1.0
    head_dir = testbed.ASSETS_DIR / "heads" / "arith"
    with_head = _evaluate(task_manager, "diversed", assistant_model=DRAFT, diversed_head=str(head_dir))
    assert len(_answers(with_head)) == 8 and with_head["config"]["verifier"] == "diversed_head"


def test_a_model_instance_works_and_target_only_keeps_the_harness_answers(task_manager, plain):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32)
    draft = AutoModelForCausalLM.from_pretrained(DRAFT, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    model = harness.DiversedLM(pretrained=target, tokenizer=tokenizer, assistant_model=draft, batch_size=4)
    results = lm_eval.simple_evaluate(model=model, tasks=[TASK], task_manager=task_manager, log_samples=True)
    assert _answers(results) == _answers(plain)
    alone = _evaluate(task_manager, "diversed")  # no draft: lm-eval's hf model exactly
    assert _answers(alone) == _answers(plain) and alone["config"]["speculation"][TASK]["acceptance_rate"] is None


@pytest.mark.parametrize(
    "model_args, match",
    [
        (dict(verifier="median:0.5"), r"`verifier='median:0.5'` is not a verifier: spell it as one of exact"),
        (dict(verifier="static:0.1,0.5"), r"needs one value"),
        (dict(verifier="exact"), r"`verifier` verifies a draft's tokens: pass `assistant_model`"),
        (dict(verifier="exact", diversed_head="x", assistant_model="y"), r"either `verifier` or `diversed_head`"),
    ],
)
def test_bad_model_args_are_refused_by_name(model_args, match):
    with pytest.raises(ValueError, match=match):
        harness.DiversedLM(pretrained=TARGET, tokenizer=TOKENIZER, device="cpu", **model_args)


def test_the_cli_runs_the_harness_with_the_model_registered(task_dir, capsys):
    from diversed_hf import cli

    argv = [
        "lm-eval",
        "--model_args",
        f"pretrained={TARGET},tokenizer={TOKENIZER},assistant_model={DRAFT},verifier=exact",
    ]
    argv += ["--tasks", TASK, "--include_path", str(task_dir), "--device", "cpu", "--batch_size", "4", "--limit", "4"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "exact_match" in out and "Speculation (diversed_hf), per task" in out and f"| {TASK} |" in out
    assert cli.main(["lm-eval", "--model", "hf"]) == 2
