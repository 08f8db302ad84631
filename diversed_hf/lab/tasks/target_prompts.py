"""Chat prompts made with the target itself, for an EagleDraft's distillation data (``train_eagle_draft.py``).

- **Follow-ups** (:func:`follow_up_prompts`): a conversation the target already answered (a sequence of an earlier
  collection: its prompt and the target's answer) continued with a follow-up request as the next user turn ("Can you
  make that shorter?"), so the draft learns second turns, whose context holds the target's own words.
- **Written requests** (:func:`write_requests`): requests the target writes itself when asked for one about a topic
  of a list, in one of several styles (a question, a request for advice, for a short text, a comparison); kept when
  they read as one request, deduplicated, and kept apart from the held-out everyday set and the broad set
  (:func:`apart_from_held_out`), then answered like any other request.

The follow-ups, topics and styles are in ``data/target_prompts.json``, written for this project (Apache-2.0), apart
from the held-out everyday prompts (``tests/test_target_prompts.py`` checks it as ``tests/test_chat_prompts.py`` does
for the broad set).
"""

from __future__ import annotations

import functools
import json
import random
import re

from ..cli_utils import write_text_atomic
from .chat_prompts import DATA_DIR, broad_chat_messages, everyday_messages, render_conversation

__all__ = [
    "apart_from_held_out",
    "follow_up_prompts",
    "parse_request",
    "request_writing_prompts",
    "turn_frame",
    "write_requests",
]

#: words in a row a kept request may share with a held-out everyday prompt (one more is a shared phrase)
SHARED_WORDS = 4
_SENTINELS = ("Q7f3aQ", "A7f3aA", "F7f3aF")  # stand-ins a template passes through unchanged


@functools.lru_cache(maxsize=1)
def _source() -> dict:
    return json.loads((DATA_DIR / "target_prompts.json").read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=16)
def turn_frame(chat_template: str = "smollm2") -> tuple[str, str]:
    """``(between, after)``: with ``chat_template``, a conversation whose first user turn was rendered with the
    generation prompt continues as ``answer + between + next request + after`` (``after`` ends with the next
    generation prompt). Found by rendering stand-in turns; a template whose first turn is not a prefix of the longer
    conversation is refused."""
    question, answer, follow_up = _SENTINELS
    one = render_conversation([{"role": "user", "content": question}], chat_template)
    turns = [("user", question), ("assistant", answer), ("user", follow_up)]
    two = render_conversation([{"role": r, "content": c} for r, c in turns], chat_template)
    rest = two[len(one) :] if two.startswith(one) else ""
    if not rest.startswith(answer) or rest.count(follow_up) != 1:
        raise ValueError(
            f"`chat_template` {chat_template!r} does not render a second turn after the first one's text (its "
            "one-turn prompt is not where its two-turn conversation begins): follow-up prompts need a template that "
            "appends turns. Leave --follow_ups out for this target."
        )
    between, after = rest[len(answer) :].split(follow_up)
    return between, after


def follow_up_prompts(
    conversations: list[tuple[list[int], int]], tokenizer, chat_template: str = "smollm2", seed: int = 0
) -> list[str]:
    """One follow-up prompt per answered conversation: ``conversations`` are ``(token ids, prompt length)`` of an
    earlier collection (the prompt then the target's answer, ``eagle_data.load_token_ids``); read-only texts and
    empty answers are skipped. The follow-up request is drawn per conversation from a seeded stream; the answer is
    decoded without special tokens and closed as the template closes a turn (an answer cut at its length limit
    stays cut: the user asks on)."""
    between, after = turn_frame(chat_template)
    follow_ups = _source()["follow_ups"]
    rng = random.Random(f"follow-ups/{seed}")
    prompts = []
    for ids, prompt_length in conversations:
        ids = list(ids)
        if prompt_length <= 1 or len(ids) <= prompt_length:  # a read-only text, or no answer
            continue
        answer = tokenizer.decode(ids[prompt_length:], skip_special_tokens=True).strip()
        if not answer:
            continue
        prompt = tokenizer.decode(ids[:prompt_length], skip_special_tokens=False)
        prompts.append(prompt + answer + between + rng.choice(follow_ups) + after)
    return prompts


