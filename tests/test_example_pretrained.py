"""examples/pretrained_generate.py on a tiny checkpoint: it generates with the checkpoint's ids,
reports its speed, and exports a `generate` SavedModel giving the same greedy text."""

import json
import os

import checkpoint_fixtures as fx
import pretrained_generate
import pytest

pytestmark = pytest.mark.tf_only  # the tokenizer's TF ops, the SavedModel


def test_a_tiny_checkpoint_end_to_end(tmp_path):
    out = tmp_path / "run"
    prompts = ["The Time Traveller", ""]
    metrics = pretrained_generate.main([
        fx.hf_checkpoint("gpt2"), "--prompt", prompts[0], "--prompt", prompts[1],
        "--max-new-tokens", "8", "--out", str(out)])
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["texts"] == metrics["texts"] and len(saved["texts"]) == 2
    assert saved["source"] == "GPT2LMHeadModel" and saved["tokens_per_second"] > 0
    assert saved["tokens"] == 16  # no end id among a random model's greedy choices here
    import tensorflow as tf

    generate = tf.saved_model.load(str(out / "saved_model")).signatures["generate"]
    served = generate(prompt=tf.constant(prompts), max_new_tokens=tf.constant(8),
                      temperature=tf.constant(0.0), top_k=tf.constant(0),
                      top_p=tf.constant(1.0), seed=tf.constant(0))
    assert [t.decode() for t in served["text"].numpy()] == saved["texts"]
    with pytest.raises(SystemExit, match="overwrite"):
        pretrained_generate.main([fx.hf_checkpoint("gpt2"), "--out", str(out)])


def test_stream_prints_the_same_text(tmp_path, capsys):
    prompt = "The Time Traveller 😀 日本"
    metrics = pretrained_generate.main([
        fx.hf_checkpoint("llama"), "--prompt", prompt, "--max-new-tokens", "8", "--out",
        str(tmp_path / "run"), "--no-export", "--stream"])
    assert metrics["streamed_texts"] == metrics["texts"] and metrics["texts"][0]
    assert f"{prompt}{metrics['texts'][0]}\n" in capsys.readouterr().out


def test_what_it_refuses(tmp_path):
    with pytest.raises(SystemExit):
        pretrained_generate.main([str(tmp_path), "--out", str(tmp_path / "x")])  # no config
    with pytest.raises(SystemExit, match="not a causal language model"):
        pretrained_generate.main([fx.hf_checkpoint("bert"), "--out", str(tmp_path / "y"),
                                  "--no-export"])


def test_an_export_that_fails_keeps_the_earlier_saved_model(tmp_path):
    """`--overwrite` with a bad `--max-length` deleted the earlier SavedModel, then failed."""
    out = tmp_path / "run"
    checkpoint = fx.hf_checkpoint("llama")  # its template holds <s>: 4 positions at least
    pretrained_generate.main([checkpoint, "--max-new-tokens", "2", "--out", str(out)])
    files = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(ValueError, match="max_length"):
        pretrained_generate.main([checkpoint, "--max-new-tokens", "2", "--out", str(out),
                                  "--overwrite", "--max-length", "3"])
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == files
    assert sorted(os.listdir(out)) == ["metrics.json", "saved_model"]  # nothing half-made
    # Beyond a GPT-2's learned positions it was cut to them without a word: now refused
    # before anything is written.
    with pytest.raises(SystemExit, match="--max-length must be at most the checkpoint's 64"):
        pretrained_generate.main([fx.hf_checkpoint("gpt2"), "--out", str(tmp_path / "g"),
                                  "--max-length", "100"])
    assert not (tmp_path / "g").exists()
    with pytest.raises(SystemExit):  # with nothing to export it would be ignored
        pretrained_generate.parse_args([checkpoint, "--no-export", "--max-length", "50"])
