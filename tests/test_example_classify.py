"""examples/classify_text.py at tiny sizes: it builds its checkpoint offline, reports the test
accuracy before and after fine-tuning, and writes a model.keras and a SavedModel that give the
same labels; it never replaces an earlier run without --overwrite."""

import json
import os

import classify_text
import keras
import numpy as np
import pytest

pytestmark = pytest.mark.tf_only  # the tokenizer's TF ops, the SavedModel

TINY = ["--num-pairs", "150", "--epochs", "1", "--batch-size", "16", "--sequence-length", "16",
        "--tiny-hidden-dim", "16", "--tiny-heads", "2", "--tiny-intermediate-dim", "16",
        "--tiny-layers", "1", "--tiny-vocabulary-size", "300"]


def test_a_tiny_run_end_to_end(tmp_path, capsys):
    out = tmp_path / "run"
    metrics = classify_text.main([*TINY, "--out", str(out)])
    printed = capsys.readouterr().out
    assert "test accuracy before fine-tuning" in printed and "after fine-tuning" in printed
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["test_accuracy"] == metrics["test_accuracy"]
    assert 0.0 <= saved["test_accuracy_before"] <= 1.0 and saved["built_checkpoint"]
    texts = saved["texts"]
    assert texts["train"] > 200 and texts["test"] > 0 and texts["validation"] > 0
    assert len(saved["history"]["loss"]) == 1 and saved["pooling"] == "pooled_output"
    assert (out / "checkpoint" / "config.json").is_file()
    served = saved["served"]
    assert len(served) == len(classify_text.EXAMPLES) + 4
    model = keras.saving.load_model(str(out / "model.keras"))
    logits = model.predict([answer["text"] for answer in served], verbose=0)
    labels = [classify_text.LABELS[i] for i in logits.argmax(axis=1)]
    assert [answer["label"] for answer in served] == labels
    np.testing.assert_allclose([answer["probability"] for answer in served],
                               keras.ops.convert_to_numpy(
                                   keras.ops.softmax(logits)).max(axis=1), atol=1e-4)
    with pytest.raises(SystemExit, match="overwrite"):
        classify_text.main([*TINY, "--out", str(out)])
    os.remove(out / "metrics.json")  # an interrupted run's files are kept too
    with pytest.raises(SystemExit, match="model.keras.*overwrite"):
        classify_text.main([*TINY, "--out", str(out), "--no-export"])


def test_the_splits_share_no_text(tmp_path):
    data = tmp_path / "pairs.txt"
    lines = [f"Sentence {i}.\tPhrase {i}." for i in range(40)]
    lines += ["Tom.\tTom.", "Hi.\tSalut.", "Hello.\tSalut.", "no tab here", ""]
    data.write_text("\n".join(lines), encoding="utf-8")
    args = classify_text.parse_args(["--data", str(data), "--num-pairs", "100",
                                     "--test-fraction", "0.25", "--out", str(tmp_path)])
    splits = classify_text.labelled_splits(args)
    texts = {name: set(split[0]) for name, split in splits.items()}
    assert not texts["train"] & texts["test"] and not texts["train"] & texts["validation"]
    assert not texts["test"] & texts["validation"]
    assert "Tom." not in set().union(*texts.values())  # in both languages: dropped
    everything = {text: label for split in splits.values() for text, label in zip(*split)}
    assert everything["Sentence 3."] == 0 and everything["Phrase 3."] == 1
    assert {"Hi.", "Hello."} <= set(everything) and everything.get("Salut.", 1) == 1
    assert len(everything) >= 40 * 2 + 2


def test_help_and_bad_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit):
        classify_text.parse_args(["--help"])
    help_text = capsys.readouterr().out
    assert "(default: 4000)" in help_text and "(default: 3)" in help_text
    for bad in (["--epochs", "0"], ["--test-fraction", "0.6"], [str(tmp_path)],
                ["--data", str(tmp_path / "missing.txt")],
                ["--tiny-hidden-dim", "30", "--tiny-heads", "4"]):
        with pytest.raises(SystemExit):
            classify_text.parse_args(bad)
