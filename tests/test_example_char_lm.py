"""examples/char_lm.py: a short run end to end (its SavedModel reads prompts as the book was
normalized), `--help`, the missing-data messages, and (slow) the default run's quality."""

import json
import os

import char_lm
import pytest

pytestmark = pytest.mark.tf_only  # tf.data, SavedModels, the examples

DATA = os.path.normpath(char_lm.DEFAULT_DATA)
needs_data = pytest.mark.skipif(not os.path.isfile(DATA),
                                reason=f"the shared data file {DATA} is not here")


@needs_data
def test_a_short_run_writes_everything(tmp_path):
    out = tmp_path / "run"
    metrics = char_lm.main(["--out", str(out), "--epochs", "1", "--steps-per-epoch", "12",
                            "--batch-size", "8", "--seq-len", "16", "--embed-dim", "16",
                            "--num-heads", "2", "--num-kv-heads", "1", "--ffn-dim", "32",
                            "--num-layers", "1", "--prompt", "The Time!", "--prompt", "é"])
    for name in ("metrics.json", "history.png", "attention.png", "saved_model"):
        assert (out / name).exists(), name
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["validation_perplexity"] == pytest.approx(metrics["validation_perplexity"])
    assert 1.0 < saved["validation_perplexity"] < 31  # better than nothing, worse than perfect
    assert set(saved["samples"]) == {"0.0", "0.6", "1.0"}
    # --prompt: what the samples continue, normalized as the book was read
    assert saved["prompts"] == ["the time ", " "]
    assert all(len(texts) == 2 for texts in saved["samples"].values())
    assert saved["samples"]["0.0"][0].startswith("the time ")
    with pytest.raises(SystemExit, match="overwrite"):  # never silently over an earlier run
        char_lm.main(["--out", str(out), "--epochs", "1", "--steps-per-epoch", "1"])
    # The exported signature lowercases and keeps letters only, as the book was read: "The"
    # reached the model as "[UNK]he".
    assert saved["served"]["context"] == ["the time traveller ", "it was"]
    import tensorflow as tf

    generate = tf.saved_model.load(str(out / "saved_model")).signatures["generate"]
    result = generate(prompt=tf.constant(["The Time Traveller, ", "the time traveller "]),
                      max_new_tokens=tf.constant(12), temperature=tf.constant(0.0),
                      top_k=tf.constant(0), top_p=tf.constant(1.0), seed=tf.constant(0))
    assert [c.decode() for c in result["context"].numpy()] == ["the time traveller "] * 2
    texts = [t.decode() for t in result["text"].numpy()]
    assert texts[0] == texts[1] == saved["served"]["text"][0][:12]


def test_a_missing_book_says_where_it_looked_and_where_to_get_it(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="No text at --data.*--download"):
        char_lm.main(["--data", str(tmp_path / "nothing.txt"), "--out", str(tmp_path / "o")])
    # A clone without the shared data: the default names --download too.
    monkeypatch.setattr(char_lm, "DEFAULT_DATA", str(tmp_path / "shared" / "timemachine.txt"))
    with pytest.raises(SystemExit, match="gutenberg.org.*--data|--download"):
        char_lm.main(["--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="not both"):  # never downloads: refused first
        char_lm.main(["--download", "--data", str(tmp_path / "book.txt"),
                      "--out", str(tmp_path / "o")])


def test_help_says_where_the_book_comes_from(capsys):
    # Every default shown: test_example_options.test_help_shows_every_default.
    with pytest.raises(SystemExit):
        char_lm.parse_args(["--help"])
    text = capsys.readouterr().out
    assert "--download" in text and "gutenberg.org" in text


def test_prompts_default_and_longer_than_the_samples_allow(capsys):
    assert char_lm.parse_args([]).prompt == list(char_lm.PROMPTS)
    assert char_lm.parse_args(["--prompt", "a", "--prompt", "b"]).prompt == ["a", "b"]
    longest = char_lm.SAMPLE_LENGTH - 1 - char_lm.SAMPLE_NEW
    assert char_lm.parse_args(["--prompt", "x" * longest]).prompt == ["x" * longest]
    with pytest.raises(SystemExit):
        char_lm.parse_args(["--prompt", "x" * (longest + 1)])
    assert f"--prompt must be at most {longest} characters" in capsys.readouterr().err


@needs_data
@pytest.mark.slow
def test_the_default_run_learns_the_book(tmp_path):
    metrics = char_lm.main(["--out", str(tmp_path / "run")])
    assert metrics["validation_perplexity"] < 5.5
