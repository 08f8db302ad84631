"""Distilling an EagleDraft with bad settings, data or directories: each refused early with the argument and the fix
(tiny models, a word-level tokenizer; a collection of a few short answers)."""

from __future__ import annotations

import json
import math

import pytest
import torch

pytest.importorskip("trl")

import train_eagle_draft  # noqa: E402
from test_training import tiny_tokenizer  # noqa: E402
from tiny_models import make_model  # noqa: E402

from diversed_hf import EagleDraft, enable_diversed  # noqa: E402
from diversed_hf.training import eagle_save  # noqa: E402
from diversed_hf.training.eagle_data import CollectionSettings, collect, load_sequences  # noqa: E402
from diversed_hf.training.eagle_distill import DistillSettings, check_save_to, distill, save_draft  # noqa: E402

PROMPTS = [("t5 t6 t7", 4), ("t8 t9", 4), ("t10 t11 t12 t13", 4), ("t14 t15", 4)]
FAST = DistillSettings(draft_vocab_size=None, epochs=1, batch_size=2, save_steps=1, held_out=0.25)


def collection(directory, prompts=PROMPTS):
    target = make_model("llama")
    collect(target, tiny_tokenizer(), prompts, directory, CollectionSettings(batch_size=4, top_k=4), progress=False)
    return target


@pytest.mark.parametrize("temperature", [0, 0.0, -0.5, math.nan, math.inf])
def test_collection_refuses_a_temperature_that_is_not_positive_and_finite(temperature):
    with pytest.raises(ValueError, match=r"`temperature` must be a positive finite number.*`greedy_fraction`"):
        CollectionSettings(temperature=temperature)
    with pytest.raises(SystemExit):
        train_eagle_draft.parse_args(["--temperature", str(temperature)])


@pytest.mark.parametrize(
    "values, match",
    [
        (dict(learning_rate=math.nan), "`learning_rate` must be a finite number > 0"),
        (dict(learning_rate=0.0), "`learning_rate` must be a finite number > 0"),
        (dict(tv_weight=-1.0), "`tv_weight` must be a finite number >= 0"),
        (dict(epochs=0), "`epochs` must be a positive integer"),
        (dict(held_out=1.0), r"`held_out` must be in \(0, 1\)"),
        (dict(draft_vocab_size=0), "`draft_vocab_size` must be a positive integer or None"),
        (dict(mixed_precision="fp16"), "`mixed_precision` must be one of 'no', 'bf16', got 'fp16'"),
        (dict(group_by_length=1), "`group_by_length` must be True or False, got 1"),
    ],
)
def test_distill_settings_are_checked_when_made(values, match):
    with pytest.raises(ValueError, match=match):
        DistillSettings(**values)


def test_the_command_refuses_an_unknown_precision_by_name(capsys):
    with pytest.raises(SystemExit):
        train_eagle_draft.parse_args(["--mixed_precision", "fp16"])
    assert "--mixed_precision 'fp16': give 'bf16'" in capsys.readouterr().err


def test_batches_of_like_lengths_cover_the_epoch_and_pad_less():
    """``group_by_length``: every training sequence once an epoch, in batches of like lengths (far fewer padded cells
    than batches drawn uniformly), an order set by the seed and the epoch."""
    from types import SimpleNamespace

    from diversed_hf.training.eagle_distill import _epoch_batches

    lengths = [int(n) for n in torch.randint(20, 400, (1000,), generator=torch.Generator().manual_seed(0))]
    training = [SimpleNamespace(ids=torch.zeros(n)) for n in lengths]

    def padded(batches):
        return sum(len(b) * max(lengths[i] for i in b) - sum(lengths[i] for i in b) for b in batches)

    settings = DistillSettings(batch_size=8, group_by_length=True)
    grouped = _epoch_batches(training, settings, epoch=0)
    uniform = _epoch_batches(training, DistillSettings(batch_size=8), epoch=0)
    assert sorted(i for b in grouped for i in b) == list(range(1000)) and max(map(len, grouped)) == 8
    assert padded(grouped) < padded(uniform) / 10
    assert grouped == _epoch_batches(training, settings, epoch=0) != _epoch_batches(training, settings, epoch=1)
    assert grouped != _epoch_batches(training, DistillSettings(batch_size=8, group_by_length=True, seed=1), epoch=0)


