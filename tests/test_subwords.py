"""Subword vocabularies (SentencePiece learned from the training split, applied in a graph) and
the whitespace every standardization treats as nothing."""

import sys

import numpy as np
import pytest
import tensorflow as tf
from translation_fixtures import write_pairs_file

from keras_attn.data import dates, pairs
from keras_attn.data.subwords import (
    WORD_START,
    SentencePieceVectorizer,
    detokenize,
    detokenize_tf,
    learn_sentencepiece,
)
from keras_attn.data.translation import WHITESPACE
from keras_attn.tokens import BOS_ID, EOS_ID, PAD_ID, RESERVED_TOKENS, UNK_ID

TEXTS = ["the cat sat", "the cats sat down", "a dog sat", "the dogs ran", "cats ran down"] * 20


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory):
    return str(write_pairs_file(tmp_path_factory.mktemp("pairs") / "fra.txt"))


@pytest.fixture(scope="module")
def subword_data(pairs_file):
    return pairs.load_tatoeba(pairs_file, test_fraction=0.25, tokenizer="sentencepiece",
                              vocab_size=40, verbose=0)


def test_whitespace_is_every_character_python_calls_whitespace():
    every = {chr(code) for code in range(sys.maxunicode + 1) if chr(code).isspace()}
    assert set(WHITESPACE) == every and len(WHITESPACE) == len(every) == 29
    assert {"\u00a0", "\u3000", "\u2003", "\u202f", "\u2028", "\x85"} <= every


@pytest.mark.parametrize("standardize, standardize_tf", [
    (pairs.preprocess, pairs.preprocess_tf), (dates.to_tokens, dates.to_tokens_tf)])
def test_unicode_whitespace_standardizes_to_nothing_or_one_space(standardize, standardize_tf):
    texts = list(WHITESPACE) + [WHITESPACE, " \u3000\u00a0 "]
    assert [standardize(t) for t in texts] == [""] * len(texts)
    assert standardize_tf(tf.constant(texts)).numpy().tolist() == [b""] * len(texts)
    spaced = ["i\u3000ran\u2003now\u00a0.", "3\u20093\u300021"]
    expected = [standardize(t) for t in ["i ran now .", "3 3 21"]]
    assert [standardize(t) for t in spaced] == expected
    assert [t.decode() for t in standardize_tf(tf.constant(spaced)).numpy()] == expected


def test_learning_is_deterministic_and_keeps_keras_attns_reserved_ids():
    model = learn_sentencepiece(TEXTS, 30)
    assert learn_sentencepiece(list(TEXTS), 30) == model
    assert learn_sentencepiece(TEXTS, 20, model_type="unigram") != learn_sentencepiece(TEXTS, 20)
    vocabulary = SentencePieceVectorizer(model, 8).get_vocabulary()
    assert vocabulary[:4] == list(RESERVED_TOKENS) and len(vocabulary) == 30
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert len(set(vocabulary)) == 30 and all(piece for piece in vocabulary[4:])
    # Every character of the texts is a piece (character coverage 1): nothing is unknown.
    assert {c for text in TEXTS for c in text.replace(" ", "")} <= {
        c for piece in vocabulary[4:] for c in piece}


def test_vectorizer_pads_truncates_counts_and_reads_back():
    vectorizer = SentencePieceVectorizer(learn_sentencepiece(TEXTS, 30), 4)
    vocabulary = vectorizer.get_vocabulary()
    texts = ["the cats sat down", "a", "", "the dogs ran " * 3]
    counts = vectorizer.count_tokens(tf.constant(texts)).numpy()
    ids = vectorizer(tf.constant(texts)).numpy()
    assert ids.shape == (4, 4) and ids.dtype == np.int32
    assert counts[2] == 0 and counts[3] > 4 and 0 < counts[1] <= 2
    for row, count, text in zip(ids, counts, texts):
        assert np.all(row[min(count, 4):] == PAD_ID) and np.all(row[:min(count, 4)] >= 4)
        if count <= 4:
            assert detokenize([vocabulary[i] for i in row[:count]]) == text
    # The pieces of a word: the first carries the word-start marker, the others do not.
    longer = SentencePieceVectorizer(vectorizer.model, 8)(tf.constant(texts[:1])).numpy()[0]
    pieces = [vocabulary[i] for i in longer[:counts[0]]]
    assert sum(piece.startswith(WORD_START) for piece in pieces) == 4 and len(pieces) > 4
    assert detokenize(pieces) == texts[0]
    # A character never seen in training is [UNK]; the known ones around it are not.
    unknown = vectorizer(tf.constant(["the zebra"])).numpy()[0]
    assert UNK_ID in unknown.tolist() and unknown[0] != UNK_ID
    copy = SentencePieceVectorizer.from_config(vectorizer.get_config())
    np.testing.assert_array_equal(copy(tf.constant(texts)).numpy(), ids)
    assert vectorizer.get_config()["output_sequence_length"] == 4


