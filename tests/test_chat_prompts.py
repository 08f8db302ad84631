"""The everyday chat prompts: the broad set drafts are distilled on, the held-out set they are measured on, and a
user's own prompts for ``train_eagle_draft.py --prompts``."""

from __future__ import annotations

import json
import re

import pytest

from diversed_hf.lab.tasks.chat_prompts import (
    _broad_source,
    broad_chat_messages,
    broad_chat_prompts,
    everyday_messages,
    everyday_prompts,
    load_user_prompts,
    render_conversation,
)


def test_broad_set_is_large_distinct_and_the_same_on_every_run():
    messages = broad_chat_messages()
    assert len(messages) == len(set(messages)) == 3236
    assert broad_chat_messages() == messages and broad_chat_messages(seed=1) != messages
    # a seed reorders the set and redraws the audiences of the templates that name one
    without_audience = [m for m in messages if " to a " not in m and " to my " not in m and " to someone " not in m]
    assert set(without_audience) <= set(broad_chat_messages(seed=1))
    assert broad_chat_messages(10) == messages[:10]
    assert all("{" not in m and "}" not in m for m in messages)
    kinds = _broad_source()["templates"]
    assert len(kinds) >= 8 and sum(len(t) for t in kinds.values()) >= 50


def test_broad_prompts_are_chat_turns():
    prompts = broad_chat_prompts(3)
    assert all(p.startswith("<|im_start|>") and p.endswith("<|im_start|>assistant\n") for p in prompts)
    assert broad_chat_messages(3)[0] in prompts[0]


def test_held_out_everyday_set_is_apart_from_the_broad_set():
    held_out = everyday_messages()
    assert len(held_out) == len(set(held_out)) == 64
    assert not set(held_out) & set(broad_chat_messages())
    source = _broad_source()
    topics = {topic.lower() for kind in source["templates"] for topic in source[kind] if len(topic) > 12}
    assert not [(t, m) for m in held_out for t in topics if t in m.lower()]
    frames = []  # templates with at least four words of their own: a held-out prompt must not be one filled in
    for templates in source["templates"].values():
        for template in templates:
            fixed = re.sub(r"\{[xa]\}", " ", template)
            if len(fixed.split()) >= 4:
                pattern = re.escape(template).replace(re.escape("{x}"), ".+").replace(re.escape("{a}"), ".+")
                frames.append(re.compile(f"^{pattern}$", re.IGNORECASE))
    assert not [m for m in held_out for frame in frames if frame.match(m)]
    assert len(everyday_prompts(5)) == 5 and held_out[0] in everyday_prompts(1)[0]
    with pytest.raises(ValueError, match=r"`num_prompts` must be in \[1, 64\]"):
        everyday_prompts(65)


def test_user_prompts_from_jsonl_conversations_and_plain_prompts(tmp_path):
    path = tmp_path / "chats.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"}]},
        {
            "conversations": [
                {"from": "system", "value": "Be brief."},
                {"from": "human", "value": "Name a fruit."},
                {"from": "gpt", "value": "Apple."},
                {"from": "human", "value": "Another?"},
                {"from": "gpt", "value": "Pear."},
            ]
        },
        {"prompt": "Plain prompt"},
        {"instruction": "An instruction"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    prompts = load_user_prompts(path)
    assert len(prompts) == 4
    assert prompts[0].endswith("<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")  # cut after the user
    assert "Hello!" not in prompts[0]
    assert "Be brief." in prompts[1] and "Apple." in prompts[1] and "Pear." not in prompts[1]
    assert prompts[1].endswith("Another?<|im_end|>\n<|im_start|>assistant\n")
    assert "Plain prompt" in prompts[2] and "An instruction" in prompts[3]
    assert load_user_prompts(path, num_prompts=2) == prompts[:2]


def test_user_prompts_from_a_datasets_directory(tmp_path):
    import datasets

    datasets.Dataset.from_dict({"question": ["What is 2 + 2?", "Why is the sky blue?"]}).save_to_disk(tmp_path / "d")
    prompts = load_user_prompts(tmp_path / "d")
    assert len(prompts) == 2 and "Why is the sky blue?" in prompts[1]
    datasets.DatasetDict({"test": datasets.Dataset.from_dict({"text": ["x"]})}).save_to_disk(tmp_path / "dd")
    with pytest.raises(ValueError, match=r"no split 'train' \(it has \['test'\]\)"):
        load_user_prompts(tmp_path / "dd")
    assert len(load_user_prompts(tmp_path / "dd", split="test")) == 1


@pytest.mark.parametrize(
    "lines, message",
    [
        (['{"prompt": "fine"}', '{"other": 1}'], r"\.jsonl, line 2: a row .* has no prompt: give `messages`"),
        (["{not json"], r"line 1: not JSON"),
        (['{"messages": [{"role": "assistant", "content": "only me"}]}'], r"\.jsonl, line 1: .*has no user turn"),
        (['{"prompt": "a"}', "", '{"messages": [{"role": "robot", "content": "x"}]}'], r"line 3: .*no known role"),
        ([""], "holds no prompts"),
    ],
)
def test_bad_user_prompts_name_the_file_and_the_fix(tmp_path, lines, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines))
    with pytest.raises(ValueError, match=message):
        load_user_prompts(path)


def test_missing_user_prompts_file():
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_user_prompts("nowhere/chats.jsonl")


def test_render_conversation_without_template_is_the_last_user_turn():
    turns = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    assert render_conversation(turns, chat_template="none") == "c"
