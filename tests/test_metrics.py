"""Tests of keras_attn.metrics against references written straight from the formulas."""

import collections
import math

import keras
import numpy as np
import pytest
from backend_utils import assert_allclose, dtype_of

from keras_attn import metrics

# ---------------------------------------------------------------- BLEU


def d2l_bleu(pred_seq, label_seq, k):
    """d2l's loop, verbatim in spirit: matches found by decrementing label n-gram counts."""
    pred_tokens, label_tokens = pred_seq.split(" "), label_seq.split(" ")
    len_pred, len_label = len(pred_tokens), len(label_tokens)
    score = math.exp(min(0, 1 - len_label / len_pred))
    for n in range(1, min(k, len_pred) + 1):
        num_matches, label_subs = 0, collections.defaultdict(int)
        for i in range(len_label - n + 1):
            label_subs[" ".join(label_tokens[i : i + n])] += 1
        for i in range(len_pred - n + 1):
            if label_subs[" ".join(pred_tokens[i : i + n])] > 0:
                num_matches += 1
                label_subs[" ".join(pred_tokens[i : i + n])] -= 1
        score *= math.pow(num_matches / (len_pred - n + 1), math.pow(0.5, n))
    return score


@pytest.mark.parametrize(
    "pred, label",
    [
        ("il est riche .", "il est calme ."),
        ("je suis en retard ?", "je suis chez moi ."),
        ("a b a b a", "a b a"),
        ("a a a", "a b a c a a"),
        ("x", "a b c"),
        ("le chat le chat le chat .", "le chat est sur le tapis ."),
    ],
)
def test_bleu_matches_d2l_loop(pred, label):
    assert metrics.bleu(pred, label, k=4) == pytest.approx(
        d2l_bleu(pred, label, 4), rel=1e-12
    )
    assert metrics.bleu(pred.split(), label.split(), k=2) == pytest.approx(
        d2l_bleu(pred, label, 2)
    )


def test_bleu_hand_values():
    assert metrics.bleu("va !", "va !") == 1.0
    assert metrics.bleu(["a", "b", "c", "d"], "a b c d e") == pytest.approx(
        math.exp(-0.25)
    )
    # p1 = 3/4, p2 = 1/3, p3 = 0 -> 0
    assert metrics.bleu("il est riche .", "il est calme .") == 0.0
    # k=2: (3/4)^(1/2) * (1/3)^(1/4)
    assert metrics.bleu("il est riche .", "il est calme .", k=2) == pytest.approx(
        0.75**0.5 * (1 / 3) ** 0.25
    )
    assert metrics.bleu("", "a b") == 0.0 and metrics.bleu([], ["a"]) == 0.0


def reference_corpus_bleu(predictions, references, max_n=4):
    """Papineni's corpus BLEU, written independently with lists of n-grams."""
    matches, totals, c, r = [0] * max_n, [0] * max_n, 0, 0
    for pred, ref in zip(predictions, references):
        pred, ref = pred.split(), ref.split()
        c, r = c + len(pred), r + len(ref)
        for n in range(1, max_n + 1):
            pred_grams = [tuple(pred[i : i + n]) for i in range(len(pred) - n + 1)]
            ref_grams = [tuple(ref[i : i + n]) for i in range(len(ref) - n + 1)]
            totals[n - 1] += len(pred_grams)
            for gram in set(pred_grams):
                matches[n - 1] += min(pred_grams.count(gram), ref_grams.count(gram))
    if c == 0 or 0 in matches:
        return 0.0
    precisions = np.array(matches) / np.array(totals)
    bp = 1.0 if c > r else math.exp(1 - r / c)
    return bp * float(np.prod(precisions ** (1.0 / max_n)))


CORPUS = (
    [
        "the cat sat on the mat",
        "there is a cat on the mat",
        "a b c d e f g",
        "le chat est sur le tapis",
    ],
    [
        "the cat is on the mat",
        "there is a cat on the mat",
        "a b c d x f g h i",
        "le chat dort sur le tapis",
    ],
)


@pytest.mark.parametrize("max_n", [1, 2, 3, 4])
def test_corpus_bleu_matches_reference(max_n):
    predictions, references = CORPUS
    expected = reference_corpus_bleu(predictions, references, max_n)
    assert 0 < expected < 1
    assert metrics.corpus_bleu(predictions, references, max_n) == pytest.approx(
        expected, rel=1e-12
    )
    assert metrics.corpus_bleu(
        [p.split() for p in predictions], [r.split() for r in references], max_n
    ) == pytest.approx(expected)