def test_vectorizer_survives_clear_session():
    """`keras.backend.clear_session()` destroys the op's model resource; the vectorizer makes
    it again instead of failing."""
    import keras

    vectorizer = SentencePieceVectorizer(learn_sentencepiece(TEXTS, 30), 6)
    before = vectorizer(tf.constant(TEXTS[:3])).numpy()
    keras.backend.clear_session()
    np.testing.assert_array_equal(vectorizer(tf.constant(TEXTS[:3])).numpy(), before)
    graph = tf.function(lambda texts: vectorizer(texts))
    keras.backend.clear_session()
    np.testing.assert_array_equal(graph(tf.constant(TEXTS[:3])).numpy(), before)


def test_vectorizer_runs_inside_a_graph_and_a_dataset():
    vectorizer = SentencePieceVectorizer(learn_sentencepiece(TEXTS, 30), 6)
    eager = vectorizer(tf.constant(TEXTS[:5])).numpy()
    graph = tf.function(lambda texts: vectorizer(texts))(tf.constant(TEXTS[:5])).numpy()
    mapped = next(iter(tf.data.Dataset.from_tensor_slices(TEXTS[:5]).batch(5).map(vectorizer)))
    np.testing.assert_array_equal(graph, eager)
    np.testing.assert_array_equal(mapped.numpy(), eager)


@pytest.mark.parametrize("pieces, words", [
    (["▁je", "▁sui", "s", "▁."], "je suis ."),
    (["s", "▁a"], "s a"),  # a first piece without a marker still reads as a word
    (["▁", "▁a", "[UNK]", "b"], "a[UNK]b"),
    ([], ""),
])
def test_detokenize_in_python_and_in_a_graph(pieces, words):
    assert detokenize(pieces) == words
    joined = tf.constant(["".join(pieces)])
    assert detokenize_tf(joined).numpy()[0].decode() == words


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="vocab_size"):
        learn_sentencepiece(TEXTS, 4)
    with pytest.raises(ValueError, match="vocab_size.*smaller"):
        learn_sentencepiece(["ab"], 5000)
    with pytest.raises(ValueError, match="model_type"):
        learn_sentencepiece(TEXTS, 30, model_type="wordpiece")
    with pytest.raises(ValueError, match="texts"):
        learn_sentencepiece(["", ""], 30)
    with pytest.raises(ValueError, match="model"):
        SentencePieceVectorizer("not bytes", 4)
    with pytest.raises(ValueError, match="model"):
        SentencePieceVectorizer(b"not a model", 4)
    with pytest.raises(ValueError, match="output_sequence_length"):
        SentencePieceVectorizer(learn_sentencepiece(TEXTS, 30), 0)


def test_subwords_keep_the_word_level_splits_and_read_back_every_target(pairs_file,
                                                                         subword_data):
    words = pairs.load_tatoeba(pairs_file, test_fraction=0.25, verbose=0)
    data = subword_data
    assert (data.test, data.validation) == (words.test, words.validation)
    assert data.train == words.train  # no training pair is too long in pieces here
    assert data.word_start == WORD_START and data.target_joiner == " "
    assert data.source_vocab_size == data.target_vocab_size == 40
    for split in (data.train, data.test):
        targets = [target for _, target in split]
        assert data.decode(data.encode_targets(targets)) == targets
    _, target_in, target_out = data.encode_pairs(data.train[:8])
    assert np.all(target_in[:, 0] == BOS_ID)
    # target_in is <bos> y, target_out is y <eos>
    np.testing.assert_array_equal(target_in[:, 1:], np.where(target_out == EOS_ID, PAD_ID,
                                                             target_out)[:, :-1])
    lengths = np.count_nonzero(target_out, axis=1)
    assert np.all(target_out[np.arange(8), lengths - 1] == EOS_ID)
    assert data.decode(target_out) == [target for _, target in data.train[:8]]
    # The sample data has "fatigué", "prêt", "occupé": words a word vocabulary keeps whole.
    assert data.unknown_rate([s for s, _ in data.test]) == 0.0
    assert words.unknown_rate(["i am zzz ."]) == 0.25
    assert data.unknown_rate(["i am zzz ."]) > 0  # z was never seen


def test_piece_lengths_come_from_the_training_pairs(pairs_file, subword_data):
    data = subword_data
    counts = [data.source_vectorizer.count_tokens(tf.constant([s for s, _ in data.train])),
              data.target_vectorizer.count_tokens(tf.constant([t for _, t in data.train]))]
    assert data.source_length == pairs.typical_length(counts[0].numpy().tolist())
    assert data.target_length == pairs.typical_length((counts[1].numpy() + 1).tolist())
    dataset = data.make_dataset("train", 16, group_by_length=True)
    batches = list(dataset)
    assert sum(int(x[0].shape[0]) for x, _ in batches) == len(data.train)


@pytest.mark.parametrize("kwargs, name", [
    ({"tokenizer": "bpe"}, "tokenizer"),
    ({"tokenizer": "sentencepiece"}, "vocab_size"),
    ({"tokenizer": "sentencepiece", "vocab_size": 40, "min_freq": 2}, "min_freq"),
    ({"vocab_size": 40}, "vocab_size"),
    ({"tokenizer": "sentencepiece", "vocab_size": 3}, "vocab_size"),
])
def test_tokenizer_options_that_do_not_go_together_are_refused(pairs_file, kwargs, name):
    with pytest.raises(ValueError, match=name):
        pairs.load_tatoeba(pairs_file, verbose=0, **kwargs)
