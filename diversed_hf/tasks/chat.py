"""Chat prompts: a user message rendered with a chat template, as the model's tokenizer would.

Tasks for instruction-tuned models (``humaneval``, the real pair's ``arith_chat``) take a
``chat_template`` option:

- ``"smollm2"`` (default): SmolLM2-Instruct's ChatML template, shipped in the package
  (``templates/smollm2_chat.jinja``), so prompts are built without downloading any tokenizer;
- ``"none"``: the plain user message, for base models;
- a path to a ``.jinja`` file, or to a tokenizer directory whose ``chat_template.jinja`` /
  ``tokenizer_config.json`` carries one (what ``save_pretrained`` writes).

Rendering follows transformers' ``apply_chat_template`` (a sandboxed Jinja environment with
``trim_blocks`` and ``lstrip_blocks``); ``tests/test_real_tasks.py`` checks it against the tokenizer.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

__all__ = ["CHAT_TEMPLATES", "chat_prompt", "load_chat_template"]

_TEMPLATES_DIR = Path(__file__).resolve().parents[1] / "templates"
#: Chat templates shipped with the package, by name.
CHAT_TEMPLATES = {"smollm2": _TEMPLATES_DIR / "smollm2_chat.jinja"}


@functools.lru_cache(maxsize=16)
def load_chat_template(chat_template: str) -> str | None:
    """The Jinja source named by ``chat_template`` (see the module docstring); ``None`` for ``"none"``."""
    if not isinstance(chat_template, str) or not chat_template:
        raise TypeError(f"`chat_template` must be a template name, a file or a tokenizer directory, got {chat_template!r}.")
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
        raise ValueError(f"`chat_template` {chat_template!r} is a directory without a chat template (chat_template.jinja).")
    raise ValueError(
        f"`chat_template` is {chat_template!r}: not a shipped template ({sorted(CHAT_TEMPLATES)}), 'none', a .jinja "
        "file or a tokenizer directory. Pass one of those."
    )


@functools.lru_cache(maxsize=16)
def _compiled(source: str):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    return ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(source)


def chat_prompt(user_message: str, chat_template: str = "smollm2") -> str:
    """``user_message`` as the model sees it before its answer: one user turn plus the generation prompt."""
    source = load_chat_template(chat_template)
    if source is None:
        return user_message
    return _compiled(source).render(messages=[{"role": "user", "content": user_message}], add_generation_prompt=True)