def test_a_bfloat16_distillation_learns_and_says_so(tmp_path):
    """``mixed_precision='bf16'``: the loss under bfloat16 autocast over float32 weights; the record names it."""
    target = collection(tmp_path / "data", PROMPTS * 4)
    settings = DistillSettings(
        draft_vocab_size=None, epochs=4, batch_size=2, held_out=0.25, learning_rate=1e-2, mixed_precision="bf16"
    )
    saved = distill(target, tmp_path / "data", tmp_path / "checkpoints", tmp_path / "draft", settings, progress=False)
    record = json.loads((saved / "training.json").read_text())
    assert record["settings"]["mixed_precision"] == "bf16"
    assert record["held_out_after"]["acceptance_t1"][0] > record["held_out_before"]["acceptance_t1"][0]


def test_an_empty_collection_is_named_empty(tmp_path):
    with pytest.raises(ValueError, match="`prompts` is empty"):
        collect(make_model("llama"), tiny_tokenizer(), [], tmp_path / "data", progress=False)
    (tmp_path / "old").mkdir()  # what an earlier version wrote for 0 prompts: a manifest and no shard
    (tmp_path / "old" / "manifest.json").write_text(json.dumps({"num_prompts": 0}))
    with pytest.raises(ValueError, match="collection in .*old is empty: it was made from 0 prompts"):
        load_sequences(tmp_path / "old")


def test_one_sequence_is_too_few_for_a_held_out_split(tmp_path):
    target = collection(tmp_path / "data", PROMPTS[:1])
    with pytest.raises(ValueError, match=r"holds 1 sequence\(s\): too few for a held-out split"):
        distill(target, tmp_path / "data", tmp_path / "checkpoints", tmp_path / "draft", FAST, progress=False)


def test_checkpoints_stray_folders_are_ignored_and_a_truncated_one_is_named(tmp_path):
    target = collection(tmp_path / "data")
    checkpoints = tmp_path / "checkpoints"
    (checkpoints / "checkpoint-best").mkdir(parents=True)  # a user's folder: not a checkpoint-<step>
    (checkpoints / "checkpoint-best" / "state.pt").write_bytes(b"")
    saved = distill(target, tmp_path / "data", checkpoints, tmp_path / "draft", FAST, progress=False)
    assert (saved / "model.safetensors").is_file() and (checkpoints / "checkpoint-best").is_dir()
    latest = max(checkpoints.glob("checkpoint-[0-9]*"), key=lambda p: int(p.name.split("-")[1]))
    state = latest / "state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])  # cut short, as by a full disk
    with pytest.raises(ValueError, match=rf"checkpoint {state} is truncated or damaged.*Remove {latest}"):
        distill(target, tmp_path / "data", checkpoints, tmp_path / "draft", FAST, progress=False)


def test_save_to_holding_other_files_or_overlapping_the_run_is_refused(tmp_path):
    data, checkpoints = tmp_path / "run" / "data", tmp_path / "run" / "checkpoints"
    for save_to, match in (
        (tmp_path / "run", "overlaps the collected data"),  # --save_to equal to --output_dir
        (data / "draft", "overlaps the collected data"),
        (checkpoints, "overlaps the checkpoints"),
    ):
        with pytest.raises(ValueError, match=match):
            check_save_to(save_to, data, checkpoints)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    with pytest.raises(ValueError, match=r"holds files that are not an EagleDraft's \(notes.txt\)"):
        check_save_to(mine, data, checkpoints)
    model = tmp_path / "model"
    make_model("llama").save_pretrained(model)  # config.json, model.safetensors, ...: another model's
    with pytest.raises(ValueError, match="holds another model .*'llama'"):
        check_save_to(model, data, checkpoints)
    draft = EagleDraft.for_target(make_model("llama"))
    with pytest.raises(ValueError, match="notes.txt"):
        save_draft(draft, mine, {})  # the library refuses too
    assert (mine / "notes.txt").read_text() == "my notes"
    assert check_save_to(tmp_path / "new", data, checkpoints) == tmp_path / "new"


