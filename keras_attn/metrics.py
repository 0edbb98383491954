"""Translation scores (BLEU, exact match) and the masked sequence loss and accuracy.

`keras_attn.tokens.PAD_ID` (0) is padding everywhere: the loss and the accuracy average over the
positions where `y_true != PAD_ID` only.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence

import keras
from keras import ops

from keras_attn._checks import as_rate
from keras_attn.tokens import PAD_ID  # re-exported: `keras_attn.metrics.PAD_ID` stays


def _tokens(sequence: str | Sequence[str]) -> list[str]:
    return sequence.split() if isinstance(sequence, str) else list(sequence)


def _ngrams(tokens: list[str], n: int) -> collections.Counter:
    return collections.Counter(
        tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)
    )


def bleu(
    pred_tokens: str | Sequence[str], label_tokens: str | Sequence[str], k: int = 4
) -> float:
    """Per-sentence BLEU as defined in d2l (section 10.7).

    score = exp(min(0, 1 - len_label / len_pred)) * prod_{n=1..min(k, len_pred)} p_n^(1/2^n),
    where p_n is the number of predicted n-grams matched in the label (each label n-gram used at
    most as often as it occurs) divided by the number of predicted n-grams.

    Args:
        pred_tokens: predicted tokens, a list or a whitespace-separated string.
        label_tokens: reference tokens, a list or a whitespace-separated string.
        k: int, longest n-gram. Defaults to `4`.

    Returns:
        float in [0, 1]; 1.0 for a perfect match, 0.0 for an empty prediction.

    Example:
    >>> bleu("il fait froid .", "il fait froid .")
    1.0
    """
    pred, label = _tokens(pred_tokens), _tokens(label_tokens)
    if k <= 0:
        raise ValueError(f"Argument `k` must be a positive integer. Received: k={k!r}")
    if not pred:
        return 0.0
    score = math.exp(min(0.0, 1.0 - len(label) / len(pred)))
    for n in range(1, min(k, len(pred)) + 1):
        pred_counts, label_counts = _ngrams(pred, n), _ngrams(label, n)
        matches = sum(
            min(count, label_counts[gram]) for gram, count in pred_counts.items()
        )
        score *= (matches / (len(pred) - n + 1)) ** (0.5**n)
    return score


def corpus_bleu(
    predictions: Sequence[str | Sequence[str]],
    references: Sequence[str | Sequence[str]],
    max_n: int = 4,
) -> float:
    """Corpus BLEU (Papineni et al., 2002) with one reference per prediction, no smoothing.

    Clipped n-gram matches and predicted n-gram counts are summed over the whole corpus before
    dividing, the precisions p_1..p_max_n are combined by a geometric mean with uniform weights,
    and the brevity penalty uses the total lengths c (predictions) and r (references):
    BLEU = min(1, exp(1 - r / c)) * exp(sum_n log(p_n) / max_n). Without smoothing, a corpus
    with any zero precision scores 0.0 (as `nltk.translate.bleu_score.corpus_bleu` does).

    Args:
        predictions: list of predictions, each a token list or a whitespace-separated string.
        references: list of references, same length and form as `predictions`.
        max_n: int, longest n-gram. Defaults to `4`.

    Returns:
        float in [0, 1].

    References:
        - [Papineni et al., 2002](https://aclanthology.org/P02-1040/)
    """
    if len(predictions) != len(references):
        raise ValueError(
            "Arguments `predictions` and `references` must have the same length. Received: "
            f"len(predictions)={len(predictions)}, len(references)={len(references)}"
        )
    if max_n <= 0:
        raise ValueError(
            f"Argument `max_n` must be a positive integer. Received: max_n={max_n!r}"
        )
    matches, totals = [0] * max_n, [0] * max_n
    pred_length = ref_length = 0
    for prediction, reference in zip(predictions, references):
        pred, ref = _tokens(prediction), _tokens(reference)
        pred_length += len(pred)
        ref_length += len(ref)
        for n in range(1, max_n + 1):
            pred_counts, ref_counts = _ngrams(pred, n), _ngrams(ref, n)
            matches[n - 1] += sum(
                min(c, ref_counts[gram]) for gram, c in pred_counts.items()
            )
            totals[n - 1] += max(len(pred) - n + 1, 0)
    if pred_length == 0 or min(matches) == 0:
        return 0.0
    log_precision = sum(math.log(m / t) for m, t in zip(matches, totals)) / max_n
    brevity = min(0.0, 1.0 - ref_length / pred_length)
    return math.exp(brevity + log_precision)


def exact_match(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Fraction of predictions equal to their reference (string equality).

    Args:
        predictions: list of str.
        references: list of str, same length.

    Returns:
        float in [0, 1]; 0.0 for empty lists.
    """
    if len(predictions) != len(references):
        raise ValueError(
            "Arguments `predictions` and `references` must have the same length. Received: "
            f"len(predictions)={len(predictions)}, len(references)={len(references)}"
        )
    if not predictions:
        return 0.0
    return sum(p == r for p, r in zip(predictions, references)) / len(predictions)


@keras.saving.register_keras_serializable(package="keras_attn")
def masked_sparse_categorical_crossentropy(y_true, y_pred):
    """Mean cross-entropy over the non-padding tokens of a batch (`PAD_ID` is padding).

    The logits are cast to float32 first, so mixed precision (float16/bfloat16 logits) is safe.
    A batch made only of padding gives 0.

    Args:
        y_true: integer tensor `(batch_size, seq_len)` of target ids.
        y_pred: logits `(batch_size, seq_len, vocab_size)`.

    Returns:
        float32 scalar: sum of the per-token losses where `y_true != PAD_ID`, divided by their
        count.

    Example:
    >>> model.compile(optimizer="adam", loss=masked_sparse_categorical_crossentropy)
    """
    y_true = ops.cast(y_true, "int32")
    y_pred = ops.cast(y_pred, "float32")
    losses = ops.sparse_categorical_crossentropy(
        y_true, y_pred, from_logits=True
    )  # (B, T)
    mask = ops.cast(ops.not_equal(y_true, PAD_ID), "float32")
    return ops.divide_no_nan(ops.sum(losses * mask), ops.sum(mask))


@keras.saving.register_keras_serializable(package="keras_attn")
class MaskedSequenceLoss(keras.losses.Loss):
    """`masked_sparse_categorical_crossentropy` as a `keras.losses.Loss`, with label smoothing.

    `call` gives one value per sequence, its share of the token mean (its summed token losses
    times `B / tokens in the batch`), so that Keras' `"sum_over_batch_size"` reduction gives
    the token mean and, under `tf.distribute`, divides by the number of replicas as it does
    for every per-example loss (a scalar here would be summed over the replicas instead).

    With `label_smoothing = e`, each token's loss is `(1 - e) * (-log p[y]) + e * mean_v
    (-log p[v])`: the cross-entropy against a target that puts `e` of its mass uniformly over
    the vocabulary (Szegedy et al., 2016), as `keras.losses.CategoricalCrossentropy` does.

    Args:
        label_smoothing: float in [0, 1), the mass moved to the uniform distribution.
            Defaults to `0.0`.
        name: str. Defaults to `"masked_sequence_loss"`.
        reduction: see `keras.losses.Loss`. Defaults to `"sum_over_batch_size"`.

    Example:
    >>> model.compile(optimizer="adam", loss=MaskedSequenceLoss(label_smoothing=0.1),
    ...               metrics=[MaskedAccuracy()])
    """

    def __init__(
        self,
        label_smoothing: float = 0.0,
        name: str = "masked_sequence_loss",
        reduction="sum_over_batch_size",
        **kwargs,
    ):
        label_smoothing = as_rate("label_smoothing", label_smoothing)
        # float32 whatever the global policy: the loss is never computed in half precision.
        kwargs.pop("dtype", None)
        super().__init__(name=name, reduction=reduction, dtype="float32", **kwargs)
        self.label_smoothing = label_smoothing

    def call(self, y_true, y_pred):
        y_true = ops.cast(y_true, "int32")
        logits = ops.cast(y_pred, "float32")
        if self.label_smoothing:  # one log-softmax for both terms
            log_probs = ops.log_softmax(logits, axis=-1)  # (B, T, V)
            picked = -ops.take_along_axis(
                log_probs, ops.expand_dims(ops.maximum(y_true, 0), -1), axis=-1)[..., 0]
            uniform = -ops.mean(log_probs, axis=-1)  # (B, T)
            losses = (1.0 - self.label_smoothing) * picked + self.label_smoothing * uniform
        else:
            losses = ops.sparse_categorical_crossentropy(
                y_true, logits, from_logits=True)  # (B, T)
        mask = ops.cast(ops.not_equal(y_true, PAD_ID), "float32")
        per_sequence = ops.sum(losses * mask, axis=-1)  # (B,)
        batch = ops.cast(ops.shape(y_true)[0], "float32")
        return ops.divide_no_nan(per_sequence * batch, ops.sum(mask))  # mean = token mean

    def get_config(self):
        return {**super().get_config(), "label_smoothing": self.label_smoothing}


@keras.saving.register_keras_serializable(package="keras_attn")
def masked_accuracy(y_true, y_pred):
    """Token accuracy over the non-padding positions of a batch (`PAD_ID` is padding).

    For direct calls. In `compile(metrics=[...])` prefer `MaskedAccuracy()`: Keras would average
    this function's per-batch values (not per token), and it cannot combine a scalar with the
    per-token weights it derives from a Keras mask (`Embedding(mask_zero=True)` upstream), which
    raises an error.

    Args:
        y_true: integer tensor `(batch_size, seq_len)` of target ids.
        y_pred: logits or probabilities `(batch_size, seq_len, vocab_size)`.

    Returns:
        float32 scalar in [0, 1] (0 when all is padding).
    """
    correct, count = _masked_counts(y_true, y_pred, None)
    return ops.divide_no_nan(correct, count)


def _masked_counts(y_true, y_pred, sample_weight):
    y_true = ops.cast(y_true, "int32")
    predicted = ops.cast(ops.argmax(y_pred, axis=-1), "int32")  # (B, T)
    mask = ops.cast(ops.not_equal(y_true, PAD_ID), "float32")
    if sample_weight is not None:
        sample_weight = ops.cast(sample_weight, "float32")
        if len(sample_weight.shape) == 1:
            sample_weight = ops.expand_dims(sample_weight, -1)  # (B, 1)
        mask = mask * sample_weight
    hits = ops.cast(ops.equal(predicted, y_true), "float32")
    return ops.sum(hits * mask), ops.sum(mask)


@keras.saving.register_keras_serializable(package="keras_attn")
class MaskedAccuracy(keras.metrics.Metric):
    """Streaming token accuracy over non-padding positions (`PAD_ID` is padding).

    Counts correct and non-padding tokens over all batches, so the result is exact per token.

    Args:
        name: str. Defaults to `"masked_accuracy"`.

    Call arguments (`update_state`):
        y_true: integer tensor `(batch_size, seq_len)`.
        y_pred: logits `(batch_size, seq_len, vocab_size)`.
        sample_weight: optional weights `(batch_size,)` or `(batch_size, seq_len)`.

    Example:
    >>> model.compile(optimizer="adam", loss=MaskedSequenceLoss(), metrics=[MaskedAccuracy()])
    """

    def __init__(self, name: str = "masked_accuracy", **kwargs):
        kwargs.setdefault("dtype", "float32")
        super().__init__(name=name, **kwargs)
        self.correct = self.add_variable(shape=(), initializer="zeros", name="correct")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        correct, count = _masked_counts(y_true, y_pred, sample_weight)
        self.correct.assign(self.correct + correct)
        self.count.assign(self.count + count)

    def result(self):
        return ops.divide_no_nan(self.correct, self.count)

    def reset_state(self):
        self.correct.assign(0.0)
        self.count.assign(0.0)
