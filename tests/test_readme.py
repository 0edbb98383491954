"""The README's Python blocks run as written (training shrunk to a few steps), in order, in a
fresh interpreter, and each prints something: the README cannot drift from the code."""

import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.tf_only  # the blocks export SavedModels

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Shrinks training only: fewer examples and epochs; nothing else of a block changes.
SHRINK = [(r"load_dates_translation\(\)", "load_dates_translation(num_examples=1000)"),
          (r"epochs=\d+", "epochs=1")]


def python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return [textwrap.dedent(block)
            for block in re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)]


def test_the_readme_has_the_blocks_it_shows():
    blocks = python_blocks()
    assert len(blocks) >= 6
    assert all("print(" in block for block in blocks), "every block shows something"


def test_every_python_block_runs_as_written(tmp_path):
    blocks = []
    for block in python_blocks():
        for pattern, replacement in SHRINK:
            block = re.sub(pattern, replacement, block)
        blocks.append(block)
    script = "\n".join(
        f"print('--- block {i}', flush=True)\n{block}" for i, block in enumerate(blocks))
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    printed = result.stdout.split("--- block ")
    assert len(printed) == len(blocks) + 1
    for chunk in printed[1:]:
        assert len(chunk.strip().splitlines()) >= 2, f"block {chunk[:3]} printed nothing"
