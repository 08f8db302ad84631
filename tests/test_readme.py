"""The README's code that claims to run does run."""

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_custom_verifier_block_runs():
    blocks = [block for block in python_blocks() if "class UnsureTargetVerifier(Verifier)" in block]
    assert len(blocks) == 1, "README.md should hold exactly one custom-verifier example"
    verifier_lines = blocks[0].split("class UnsureTargetVerifier")[1].split("\n\n\n")[0].split("target, draft")[0]
    assert len([line for line in verifier_lines.strip().splitlines() if line.strip()]) <= 10
    done = subprocess.run([sys.executable, "-c", blocks[0]], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    match = re.search(r"acceptance (\d\.\d\d)", done.stdout)
    assert match and 0.0 <= float(match.group(1)) <= 1.0, done.stdout
