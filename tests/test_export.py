"""SavedModel export: raw strings in, strings and confidence scores out, served by TensorFlow
alone; empty and over-long inputs are never passed off as ordinary translations."""

import json
import math
import os
import re
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from export_utils import check_never_writes_over_anything

from keras_attn import decoding
from keras_attn.data.dates import load_dates, load_dates_translation
from keras_attn.data.translation import WHITESPACE
from keras_attn.export import (
    export_nat_translator,
    export_translator,
    make_translate_fn,
)
from keras_attn.metrics import MaskedSequenceLoss
from keras_attn.models import bahdanau_seq2seq, nat_seq2seq, transformer_seq2seq

pytestmark = pytest.mark.tf_only  # SavedModels

# Loads the SavedModel in a fresh interpreter where keras_attn and Keras cannot be imported.
SERVE_SCRIPT = """
import importlib.util, json, os, sys
sys.modules["keras_attn"] = None
sys.modules["keras"] = None
import tensorflow as tf
if sys.argv[3] == "sentencepiece_op":  # tensorflow-text's op, without importing the package
    folder = os.path.dirname(importlib.util.find_spec("tensorflow_text").origin)
    tf.load_op_library(os.path.join(folder, "python", "ops", "_sentencepiece_tokenizer.so"))
translator = tf.saved_model.load(sys.argv[1])
texts = json.loads(sys.argv[2])
out = translator.signatures["translate"](text=tf.constant(texts, tf.string))
serve = translator.signatures["serve"]
lengths = {name: spec.shape[1] for name, spec in serve.structured_input_signature[1].items()}
ids = {name: tf.constant([[5, 6, 7] + [0] * (length - 3)], tf.int32)
       for name, length in lengths.items()}
logits = serve(**ids)["logits"]
print(json.dumps({"translations": [t.decode() for t in out["translation"].numpy()],
                  "scores": [float(s) for s in out["score"].numpy()],
                  "truncated": [bool(t) for t in out["truncated"].numpy()],
                  "dtypes": {k: v.dtype.name for k, v in out.items()},
                  "logits_shape": logits.shape.as_list()}))
"""

LONG = "march 3rd, 2021 " * 40  # far more tokens than the source length (11 for the dates)
ODD_INPUTS = [
    "",  # empty
    LONG,
    "the zzyzx of qwfp, 2021",  # unknown words
    "   ",  # whitespace only
]
IN_DISTRIBUTION = ["saturday, march 3 2021", "3/3/21", "the 3rd of march, 2021"]