def request_writing_prompts(num_prompts: int, seed: int = 0, chat_template: str = "smollm2") -> list[str]:
    """``num_prompts`` chat prompts asking the target to write one request about a topic in a style (every
    topic-style pair once before any repeats, in a seeded order)."""
    from .chat import chat_prompt

    if isinstance(num_prompts, bool) or not isinstance(num_prompts, int) or num_prompts < 0:
        raise ValueError(f"`num_prompts` must be a non-negative integer, got {num_prompts!r}.")
    source = _source()
    pairs = [(style, topic) for style in source["styles"] for topic in source["topics"]]
    random.Random(f"request-writing/{seed}").shuffle(pairs)
    pairs = (pairs * (1 + num_prompts // len(pairs)))[:num_prompts]
    return [chat_prompt(style.format(topic=topic), chat_template) for style, topic in pairs]


_LEAD = re.compile(r"^(?:question|request|message|user|q)\s*[:\-]\s*", re.IGNORECASE)


def parse_request(text: str) -> str | None:
    """The request in a target's reply to a request-writing prompt: its first non-empty line without a leading
    label ("Question:") or quotes; ``None`` when that does not read as one request (too short or long, no letters,
    not ending as a sentence, or a reply that answers instead of asking)."""
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    line = _LEAD.sub("", line).strip().strip("\"'“”").strip()
    if not 12 <= len(line) <= 240 or not re.search(r"[A-Za-z]{3}", line) or line[-1] not in "?.!":
        return None
    if line.lower().startswith(("sure", "here is", "here's", "certainly", "i ", "as an ai")):
        return None
    return line


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def _runs(words: list[str], size: int) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + size]) for i in range(len(words) - size + 1)}


@functools.lru_cache(maxsize=1)
def _held_out_runs() -> frozenset:
    runs = set()
    for message in everyday_messages():
        runs |= _runs(_words(message), SHARED_WORDS + 1)
    return frozenset(runs)


@functools.lru_cache(maxsize=1)
def _broad_keys() -> frozenset:
    return frozenset(" ".join(_words(m)) for m in broad_chat_messages())


def apart_from_held_out(requests: list[str]) -> list[str]:
    """``requests`` without duplicates (same words, any case or punctuation), without any that is a broad-set
    request, and without any that shares a run of more than :data:`SHARED_WORDS` words with a held-out everyday
    prompt, in their order."""
    broad = _broad_keys()
    held_out = _held_out_runs()
    seen, kept = set(), []
    for request in requests:
        words = _words(request)
        key = " ".join(words)
        if key in seen or key in broad or _runs(words, SHARED_WORDS + 1) & held_out:
            continue
        seen.add(key)
        kept.append(request)
    return kept


def write_requests(
    target,
    tokenizer,
    num_requests: int,
    *,
    seed: int = 0,
    chat_template: str = "smollm2",
    batch_size: int = 32,
    temperature: float = 1.0,
    max_new_tokens: int = 48,
    attempts: int = 3,
    progress: bool = True,
    partial_file=None,
) -> list[str]:
    """Up to ``num_requests`` requests the target writes (:func:`request_writing_prompts`, sampled at
    ``temperature``, seeded), each parsed (:func:`parse_request`) and kept apart (:func:`apart_from_held_out`); at
    most ``attempts * num_requests`` prompts are tried. Returns the user messages (render them to answer them).

    ``partial_file`` (a path): after each batch the requests kept so far, the next prompt and the sampling stream's
    state are written there, and a call with the same arguments goes on from it, so a run that stops loses one batch
    (on the CPU the result is the one an unbroken run gives); the caller removes it once the requests are stored."""
    from pathlib import Path

    import torch
    from tqdm.auto import tqdm

    if isinstance(num_requests, bool) or not isinstance(num_requests, int) or num_requests < 0:
        raise ValueError(f"`num_requests` must be a non-negative integer, got {num_requests!r}.")
    prompts = request_writing_prompts(attempts * num_requests, seed, chat_template)
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    kept: list[str] = []
    asked = {"seed": seed, "num_requests": num_requests, "chat_template": chat_template, "batch_size": batch_size}
    asked |= {"temperature": temperature, "max_new_tokens": max_new_tokens, "attempts": attempts}
    partial = json.loads(Path(partial_file).read_text()) if partial_file and Path(partial_file).is_file() else None
    if partial is not None and partial["asked"] != asked:
        partial = None  # another call's: start over
    first = 0 if partial is None else partial["next"]
    bar = tqdm(total=num_requests, desc="requests the target writes", disable=not progress)
    try:
        with torch.random.fork_rng(devices=[]):  # seeded sampling that leaves the caller's stream as it was
            torch.manual_seed(seed)
            if partial is not None:
                kept = partial["kept"]
                torch.set_rng_state(torch.tensor(partial["rng"], dtype=torch.uint8))
                bar.update(len(kept))
            for start in range(first, len(prompts), batch_size):
                if len(kept) >= num_requests:
                    break
                texts = prompts[start : start + batch_size]
                batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
                with torch.no_grad():
                    out = target.generate(
                        **batch.to(target.device),
                        do_sample=True,
                        temperature=temperature,
                        top_k=0,
                        top_p=1.0,
                        max_new_tokens=max_new_tokens,
                        pad_token_id=pad_id,
                    )
                replies = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
                before = len(kept)
                kept = apart_from_held_out(kept + [r for r in map(parse_request, replies) if r])[:num_requests]
                bar.update(len(kept) - before)
                if partial_file:
                    state = {"asked": asked, "next": start + batch_size, "kept": kept}
                    state["rng"] = torch.get_rng_state().tolist()
                    write_text_atomic(partial_file, json.dumps(state))
    finally:
        tokenizer.padding_side = padding_side
        bar.close()
    return kept
