"""Public names that load on first use (PEP 562), for the package and its rooms.

``import diversed_hf.verifiers`` (or any room) runs no module of the room: a name such as ``ExactVerifier`` loads
its module the first time it is read. So importing one module of a room (``diversed_hf.verifiers.ops``) never drags
in the others, and rooms that use each other (drafting and generation, heads and verifiers) import without cycles.
"""

from __future__ import annotations

import importlib
import sys


def exports(package: str, table: dict[str, str]):
    """``__getattr__`` and ``__dir__`` for ``package``, whose public names come from ``table``: name -> the
    module (relative to the package) that defines it."""

    def __getattr__(name: str):
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(table[name], package), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(table))

    return __getattr__, __dir__
