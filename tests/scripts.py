"""The measurement scripts (``benchmarks/*.py``) as modules, for the tests that call their functions.

The scripts are not on the import path (no script imports another: what they share is in ``diversed_hf.cli``); a test
loads one from its file, once per session.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_script(name: str):
    """``benchmarks/<name>.py`` loaded as a module (the same object on every call)."""
    module_name = f"benchmarks_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[module_name]
            raise
    return sys.modules[module_name]