@pytest.mark.parametrize("exchange", [True, False])  # one renameat2 exchange, or the two renames where it is missing
def test_an_earlier_draft_is_replaced_whole(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(eagle_save, "_exchange", lambda first, second: False)
    target = make_model("llama")
    first, second = (EagleDraft.for_target(target) for _ in range(2))
    save_draft(first, tmp_path / "draft", {"run": 1})
    check_save_to(tmp_path / "draft", tmp_path / "data", tmp_path / "checkpoints")  # an earlier draft: accepted
    save_draft(second, tmp_path / "draft", {"run": 2})
    assert json.loads((tmp_path / "draft" / "training.json").read_text()) == {"run": 2}
    loaded = EagleDraft.from_pretrained(tmp_path / "draft", target=target)
    torch.testing.assert_close(loaded.fc.weight, second.fc.weight.to(torch.bfloat16).float())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft"]  # nothing staged or kept beside it


def test_train_eagle_draft_checks_save_to_before_the_target_loads(tmp_path, monkeypatch):
    from diversed_hf.testbed import smollm2

    monkeypatch.setattr(smollm2, "load_smollm2_target", lambda *a, **k: pytest.fail("the target was loaded"))
    output_dir = tmp_path / "run"
    with pytest.raises(ValueError, match="`--save_to` .* overlaps the collected data"):
        train_eagle_draft.main(["--output_dir", str(output_dir), "--save_to", str(output_dir)])
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("")
    with pytest.raises(ValueError, match=r"`--save_to` .*mine holds files that are not an EagleDraft's \(thesis"):
        train_eagle_draft.main(["--output_dir", str(output_dir), "--save_to", str(tmp_path / "mine")])
    assert (tmp_path / "mine" / "thesis.tex").is_file()


def test_train_eagle_draft_distils_on_a_users_own_prompts(tmp_path, monkeypatch):
    """``--prompts`` (a JSON-lines file of conversations and plain prompts) replaces the broad chat set; the
    record says what the mix was."""
    from diversed_hf.testbed import smollm2

    target = make_model("llama")
    monkeypatch.setattr(smollm2, "load_smollm2_target", lambda *a, **k: (target, tiny_tokenizer()))
    prompts = tmp_path / "mine.jsonl"
    rows = [{"prompt": f"t{i} t{i + 1} t{i + 2}"} for i in range(4, 10)]
    rows.append({"conversations": [{"from": "human", "value": "t20 t21"}, {"from": "gpt", "value": "t22"}]})
    prompts.write_text("\n".join(json.dumps(r) for r in rows))
    save_to = tmp_path / "draft"
    argv = ["--output_dir", str(tmp_path / "run"), "--save_to", str(save_to), "--prompts", str(prompts)]
    argv += ["--num_arith", "0", "--code_samples", "0", "--num_docstrings", "0", "--chat_max_new_tokens", "3"]
    argv += ["--epochs", "1", "--batch_size", "2", "--top_k", "4", "--draft_vocab_size", "0", "--held_out", "0.3"]
    assert train_eagle_draft.main(argv) == save_to
    record = json.loads((save_to / "training.json").read_text())
    assert record["prompt_mix"] == {f"your prompts ({prompts})": 7} and record["num_prompts"] == 7
    assert "--prompts" in record["recipe"] and f"7 your prompts ({prompts})" in (save_to / "README.md").read_text()
    # the saved draft carries the default tree, and generate with no knobs drafts it (read back from disk)
    draft = EagleDraft.from_pretrained(save_to, target=target)
    assert (draft.generation_config.assistant_tree_top_k, draft.generation_config.assistant_tree_size) == (4, 12)
    enable_diversed(target)
    output = target.generate(
        torch.tensor([[5, 6, 7, 8]]),
        assistant_model=draft,
        do_sample=False,
        max_new_tokens=8,
        return_dict_in_generate=True,
    )
    assert float(output.speculation.nodes_per_round[0]) > draft.generation_config.num_assistant_tokens


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--num_chat", "0", "--num_arith", "0", "--code_samples", "0", "--num_docstrings", "0"],
            "the prompt mix is empty",
        ),
        (["--num_chat", "-1"], "--num_chat must be 0 or a positive integer"),
        (["--learning_rate", "nan"], "--learning_rate must be a positive finite number"),
        (["--tv_weight", "-1"], "--tv_weight must be a finite number >= 0"),
        (["--chat_max_new_tokens", "0"], "--chat_max_new_tokens must be a positive integer"),
        (["--num_user_prompts", "0"], "--num_user_prompts must be a positive integer"),
        (["--assistant_tree_size", "2"], "the saved draft's tree: `assistant_tree_size=2` is below the tree's depth"),
        (["--assistant_tree_top_k", "0"], "`assistant_tree_top_k` must be a positive integer"),
    ],
)
def test_train_eagle_draft_refuses_bad_options_before_anything_loads(argv, message, capsys):
    with pytest.raises(SystemExit):
        train_eagle_draft.parse_args(argv)
    assert message in capsys.readouterr().err


