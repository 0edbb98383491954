"""examples/char_lm.py: a short run end to end, the missing-data message, and (slow) the
default run's quality."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "examples"))
import char_lm

pytestmark = pytest.mark.tf_only  # tf.data, SavedModels, the examples

DATA = os.path.normpath(char_lm.DEFAULT_DATA)
needs_data = pytest.mark.skipif(not os.path.isfile(DATA),
                                reason=f"the shared data file {DATA} is not here")


@needs_data
def test_a_short_run_writes_everything(tmp_path):
    out = tmp_path / "run"
    metrics = char_lm.main(["--out", str(out), "--epochs", "1", "--steps-per-epoch", "4",
                            "--batch-size", "8", "--seq-len", "16", "--embed-dim", "16",
                            "--num-heads", "2", "--num-kv-heads", "1", "--ffn-dim", "32",
                            "--num-layers", "1"])
    for name in ("metrics.json", "history.png", "attention.png", "saved_model"):
        assert (out / name).exists(), name
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["validation_perplexity"] == pytest.approx(metrics["validation_perplexity"])
    assert 1.0 < saved["validation_perplexity"] < 31  # better than nothing, worse than perfect
    assert set(saved["samples"]) == {"0.0", "0.6", "1.0"}
    with pytest.raises(SystemExit, match="overwrite"):  # never silently over an earlier run
        char_lm.main(["--out", str(out), "--epochs", "1", "--steps-per-epoch", "1"])


def test_a_missing_book_says_where_it_looked(tmp_path):
    with pytest.raises(SystemExit, match="No text at --data"):
        char_lm.main(["--data", str(tmp_path / "nothing.txt"), "--out", str(tmp_path / "o")])


@needs_data
@pytest.mark.slow
def test_the_default_run_learns_the_book(tmp_path):
    metrics = char_lm.main(["--out", str(tmp_path / "run")])
    assert metrics["validation_perplexity"] < 5.5
