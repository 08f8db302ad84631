"""Everyday chat prompts: a broad set to distil drafts on, a held-out set written apart to measure them, and the
reader for a user's own conversations (``training/train_eagle_draft.py --prompts``).

- **Broad set** (:func:`broad_chat_messages`): requests a person types into a chat assistant (tips, explanations,
  recipes, travel plans, short poems and stories, comparisons, messages to write, small programs), composed from
  typed topic lists and request templates in ``data/chat_prompts.json``, written for this project (Apache-2.0).
  3236 distinct requests; provenance in ``data/chat_prompts.md``.
- **Held-out everyday set** (:func:`everyday_messages`): 64 prompts written one by one in ``data/everyday.jsonl``,
  not from the broad set's templates or topics (``tests/test_chat_prompts.py`` checks that no held-out prompt shares
  a template frame with a broad one). Figures measured "on everyday prompts" are on this set.
- **A user's own** (:func:`load_user_prompts`): a JSON-lines file, a ``datasets`` directory (``save_to_disk``) or a
  dataset name, with rows of plain prompts (``prompt`` / ``instruction`` / ``question`` / ``text``) or conversations
  (``messages`` with ``role`` / ``content``, or ShareGPT's ``conversations`` with ``from`` / ``value``).
"""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path

__all__ = [
    "broad_chat_messages",
    "broad_chat_prompts",
    "everyday_messages",
    "everyday_prompts",
    "load_everyday_chat",
    "load_user_prompts",
    "render_conversation",
]

DATA_DIR = Path(__file__).resolve().parent / "data"
PROMPT_COLUMNS = ("prompt", "instruction", "question", "text")
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


@functools.lru_cache(maxsize=1)
def _broad_source() -> dict:
    return json.loads((DATA_DIR / "chat_prompts.json").read_text(encoding="utf-8"))


def broad_chat_messages(num_prompts: int | None = None, seed: int = 0) -> list[str]:
    """The broad set's user messages, shuffled by ``seed``; the first ``num_prompts`` (all 3237 when ``None``).

    Each topic meets each template of its kind once; a template that names an audience (``{a}``) draws one per
    request from the same seeded stream, so the set is the same on every machine.
    """
    if num_prompts is not None and (not isinstance(num_prompts, int) or num_prompts < 0):
        raise ValueError(f"`num_prompts` must be None (all) or a non-negative integer, got {num_prompts!r}.")
    source = _broad_source()
    audiences = source["audience"]
    rng = random.Random(f"broad-chat/{seed}")
    messages = []
    for kind, templates in source["templates"].items():
        for topic in source[kind]:
            for template in templates:
                messages.append(template.format(x=topic, a=rng.choice(audiences)))
    messages = sorted(set(messages))
    rng.shuffle(messages)
    return messages if num_prompts is None else messages[:num_prompts]


def broad_chat_prompts(num_prompts: int | None = None, seed: int = 0, chat_template: str = "smollm2") -> list[str]:
    """:func:`broad_chat_messages` rendered as chat prompts (one user turn and the generation prompt)."""
    from .chat import chat_prompt

    return [chat_prompt(m, chat_template) for m in broad_chat_messages(num_prompts, seed)]


@functools.lru_cache(maxsize=1)
def everyday_messages() -> tuple[str, ...]:
    """The 64 held-out everyday user messages, in file order."""
    lines = (DATA_DIR / "everyday.jsonl").read_text(encoding="utf-8").splitlines()
    return tuple(json.loads(line)["prompt"] for line in lines if line.strip())


def everyday_prompts(num_prompts: int | None = None, chat_template: str = "smollm2") -> list[str]:
    """The held-out everyday messages rendered as chat prompts; the first ``num_prompts`` (all when ``None``)."""
    from .chat import chat_prompt

    messages = everyday_messages()
    if num_prompts is not None:
        if not isinstance(num_prompts, int) or not 1 <= num_prompts <= len(messages):
            raise ValueError(f"`num_prompts` must be in [1, {len(messages)}] or None (all), got {num_prompts!r}.")
        messages = messages[:num_prompts]
    return [chat_prompt(m, chat_template) for m in messages]