def test_a_missing_prompts_file_is_refused_before_the_target_loads(tmp_path, monkeypatch):
    from diversed_hf.testbed import smollm2

    monkeypatch.setattr(smollm2, "load_smollm2_target", lambda *a, **k: pytest.fail("the target was loaded"))
    with pytest.raises(FileNotFoundError, match="no such file"):
        train_eagle_draft.main(["--output_dir", str(tmp_path / "run"), "--prompts", str(tmp_path / "none.jsonl")])


def test_a_second_collection_on_new_prompts_is_distilled_with_the_first(tmp_path, monkeypatch):
    """``--data_only`` writes ``collection.json``; ``--extra_data`` distils on that collection too, and the record sums
    both mixes and names both commands in order."""
    from diversed_hf.testbed import smollm2

    target = make_model("llama")
    monkeypatch.setattr(smollm2, "load_smollm2_target", lambda *a, **k: (target, tiny_tokenizer()))
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    first.write_text("\n".join(json.dumps({"prompt": f"t{i} t{i + 1} t{i + 2}"}) for i in range(4, 9)))
    second.write_text("\n".join(json.dumps({"prompt": f"t{i} t{i + 3}"}) for i in range(10, 14)))
    common = ["--num_arith", "0", "--code_samples", "0", "--num_docstrings", "0", "--chat_max_new_tokens", "3"]
    common += ["--top_k", "4", "--generation_batch_size", "4"]
    assert train_eagle_draft.main(
        ["--output_dir", str(tmp_path / "a"), "--prompts", str(first), "--data_only", *common]
    ) == (tmp_path / "a" / "data")
    made = json.loads((tmp_path / "a" / "collection.json").read_text())
    assert made["num_prompts"] == 5 and made["dtype"] == "bfloat16" and "--data_only" in made["recipe"]

    save_to = tmp_path / "draft"
    argv = ["--output_dir", str(tmp_path / "b"), "--prompts", str(second), "--save_to", str(save_to), *common]
    argv += ["--extra_data", str(tmp_path / "a" / "data"), "--epochs", "1", "--batch_size", "2"]
    argv += ["--draft_vocab_size", "0", "--held_out", "0.2"]
    assert train_eagle_draft.main(argv) == save_to
    record = json.loads((save_to / "training.json").read_text())
    assert record["num_prompts"] == 9 and record["num_sequences"] == {"train": 7, "held_out": 2}
    assert record["prompt_mix"] == {f"your prompts ({first})": 5, f"your prompts ({second})": 4}
    assert record["recipe"].index("--data_only") < record["recipe"].index("--extra_data")
    assert [c["num_prompts"] for c in record["collections"]] == [4, 5]
    card = (save_to / "README.md").read_text()
    assert "The data is 2 collections" in card and "held-out figures below lean optimistic" in card
    rebuild = card.split("## Rebuild", 1)[1]
    assert rebuild.index("--data_only") < rebuild.index("--extra_data") and " && " not in rebuild
    run = json.loads((tmp_path / "b" / "checkpoints" / "run.json").read_text())
    assert isinstance(run["data_manifest"], list) and len(run["data_manifest"]) == 2


def test_extra_data_must_be_a_collection(tmp_path, capsys):
    with pytest.raises(SystemExit):
        train_eagle_draft.parse_args(["--extra_data", str(tmp_path)])
    assert f"--extra_data {tmp_path} is not a collection (no manifest.json)" in capsys.readouterr().err
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text("{}")
    with pytest.raises(ValueError, match=r"collection.json is missing or unreadable.*--data_only"):
        train_eagle_draft._collection_record(tmp_path / "data")


def test_chat_offset_takes_requests_after_the_first():
    from diversed_hf.lab.tasks.chat_prompts import broad_chat_prompts
    from diversed_hf.lab.tasks.eagle_prompts import eagle_prompt_mix

    mix = eagle_prompt_mix(0, 0, 0, num_chat=3, chat_offset=5)
    assert [p for p, _ in mix["chat"]] == broad_chat_prompts(8)[5:]
    with pytest.raises(ValueError, match="`chat_offset` must be a non-negative integer"):
        eagle_prompt_mix(0, 0, 0, num_chat=3, chat_offset=-1)


