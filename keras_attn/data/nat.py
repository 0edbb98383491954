"""tf.data pipelines for conditional masked language models (Mask-Predict training).

Each target `y` (no `<bos>`, no `<eos>`) of `N` tokens gets a fresh random mask every time it
is seen in training (every epoch; held-out splits keep theirs): a number of masked tokens drawn uniformly from `1..N`, then that many
positions drawn uniformly without replacement, replaced by `<mask>`
(`keras_attn.tokens.mask_id(target_vocab_size)`). The token loss counts only those positions
(per-token sample weights), as in Ghazvininejad et al., 2019, https://arxiv.org/abs/1904.09324.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from keras_attn._checks import check_bool, check_int, check_positive_int
from keras_attn.data.translation import (
    Pair,
    TranslationData,
    batch_by_length,
    batch_length,
)
from keras_attn.tokens import PAD_ID, mask_id


def mask_targets(target_ids: tf.Tensor, seed: tf.Tensor, mask_token_id: int):
    """One example's CMLM masking.

    Args:
        target_ids: int32 `(T,)`, `N` tokens then padding (0).
        seed: int `(2,)`, a stateless random seed.
        mask_token_id: int, the `<mask>` id.

    Returns:
        `(masked_target_ids, masked)`: int32 `(T,)` with `k ~ U{1..N}` random token positions
        replaced by `mask_token_id`, and the float32 `(T,)` indicator of those positions (all
        zero when `N = 0`).
    """
    seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), 2)  # (2, 2)
    real = tf.not_equal(target_ids, PAD_ID)  # (T,)
    length = tf.reduce_sum(tf.cast(real, tf.int32))
    count = tf.random.stateless_uniform([], seeds[0], minval=1,
                                        maxval=tf.maximum(length, 1) + 1, dtype=tf.int32)
    noise = tf.random.stateless_uniform(tf.shape(target_ids), seeds[1])  # (T,) in [0, 1)
    noise = tf.where(real, noise, 2.0)  # padding ranks last
    rank = tf.argsort(tf.argsort(noise))  # (T,) rank of each position's noise
    masked = tf.logical_and(real, rank < count)
    return (tf.where(masked, tf.constant(mask_token_id, tf.int32), target_ids),
            tf.cast(masked, tf.float32))


def cmlm_example(source_ids: tf.Tensor, target_ids: tf.Tensor, seed: tf.Tensor,
                 mask_token_id: int):
    """One training example of a CMLM, as `make_cmlm_dataset` gives it (unbatched):
    `((source_ids, masked_target_ids), (target_ids, length), (token_weights, 1.0))`, with the
    masks of `mask_targets(target_ids, seed, mask_token_id)` and `length` the number of target
    tokens."""
    masked_target, weights = mask_targets(target_ids, seed, mask_token_id)
    length = tf.reduce_sum(tf.cast(tf.not_equal(target_ids, PAD_ID), tf.int32))
    return (source_ids, masked_target), (target_ids, length), (weights, tf.constant(1.0))


def make_cmlm_dataset(
    data: TranslationData,
    split_or_pairs: str | Sequence[Pair],
    batch_size: int = 64,
    shuffle: bool = False,
    seed: int | None = 0,
    drop_remainder: bool = False,
    group_by_length: bool = False,
) -> tf.data.Dataset:
    """A batched dataset for `model.fit` of a `keras_attn.models.nat_seq2seq` model.

    Targets are encoded with `data.target_vectorizer` as the plain tokens `y` padded to
    `data.target_length` (build the model with `max_target_length=data.target_length`), and
    masked afresh on every pass when `shuffle` (training), with the same masks on every pass
    otherwise (see the module docstring); the random masks depend only on `seed`.

    Args:
        data: a `TranslationData`.
        split_or_pairs: `"train"`, `"validation"`, `"test"`, or a list of `(source, target)`
            token strings.
        batch_size: int. Defaults to `64`.
        shuffle: bool, shuffle the examples (reshuffled every epoch). Defaults to `False`.
        seed: optional int, seed of the shuffle and of the masks. Defaults to `0`.
        drop_remainder: bool, drop the last incomplete batch. Defaults to `False`.
        group_by_length: bool, batch examples of the same length (the longer of source and
            target, in tokens) and cut every batch to its longest source and target, as
            `TranslationData.make_dataset(group_by_length=True)` does: `Ls`, `Lt` below become
            the batch's own lengths (`Lt` at most the model's `max_target_length`, which the
            length classes keep). Defaults to `False`.

    Returns:
        A dataset of `((source_ids, masked_target_ids), (target_ids, length),
        (token_weights, length_weights))`: int32 `(B, Ls)`, `(B, Lt)`, `(B, Lt)`, `(B,)` and
        float32 `(B, Lt)` (1 at the masked positions, else 0), `(B,)` (ones). `length` is the
        number of target tokens. With `compile_cmlm` the token loss is the mean over the
        masked positions only.

    Example:
    >>> data = load_dates_translation(num_examples=1000)
    >>> (src, masked), (tgt, length), (w, _) = next(iter(make_cmlm_dataset(data, "train", 8)))
    >>> src.shape, masked.shape, length.shape  # (8, 11), (8, 11), (8,)
    """
    split_or_pairs = data.pairs_of(split_or_pairs, "split_or_pairs")
    check_positive_int("batch_size", batch_size)
    check_int("seed", seed, 0, allow_none=True)
    check_bool("shuffle", shuffle)
    check_bool("drop_remainder", drop_remainder)
    check_bool("group_by_length", group_by_length)
    sources = data.encode_source([s for s, _ in split_or_pairs], standardize=False)  # (N, Ls)
    targets = data.encode_targets([t for _, t in split_or_pairs])  # (N, Lt)
    token_mask_id = mask_id(data.target_vocab_size)

    dataset = tf.data.Dataset.from_tensor_slices((sources, targets))
    if shuffle and len(sources) > 0:
        dataset = dataset.shuffle(len(sources), seed=seed, reshuffle_each_iteration=True)
    # One fresh stateless seed per example and pass (epoch) when shuffling (training); the
    # same masks on every pass otherwise, so that a validation loss is comparable across epochs.
    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=shuffle).batch(2)

    def example(pair, example_seed):
        return cmlm_example(*pair, example_seed, token_mask_id)

    dataset = tf.data.Dataset.zip((dataset, seeds)).map(
        example, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if not group_by_length:
        dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)
        return dataset.prefetch(tf.data.AUTOTUNE)

    def length_of(inputs, targets, weights):
        return tf.maximum(tf.math.count_nonzero(inputs[0]), tf.cast(targets[1], tf.int64))

    def cut(inputs, targets, weights):
        (source, masked), (target, length), (token_weights, length_weights) = (
            inputs, targets, weights)
        source_length, target_length = batch_length(source), batch_length(target)
        return ((source[:, :source_length], masked[:, :target_length]),
                (target[:, :target_length], length),
                (token_weights[:, :target_length], length_weights))

    lengths = np.maximum(np.count_nonzero(sources, axis=1), np.count_nonzero(targets, axis=1))
    dataset = batch_by_length(dataset, length_of, lengths, batch_size, drop_remainder)
    return dataset.map(cut, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