def test_corpus_bleu_hand_values():
    # p1 = 5/6, p2 = 3/5, p3 = 1/4, same length: (1/8)^(1/3) = 0.5; no matching 4-gram -> 0.
    pred, ref = ["the cat sat on the mat"], ["the cat is on the mat"]
    assert metrics.corpus_bleu(pred, ref, max_n=3) == pytest.approx(0.5)
    assert metrics.corpus_bleu(pred, ref) == 0.0
    assert metrics.corpus_bleu(CORPUS[1], CORPUS[1]) == pytest.approx(1.0)
    # Brevity penalty on the corpus lengths: 4 predicted tokens against 8.
    assert metrics.corpus_bleu(
        ["a b", "c d"], ["a b x y", "c d z w"], max_n=2
    ) == pytest.approx(math.exp(1 - 8 / 4))
    with pytest.raises(ValueError, match="predictions"):
        metrics.corpus_bleu(["a"], [])


def test_corpus_bleu_agrees_with_nltk_when_available():
    bleu_score = pytest.importorskip("nltk.translate.bleu_score")
    predictions, references = CORPUS
    expected = bleu_score.corpus_bleu(
        [[r.split()] for r in references], [p.split() for p in predictions]
    )
    assert metrics.corpus_bleu(predictions, references) == pytest.approx(expected)


def test_exact_match():
    assert (
        metrics.exact_match(["2021-03-03", "1999-01-01"], ["2021-03-03", "1999-01-02"])
        == 0.5
    )
    assert metrics.exact_match([], []) == 0.0
    with pytest.raises(ValueError, match="references"):
        metrics.exact_match(["a"], ["a", "b"])


# ---------------------------------------------------------------- masked loss and accuracy


def _batch(seed=0, batch=3, length=5, vocab=7):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(batch, length, vocab)).astype(np.float32) * 3
    y_true = rng.integers(1, vocab, size=(batch, length))
    y_true[0, 3:] = 0
    y_true[1, 1:] = 0
    return y_true, logits


def numpy_masked_loss(y_true, logits):
    logits = logits.astype(np.float64)
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, y_true[..., None], axis=-1)[..., 0]
    mask = y_true != 0
    return nll[mask].mean()


def numpy_masked_accuracy(y_true, logits):
    mask = y_true != 0
    return (logits.argmax(-1) == y_true)[mask].mean()


def test_masked_loss_matches_numpy_and_ignores_padding():
    y_true, logits = _batch()
    expected = numpy_masked_loss(y_true, logits)
    loss = metrics.masked_sparse_categorical_crossentropy(y_true, logits)
    assert_allclose(keras.ops.convert_to_numpy(loss), expected, rtol=1e-5)
    assert_allclose(
        keras.ops.convert_to_numpy(metrics.MaskedSequenceLoss()(y_true, logits)),
        expected,
        rtol=1e-5,
    )
    changed = logits.copy()
    changed[y_true == 0] = 100.0  # padding positions may hold anything
    assert_allclose(
        keras.ops.convert_to_numpy(
            metrics.masked_sparse_categorical_crossentropy(y_true, changed)
        ),
        expected,
        rtol=1e-5,
    )
    all_padding = metrics.masked_sparse_categorical_crossentropy(
        np.zeros((2, 3), int), logits[:2, :3]
    )
    assert float(all_padding) == 0.0


@pytest.mark.parametrize("smoothing", [0.1, 0.3])
def test_label_smoothing_matches_the_smoothed_target_cross_entropy(smoothing):
    y_true, logits = _batch()
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    vocab = logits.shape[-1]
    target = np.full(logits.shape, smoothing / vocab)  # (1 - e) one-hot + e uniform
    rows, cols = np.indices(y_true.shape)
    target[rows, cols, y_true] += 1.0 - smoothing
    per_token = -(target * log_p).sum(-1)
    mask = y_true != 0
    expected = per_token[mask].mean()
    loss = metrics.MaskedSequenceLoss(label_smoothing=smoothing)
    assert_allclose(keras.ops.convert_to_numpy(loss(y_true, logits)), expected, rtol=1e-5)
    unsmoothed = keras.ops.convert_to_numpy(metrics.MaskedSequenceLoss()(y_true, logits))
    assert abs(float(unsmoothed) - expected) > 1e-3  # smoothing changes the value
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(loss))
    assert restored.label_smoothing == smoothing


