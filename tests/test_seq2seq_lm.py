"""`keras_attn.tasks.Seq2SeqLM` and its `Seq2SeqLMPreprocessor`: the translators as one object.

Strings in and out equal the ids path (`decoding.generate`, `mask_predict` and
`TranslationData`'s own encoding and decoding), `fit` on pairs of strings trains, `.keras`
files keep the preprocessor, the search and the outputs, the SavedModel's `translate` answers
what the task answers, and what cannot be honoured is a ValueError naming it."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_attn as ka
from keras_attn.data.dates import load_dates_translation
from keras_attn.preprocessing import Seq2SeqLMPreprocessor
from keras_attn.tasks import Seq2SeqLM

pytestmark = pytest.mark.tf_only  # tf.data pipelines and SavedModels

RAW = ["march 3rd, 2021", "3/3/21", "the 1st of june, 1989", "Tue, 14 Jul 20"]
TARGETS = ["2021-03-03", "2021-03-03", "1989-06-01", "2020-07-14"]
SIZES = {"num_layers": 1, "hidden_dim": 32, "num_heads": 2, "intermediate_dim": 64}


@pytest.fixture(scope="module")
def data():
    return load_dates_translation(num_examples=1500)


@pytest.fixture(scope="module")
def translator(data):
    """A small Transformer trained for two epochs on pairs of strings."""
    keras.utils.set_random_seed(0)
    model = ka.models.transformer_seq2seq(data.source_vocab_size, data.target_vocab_size,
                                          **SIZES)
    task = Seq2SeqLM(model, Seq2SeqLMPreprocessor.from_data(data))
    task.compile(optimizer=keras.optimizers.Adam(3e-3))
    task.history_ = task.fit(data.train, validation_data=data.validation[:200], epochs=2,
                             batch_size=64, verbose=0)
    return task


@pytest.fixture(scope="module")
def nat(data):
    keras.utils.set_random_seed(0)
    model = ka.models.nat_seq2seq(data.source_vocab_size, data.target_vocab_size,
                                  max_target_length=data.target_length, **SIZES)
    task = Seq2SeqLM(model, Seq2SeqLMPreprocessor.from_data(data), iterations=2)
    task.compile(optimizer=keras.optimizers.Adam(3e-3))
    task.history_ = task.fit(data.train, epochs=2, batch_size=64, verbose=0)
    return task


def test_the_preprocessor_encodes_as_the_data_does(data):
    preprocessor = Seq2SeqLMPreprocessor.from_data(data)
    (source, target_in), target_out = preprocessor(RAW, TARGETS)
    expected = data.encode_pairs([(data.standardize(s), data.standardize(t))
                                  for s, t in zip(RAW, TARGETS)])
    for got, want in zip((source, target_in, target_out), expected):
        np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(preprocessor.encode_source(RAW).numpy(),
                                  data.encode_source(RAW))
    ids = expected[2]  # y <eos>: decode reads up to the end id
    assert preprocessor.decode(ids) == data.decode(ids) == TARGETS


def test_a_target_that_fills_every_position_has_no_end_id(data):
    preprocessor = Seq2SeqLMPreprocessor.from_data(data)
    long = "1 2 3 4 5 6 7 8 9 0 1 2 3"  # more tokens than target_length
    _, target_out = preprocessor(["3/3/21"], [long])
    assert 3 not in target_out.numpy()[0]


def test_fit_on_pairs_of_strings_trains(translator):
    history = translator.history_.history
    assert history["loss"][-1] < history["loss"][0] - 0.3
    assert "val_loss" in history


def test_strings_equal_the_ids_path(translator, data):
    ids = data.encode_source(RAW)
    for sampler in ("greedy", ka.decoding.Beam(3)):
        tokens = ka.decoding.generate(translator.backbone, ids, data.target_length,
                                      sampler=ka.decoding.samplers.get(sampler))
        assert translator.translate(RAW, sampler=sampler) == data.decode(tokens)
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(translator.generate(ids, sampler=sampler)),
            keras.ops.convert_to_numpy(tokens))
    assert translator.translate(RAW[0]) == translator.translate(RAW[:1])[0]


def test_the_nat_translates_with_mask_predict(nat, data):
    assert nat.history_.history["loss"][-1] < nat.history_.history["loss"][0]
    ids = data.encode_source(RAW)
    tokens, _ = ka.decoding.mask_predict(nat.backbone, ids, max_length=data.target_length,
                                         iterations=2)
    assert nat.translate(RAW) == data.decode(tokens)
    tokens, _ = ka.decoding.mask_predict(nat.backbone, ids, max_length=data.target_length,
                                         iterations=1)
    assert nat.translate(RAW, iterations=1) == data.decode(tokens)


@pytest.mark.parametrize("kind", ["at", "nat"])
def test_keras_file_keeps_the_preprocessor_and_the_search(request, tmp_path, kind):
    task = request.getfixturevalue("translator" if kind == "at" else "nat")
    if kind == "at":
        task.compile(optimizer=keras.optimizers.Adam(3e-3), sampler=ka.decoding.Beam(2))
    before = task.translate(RAW)
    path = str(tmp_path / "translator.keras")
    task.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, Seq2SeqLM)
    assert loaded.translate(RAW) == before
    if kind == "at":
        assert isinstance(loaded.sampler, ka.decoding.Beam) and loaded.sampler.num_beams == 2
        task.compile(optimizer=keras.optimizers.Adam(3e-3), sampler="greedy")
    else:
        assert loaded.iterations == 2


def test_the_export_answers_what_the_task_answers(translator, tmp_path):
    texts = RAW + ["", " \t "]  # no token: "" on both paths
    path = translator.export(str(tmp_path / "saved"), beam_size=3)
    served = tf.saved_model.load(path)
    out = served.signatures["translate"](text=tf.constant(texts))
    assert [t.decode() for t in out["translation"].numpy()] == translator.translate(
        texts, sampler=ka.decoding.Beam(3))
    greedy = served.signatures["translate_with_settings"](
        text=tf.constant(texts), beam_size=tf.constant(1))
    assert [t.decode() for t in greedy["translation"].numpy()] == translator.translate(texts)


@pytest.mark.parametrize("kind", ["at", "nat"])
def test_a_source_without_tokens_translates_to_the_empty_string(translator, nat, kind):
    task = translator if kind == "at" else nat
    assert task.translate("") == "" and task.translate(" \t\n") == ""
    texts = task.translate(["", RAW[0], "  "])
    assert texts[0] == texts[2] == "" and texts[1] == task.translate(RAW[0]) != ""


def test_sentencepiece_vocabularies_survive_the_config(tmp_path):
    from keras_attn.data.subwords import SentencePieceVectorizer, learn_sentencepiece

    texts = ["the cat sat", "the cats sat down", "a dog ran", "the dogs ran down"] * 25
    pieces = SentencePieceVectorizer(learn_sentencepiece(texts, vocab_size=30), 6)
    preprocessor = Seq2SeqLMPreprocessor(pieces, pieces, word_start="▁")
    copy = Seq2SeqLMPreprocessor.from_config(preprocessor.get_config())
    for a, b in zip(tf.nest.flatten(preprocessor(["the dogs sat"], ["a cat ran"])),
                    tf.nest.flatten(copy(["the dogs sat"], ["a cat ran"]))):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    ids = copy.encode_source(["the dogs sat"]).numpy()
    assert copy.decode(ids) == ["the dogs sat"]


@pytest.mark.parametrize("call,match", [
    (lambda t, d: Seq2SeqLM(ka.models.causal_lm(50, **SIZES)), "backbone"),
    (lambda t, d: Seq2SeqLM(t.backbone, "not a preprocessor"), "preprocessor"),
    (lambda t, d: t.fit(RAW, epochs=1, verbose=0), "targets"),
    (lambda t, d: t.fit(RAW, TARGETS[:2], epochs=1, verbose=0), "one target per source"),
    (lambda t, d: t.translate(RAW, iterations=3), "iterations"),
    (lambda t, d: t.translate([[1, 2]]), "texts"),
    (lambda t, d: t.generate(RAW, max_length=0), "max_length"),
    (lambda t, d: t.export("unused", length_beam=2), "length_beam"),
])
def test_what_cannot_be_honoured_is_named(translator, data, call, match):
    with pytest.raises(ValueError, match=match):
        call(translator, data)


def test_a_nat_takes_no_sampler(nat):
    with pytest.raises(ValueError, match="sampler"):
        nat.translate(RAW, sampler="greedy")
    with pytest.raises(ValueError, match="sampler"):
        nat.compile(sampler=ka.decoding.Beam(2))
    with pytest.raises(ValueError, match="beam_size"):
        nat.export("unused", beam_size=2)


def test_vectorizers_that_cannot_translate_are_refused(data):
    counts = keras.layers.TextVectorization(output_mode="count")
    counts.adapt(["a b"])
    with pytest.raises(ValueError, match="source_vectorizer"):
        Seq2SeqLMPreprocessor(counts, data.target_vectorizer)
    plain = keras.layers.TextVectorization(output_sequence_length=4)
    plain.adapt(["a b c"])
    with pytest.raises(ValueError, match="reserved tokens"):
        Seq2SeqLMPreprocessor(data.source_vectorizer, plain)


def test_a_task_is_compiled_when_made_unless_told_not(translator):
    made = Seq2SeqLM(translator.backbone, translator.preprocessor)
    assert made.compiled and isinstance(made.optimizer, keras.optimizers.Adam)
    assert not Seq2SeqLM(translator.backbone, compile=False).compiled
    with pytest.raises(ValueError, match="compile"):
        Seq2SeqLM(translator.backbone, compile="yes")