def serve_without_keras(path, texts, cwd, ops="none", check=True):
    """Serves `texts` with the SavedModel at `path` in a fresh interpreter that cannot import
    keras_attn or Keras; `ops="sentencepiece_op"` first registers tensorflow-text's
    SentencePiece op (`tf.load_op_library`). Returns the outputs, or the completed process
    when `check=False`."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", SERVE_SCRIPT, path, json.dumps(texts), ops],
        capture_output=True, text=True, timeout=300, env=env, cwd=str(cwd), check=False,
    )
    if not check:
        return result
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def dates():
    return load_dates_translation(num_examples=400, seed=1)


def train(model, data, epochs=1, learning_rate=5e-3):
    steps = epochs * -(-len(data.train) // 64)
    schedule = keras.optimizers.schedules.CosineDecay(learning_rate, steps, alpha=0.05)
    model.compile(optimizer=keras.optimizers.Adam(schedule), loss=MaskedSequenceLoss())
    model.fit(data.make_dataset("train", 64, shuffle=True), epochs=epochs, shuffle=False,
              verbose=0)
    return model


MODELS = {
    "transformer": lambda d: transformer_seq2seq(d.source_vocab_size, d.target_vocab_size,
                                                 num_layers=1, hidden_dim=16, num_heads=2,
                                                 intermediate_dim=32),
    "bahdanau": lambda d: bahdanau_seq2seq(d.source_vocab_size, d.target_vocab_size,
                                           embedding_dim=8, units=16, num_layers=1),
}


def export_and_serve(model, data, beam_size, texts, tmp_path):
    """Exports `model`, serves `texts` in a fresh interpreter without Keras, and checks the
    outputs against the same function in Python and against the decoding API."""
    path = str(tmp_path / "export")
    export_translator(model, data.source_vectorizer, data.target_vectorizer, path,
                      beam_size=beam_size, standardize=data.standardize_tf, joiner="")
    in_python = make_translate_fn(
        model, data.source_vectorizer, data.target_vectorizer.get_vocabulary(),
        data.target_length, beam_size, standardize=data.standardize_tf, joiner="",
    )(tf.constant(texts))
    expected = [t.decode() for t in in_python["translation"].numpy()]
    # Translating through the Python decoding API gives the same strings and scores.
    ids = data.encode_source([data.standardize(t) for t in IN_DISTRIBUTION], standardize=False)
    tokens, scores = decoding.generate(model, ids, data.target_length, return_scores=True,
                                       sampler=decoding.Beam(beam_size))
    assert texts[:3] == IN_DISTRIBUTION and data.decode(tokens) == expected[:3]
    np.testing.assert_allclose(in_python["score"].numpy()[:3], np.asarray(scores), atol=1e-5)

    served = serve_without_keras(path, texts, tmp_path)
    assert served["translations"] == expected
    np.testing.assert_allclose(served["scores"], in_python["score"].numpy(), atol=1e-5)
    assert served["truncated"] == in_python["truncated"].numpy().tolist()
    assert served["dtypes"] == {"translation": "string", "score": "float32",
                                "truncated": "bool"}
    assert served["logits_shape"] == [1, 11, data.target_vocab_size]
    # Empty and whitespace-only inputs: nothing to translate, and the score says so.
    for i in (3, 6):
        assert served["translations"][i] == "" and served["scores"][i] == -math.inf
    # Only the over-long input is flagged; the others have real, finite scores <= 0.
    assert served["truncated"][:7] == [False, False, False, False, True, False, False]
    finite = [s for i, s in enumerate(served["scores"]) if i not in (3, 6)]
    assert all(math.isfinite(s) and s <= 0 for s in finite)
    return served


# Greedy search on the Transformer is served by `test_nonsense_scores_clearly_lower_than_dates`.
@pytest.mark.parametrize("name,beam_size", [("bahdanau", 1), ("transformer", 3)])
def test_exported_translator_serves_without_keras_attn(name, beam_size, dates, tmp_path):
    keras.utils.set_random_seed(0)
    model = train(MODELS[name](dates), dates)
    export_and_serve(model, dates, beam_size, IN_DISTRIBUTION + ODD_INPUTS, tmp_path)


def test_truncated_flags_exactly_the_inputs_longer_than_the_source_length(dates):
    model = MODELS["transformer"](dates)
    translate = make_translate_fn(model, dates.source_vectorizer,
                                  dates.target_vectorizer.get_vocabulary(),
                                  dates.target_length, standardize=dates.standardize_tf,
                                  joiner="")
    length = dates.source_length  # 11 tokens; every digit is a token
    texts = ["1" * length, "1" * (length + 1), " 1 2 " + "3" * (length - 2), "2021-03-03"]
    out = translate(tf.constant(texts))
    assert out["truncated"].numpy().tolist() == [False, True, False, False]
    # A truncated input is translated from its first `length` tokens, and flagged.
    head = translate(tf.constant(["1" * length]))
    assert out["translation"].numpy()[1] == head["translation"].numpy()[0]


@pytest.fixture(scope="module")
def trained_dates_model():
    """A small Transformer trained on the dates to about 80% exact match (about 30 s)."""
    keras.utils.set_random_seed(0)
    data = load_dates_translation(num_examples=4000, seed=1)
    model = transformer_seq2seq(data.source_vocab_size, data.target_vocab_size, num_layers=1,
                                hidden_dim=32, num_heads=2, intermediate_dim=64)
    return train(model, data, epochs=12), data


NONSENSE = ["hello world", "qwerty uiop", "banana bread recipe", "the cat sat on the mat",
            "not a date", "tomorrow"]


def test_nonsense_scores_clearly_lower_than_dates(trained_dates_model, tmp_path):
    model, data = trained_dates_model
    test = load_dates(num_examples=4000, seed=1).test[:50]
    texts = IN_DISTRIBUTION + ODD_INPUTS + [source for source, _ in test] + NONSENSE
    served = export_and_serve(model, data, 1, texts, tmp_path)
    first = len(IN_DISTRIBUTION + ODD_INPUTS)
    scores = np.asarray(served["scores"][first:])
    in_distribution, nonsense = scores[:len(test)], scores[len(test):]
    translations = served["translations"][first:]
    accuracy = np.mean([p == target for p, (_, target) in zip(translations, test)])
    assert accuracy >= 0.5, accuracy  # the model has learned the task
    # Nonsense still comes back as a well-formed date, but with a clearly lower score: every
    # nonsense input scores below the typical date by more than half a nat per token.
    assert all(len(t) == 10 and t[4] == "-" for t in translations[len(test):])
    assert nonsense.max() < np.median(in_distribution) - 0.5, (nonsense, in_distribution)
    assert nonsense.mean() < in_distribution.mean() - 0.5


def test_saved_model_cli_lists_both_signatures(dates, tmp_path):
    cli = shutil.which("saved_model_cli")
    if cli is None:
        pytest.skip("saved_model_cli is not on PATH")
    model = transformer_seq2seq(dates.source_vocab_size, dates.target_vocab_size, num_layers=1,
                                hidden_dim=16, num_heads=2, intermediate_dim=32)
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
    assert "outputs['score'] tensor_info:\n        dtype: DT_FLOAT" in text
    assert "outputs['truncated'] tensor_info:\n        dtype: DT_BOOL" in text


def test_one_saved_model_serves_greedy_and_beam_search_by_request(dates, tmp_path):
    """`translate_with_settings` takes the search as a request setting: `beam_size` 1 is
    greedy search (the fast one), the export's `beam_size` its beam search (what `translate`
    serves); another value fails the call, naming `beam_size`."""
    keras.utils.set_random_seed(0)
    model = train(MODELS["transformer"](dates), dates)
    path = str(tmp_path / "export")
    export_translator(model, dates.source_vectorizer, dates.target_vectorizer, path,
                      beam_size=3, length_penalty=1.0, standardize=dates.standardize_tf,
                      joiner="")
    translator = tf.saved_model.load(path)
    texts = tf.constant(IN_DISTRIBUTION + ["the zzyzx of qwfp, 2021", "march 3rd, 2021"])

    def python(beam_size):
        return make_translate_fn(model, dates.source_vectorizer,
                                 dates.target_vectorizer.get_vocabulary(), dates.target_length,
                                 beam_size, 1.0, standardize=dates.standardize_tf,
                                 joiner="")(texts)

    served = {size: translator.signatures["translate_with_settings"](
        text=texts, beam_size=tf.constant(size)) for size in (1, 3)}
    default = translator.signatures["translate"](text=texts)
    for size, out in served.items():
        want = python(size)
        assert out["translation"].numpy().tolist() == want["translation"].numpy().tolist()
        np.testing.assert_allclose(out["score"].numpy(), want["score"].numpy(), atol=1e-5)
    assert default["translation"].numpy().tolist() == served[3]["translation"].numpy().tolist()
    # Beam search ranks by the score: it is never below greedy search's.
    assert np.all(served[3]["score"].numpy() >= served[1]["score"].numpy() - 1e-5)
    with pytest.raises(tf.errors.InvalidArgumentError, match="beam_size"):
        translator.signatures["translate_with_settings"](text=texts, beam_size=tf.constant(2))


def test_export_rejects_bad_arguments(dates, tmp_path):
    model = transformer_seq2seq(dates.source_vocab_size, dates.target_vocab_size, num_layers=1,
                                hidden_dim=16, num_heads=2, intermediate_dim=32)
    with pytest.raises(ValueError, match="beam_size"):
        export_translator(model, dates.source_vectorizer, dates.target_vectorizer,
                          str(tmp_path / "x"), beam_size=0)
    with pytest.raises(ValueError, match="source_vectorizer"):
        export_translator(model, "not a vectorizer", dates.target_vectorizer,
                          str(tmp_path / "x"))
    with pytest.raises(ValueError, match="length_penalty"):
        export_translator(model, dates.source_vectorizer, dates.target_vectorizer,
                          str(tmp_path / "x"), length_penalty=-1.0)
    # A vectorizer that standardizes on its own would make the truncation flag count wrong.
    lowercasing = keras.layers.TextVectorization(
        standardize="lower_and_strip_punctuation", output_sequence_length=11,
        vocabulary=dates.source_vectorizer.get_vocabulary()[2:])
    with pytest.raises(ValueError, match="source_vectorizer.*standardize"):
        export_translator(model, lowercasing, dates.target_vectorizer, str(tmp_path / "x"))
    assert not np.any([p.exists() for p in tmp_path.iterdir()])


def test_translators_are_never_written_over_anything(dates, tmp_path):
    """`export_translator` and `export_nat_translator` wrote into an existing directory (an
    earlier SavedModel's variables mixed with the new ones), and `""` into the working
    directory, as the generators did: every exporter refuses alike."""
    model = transformer_seq2seq(dates.source_vocab_size, dates.target_vocab_size, num_layers=1,
                                hidden_dim=16, num_heads=2, intermediate_dim=32)
    check_never_writes_over_anything(lambda path: export_translator(
        model, dates.source_vectorizer, dates.target_vectorizer, path), tmp_path)
    nat = nat_seq2seq(dates.source_vocab_size, dates.target_vocab_size, 1, 16, 2, 32, 0.0,
                      max_target_length=dates.target_length)
    check_never_writes_over_anything(lambda path: export_nat_translator(
        nat, dates.source_vectorizer, dates.target_vectorizer, path), tmp_path,
        name="path")


# Every whitespace character alone, all of them at once, and a mix with ASCII spaces.
WHITESPACE_ONLY = [*WHITESPACE, WHITESPACE, " \u00a0\u3000\u2003\t\n"]


def check_nothing_to_translate(served, count):
    """The first `count` outputs are '' with score -inf."""
    assert served["translations"][:count] == [""] * count
    assert served["scores"][:count] == [-math.inf] * count


def test_unicode_whitespace_is_nothing_to_translate(dates, tmp_path):
    """Only spaces, of any Unicode kind (U+00A0, U+2003, U+3000 ...), give '' and -inf through
    the SavedModel; around a date they are ordinary spaces."""
    model = MODELS["transformer"](dates)
    path = str(tmp_path / "export")
    export_translator(model, dates.source_vectorizer, dates.target_vectorizer, path,
                      standardize=dates.standardize_tf, joiner="")
    served = serve_without_keras(path, WHITESPACE_ONLY + ["3/3/21", "\u30003/3/21\u00a0"],
                                 tmp_path)
    count = len(WHITESPACE_ONLY)
    check_nothing_to_translate(served, count)
    # (an untrained model may well translate the date as ''; the finite score says it was
    # translated, where nothing to translate scores -inf)
    assert served["translations"][count] == served["translations"][count + 1]
    assert np.isfinite(served["scores"][count])
    assert served["scores"][count] == pytest.approx(served["scores"][count + 1])
    # Without a standardization the raw text decides: still nothing to translate.
    raw = make_translate_fn(model, dates.source_vectorizer,
                            dates.target_vectorizer.get_vocabulary(), dates.target_length,
                            joiner="")(tf.constant(WHITESPACE_ONLY))
    assert raw["translation"].numpy().tolist() == [b""] * count
    assert np.all(raw["score"].numpy() == -np.inf)


@pytest.fixture(scope="module")
def subword_pairs(tmp_path_factory):
    from translation_fixtures import write_pairs_file

    from keras_attn.data.pairs import load_tatoeba

    path = write_pairs_file(tmp_path_factory.mktemp("pairs") / "fra.txt")
    return load_tatoeba(str(path), test_fraction=0.25, tokenizer="sentencepiece",
                        vocab_size=40, verbose=0)


def test_subword_translator_needs_the_sentencepiece_op_and_nothing_else(subword_pairs,
                                                                      tmp_path):
    """With subword vocabularies the graph holds tensorflow-text's SentencePiece op: loading
    fails without it, and registering the op alone (no Keras, no keras_attn, not even the
    tensorflow_text package) serves what Python computes, detokenized into words."""
    data = subword_pairs
    keras.utils.set_random_seed(0)
    model = train(MODELS["transformer"](data), data, epochs=3)
    path = str(tmp_path / "export")
    export_translator(model, data.source_vectorizer, data.target_vectorizer, path,
                      **data.text_options)
    texts = [*WHITESPACE_ONLY, "I am tall.", "She is not busy!", "You are zzz.",
             "We are ready. " * 10]
    failed = serve_without_keras(path, texts, tmp_path, check=False)
    # (which of its ops the loader meets first varies: SentencepieceOp, SentencepieceTokenizeOp)
    assert failed.returncode != 0 and re.search(r"not registered '?Sentencepiece",
                                                failed.stderr), failed.stderr[-2000:]
    served = serve_without_keras(path, texts, tmp_path, ops="sentencepiece_op")
    in_python = make_translate_fn(model, data.source_vectorizer,
                                  data.target_vectorizer.get_vocabulary(), data.target_length,
                                  **data.text_options)(tf.constant(texts))
    assert served["translations"] == [t.decode() for t in in_python["translation"].numpy()]
    np.testing.assert_allclose(served["scores"], in_python["score"].numpy(), atol=1e-5)
    count = len(WHITESPACE_ONLY)
    check_nothing_to_translate(served, count)
    assert served["truncated"] == [False] * (count + 3) + [True]
    # The same words as greedy search + TranslationData.decode (pieces -> words).
    sources = [data.standardize(t) for t in texts[count:]]
    ids = decoding.generate(model, data.encode_source(sources, standardize=False),
                            data.target_length)
    assert served["translations"][count:] == data.decode(ids)
    assert all("\u2581" not in t and "  " not in t for t in served["translations"])
    assert served["logits_shape"] == [1, data.target_length, data.target_vocab_size]


def test_word_start_needs_a_space_joiner(subword_pairs):
    data = subword_pairs
    model = MODELS["transformer"](data)
    with pytest.raises(ValueError, match="joiner"):
        make_translate_fn(model, data.source_vectorizer, data.target_vectorizer.get_vocabulary(),
                          data.target_length, joiner="", word_start="\u2581")
    with pytest.raises(ValueError, match="word_start"):
        make_translate_fn(model, data.source_vectorizer, data.target_vectorizer.get_vocabulary(),
                          data.target_length, word_start="")
