"""Prompts the target answers to make an EagleDraft's distillation data (:mod:`diversed_hf.training.eagle_data`).

An EAGLE draft learns the target's own continuations, so the prompts should look like what it will be asked. Four
offline sources, all chat-formatted with the target's template:

- everyday requests of the broad chat set (:mod:`diversed_hf.lab.tasks.chat_prompts`), or a user's own prompts;
- ``arith_chat`` training problems (the real pair's arithmetic task; its test split is never used);
- ``humaneval`` training problems (the real pair's code task, its training split);
- requests to explain functions of the Python standard library from their docstrings (real English and code
  text; the PSF licence), taken from a fixed list of modules in a fixed order;
- for the task-tuned target, ``synopsis`` and ``arith_steps`` training prompts (the tasks it was tuned on; their
  test splits are never used);
- existing text read as it is (**prefill**, no answer decoded; every position trains the draft): other standard-library
  docstrings, then the ``synopsis`` training documents.
"""

from __future__ import annotations

import importlib
import inspect
import random
from pathlib import Path

from .chat import chat_prompt
from .registry import get_task, load_task_dataset

__all__ = [
    "STDLIB_MODULES",
    "docstring_prompts",
    "eagle_prompt_mix",
    "eagle_prompts",
    "interleave",
    "check_target_model",
    "prefill_texts",
]

STDLIB_MODULES = (
    "os",
    "os.path",
    "shutil",
    "json",
    "re",
    "string",
    "textwrap",
    "random",
    "statistics",
    "math",
    "itertools",
    "functools",
    "collections",
    "heapq",
    "bisect",
    "datetime",
    "calendar",
    "fractions",
    "decimal",
    "pathlib",
    "glob",
    "fnmatch",
    "csv",
    "base64",
    "hashlib",
    "zlib",
    "gzip",
    "tarfile",
    "zipfile",
    "urllib.parse",
    "html",
    "difflib",
    "pprint",
    "copy",
    "operator",
    "secrets",
    "uuid",
    "shlex",
    "tempfile",
    "inspect",
    "ast",
    "logging",
    "argparse",
    "configparser",
    "sqlite3",
    "unicodedata",
    "colorsys",
    "email.utils",
    "http.cookies",
)


def docstring_prompts(num_prompts: int, seed: int = 0, chat_template: str = "smollm2") -> list[str]:
    """``num_prompts`` chat prompts asking to explain a standard-library function given its signature and docstring
    (rendered with ``chat_template``: :mod:`.chat`)."""
    return [
        chat_prompt(f"Explain in a few sentences what this Python function does:\n\n{entry}", chat_template)
        for entry in _docstring_entries(seed)[:num_prompts]
    ]


def prefill_texts(num_texts: int, seed: int = 0, offset: int = 0) -> list[str]:
    """``num_texts`` existing texts the target reads as they are (no answer is decoded; every position trains the
    draft): standard-library functions' signatures and docstrings, after the first ``offset`` (those
    :func:`docstring_prompts` asks about come first in the same order, so ``offset`` keeps the two apart), then the
    synopsis task's training documents."""
    texts = _docstring_entries(seed)[offset:]
    if len(texts) < num_texts:
        texts += list(load_task_dataset("synopsis", split="train")["document"])
    return texts[:num_texts]


def _docstring_entries(seed: int) -> list[str]:
    """``module.function(signature)`` and its docstring, for the functions of :data:`STDLIB_MODULES`, shuffled."""
    entries = []
    for module_name in STDLIB_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # a module this Python lacks (sqlite3 without its library)
            continue
        for name in sorted(dir(module)):
            function = getattr(module, name, None)
            if name.startswith("_") or not inspect.isfunction(function):
                continue
            doc = inspect.getdoc(function)
            if not doc or len(doc) < 80 or len(doc) > 1200:
                continue
            try:
                signature = str(inspect.signature(function))
            except (TypeError, ValueError):
                continue
            if " at 0x" in signature:  # a default shown with its memory address: not the same text in two runs
                continue
            entries.append(f"{module_name}.{name}{signature}\n\n{doc}")
    entries = sorted(set(entries))
    random.Random(f"eagle-docstrings/{seed}").shuffle(entries)
    return entries


