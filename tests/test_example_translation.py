"""The translation examples in smoke runs: metrics.json, heatmaps, export, mirrored, resume.

The full default runs (quality targets) are `slow` tests.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.tf_only  # tf.data, SavedModels, the examples

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
SMOKE = ["--num-examples", "300", "--epochs", "1", "--max-test", "20", "--batch-size", "64"]


def run_example(script, tmp_path, *args, check=True):
    out, export = tmp_path / "out", tmp_path / "export"
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--out", str(out), "--export-dir", str(export),
         *args],
        capture_output=True, text=True, timeout=1500, cwd=str(tmp_path),
        env={**os.environ, "CI": "1"}, check=False,
    )
    if check:
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result, out, export


def check_outputs(out, export):
    metrics = json.loads((out / "metrics.json").read_text())
    for key in ("exact_match", "bleu", "train_seconds", "num_test"):
        assert key in metrics
    assert 0.0 <= metrics["exact_match"] <= 1.0 and 0.0 <= metrics["bleu"] <= 1.0
    assert metrics["export_matches_python"] is True
    assert (export / "saved_model.pb").exists()
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert "history.png" in pngs and "attention_0.png" in pngs
    assert all((out / p).stat().st_size > 2000 for p in pngs)
    return metrics


SUBJECTS = [("i am", "je suis"), ("you are", "tu es"), ("he is", "il est"),
            ("we are", "nous sommes"), ("they are", "ils sont"), ("she is", "elle est")]
ADJECTIVES = [("tall", "grand"), ("cold", "froid"), ("happy", "heureux"), ("tired", "fatigué"),
              ("late", "en retard"), ("ready", "prêt"), ("sick", "malade"), ("busy", "occupé")]


def write_pairs_file(path):
    """A small English–French export in the Tatoeba/Anki format, with some malformed lines."""
    lines = []
    for (en_s, fr_s) in SUBJECTS:
        for (en_a, fr_a) in ADJECTIVES:
            lines.append(f"{en_s.capitalize()} {en_a}.\t{fr_s.capitalize()} {fr_a}.\tCC-BY 2.0")
            lines.append(f"{en_s.capitalize()} not {en_a}!\t{fr_s.capitalize()} pas {fr_a}\u202f!")
    lines += ["no tab on this line", "\tempty English side", ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


@pytest.mark.parametrize("script,data", [("transformer_translation.py", "dates"),
                                         ("bahdanau_translation.py", "pairs")])
def test_translation_example_smoke(script, data, tmp_path):
    extra = ["--data", str(write_pairs_file(tmp_path / "fra.txt"))] if data == "pairs" else []
    result, out, export = run_example(script, tmp_path, *SMOKE, *extra)
    metrics = check_outputs(out, export)
    assert metrics["epochs_run"] == 1
    assert metrics["task"] == ("dates" if data == "dates" else "tatoeba")
    assert "test exact match" in result.stdout


def test_mirrored_strategy_and_resume(tmp_path):
    """Two logical CPUs under MirroredStrategy; an interrupted run resumes where it stopped."""
    args = [*SMOKE[:2], "--epochs", "3", "--max-test", "10", "--strategy", "mirrored"]
    first, out, _ = run_example("transformer_translation.py", tmp_path, *args,
                                "--interrupt-after", "1", check=False)
    assert first.returncode == 3, first.stderr[-3000:]
    assert "interrupted after epoch 1" in first.stdout
    assert (out / "backup").exists()
    _, out, export = run_example("transformer_translation.py", tmp_path, *args, "--resume")
    metrics = check_outputs(out, export)
    assert metrics["strategy"] == "mirrored"
    assert metrics["epochs_run"] == 2  # epoch 1 came from the backup, not trained again


@pytest.mark.slow
def test_transformer_default_run_reaches_99_percent(tmp_path):
    _, out, export = run_example("transformer_translation.py", tmp_path)
    metrics = check_outputs(out, export)
    assert metrics["exact_match"] >= 0.99, metrics


@pytest.mark.slow
def test_bahdanau_default_run_learns_dates(tmp_path):
    _, out, export = run_example("bahdanau_translation.py", tmp_path)
    metrics = check_outputs(out, export)
    assert metrics["exact_match"] >= 0.95, metrics