@pytest.mark.parametrize("smoothing", [-0.1, 1.0, "a lot", None])
def test_label_smoothing_out_of_range_names_the_argument(smoothing):
    with pytest.raises(ValueError, match="label_smoothing"):
        metrics.MaskedSequenceLoss(label_smoothing=smoothing)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_masked_loss_half_precision_logits(dtype):
    y_true, logits = _batch()
    # Large but finite logits (float16 ends at 65504) overflow float16 softmax sums.
    half = keras.ops.cast(np.clip(logits * 1e4, -6e4, 6e4), dtype)
    loss = metrics.masked_sparse_categorical_crossentropy(y_true, half)
    assert dtype_of(loss) == "float32" and np.isfinite(float(loss))
    expected = numpy_masked_loss(
        y_true, keras.ops.convert_to_numpy(keras.ops.cast(half, "float32"))
    )
    assert_allclose(float(loss), expected, rtol=1e-4)
    assert dtype_of(metrics.MaskedSequenceLoss()(y_true, half)) == "float32"


def test_masked_accuracy_function_and_streaming_metric():
    y_true, logits = _batch(seed=1)
    y_true[2, 0] = logits[2, 0].argmax()  # at least one hit
    expected = numpy_masked_accuracy(y_true, logits)
    assert float(metrics.masked_accuracy(y_true, logits)) == pytest.approx(expected)
    metric = metrics.MaskedAccuracy()
    y_true2, logits2 = _batch(seed=2, batch=2)
    y_true2[:, :] = logits2.argmax(-1)  # all correct where not padding
    y_true2[0, 2:] = 0
    metric.update_state(y_true, logits)
    metric.update_state(y_true2, logits2)
    mask, mask2 = y_true != 0, y_true2 != 0
    hits = (logits.argmax(-1) == y_true)[mask].sum() + (logits2.argmax(-1) == y_true2)[
        mask2
    ].sum()
    assert float(metric.result()) == pytest.approx(hits / (mask.sum() + mask2.sum()))
    metric.reset_state()
    assert float(metric.result()) == 0.0


def _tiny_model(mask_zero):
    inputs = keras.Input((5,), dtype="int32")
    x = keras.layers.Embedding(7, 8, mask_zero=mask_zero)(inputs)
    return keras.Model(inputs, keras.layers.Dense(7)(x))


@pytest.mark.parametrize("mask_zero", [False, True])
def test_compile_fit_evaluate_and_save(tmp_path, mask_zero):
    keras.utils.set_random_seed(0)
    y_true, _ = _batch()
    x = y_true.copy()
    model = _tiny_model(mask_zero)
    model.compile(
        optimizer="adam",
        loss=metrics.masked_sparse_categorical_crossentropy,
        # The scalar-valued function cannot take Keras' per-token mask weights; the class can.
        metrics=[metrics.MaskedAccuracy()]
        + ([] if mask_zero else [metrics.masked_accuracy]),
    )
    model.fit(x, y_true, batch_size=3, epochs=1, verbose=0)
    logits = model.predict(x, verbose=0)
    results = model.evaluate(x, y_true, batch_size=3, verbose=0, return_dict=True)
    # A propagated Keras mask (mask_zero=True) must not change the token mean.
    assert results["loss"] == pytest.approx(numpy_masked_loss(y_true, logits), rel=1e-4)
    assert results["masked_accuracy"] == pytest.approx(
        numpy_masked_accuracy(y_true, logits)
    )
    path = str(tmp_path / "model.keras")
    model.save(path)
    restored = keras.saving.load_model(path, safe_mode=True)
    assert_allclose(restored.predict(x, verbose=0), logits, rtol=1e-6)
    again = restored.evaluate(x, y_true, batch_size=3, verbose=0, return_dict=True)
    assert again["loss"] == pytest.approx(results["loss"], rel=1e-5)


def test_loss_and_metric_serialize():
    for obj in (metrics.MaskedSequenceLoss(), metrics.MaskedAccuracy()):
        restored = keras.saving.deserialize_keras_object(
            keras.saving.serialize_keras_object(obj)
        )
        assert type(restored) is type(obj) and restored.name == obj.name
    fn = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(
            metrics.masked_sparse_categorical_crossentropy
        )
    )
    assert fn is metrics.masked_sparse_categorical_crossentropy
