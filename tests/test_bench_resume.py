"""``diversed-hf bench --resume``: an interrupted run started again redoes only the methods it had not finished."""

import copy

import pytest
import torch
from tiny_models import make_model

from diversed_hf import DiversedHead
from diversed_hf.cli import bench as bench_cli
from diversed_hf.lab import bench
from diversed_hf.lab.bench import runner
from diversed_hf.lab.bench.partial import PartialRecords, clear_partial, partial_dir
from diversed_hf.testbed import load_tokenizer


@pytest.fixture(scope="module")
def pair():
    tokenizer = load_tokenizer()
    target = make_model("llama", hidden_size=32, num_layers=2, vocab_size=len(tokenizer), seed=1)
    draft = copy.deepcopy(target)
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.mul_(0.9)
    for model in (target, draft):
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    return target, draft, tokenizer


def config(**overrides):
    values = dict(num_prompts=3, num_timing_prompts=0, max_new_tokens=8, batch_size=2, cost_tokens=2, repeats=1)
    return bench.BenchConfig(**{**values, **overrides})


RUN_BATCH = runner._run_batch


def _interrupt_at(monkeypatch, *families: str):
    """From now on a run dies as soon as a method of one of ``families`` starts decoding."""

    def dying(target, drafts, method, *args, **kwargs):
        if method.family in families:
            raise KeyboardInterrupt
        return RUN_BATCH(target, drafts, method, *args, **kwargs)

    monkeypatch.setattr(runner, "_run_batch", dying)


def test_an_interrupted_run_resumes_with_the_methods_it_finished(pair, tmp_path, monkeypatch):
    target, draft, tokenizer = pair
    task = bench.load_task("arith", 3)
    methods, _ = bench.parse_methods(["target", "sd", "static:0.5"])
    folder = tmp_path / "partial" / "arith"
    _interrupt_at(monkeypatch, "static-ensemble")
    with pytest.raises(KeyboardInterrupt):
        bench.run_bench(target, draft, tokenizer, task, methods, config(), partial_dir=folder)
    assert len(list(folder.glob("*.pt"))) == 2  # target-only and SD were finished and kept

    # Started again: target-only and SD come from what was kept (decoding them would die), static runs.
    _interrupt_at(monkeypatch, "target-only", "sd")
    resumed = bench.run_bench(target, draft, tokenizer, task, methods, config(), partial_dir=folder)
    monkeypatch.undo()
    fresh = bench.run_bench(target, draft, tokenizer, task, methods, config())
    for kept, new in zip(resumed.rows, fresh.rows):
        for key in ("method", "quality", "acceptance_rate", "num_generated"):
            assert kept[key] == new[key], key
    assert resumed.examples.keys() == fresh.examples.keys()


def test_changed_settings_models_or_heads_run_a_method_again(pair, tmp_path):
    target, draft, tokenizer = pair
    task = bench.load_task("arith", 3)
    head = DiversedHead.for_pair(target, draft, architecture="linear")
    methods, _ = bench.parse_methods(["sd", "diversed"], head=head)
    sd, diversed = methods

    def kept(method, *, setting=config(), models=None, folder=tmp_path / "arith"):
        records = PartialRecords(
            folder, task=task, config=setting, models=models or {"target": target, "draft": draft}, num_processes=1
        )
        return records.load(method)

    saved = PartialRecords(
        tmp_path / "arith", task=task, config=config(), models={"target": target, "draft": draft}, num_processes=1
    )
    saved.save(sd, [{"index": 0}])
    saved.save(diversed, [{"index": 1}])
    assert kept(sd) == [{"index": 0}] and kept(diversed) == [{"index": 1}]
    assert kept(sd, setting=config(temperature=0.5)) is None  # what is generated changed
    assert kept(sd, setting=config(repeats=3, num_timing_prompts=2)) == [{"index": 0}]  # only the timing changed
    assert kept(sd, models={"target": target, "draft": target}) is None  # another draft
    assert kept(sd, folder=tmp_path / "elsewhere") is None
    with torch.no_grad():
        next(head.parameters()).add_(1.0)
    assert kept(diversed) is None and kept(sd) == [{"index": 0}]  # the head's weights changed


def test_bench_command_keeps_methods_only_with_resume_and_clears_them_once_written(tmp_path):
    out = tmp_path / "out"
    folder = partial_dir(out, "arith")
    folder.mkdir(parents=True)
    (folder / "stale.pt").write_bytes(b"")
    arguments = bench_cli.BenchArguments(task=["arith"], output_dir=str(out))
    assert bench_cli._partial_dir(arguments, "arith") is None  # not resumable: warns, keeps nothing
    arguments.resume = True
    assert bench_cli._partial_dir(arguments, "arith") == folder
    clear_partial(out, ["arith"])
    assert not (out / "partial").exists()