def test_the_tuned_targets_task_prompts_join_the_mix_from_their_training_splits():
    from diversed_hf.lab.tasks import get_task, load_task_dataset
    from diversed_hf.lab.tasks.eagle_prompts import eagle_prompt_mix

    mix = eagle_prompt_mix(0, 0, 0, num_synopsis=3, num_arith_steps=2)
    assert set(mix) == {"chat", "arith_chat", "humaneval", "docstrings", "synopsis", "arith_steps", "prefill"}
    assert [p for p, _ in mix["arith_steps"]] == list(
        load_task_dataset("arith_steps", split="train", num_examples=2)["prompt"]
    )
    assert {n for _, n in mix["synopsis"]} == {get_task("synopsis").max_new_tokens} and len(mix["synopsis"]) == 3
    assert "synopsis" not in eagle_prompt_mix(0, 0, 0)  # the default mix is unchanged
    with pytest.raises(ValueError, match="`num_arith_steps` must be a non-negative integer"):
        eagle_prompt_mix(0, 0, 0, num_arith_steps=-2)


def test_the_tuned_target_is_named_and_its_adapter_checked_before_any_model_loads(tmp_path, monkeypatch, capsys):
    from diversed_hf.testbed import smollm2, smollm2_tuned

    with pytest.raises(SystemExit):
        train_eagle_draft.parse_args(["--adapter", str(tmp_path)])
    assert "is for the tuned target: add --target smollm2-tuned" in capsys.readouterr().err
    monkeypatch.setattr(smollm2, "load_smollm2_target", lambda *a, **k: pytest.fail("a model was loaded"))
    argv = ["--target", "smollm2-tuned", "--adapter", str(tmp_path / "none"), "--output_dir", str(tmp_path / "run")]
    with pytest.raises(FileNotFoundError, match=r"no task-tuned adapter .*tune_target\.py"):
        train_eagle_draft.main(argv)
    assert "--target smollm2-tuned" in smollm2_tuned.TUNED_EAGLE_COMMAND
    args = train_eagle_draft.parse_args(["--target", "smollm2-tuned", "--num_synopsis", "3", "--num_arith_steps", "2"])
    mix = train_eagle_draft._prompts(args)
    assert len(mix["synopsis"]) == 3 and len(mix["arith_steps"]) == 2


def test_a_collection_of_another_target_or_dtype_is_refused_naming_both(tmp_path, monkeypatch):
    """The collection records what answered (target, dtype): a run for the tuned target, or in float32, into a
    folder holding the base target's bfloat16 data is refused instead of reusing it under a false label."""
    from diversed_hf.testbed import smollm2, smollm2_tuned

    target = make_model("llama")
    monkeypatch.setattr(smollm2, "load_smollm2_target", lambda *a, **k: (target, tiny_tokenizer()))
    monkeypatch.setattr(smollm2_tuned, "load_tuned_target", lambda *a, **k: (target, tiny_tokenizer()))
    argv = ["--output_dir", str(tmp_path / "run"), "--num_chat", "2", "--num_arith", "0", "--code_samples", "0"]
    argv += ["--num_docstrings", "0", "--chat_max_new_tokens", "3", "--top_k", "4", "--data_only"]
    train_eagle_draft.main(argv)
    manifest = json.loads((tmp_path / "run" / "data" / "manifest.json").read_text())
    assert manifest["source"] == {"target": "smollm2", "dtype": "bfloat16"}
    with pytest.raises(ValueError, match=r"source: \{'target': 'smollm2', .*\} there, \{'target': 'smollm2-tuned'"):
        train_eagle_draft.main([*argv, "--target", "smollm2-tuned"])
    with pytest.raises(ValueError, match=r"'dtype': 'bfloat16'\} there, \{'target': 'smollm2', 'dtype': 'float32'\}"):
        train_eagle_draft.main([*argv, "--dtype", "float32"])
    assert json.loads((tmp_path / "run" / "collection.json").read_text())["dtype"] == "bfloat16"  # not rewritten


def test_a_steps_speed_counts_the_cells_and_positions_it_trained(tmp_path):
    """``step_speed`` (``benchmarks/distill_speed.py``): padded cells per trained position >= 1, a positive rate; too
    few steps to time is refused."""
    from diversed_hf.training.eagle_distill import step_speed

    target = collection(tmp_path / "data", PROMPTS * 3)
    sequences = load_sequences(tmp_path / "data")
    speed, draft = step_speed(target, sequences, DistillSettings(draft_vocab_size=None, batch_size=2), steps=4)
    assert speed["cells_per_position"] >= 1 and speed["positions_per_second"] > 0 and draft.training
    with pytest.raises(ValueError, match="`steps` 2 leaves no timed step"):
        step_speed(target, sequences, DistillSettings(draft_vocab_size=None, batch_size=2), steps=2)


