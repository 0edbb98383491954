"""The README's and the docs chapters' Python blocks run as written (training shrunk to a few
steps), in order, one fresh interpreter per file, and each prints something: the documents
cannot drift from the code. Their links lead to files that exist."""

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
# The documents whose blocks run here; docs/scale.md's block needs 8 JAX devices and runs in
# tests/test_sharding.py.
DOCUMENTS = ["README.md", "docs/layers.md", "docs/models.md", "docs/checkpoints.md",
             "docs/examples.md", "docs/exporting.md"]
RUN_ELSEWHERE = {"docs/scale.md": "tests/test_sharding.py"}


def python_blocks(document: str) -> list[str]:
    text = (ROOT / document).read_text()
    return [textwrap.dedent(block)
            for block in re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)]


def markdown_files() -> list[str]:
    return ["README.md"] + sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))


def test_every_document_with_python_blocks_is_run_somewhere():
    with_blocks = {doc for doc in markdown_files() if python_blocks(doc)}
    assert with_blocks == set(DOCUMENTS) | set(RUN_ELSEWHERE)
    for document, test in RUN_ELSEWHERE.items():
        assert document in (ROOT / test).read_text()
    assert len(python_blocks("README.md")) >= 5
    for document in DOCUMENTS:
        assert all("print(" in block for block in python_blocks(document)), (
            f"every block of {document} shows something")


def test_the_readme_is_short_and_every_link_leads_somewhere():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
    for document in markdown_files():
        text = re.sub(r"```.*?```", "", (ROOT / document).read_text(), flags=re.DOTALL)
        for target in re.findall(r"\]\(([^)\s#:\"']+)(?:#[^)]*)?\)", text):
            path = (ROOT / document).parent / target
            assert path.exists(), f"{document} links to {target}, which does not exist"
    for line in (ROOT / "tests" / "backend_files.txt").read_text().split():
        assert (ROOT / line).is_file(), f"tests/backend_files.txt names {line}, not a file"


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_python_block_runs_as_written(tmp_path, document):
    blocks = []
    for block in python_blocks(document):
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
