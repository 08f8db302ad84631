"""Prompts made with the target for an EagleDraft's data: follow-up turns after its answers, and requests it writes
itself, kept apart from the held-out everyday set (tiny models; word-level tokenizers)."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

pytest.importorskip("trl")

import train_eagle_draft  # noqa: E402
from test_training import VOCAB_SIZE, tiny_tokenizer  # noqa: E402
from tiny_models import make_model  # noqa: E402

from diversed_hf.lab.tasks.chat_prompts import broad_chat_messages, everyday_messages  # noqa: E402
from diversed_hf.lab.tasks.target_prompts import (  # noqa: E402
    SHARED_WORDS,
    _runs,
    _source,
    _words,
    apart_from_held_out,
    follow_up_prompts,
    parse_request,
    request_writing_prompts,
    turn_frame,
    write_requests,
)
from diversed_hf.training.eagle_data import load_token_ids  # noqa: E402


def test_the_lists_are_apart_from_the_held_out_set():
    """The follow-ups and the request-writing prompts share no run of five words with a held-out everyday prompt,
    and no topic names one, as tests/test_chat_prompts.py checks for the broad set."""
    source = _source()
    assert len(source["follow_ups"]) >= 30 and len(source["topics"]) >= 100 and len(source["styles"]) >= 5
    assert apart_from_held_out(source["follow_ups"]) == source["follow_ups"]
    held_out = " | ".join(m.lower() for m in everyday_messages())
    assert not [t for t in source["topics"] if len(t) > 12 and t.lower() in held_out]
    writing = [style.format(topic=topic) for style in source["styles"] for topic in source["topics"]]
    assert len(apart_from_held_out(writing)) == len(writing)


def test_requests_are_parsed_deduplicated_and_kept_apart():
    assert parse_request('Question: "How do I keep basil alive indoors?"\nmore') == "How do I keep basil alive indoors?"
    for reply in ("Sure! Here is a question:", "What?", "no ending", "", "1234567890123?", "x" * 300 + "?"):
        assert parse_request(reply) is None, reply
    held_out = everyday_messages()[2]  # "Is it bad to drink coffee right before going to bed?"
    near = "Honestly, is it bad to drink coffee right before a nap?"  # five of its words in a row
    assert _runs(_words(near), SHARED_WORDS + 1) & _runs(_words(held_out), SHARED_WORDS + 1)
    requests = [held_out, near, "How do volcanoes form?", "how do VOLCANOES form", broad_chat_messages()[0]]
    assert apart_from_held_out(requests) == ["How do volcanoes form?"]
    prompts = request_writing_prompts(700)
    assert len(prompts) == 700 and len(set(prompts[:642])) == 642  # every topic-style pair once before repeats
    assert prompts[0].endswith("<|im_start|>assistant\n") and request_writing_prompts(3, seed=1) != prompts[:3]


def test_follow_ups_continue_the_targets_answer_as_the_template_closes_a_turn():
    between, after = turn_frame("smollm2")
    assert (between, after) == ("<|im_end|>\n<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n")
    tokenizer = tiny_tokenizer()
    conversations = [([5, 6, 7, 8, 9], 3), ([10, 11], 1), ([12, 13], 2), ([14, 15, 1], 2)]
    prompts = follow_up_prompts(conversations, tokenizer, seed=0)
    assert len(prompts) == 1  # a read-only text, an empty answer and an answer of only EOS are skipped
    (prompt,) = prompts
    assert prompt.startswith("t5 t6 t7t8 t9" + between) and prompt.endswith(after)
    assert prompt[len("t5 t6 t7t8 t9" + between) : -len(after)] in _source()["follow_ups"]
    many = conversations * 5
    assert follow_up_prompts(many, tokenizer, seed=0) != follow_up_prompts(many, tokenizer, seed=1)
    with pytest.raises(ValueError, match="does not render a second turn"):
        turn_frame("none")


def _question_tokenizer():
    """Every word ends a question: any short reply reads as one request."""
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3} | {f"word{i}?": i for i in range(4, VOCAB_SIZE)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>"
    )


def test_the_target_writes_requests_seeded_and_without_touching_the_callers_stream():
    target = make_model("llama")
    tokenizer = _question_tokenizer()
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    requests = write_requests(target, tokenizer, 6, seed=0, batch_size=4, max_new_tokens=4, progress=False)
    assert torch.equal(torch.random.get_rng_state(), state) and tokenizer.padding_side == "right"
    assert 1 <= len(requests) <= 6 and len(set(requests)) == len(requests)
    assert all(parse_request(r) == r for r in requests)
    again = write_requests(target, tokenizer, 6, seed=0, batch_size=4, max_new_tokens=4, progress=False)
    assert again == requests
    with pytest.raises(ValueError, match="`num_requests` must be a non-negative integer"):
        write_requests(target, tokenizer, -1)


def test_writing_requests_that_stopped_goes_on_to_the_unbroken_runs_requests(tmp_path, monkeypatch):
    """With ``partial_file`` a run that stops after two batches loses nothing: the next call goes on from its
    requests and sampling state and returns what an unbroken run returns; a partial file of other arguments is
    ignored."""
    target = make_model("llama")
    tokenizer = _question_tokenizer()
    settings = dict(seed=0, batch_size=2, max_new_tokens=4, progress=False)
    unbroken = write_requests(target, tokenizer, 8, **settings)
    partial, generate, calls = tmp_path / "partial.json", target.generate, []

    def stopping(*args, **kwargs):
        if len(calls) == 2:
            raise KeyboardInterrupt  # the session ends
        calls.append(1)
        return generate(*args, **kwargs)

    monkeypatch.setattr(target, "generate", stopping)
    with pytest.raises(KeyboardInterrupt):
        write_requests(target, tokenizer, 8, partial_file=partial, **settings)
    monkeypatch.setattr(target, "generate", generate)
    stored = json.loads(partial.read_text())
    assert stored["next"] == 4 and stored["kept"] == unbroken[: len(stored["kept"])]
    assert write_requests(target, tokenizer, 8, partial_file=partial, **settings) == unbroken
    other = write_requests(target, tokenizer, 8, partial_file=partial, **{**settings, "seed": 1})
    assert other == write_requests(target, tokenizer, 8, **{**settings, "seed": 1})


def test_train_eagle_draft_answers_follow_ups_and_written_requests(tmp_path, monkeypatch):
    """A second collection continues the first one's conversations (--follow_ups) and answers requests the target
    wrote (--num_written, kept in written_requests.json and reused on a rerun); the record names both sources."""
    from diversed_hf.testbed import smollm2

    target = make_model("llama")
    monkeypatch.setattr(smollm2, "load_smollm2_target", lambda *a, **k: (target, tiny_tokenizer()))
    common = ["--num_arith", "0", "--code_samples", "0", "--num_docstrings", "0", "--chat_max_new_tokens", "3"]
    common += ["--top_k", "4", "--data_only"]
    first = tmp_path / "first"
    train_eagle_draft.main(["--output_dir", str(first), "--num_chat", "4", *common])
    answered = [c for c in load_token_ids(first / "data") if len(c[0]) > c[1]]
    second = tmp_path / "second"
    argv = ["--output_dir", str(second), "--num_chat", "0", "--follow_ups", str(first / "data"), *common]
    argv += ["--num_written", "3"]
    train_eagle_draft.main(argv)
    record = json.loads((second / "collection.json").read_text())
    assert record["prompt_mix"]["follow-ups"] == len(answered) == 4
    written = json.loads((second / "written_requests.json").read_text())
    assert (written["seed"], written["num_written"], written["target"]) == (0, 3, "smollm2")
    assert not (second / "written_requests.partial.json").exists()
    assert record["prompt_mix"].get("written requests", 0) == len(written["requests"])
    # a rerun reads the same requests back and finds every shard written
    (second / "written_requests.json").write_text(json.dumps({**written, "requests": written["requests"]}))
    train_eagle_draft.main(argv)
    assert json.loads((second / "collection.json").read_text())["prompt_mix"] == record["prompt_mix"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num_follow_ups", "3"], "--num_follow_ups 3 limits the follow-up turns of --follow_ups DIR"),
        (["--follow_ups", "nowhere"], "--follow_ups nowhere is not a collection (no manifest.json)"),
        (["--num_written", "-1"], "--num_written must be 0 or a positive integer"),
    ],
)
def test_bad_follow_up_and_written_options_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        train_eagle_draft.parse_args(argv)
    assert message in capsys.readouterr().err
