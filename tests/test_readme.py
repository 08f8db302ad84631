"""Every ```python block of the README runs as it stands, offline; blocks that need the Hub are compiled."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
NEEDS_HUB = "# needs the Hub"


def python_blocks() -> list[tuple[int, str]]:
    text = README.read_text()
    return [
        (text[: m.start()].count("\n") + 1, m.group(1))
        for m in re.finditer(r"```python\n(.*?)```", text, flags=re.DOTALL)
    ]


BLOCKS = python_blocks()


@pytest.mark.parametrize("line, code", BLOCKS, ids=[f"README.md:{line}" for line, _ in BLOCKS])
def test_readme_python_block(line, code, tmp_path):
    compile(code, f"README.md:{line}", "exec")
    if code.startswith(NEEDS_HUB):
        return
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"README.md:{line} failed:\n{done.stderr[-3000:]}"
    if "UnsureTargetVerifier" in code:
        match = re.search(r"acceptance (\d\.\d\d)", done.stdout)
        assert match and 0.0 <= float(match.group(1)) <= 1.0, done.stdout


def test_the_custom_verifier_takes_ten_lines():
    """The example rule (run above with the other blocks) is at most ten lines of code."""
    blocks = [code for _, code in BLOCKS if "class UnsureTargetVerifier(Verifier)" in code]
    assert len(blocks) == 1, "README.md should hold exactly one custom-verifier example"
    verifier_lines = blocks[0].split("class UnsureTargetVerifier")[1].split("target, draft")[0]
    assert len([line for line in verifier_lines.strip().splitlines() if line.strip()]) <= 10
