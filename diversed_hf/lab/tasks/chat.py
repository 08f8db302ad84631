"""Chat prompts: a user message rendered with a chat template, as the model's tokenizer would.

Tasks for instruction-tuned models (``humaneval``, the real pair's ``arith_chat``) take a
``chat_template`` option:

- ``"smollm2"`` (default): SmolLM2-Instruct's ChatML template, shipped in the package
  (``templates/smollm2_chat.jinja``), so prompts are built without downloading any tokenizer;
- ``"none"``: the plain user message, for base models;
- a path to a ``.jinja`` file, or to a tokenizer directory whose ``chat_template.jinja`` /
  ``tokenizer_config.json`` carries one (what ``save_pretrained`` writes).

Rendering is transformers' own (the function behind ``apply_chat_template``, reached through
:func:`diversed_hf.compat.render_chat_template`): the same Jinja environment (``{% break %}``,
``raise_exception``, ``strftime_now``) and the tokenizer's special tokens (``bos_token``, ``eos_token``, ...),
read from the tokenizer directory's ``tokenizer_config.json`` / ``special_tokens_map.json`` -- for a ``.jinja``
file, from the directory it sits in. A template that reads a special token no file names is refused rather than
rendered with an empty one. ``tests/test_real_tasks.py`` checks the output against the tokenizer's.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

__all__ = ["CHAT_TEMPLATES", "chat_prompt", "load_chat_template", "special_tokens"]

_TEMPLATES_DIR = Path(__file__).resolve().parents[2] / "templates"
#: Chat templates shipped with the package, by name.
CHAT_TEMPLATES = {"smollm2": _TEMPLATES_DIR / "smollm2_chat.jinja"}
#: the named special tokens ``apply_chat_template`` passes to a template (transformers' ``special_tokens_map``)
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


@functools.lru_cache(maxsize=16)
def load_chat_template(chat_template: str) -> str | None:
    """The Jinja source named by ``chat_template`` (see the module docstring); ``None`` for ``"none"``."""
    if not isinstance(chat_template, str) or not chat_template:
        raise TypeError(
            f"`chat_template` must be a template name, a file or a tokenizer directory, got {chat_template!r}."
        )
    if chat_template == "none":
        return None
    if chat_template in CHAT_TEMPLATES:
        return CHAT_TEMPLATES[chat_template].read_text(encoding="utf-8")
    path = Path(chat_template)
    if path.is_file():
        return path.read_text(encoding="utf-8")
    if path.is_dir():
        if (path / "chat_template.jinja").is_file():
            return (path / "chat_template.jinja").read_text(encoding="utf-8")
        config = path / "tokenizer_config.json"
        if config.is_file():
            template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
            if isinstance(template, str):
                return template
        raise ValueError(
            f"`chat_template` {chat_template!r} is a directory without a chat template (chat_template.jinja)."
        )
    raise ValueError(
        f"`chat_template` is {chat_template!r}: not a shipped template ({sorted(CHAT_TEMPLATES)}), 'none', a .jinja "
        "file or a tokenizer directory. Pass one of those."
    )


@functools.lru_cache(maxsize=16)
def special_tokens(chat_template: str) -> dict[str, str]:
    """The named special tokens of the tokenizer ``chat_template`` belongs to (a tokenizer directory, or the
    directory of a ``.jinja`` file), as ``apply_chat_template`` passes them; empty for a shipped template or none."""
    if chat_template in CHAT_TEMPLATES or chat_template == "none":
        return {}
    path = Path(chat_template)
    directory = path if path.is_dir() else path.parent
    tokens: dict[str, str] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the config's values win, as transformers'
        file = directory / name
        if not file.is_file():
            continue
        config = json.loads(file.read_text(encoding="utf-8"))
        for key in SPECIAL_TOKENS:
            value = config.get(key)
            if isinstance(value, dict):  # a serialised AddedToken
                value = value.get("content")
            if isinstance(value, str):
                tokens[key] = value
    return tokens


def chat_prompt(user_message: str, chat_template: str = "smollm2") -> str:
    """``user_message`` as the model sees it before its answer: one user turn plus the generation prompt."""
    from ... import compat

    source = load_chat_template(chat_template)
    if source is None:
        return user_message
    tokens = special_tokens(chat_template)
    missing = sorted(set(SPECIAL_TOKENS) & _variables(source) - set(tokens))
    if missing:
        raise ValueError(
            f"`chat_template` {chat_template!r} reads {missing}, which no tokenizer_config.json beside it names: the "
            "prompt would lose them. Pass the tokenizer directory (what `save_pretrained` writes) instead."
        )
    messages = [{"role": "user", "content": user_message}]
    return compat.render_chat_template(source, messages, add_generation_prompt=True, **tokens)


@functools.lru_cache(maxsize=16)
def _variables(source: str) -> frozenset[str]:
    """The names ``source`` reads from its context (jinja2's own analysis)."""
    import jinja2
    from jinja2 import meta

    try:
        tree = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(source)
    except jinja2.TemplateSyntaxError:  # a tag only transformers' environment knows ({% generation %}): it renders
        return frozenset()
    return frozenset(meta.find_undeclared_variables(tree))