def load_everyday_chat(
    split: str = "test", num_examples: int | None = None, seed: int = 0, chat_template: str = "smollm2"
):
    """The ``chat`` task's rows (``prompt``, an empty ``reference``): ``train`` is the broad set shuffled by ``seed``,
    ``test`` the held-out everyday set in file order; the first ``num_examples`` (all when ``None``).

    Chat has no answer to score: heads train on agreement with the target's own answers (``target_agreement``) and
    are measured against target-only samples (:mod:`diversed_hf.lab.bench.chat_quality`).
    """
    from .registry import require

    if split not in ("train", "test"):
        raise ValueError(f"`split` is {split!r}; the chat task has 'train' (the broad set) and 'test' (everyday).")
    if split == "train":
        prompts = broad_chat_prompts(num_examples, seed=seed, chat_template=chat_template)
    else:
        count = len(everyday_messages()) if num_examples is None else min(num_examples, len(everyday_messages()))
        prompts = everyday_prompts(count, chat_template=chat_template)
    return require("datasets").Dataset.from_dict({"prompt": prompts, "reference": [""] * len(prompts)})


def render_conversation(messages: list[dict], chat_template: str = "smollm2") -> str:
    """A conversation up to its last user turn, rendered with the generation prompt: what the model answers next."""
    from ... import compat
    from .chat import load_chat_template, special_tokens

    turns = [
        {"role": SHAREGPT_ROLES.get(m.get("role", m.get("from")), None), "content": m.get("content", m.get("value"))}
        for m in messages
    ]
    bad = [m for m, t in zip(messages, turns) if t["role"] is None or not isinstance(t["content"], str)]
    if bad:
        raise ValueError(
            f"a conversation turn {bad[0]!r} has no known role or no text: turns need `role` (user / assistant / "
            "system) and `content`, or ShareGPT's `from` (human / gpt / system) and `value`."
        )
    last_user = max((i for i, t in enumerate(turns) if t["role"] == "user"), default=None)
    if last_user is None:
        raise ValueError(f"a conversation has no user turn to answer: {messages!r}.")
    source = load_chat_template(chat_template)
    turns = turns[: last_user + 1]
    if source is None:
        return turns[-1]["content"]
    return compat.render_chat_template(source, turns, add_generation_prompt=True, **special_tokens(chat_template))


def _row_prompt(row: dict, chat_template: str, where: str) -> str:
    for key in ("messages", "conversations"):
        if isinstance(row.get(key), list):
            try:
                return render_conversation(row[key], chat_template)
            except ValueError as error:
                raise ValueError(f"{where}: {error}") from None
    for key in PROMPT_COLUMNS:
        if isinstance(row.get(key), str) and row[key].strip():
            from .chat import chat_prompt

            return chat_prompt(row[key], chat_template)
    raise ValueError(
        f"{where}: a row with keys {sorted(row)} has no prompt: give `messages` / `conversations` (a conversation) or "
        f"one of {list(PROMPT_COLUMNS)} (a plain prompt)."
    )


def load_user_prompts(
    source: str | Path, num_prompts: int | None = None, chat_template: str = "smollm2", split: str = "train"
) -> list[str]:
    """Chat prompts from ``source``: a ``.jsonl`` file, a ``datasets`` directory, or a dataset name (its ``split``).

    Conversations are cut after their last user turn (the model writes the answer it would give); plain prompts
    become one user turn. The first ``num_prompts`` rows are read (all when ``None``).
    """
    path = Path(source)
    if path.suffix == ".jsonl" or path.is_file():
        if not path.is_file():
            raise FileNotFoundError(f"`--prompts` {source!r}: no such file.")
        rows = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"`--prompts` {source}, line {number}: not JSON ({error.msg}).") from None
            rows.append((f"line {number}", row if isinstance(row, dict) else {"prompt": row}))
    else:
        from .registry import require

        datasets = require("datasets")
        if path.is_dir():
            dataset = datasets.load_from_disk(str(path))
            if isinstance(dataset, datasets.DatasetDict):
                if split not in dataset:
                    raise ValueError(f"`--prompts` {source}: no split {split!r} (it has {sorted(dataset)}).")
                dataset = dataset[split]
        else:
            dataset = datasets.load_dataset(str(source), split=split)
        if num_prompts is not None:
            dataset = dataset.select(range(min(num_prompts, len(dataset))))
        rows = [(f"row {index}", row) for index, row in enumerate(dataset)]
    if num_prompts is not None:
        rows = rows[:num_prompts]
    prompts = [_row_prompt(dict(row), chat_template, f"`--prompts` {source}, {where}") for where, row in rows]
    if not prompts:
        raise ValueError(f"`--prompts` {source} holds no prompts.")
    return prompts
