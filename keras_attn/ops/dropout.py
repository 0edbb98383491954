"""Inverted dropout with a 16-bit mask (TensorFlow) or `keras.random.dropout` (other backends)."""

from __future__ import annotations

import keras
from keras import ops

from keras_attn._checks import as_rate

# Dropout keeps an element when 16 random bits reach this many (the rate, in 1/65536 steps).
_DROPOUT_LEVELS = 65536


def dropout_scale(rate: float) -> float:
    """The factor `dropout(x, rate)` multiplies kept elements by, before rounding to x's dtype:
    the inverse of the keep probability of the 16-bit mask, or `1 / (1 - rate)` where
    `keras.random.dropout` draws the mask."""
    threshold = round(rate * _DROPOUT_LEVELS)
    if keras.backend.backend() != "tensorflow" or threshold >= _DROPOUT_LEVELS:
        return 1.0 / (1.0 - rate)
    return _DROPOUT_LEVELS / (_DROPOUT_LEVELS - threshold)


def dropout(x, rate: float, seed=None):
    """Inverted dropout: zero each element with probability `rate`, scale the rest up.

    Same contract as `keras.random.dropout` (the output's expectation is `x`; an int `seed`
    gives the same mask on every call, a `keras.random.SeedGenerator` a new one each call),
    but cheaper on the TensorFlow backend: the mask is drawn from 16 random bits per element
    instead of one float32 uniform, so one 32-bit draw decides two elements and the random
    number generation, the largest cost of dropout on a CPU, halves. The drop probability is
    `rate` rounded to a multiple of 2**-16 (0.1 becomes 0.100006), and the kept elements are
    scaled by the inverse of that keep probability (rounded to the dtype of `x`, so in float16
    and bfloat16 the expectation is off by up to a rounding step, as with
    `keras.random.dropout`). Other backends, and rates within 2**-17 of 1, use
    `keras.random.dropout`.

    Args:
        x: floating-point tensor of any shape.
        rate: float in [0, 1), the probability of zeroing an element.
        seed: int, `keras.random.SeedGenerator` or `None` (Keras' global generator).

    Returns:
        Tensor with the shape and dtype of `x`.
    """
    rate = as_rate("rate", rate)
    x = ops.convert_to_tensor(x)
    if not keras.backend.is_float_dtype(x.dtype):
        raise ValueError(
            f"Argument `x` must be a floating-point tensor. Received: x.dtype={x.dtype}"
        )
    threshold = round(rate * _DROPOUT_LEVELS)
    if keras.backend.backend() != "tensorflow" or threshold >= _DROPOUT_LEVELS:
        return keras.random.dropout(x, rate, seed=seed) if rate > 0.0 else x
    if threshold == 0:
        return x
    import tensorflow as tf

    # A (2,) seed for TensorFlow's stateless generator, drawn the way Keras draws any random
    # tensor from `seed`, so int seeds, seed generators and None behave as in keras.random.
    tf_seed = keras.random.randint((2,), 0, 2**31 - 1, seed=seed, dtype="int32")
    shape = tf.shape(x, out_type=tf.int64)
    last = x.shape[-1] if x.shape.rank else None
    if isinstance(last, int) and last % 2 == 0:
        # Half as many 32-bit words along the last axis; each splits into two 16-bit halves.
        word_shape = tf.concat([shape[:-1], tf.constant([last // 2], tf.int64)], 0)
        words = tf.random.stateless_uniform(
            word_shape, tf_seed, minval=None, maxval=None, dtype=tf.uint32
        )
        bits = tf.reshape(tf.bitcast(words, tf.uint16), shape)
    else:
        size = tf.size(x, out_type=tf.int64)
        words = tf.random.stateless_uniform(
            [(size + 1) // 2], tf_seed, minval=None, maxval=None, dtype=tf.uint32
        )
        bits = tf.reshape(tf.reshape(tf.bitcast(words, tf.uint16), [-1])[:size], shape)
    keep = bits >= tf.constant(threshold, tf.uint16)
    return tf.where(keep, x * tf.cast(dropout_scale(rate), x.dtype), tf.zeros((), x.dtype))

