"""benchmarks/gpu_check.sh on a CPU: the dry run (tiny shapes) prints one table of every part
with no failed check, and a wheel folder that lacks a wheel is refused by name.

The script starts its own JAX and torch processes (`KERAS_BACKEND` set for each), so these run
once, under TensorFlow (`tf_only`): what they check does not depend on the test run's backend.
"""

import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def dry_run(*options, timeout=900):
    done = subprocess.run(["bash", str(SCRIPT), "--dry-run", *options], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False)
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| part")]
    return done, [[cell.strip() for cell in row] for row in rows]


@pytest.mark.tf_only
def test_gpu_check_dry_run_on_torch_prints_every_part_and_passes():
    done, rows = dry_run("--backends", "torch", timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.count("# keras_attn GPU check") == 1  # one table
    assert {row[0] for row in rows} == {"a", "b", "c", "d"}
    assert {row[1] for row in rows} == {"torch"}
    correctness = [row for row in rows if row[0] == "a" and "mask kinds" in row[2]]
    assert [row[5] for row in correctness] == ["pass", "pass"]  # float32, bfloat16
    assert not any(row[5].startswith("FAIL") for row in rows)
    generation = [row for row in rows if row[0] == "d"]
    assert [", B1," in row[2] for row in generation] == [True, False]  # batch 1, then the size's
    assert all("transformers" in row[4] for row in generation)


@pytest.mark.slow
@pytest.mark.tf_only
def test_gpu_check_dry_run_on_jax_and_torch():
    done, rows = dry_run(timeout=1500)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert {(row[0], row[1]) for row in rows} == {
        (part, backend) for part in "abcd" for backend in ("jax", "torch")}


@pytest.mark.tf_only
def test_gpu_check_names_the_wheels_it_lacks(tmp_path):
    (tmp_path / "keras-3.15.1-py3-none-any.whl").write_bytes(b"")
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert "keras_hub namex optree" in done.stderr
    assert "gpu_wheels.sh" in done.stderr
