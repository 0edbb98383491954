"""Pure tensor functions for attention, written with `keras.ops` (one exception: `dropout`
draws its mask with TensorFlow's stateless generator when TensorFlow is the backend).

Every mask here is boolean with **True = attend**. A query row whose mask is all False gets
all-zero attention weights (and so a zero context vector): never NaN, never uniform attention
over padding. Scores and softmax run in float32 whatever the input dtype, and the result is cast
back, so float16 and bfloat16 inputs are safe.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from keras_attn._checks import as_rate, check_positive_int
from keras_attn.chunked import chunked_dot_product_attention

# Added to the scores of masked positions (in float32). Large enough to drive exp() to exactly 0
# next to any real score, small enough that `score - max` never overflows to -inf.
_MASK_VALUE = -1e30


def _check_rank(name: str, tensor, min_rank: int) -> None:
    rank = len(tensor.shape)
    if rank < min_rank:
        raise ValueError(
            f"Argument `{name}` must have rank >= {min_rank}. "
            f"Received: {name}.shape={tuple(tensor.shape)}"
        )


def _known(*dims) -> bool:
    """True when every dimension is a static Python int."""
    return all(isinstance(d, int) for d in dims)


def _check_mask_shape(mask, query_len, key_len, batch_size=None, name="attention_mask"):
    """A boolean mask must end in (query_len, key_len) (or broadcast: 1) and match the batch."""
    shape = tuple(mask.shape)
    expected = (query_len, key_len)
    for got, want in zip(shape[-2:], expected):
        if _known(got, want) and got not in (1, want):
            raise ValueError(
                f"Argument `{name}` must have shape (batch_size, query_len={query_len}, "
                f"key_len={key_len}) or broadcast to it. Received: {name}.shape={shape}"
            )
    if len(shape) == 3 and _known(shape[0], batch_size) and shape[0] not in (1, batch_size):
        raise ValueError(
            f"Argument `{name}` must have batch size {batch_size}. Received: {name}.shape={shape}"
        )


def sequence_mask(valid_lens, maxlen: int):
    """Boolean mask of the first `valid_lens` positions along a new last axis.

    Args:
        valid_lens: integer tensor of any shape `(...)`: how many leading positions are valid.
        maxlen: int, length of the masked axis.

    Returns:
        Boolean tensor of shape `(..., maxlen)`, True where `position < valid_lens`.

    Example:
    >>> sequence_mask([1, 3], 4)  # [[T, F, F, F], [T, T, T, F]]
    """
    if maxlen is None or int(maxlen) < 0:
        raise ValueError(
            f"Argument `maxlen` must be a non-negative integer. Received: maxlen={maxlen}"
        )
    valid_lens = ops.convert_to_tensor(valid_lens)
    positions = ops.arange(int(maxlen), dtype="int32")
    return ops.less(positions, ops.expand_dims(ops.cast(valid_lens, "int32"), -1))


def causal_mask(query_len: int, key_len: int | None = None, offset=0):
    """Lower-triangular mask: query `i` may attend to key `j` when `j <= i + offset`.

    Args:
        query_len: int, number of queries `T`.
        key_len: int, number of keys `S`. Defaults to `query_len`.
        offset: int or scalar tensor, position of the first query in the key sequence
            (used by cached decoding, where query `0` is the token at position `offset`).
            Defaults to `0`.

    Returns:
        Boolean tensor of shape `(T, S)`.
    """
    key_len = query_len if key_len is None else key_len
    rows = ops.expand_dims(ops.arange(query_len, dtype="int32"), -1)  # (T, 1)
    cols = ops.expand_dims(ops.arange(key_len, dtype="int32"), 0)  # (1, S)
    return ops.less_equal(cols, rows + ops.cast(offset, "int32"))  # (T, S)


def valid_lens_mask(valid_lens, query_len: int, key_len: int, batch_size=None):
    """Turn d2l-style `valid_lens` into a `(B, T, S)` boolean mask over keys.

    Args:
        valid_lens: `(B,)` (one length per sequence, shared by every query) or `(B, T)`
            (one length per query).
        query_len: `T`.
        key_len: `S`.
        batch_size: optional `B` to check `valid_lens` against. Defaults to `None`.

    Returns:
        Boolean tensor of shape `(B, T, S)`; for `(B,)` lengths the query axis has size 1
        and broadcasts.
    """
    valid_lens = ops.convert_to_tensor(valid_lens)
    rank = len(valid_lens.shape)
    if rank in (1, 2) and _known(valid_lens.shape[0], batch_size) and (
        valid_lens.shape[0] != batch_size
    ):
        raise ValueError(
            f"Argument `valid_lens` must have batch size {batch_size}. "
            f"Received: valid_lens.shape={tuple(valid_lens.shape)}"
        )
    if rank == 1:
        return ops.expand_dims(sequence_mask(valid_lens, key_len), 1)  # (B, 1, S)
    if rank == 2:
        known = valid_lens.shape[1] is not None and query_len is not None
        if known and valid_lens.shape[1] != query_len:
            raise ValueError(
                "Argument `valid_lens` of rank 2 must have shape (batch_size, query_len="
                f"{query_len}). Received: valid_lens.shape={tuple(valid_lens.shape)}"
            )
        return sequence_mask(valid_lens, key_len)  # (B, T, S)
    raise ValueError(
        "Argument `valid_lens` must have shape (batch_size,) or (batch_size, query_len). "
        f"Received: valid_lens.shape={tuple(valid_lens.shape)}"
    )


def merge_masks(
    query_len: int,
    key_len: int,
    valid_lens=None,
    attention_mask=None,
    use_causal_mask: bool = False,
    query_mask=None,
    key_mask=None,
    causal_offset=0,
    batch_size=None,
):
    """Combine every way a mask can come in into one boolean `(B, T, S)` mask (or None).

    Args:
        query_len: `T`.
        key_len: `S`.
        valid_lens: `(B,)` or `(B, T)` lengths over the keys.
        attention_mask: boolean `(B, T, S)` (or broadcastable `(T, S)`), True = attend.
        use_causal_mask: bool, hide keys after each query.
        query_mask: `(B, T)` Keras implicit mask of the queries; padded queries attend nowhere.
        key_mask: `(B, S)` Keras implicit mask of the keys.
        causal_offset: int or scalar tensor, key position of the first query, for cached
            decoding (see `causal_mask`). Defaults to `0`.
        batch_size: optional `B`, checked against `valid_lens` and `attention_mask`.
            Defaults to `None`.

    Returns:
        Boolean tensor broadcastable to `(B, T, S)`, or None when nothing masks.
    """
    masks = []
    if valid_lens is not None:
        masks.append(valid_lens_mask(valid_lens, query_len, key_len, batch_size))
    if attention_mask is not None:
        attention_mask = ops.convert_to_tensor(attention_mask)
        if len(attention_mask.shape) not in (2, 3):
            raise ValueError(
                "Argument `attention_mask` must have shape (batch_size, query_len, key_len) or "
                f"(query_len, key_len). Received: attention_mask.shape="
                f"{tuple(attention_mask.shape)}"
            )
        _check_mask_shape(attention_mask, query_len, key_len, batch_size)
        masks.append(ops.cast(attention_mask, "bool"))
    if use_causal_mask:
        masks.append(ops.expand_dims(causal_mask(query_len, key_len, causal_offset), 0))
    if query_mask is not None:
        masks.append(ops.expand_dims(ops.cast(query_mask, "bool"), -1))  # (B, T, 1)
    if key_mask is not None:
        masks.append(ops.expand_dims(ops.cast(key_mask, "bool"), -2))  # (B, 1, S)
    if not masks:
        return None
    mask = masks[0]
    for other in masks[1:]:
        mask = ops.logical_and(mask, other)
    return mask


def _expand_mask_to(mask, rank: int):
    """Insert broadcast axes after the batch axis so a (B, T, S) mask fits (B, ..., T, S)."""
    while len(mask.shape) < rank:
        mask = ops.expand_dims(mask, 1 if len(mask.shape) == 3 else 0)
    return mask


# Dropout keeps an element when 16 random bits reach this many (the rate, in 1/65536 steps).
_DROPOUT_LEVELS = 65536


def _dropout_scale(rate: float) -> float:
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
    return tf.where(keep, x * tf.cast(_dropout_scale(rate), x.dtype), tf.zeros((), x.dtype))


def masked_softmax(scores, mask=None, valid_lens=None, axis: int = -1):
    """Softmax over `axis` that gives masked positions exactly zero weight.

    Computed in float32 and cast back to the dtype of `scores`. A row with no valid position
    gets all zeros (not NaN, not a uniform distribution), and its gradient is zero.

    Args:
        scores: float tensor, e.g. `(B, T, S)` or `(B, H, T, S)`.
        mask: optional boolean tensor broadcastable to `scores`, True = keep.
        valid_lens: optional `(B,)` or `(B, T)` integer lengths along the last axis, as in
            d2l's `masked_softmax`; merged with `mask`. Requires `axis=-1`.
        axis: int, the axis to normalize. Defaults to `-1`.

    Returns:
        Tensor with the shape and dtype of `scores`.
    """
    scores = ops.convert_to_tensor(scores)
    out_dtype = scores.dtype
    x = ops.cast(scores, "float32")
    if valid_lens is not None:
        rank = len(x.shape)
        if axis not in (-1, rank - 1):
            raise ValueError(
                f"`valid_lens` masks the last axis; received axis={axis} for scores of rank {rank}."
            )
        _check_rank("scores", x, 2)
        query_len = x.shape[-2] if rank >= 3 else 1
        vmask = valid_lens_mask(valid_lens, query_len, ops.shape(x)[-1])  # (B, T|1, S)
        if rank == 2:
            vmask = vmask[:, 0, :]
        else:
            vmask = _expand_mask_to(vmask, rank)
        mask = vmask if mask is None else ops.logical_and(ops.cast(mask, "bool"), vmask)
    if mask is not None:
        mask = ops.cast(mask, "bool")
        x = ops.where(mask, x, _MASK_VALUE)
    weights = _softmax(x, axis)
    if mask is not None:
        # Rows with nothing to attend to softmax to uniform over -1e30; zero them explicitly.
        weights = weights * ops.cast(mask, "float32")
    return ops.cast(weights, out_dtype)


def _softmax(x, axis: int):
    """Softmax over `axis`: keras.ops.softmax, one fused kernel (forward + backward of
    MultiHead about 1.5x faster at 1024 keys than written out), except on axes of size 1, where
    keras.ops.softmax warns and the written-out form below runs."""
    if x.shape[axis] != 1:
        return ops.softmax(x, axis=axis)
    shifted = x - ops.stop_gradient(ops.max(x, axis=axis, keepdims=True))
    exps = ops.exp(shifted)
    return exps / ops.sum(exps, axis=axis, keepdims=True)


def dot_product_attention(
    query,
    key,
    value,
    mask=None,
    scale: float | None = None,
    dropout_rate: float = 0.0,
    training: bool = False,
    seed=None,
    implementation: str = "dense",
    chunk_size: int | None = None,
    valid_lens=None,
    use_causal_mask: bool = False,
):
    """Scaled dot-product attention: `softmax(Q Kᵀ · scale) V`.

    Args:
        query: `(..., T, d)`, e.g. `(B, T, d)` or `(B, H, T, d)`.
        key: `(..., S, d)`.
        value: `(..., S, dv)`.
        mask: optional boolean, broadcastable to `(..., T, S)`, True = attend. A `(B, T, S)` mask
            is broadcast over the head axis of 4D inputs.
        scale: float multiplying the scores. Defaults to `1 / sqrt(d)`.
        dropout_rate: float in [0, 1), dropout on the attention weights when training.
        training: bool, whether dropout is active.
        seed: int or `keras.random.SeedGenerator` for the dropout.
        implementation: `"dense"` (the `(..., T, S)` weights in memory) or `"chunked"`
            (`keras_attn.chunked.chunked_dot_product_attention`: blockwise over keys with an
            online softmax, memory `T · chunk_size`, same values and gradients; no dropout in
            training, no weights returned). Defaults to `"dense"`.
        chunk_size: optional int, keys per block when `implementation="chunked"`; `None`
            sizes blocks to 2**25 scores per head (see `keras_attn.chunked`). Defaults to
            `None`.
        valid_lens: optional `(B,)` or `(B, T)` number of valid keys, merged with `mask`; the
            chunked implementation builds it per block, never as `(T, S)`. Defaults to `None`.
        use_causal_mask: bool, hide keys after each query, merged with `mask` (per block when
            chunked). Defaults to `False`.

    Returns:
        `(outputs, weights)`: outputs `(..., T, dv)` in the dtype of `value`, weights
        `(..., T, S)` (None when `implementation="chunked"`). Rows with nothing to attend to
        have zero weights and zero outputs.
    """
    _check_rank("query", query, 2)
    _check_rank("key", key, 2)
    _check_rank("value", value, 2)
    depth = query.shape[-1]
    if key.shape[-1] is not None and depth is not None and key.shape[-1] != depth:
        raise ValueError(
            "Arguments `query` and `key` must have the same last dimension. "
            f"Received: query.shape={tuple(query.shape)}, key.shape={tuple(key.shape)}"
        )
    if not 0.0 <= dropout_rate < 1.0:
        raise ValueError(
            f"Argument `dropout_rate` must be in [0, 1). Received: dropout_rate={dropout_rate}"
        )
    if implementation not in ("dense", "chunked"):
        raise ValueError(
            "Received an invalid value for argument `implementation`, expected \"dense\" or "
            f"\"chunked\". Received: implementation={implementation!r}"
        )
    check_positive_int("chunk_size", chunk_size, allow_none=True)
    if mask is not None:
        mask = ops.convert_to_tensor(mask)
        _check_mask_shape(mask, query.shape[-2], key.shape[-2], name="mask")
    if implementation == "chunked":
        if training and dropout_rate > 0.0:
            raise ValueError(
                "Argument `implementation=\"chunked\"` does not support dropout on the "
                "attention weights; use implementation=\"dense\" or dropout_rate=0. Received: "
                f"implementation={implementation!r}, dropout_rate={dropout_rate}, training=True"
            )
        outputs = chunked_dot_product_attention(
            query, key, value, mask=mask, valid_lens=valid_lens, causal=use_causal_mask,
            scale=scale, chunk_size=chunk_size,
        )  # (..., T, dv)
        return outputs, None
    if valid_lens is not None or use_causal_mask:
        structured = merge_masks(
            ops.shape(query)[-2], ops.shape(key)[-2], valid_lens=valid_lens,
            use_causal_mask=use_causal_mask,
        )  # (B | 1, T | 1, S)
        structured = _expand_mask_to(structured, len(query.shape))
        if mask is not None:
            mask = _expand_mask_to(ops.cast(mask, "bool"), len(query.shape))
            structured = ops.logical_and(mask, structured)
        mask = structured
    if scale is None:
        scale = 1.0 / math.sqrt(depth)
    # Scale the query before the product so float16 scores do not overflow.
    query = query * ops.cast(scale, query.dtype)
    scores = ops.matmul(query, ops.swapaxes(key, -1, -2))  # (..., T, S)
    if mask is not None:
        mask = _expand_mask_to(ops.cast(mask, "bool"), len(scores.shape))
    weights = masked_softmax(ops.cast(scores, "float32"), mask=mask)  # float32
    weights = ops.cast(weights, value.dtype)
    attended = weights
    if training and dropout_rate > 0.0:
        attended = dropout(weights, dropout_rate, seed=seed)
    outputs = ops.matmul(attended, value)  # (..., T, dv)
    return outputs, weights
