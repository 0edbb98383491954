"""Ragged tensors of the tokenizers built with a few dense ops: `tf.ragged.boolean_mask`,
`merge_dims`, `tf.concat` and a gather of ragged rows trace to dozens of ops each, which the
first call of a tokenizer pays for (tracing and graph optimization) and every call runs."""

from __future__ import annotations

import tensorflow as tf


def keep_values(ragged: tf.RaggedTensor, keep: tf.Tensor) -> tf.RaggedTensor:
    """The values of `ragged` `(B, None)` where `keep` `(N,)` (a flat mask: a few dense ops,
    where `tf.ragged.boolean_mask` traces to dozens)."""
    lengths = tf.math.unsorted_segment_sum(tf.cast(keep, tf.int64), ragged.value_rowids(),
                                           ragged.nrows())
    return tf.RaggedTensor.from_row_lengths(tf.boolean_mask(ragged.flat_values, keep),
                                            lengths, validate=False)


def nested(outer: tf.RaggedTensor, inner: tf.RaggedTensor) -> tf.RaggedTensor:
    """`(B, S)` rows of `outer` holding `(B * S, None)` rows of `inner` -> `(B, None)`: the
    inner rows joined per outer row (`merge_dims` of the nested tensor, in two ops)."""
    return tf.RaggedTensor.from_row_splits(
        inner.flat_values, tf.gather(inner.row_splits, outer.row_splits), validate=False)


def row_positions(ragged: tf.RaggedTensor) -> tf.Tensor:
    """The position of every value of `ragged` `(B, None)` in its row: `(N,)` int64."""
    rows = ragged.value_rowids()
    return tf.range(tf.size(rows, tf.int64)) - tf.gather(ragged.row_splits, rows)


def place_rows(parts: list, count) -> tf.RaggedTensor:
    """Rows given in pieces, put in order: `parts` is a list of `(row indices (k,), values,
    values per row (k,))` that together name every row at most once; returns `(count, None)`,
    a row no part names empty. (Dense ops: a gather of ragged rows traces to many more.)"""
    index = tf.concat([tf.cast(part[0], tf.int64) for part in parts], 0)  # (K,)
    values = tf.concat([part[1] for part in parts], 0)  # (N,)
    lengths = tf.concat([tf.cast(part[2], tf.int64) for part in parts], 0)  # (K,)
    splits = tf.concat([[0], tf.cumsum(tf.math.unsorted_segment_sum(lengths, index, count))], 0)
    ends = tf.cumsum(lengths)  # of each given row in `values`
    position = tf.range(tf.size(values, tf.int64))
    source = tf.searchsorted(ends, position, side="right")  # (N,) its given row
    target = tf.gather(splits, tf.gather(index, source)) + position - tf.gather(
        ends - lengths, source)
    placed = tf.scatter_nd(target[:, None], values, tf.shape(values, tf.int64))
    return tf.RaggedTensor.from_row_splits(placed, splits, validate=False)


def around(ids: tf.RaggedTensor, prefix: tf.Tensor, suffix: tf.Tensor) -> tf.RaggedTensor:
    """`prefix` (P,) + row + `suffix` (S,) for every row of `ids` `(B, None)`."""
    lengths = ids.row_lengths()  # (B,)
    before, after = tf.size(prefix, tf.int64), tf.size(suffix, tf.int64)
    splits = tf.concat([[0], tf.cumsum(lengths + before + after)], 0)  # (B + 1,)
    starts = splits[:-1, None]  # (B, 1)
    inner = tf.gather(splits, ids.value_rowids()) + before + row_positions(ids)
    heads = tf.reshape(starts + tf.range(before), [-1])  # (B * P,)
    tails = tf.reshape(starts + before + lengths[:, None] + tf.range(after), [-1])
    batch = tf.shape(lengths)[:1]
    values = tf.scatter_nd(tf.concat([inner, heads, tails], 0)[:, None], tf.concat(
        [ids.flat_values, tf.tile(prefix, batch), tf.tile(suffix, batch)], 0), splits[-1:])
    return tf.RaggedTensor.from_row_splits(values, splits, validate=False)


def join_rows(strings: tf.RaggedTensor) -> tf.Tensor:
    """The strings of every row of `strings` `(B, None)` joined: `(B,)` (one segment join;
    `tf.strings.reduce_join` of a ragged tensor traces to a dozen ops more)."""
    splits = strings.row_splits
    rows = tf.searchsorted(splits[1:], tf.range(tf.size(strings.flat_values, splits.dtype)),
                           side="right")
    return tf.strings.unsorted_segment_join(strings.flat_values, rows, tf.size(splits) - 1)