def eagle_prompt_mix(
    num_arith: int,
    code_samples: int,
    num_docstrings: int,
    *,
    num_chat: int = 0,
    chat_offset: int = 0,
    chat_prompts: list[str] | None = None,
    chat_max_new_tokens: int = 128,
    arith_max_new_tokens: int = 96,
    code_max_new_tokens: int = 160,
    docstring_max_new_tokens: int = 128,
    num_synopsis: int = 0,
    num_arith_steps: int = 0,
    seed: int = 0,
    chat_template: str = "smollm2",
    num_prefill: int = 0,
) -> dict[str, list[tuple[str, int]]]:
    """``(chat prompt, max new tokens)`` by source: ``"chat"`` (``chat_prompts`` when given, a user's own, already
    rendered; else ``num_chat`` requests of the broad set after its first ``chat_offset``: a second collection on
    requests the first did not use), ``"arith_chat"``, ``"humaneval"``, ``"docstrings"``, and, when asked for,
    ``"synopsis"`` / ``"arith_steps"`` (training prompts, each at its task's generation length), and ``"prefill"``
    (``num_prefill`` existing texts read as they are, 0 new tokens: :func:`prefill_texts`). Every prompt but the
    tuned tasks' is rendered with ``chat_template`` (the target's: a shipped name, a ``.jinja`` file or a tokenizer
    directory, :mod:`.chat`)."""
    from .chat_prompts import broad_chat_prompts

    if isinstance(chat_offset, bool) or not isinstance(chat_offset, int) or chat_offset < 0:
        raise ValueError(f"`chat_offset` must be a non-negative integer, got {chat_offset!r}.")
    chat = chat_prompts
    if chat is None:
        broad = broad_chat_prompts(chat_offset + num_chat, seed=seed, chat_template=chat_template) if num_chat else []
        chat = broad[chat_offset:]
    template = {"chat_template": chat_template}
    arith = (
        load_task_dataset("arith_chat", split="train", num_examples=num_arith, seed=seed, **template)["prompt"]
        if num_arith
        else []
    )
    code = load_task_dataset("humaneval", split="train", **template)["prompt"] if code_samples else []
    tuned_tasks = {}
    for task, count in (("synopsis", num_synopsis), ("arith_steps", num_arith_steps)):
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"`num_{task}` must be a non-negative integer, got {count!r}.")
        if count:
            spec = get_task(task)
            prompts = load_task_dataset(task, split="train", num_examples=count, seed=seed)["prompt"]
            tuned_tasks[task] = [(p, spec.max_new_tokens) for p in prompts]
    return {
        "chat": [(p, chat_max_new_tokens) for p in chat],
        "arith_chat": [(p, arith_max_new_tokens) for p in arith],
        "humaneval": [(p, code_max_new_tokens) for p in code for _ in range(code_samples)],
        "docstrings": [(p, docstring_max_new_tokens) for p in docstring_prompts(num_docstrings, seed, chat_template)],
        **tuned_tasks,
        "prefill": [(text, 0) for text in prefill_texts(num_prefill, seed, offset=num_docstrings)],
    }


def interleave(mix: dict[str, list[tuple[str, int]]], seed: int = 0) -> list[tuple[str, int]]:
    """The sources of :func:`eagle_prompt_mix` in one seeded shuffle, so every shard mixes them."""
    jobs = [job for source in mix.values() for job in source]
    random.Random(f"eagle-prompts/{seed}").shuffle(jobs)
    return jobs


def eagle_prompts(num_arith: int, code_samples: int, num_docstrings: int, *, seed: int = 0, **options):
    """:func:`eagle_prompt_mix` interleaved: what the target answers, in collection order."""
    return interleave(eagle_prompt_mix(num_arith, code_samples, num_docstrings, seed=seed, **options), seed)


def check_target_model(
    target_model: str,
    architecture: str,
    chat_template: str | None,
    needs_chat: bool,
    tokenizer_dir: Path,
    save: bool = True,
) -> str | None:
    """Refuse, before any weight loads or any prompt is answered, a target a draft cannot be distilled for: a config
    that cannot be read, an architecture ``EagleDraft.for_target`` has no layout for (``architecture="eagle"``; an
    EAGLE-3 draft reads any), or a tokenizer without a chat template when the prompts are chat and no
    ``chat_template`` is given. Returns the chat template to render the prompts with: ``chat_template``, else the
    tokenizer's own (its files saved into ``tokenizer_dir`` when ``save``: one process saves them, the others read
    them), else ``None``. Errors name ``--target_model``."""
    from transformers import AutoConfig, AutoTokenizer

    from ...drafting.eagle import layout_of

    flag = f"`--target_model {target_model}`"
    try:
        config = AutoConfig.from_pretrained(target_model)
    except (OSError, ValueError) as error:
        raise ValueError(f"{flag}: its config cannot be read ({error}). Pass a local directory or a Hub id.") from None
    text_config = config.get_text_config()
    if architecture == "eagle":
        try:
            layout_of(text_config.model_type)
        except ValueError as error:
            raise ValueError(f"{flag}: {error} An EAGLE-3 draft (--arch eagle3) reads any architecture.") from None
    missing = [name for name in ("hidden_size", "num_hidden_layers", "vocab_size") if not getattr(text_config, name, 0)]
    if missing:
        raise ValueError(f"{flag}: its config has no {missing}; a feature draft reads the target's hidden states.")
    if chat_template is not None:
        from .chat import load_chat_template

        load_chat_template(chat_template)  # a name, file or directory that holds one; refused by name otherwise
        return chat_template
    try:
        tokenizer = AutoTokenizer.from_pretrained(target_model)
    except (OSError, ValueError) as error:
        raise ValueError(f"{flag}: its tokenizer cannot be loaded ({error}).") from None
    if not getattr(tokenizer, "chat_template", None):
        if needs_chat:
            raise ValueError(
                f"{flag}: its tokenizer ({type(tokenizer).__name__}) has no chat template, and the prompts are chat "
                "requests. Pass --chat_template (a .jinja file or a tokenizer directory), or --chat_template none for "
                "plain text."
            )
        return None
    if save:  # another process rewriting them while the first reads them would hand it a partial file
        tokenizer.save_pretrained(tokenizer_dir)  # chat_template.jinja and the special tokens the template reads
    return str(tokenizer_dir)
