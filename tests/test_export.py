"""SavedModel export: raw strings in, strings out, served by TensorFlow alone."""

import json
import os
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn.data.dates import load_dates_translation
from keras_attn.export import export_translator, make_translate_fn
from keras_attn.metrics import MaskedSequenceLoss
from keras_attn.models import bahdanau_seq2seq, transformer_seq2seq

pytestmark = pytest.mark.tf_only  # SavedModels

# Loads the SavedModel in a fresh interpreter where keras_attn and Keras cannot be imported.
SERVE_SCRIPT = """
import json, sys
sys.modules["keras_attn"] = None
sys.modules["keras"] = None
import tensorflow as tf
translator = tf.saved_model.load(sys.argv[1])
texts = json.loads(sys.argv[2])
out = translator.signatures["translate"](text=tf.constant(texts, tf.string))["translation"]
ids = tf.constant([[5, 6, 7] + [0] * 8], tf.int32)
logits = translator.signatures["serve"](source_ids=ids, target_in_ids=ids)["logits"]
print(json.dumps({"translations": [t.decode() for t in out.numpy()],
                  "logits_shape": logits.shape.as_list()}))
"""

ODD_INPUTS = [
    "",  # empty
    "march 3rd, 2021 " * 40,  # far longer than the source length: truncated
    "the zzyzx of qwfp, 2021",  # unknown words
    "   ",
]


@pytest.fixture(scope="module")
def dates():
    return load_dates_translation(num_examples=400, seed=1)


def train_tiny(model, data):
    model.compile(optimizer=keras.optimizers.Adam(5e-3), loss=MaskedSequenceLoss())
    model.fit(data.make_dataset("train", 64, shuffle=True), epochs=1, verbose=0)
    return model


MODELS = {
    "transformer": lambda d: transformer_seq2seq(d.source_vocab_size, d.target_vocab_size,
                                                 num_layers=1, embed_dim=16, num_heads=2,
                                                 ffn_dim=32),
    "bahdanau": lambda d: bahdanau_seq2seq(d.source_vocab_size, d.target_vocab_size,
                                           embed_dim=8, units=16, num_layers=1),
}


@pytest.mark.parametrize("name,beam_size", [("transformer", 1), ("bahdanau", 1),
                                            ("transformer", 3)])
def test_exported_translator_serves_without_keras_attn(name, beam_size, dates, tmp_path):
    keras.utils.set_random_seed(0)
    model = train_tiny(MODELS[name](dates), dates)
    path = str(tmp_path / f"{name}_export")
    export_translator(model, dates.source_vectorizer, dates.target_vectorizer, path,
                      beam_size=beam_size, standardize=dates.standardize_tf, joiner="")

    texts = ["saturday, march 3 2021", "3/3/21", "the 3rd of march, 2021"] + ODD_INPUTS
    in_python = make_translate_fn(
        model, dates.source_vectorizer, dates.target_vectorizer.get_vocabulary(),
        dates.target_length, beam_size, standardize=dates.standardize_tf, joiner="",
    )(tf.constant(texts))
    expected = [t.decode() for t in in_python.numpy()]
    # Translating through the Python decoding API gives the same strings.
    ids = dates.encode_source([dates.standardize(t) for t in texts[:3]], standardize=False)
    from keras_attn import decoding

    tokens = (decoding.greedy_search(model, ids, dates.target_length) if beam_size == 1 else
              decoding.beam_search(model, ids, dates.target_length, beam_size=beam_size))
    assert dates.decode(tokens) == expected[:3]

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", SERVE_SCRIPT, path, json.dumps(texts)],
        capture_output=True, text=True, timeout=300, env=env, cwd=str(tmp_path), check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    served = json.loads(result.stdout.strip().splitlines()[-1])
    assert served["translations"] == expected
    assert len(served["translations"]) == len(texts)
    assert all(isinstance(t, str) for t in served["translations"])
    assert served["logits_shape"] == [1, 11, dates.target_vocab_size]


def test_saved_model_cli_lists_both_signatures(dates, tmp_path):
    cli = shutil.which("saved_model_cli")
    if cli is None:
        pytest.skip("saved_model_cli is not on PATH")
    model = transformer_seq2seq(dates.source_vocab_size, dates.target_vocab_size, num_layers=1,
                                embed_dim=16, num_heads=2, ffn_dim=32)
    path = str(tmp_path / "export")
    export_translator(model, dates.source_vectorizer, dates.target_vectorizer, path,
                      standardize=dates.standardize_tf, joiner="")
    shown = subprocess.run([cli, "show", "--dir", path, "--all"], capture_output=True,
                           text=True, timeout=300, check=False)
    assert shown.returncode == 0, shown.stderr[-2000:]
    text = shown.stdout
    assert "signature_def['translate']" in text and "signature_def['serve']" in text
    assert "inputs['text'] tensor_info:\n        dtype: DT_STRING\n        shape: (-1)" in text
    assert "outputs['translation'] tensor_info:\n        dtype: DT_STRING" in text


def test_export_rejects_bad_arguments(dates, tmp_path):
    model = transformer_seq2seq(dates.source_vocab_size, dates.target_vocab_size, num_layers=1,
                                embed_dim=16, num_heads=2, ffn_dim=32)
    with pytest.raises(ValueError, match="beam_size"):
        export_translator(model, dates.source_vectorizer, dates.target_vectorizer,
                          str(tmp_path / "x"), beam_size=0)
    with pytest.raises(ValueError, match="source_vectorizer"):
        export_translator(model, "not a vectorizer", dates.target_vectorizer,
                          str(tmp_path / "x"))
    assert not np.any([p.exists() for p in tmp_path.iterdir()])