def test_the_prompts_soft_labels_are_computed_only_where_they_train(tmp_path):
    """A row that decodes gets the target's soft labels from its last prompt position on (the earlier ones are never
    trained: placeholders, ids 0 and log-probabilities -inf); a read-only row (0 new tokens) trains every position and
    gets them all, as does every row of its batch."""
    collection(tmp_path / "answered", [("t5 t6 t7 t8", 3), ("t9 t10", 3)])
    for sequence in load_sequences(tmp_path / "answered"):
        start = sequence.prompt_length - 1
        assert torch.isinf(sequence.top_logprobs[:start]).all() and not sequence.top_ids[:start].any()
        assert torch.isfinite(sequence.top_logprobs[start:, 0]).all()
    collection(tmp_path / "read", [("t5 t6 t7 t8", 0), ("t9 t10", 3)])
    for sequence in load_sequences(tmp_path / "read"):
        assert torch.isfinite(sequence.top_logprobs[:, 0]).all()


def test_a_shard_decodes_its_prompts_in_batches_of_like_lengths_and_keeps_their_order(tmp_path, monkeypatch):
    from diversed_hf.training import eagle_data

    widths = []
    decode = eagle_data._decode_batch

    def recording(target, jobs, *args):
        widths.append(sorted(len(ids) for ids, _ in jobs))
        return decode(target, jobs, *args)

    monkeypatch.setattr(eagle_data, "_decode_batch", recording)
    prompts = [("t5", 2), ("t5 t6 t7 t8 t9 t10", 2), ("t11", 2), ("t12 t13 t14 t15 t16 t17", 2)]
    target = make_model("llama")
    settings = CollectionSettings(batch_size=2, shard_size=4, top_k=4)
    collect(target, tiny_tokenizer(), prompts, tmp_path / "data", settings, progress=False)
    assert widths[0][-1] < widths[1][0]  # the short prompts together, then the long ones
    tokenizer = tiny_tokenizer()
    for (text, _), sequence in zip(prompts, load_sequences(tmp_path / "data"), strict=True):
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert sequence.ids[: len(prompt)].tolist() == prompt  # the shard holds them in the order given


def test_checkpoints_from_before_a_setting_existed_resume_with_its_default(tmp_path):
    """A run.json written before ``group_by_length`` and ``mixed_precision`` existed is read as their defaults (what
    that run trained with): the run goes on; a run asking for another value is refused by name."""
    target = collection(tmp_path / "data")
    checkpoints = tmp_path / "checkpoints"
    distill(target, tmp_path / "data", checkpoints, tmp_path / "draft", FAST, progress=False)
    record = json.loads((checkpoints / "run.json").read_text())
    for name in ("group_by_length", "mixed_precision"):
        del record["settings"][name]
    (checkpoints / "run.json").write_text(json.dumps(record))
    distill(target, tmp_path / "data", checkpoints, tmp_path / "draft", FAST, progress=False)
    assert json.loads((checkpoints / "run.json").read_text())["settings"]["mixed_precision"] == "no"
    bf16 = DistillSettings(**{**FAST.__dict__, "mixed_precision": "bf16"})
    with pytest.raises(ValueError, match="checkpoints of another run"):
        distill(target, tmp_path / "data", checkpoints, tmp_path / "draft", bf16, progress=False)
    del record["unrolling"]  # trained before training-time test attended as drafting does: not resumed
    (checkpoints / "run.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"trained before training-time test attended as drafting does .*Remove"):
        distill(target, tmp_path / "data", checkpoints, tmp_path / "draft", FAST, progress=False)


def test_a_run_record_stopped_mid_rewrite_leaves_the_old_one_whole(tmp_path, monkeypatch):
    """run.json is rewritten through the atomic writer (here: a record from before the later settings existed gets
    their defaults): a session that ends before the rename leaves the old record whole, and no staging file."""
    from diversed_hf.common import files
    from diversed_hf.training import eagle_distill

    run_file = tmp_path / "run.json"
    old = {"settings": {"epochs": 1}, "unrolling": "chain"}
    run_file.write_text(json.dumps(old))

    def stopped(source, target):
        raise KeyboardInterrupt  # the session ends here

    monkeypatch.setattr(files.os, "replace", stopped)
    with pytest.raises(KeyboardInterrupt):
        eagle_distill._fill_new_settings(run_file)
    assert json.loads(run_file.read_text()) == old
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]
