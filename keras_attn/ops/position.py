"""Positions in attention: rotary embeddings of queries and keys, and biases of the scores that
depend on query and key positions (ALiBi, T5's relative position buckets).

A position bias is computed one tile of queries × keys at a time (`tile`), so the blockwise
kernel adds it block by block and never holds `(T, S)`; its parameters (T5's table) get their
gradient tile by tile too (`tile_grads`). A bias that depends on `key - query` only is
`relative`, which lets the local kernel compute one tile for every window.
"""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

from keras_attn._checks import check_bool, check_int, check_number
from keras_attn.ops.rope import rope_inverse_frequencies


def scaled_inverse_frequencies(depth: int, max_wavelength: float = 10000.0,
                               scaling_factor: float = 1.0):
    """RoPE's float32 inverse frequencies `(d/2,)` as a tensor, keras-hub's parameters:
    `max_wavelength^(-2i/d) / scaling_factor` (linear position interpolation when
    `scaling_factor > 1`; `rope_inverse_frequencies`' `"linear"` type)."""
    scaled = scaling_factor != 1
    return constant(("rope", int(depth), max_wavelength, scaling_factor),
                    lambda: rope_inverse_frequencies(
                        int(depth), max_wavelength, "linear" if scaled else "default",
                        factor=scaling_factor if scaled else None))


_CONSTANTS: dict = {}


def constant(key: tuple, make):
    """`ops.convert_to_tensor(make())` (`make` returns a NumPy array); on torch, one tensor per
    `key` made outside `torch.compile` and reused, since converting NumPy inside a compiled
    decoding step would break its graph (`keras_attn.decoding.stepwise`). Other backends
    convert each call: a cached tensor would leak out of the graph that made it."""
    if keras.backend.backend() != "torch":
        return ops.convert_to_tensor(make())
    import torch

    if key not in _CONSTANTS:
        value = ops.convert_to_tensor(make())
        if torch.compiler.is_compiling():
            return value
        _CONSTANTS[key] = value
    return _CONSTANTS[key]


def _axis(name: str, axis, rank: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not (
            -rank <= axis < rank):
        raise ValueError(
            f"Received an invalid value for argument `{name}`, expected an axis of the rank-"
            f"{rank} input, in [{-rank}, {rank - 1}]. Received: {name}={axis!r}"
        )
    return int(axis) % rank


def rotary_embedding(x, start_index=0, max_wavelength: float = 10000.0,
                     scaling_factor: float = 1.0, sequence_axis: int = -2, *, positions=None,
                     feature_axis: int = -1, inverse_frequencies=None,
                     attention_scaling: float = 1.0):
    """Rotate pairs of features by angles growing with the position (Su et al., 2021).

    "Rotate half" layout, as `keras_hub.layers.RotaryEmbedding`: feature `i` of the first half
    pairs with feature `i + d/2`, both rotated by `θᵢ = position · f_i` with the inverse
    frequencies `f_i = max_wavelength^(-2i/d) / scaling_factor`. Computed in float32, cast
    back.

    Args:
        x: a tensor with a sequence axis and an even feature axis `d`, e.g. `(B, T, d)` or
            `(B, H, T, d)`.
        start_index: int or scalar tensor (any integer dtype), the position of the first
            element along `sequence_axis` (a decoding cache's index). Defaults to `0`.
        max_wavelength: float, the base of the angles. Defaults to `10000`.
        scaling_factor: float >= 1, divides every angle (linear position interpolation).
            Defaults to `1.0`.
        sequence_axis: int, the axis of positions. Defaults to `-2`.
        positions: optional `(T,)` or per-batch `(B, T)` positions (any real dtype) replacing
            `start_index + arange(T)`; with `(B, T)` the batch is axis 0. Defaults to `None`.
        feature_axis: int, the axis of the rotated features. Defaults to `-1`.
        inverse_frequencies: optional float `(d/2,)` tensor replacing the frequencies above
            (other scalings of RoPE). Defaults to `None`.
        attention_scaling: float > 0, multiplies cos and sin, so the rotated features (YaRN's
            scaling, transformers' `attention_scaling`). Defaults to `1.0`.

    Returns:
        Tensor of the shape and dtype of `x`.
    """
    rank = len(x.shape)
    seq_axis = _axis("sequence_axis", sequence_axis, rank)
    feat_axis = _axis("feature_axis", feature_axis, rank)
    if seq_axis == feat_axis:
        raise ValueError(
            "Arguments `sequence_axis` and `feature_axis` must name different axes. Received: "
            f"sequence_axis={sequence_axis}, feature_axis={feature_axis}"
        )
    depth = x.shape[feat_axis]
    if depth is None or depth % 2:
        raise ValueError(
            "Rotary embeddings need an even number of features (the feature axis). Received: "
            f"x.shape={tuple(x.shape)}, feature_axis={feature_axis}"
        )
    length = ops.shape(x)[seq_axis]
    if positions is None:
        positions = ops.arange(length, dtype="float32") + ops.cast(start_index, "float32")
    else:
        if not (isinstance(start_index, (int, np.integer)) and start_index == 0):
            raise ValueError(
                "Arguments `positions` and `start_index` both place the sequence; give one. "
                f"Received: start_index={start_index!r}"
            )
        positions = ops.cast(positions, "float32")
        wanted = (x.shape[0], x.shape[seq_axis])[2 - len(positions.shape):]
        if len(positions.shape) not in (1, 2) or (len(positions.shape) == 2 and 0 in (
                seq_axis, feat_axis)) or any(  # sizes known now: those of `x`
                    None not in (have, want) and have != want
                    for have, want in zip(positions.shape, wanted)):
            raise ValueError(
                "Argument `positions` must have shape (sequence_length,) or (batch_size, "
                "sequence_length) of `x`, the batch on axis 0. Received: "
                f"positions.shape={tuple(positions.shape)} for x.shape={tuple(x.shape)}, "
                f"sequence_axis={sequence_axis}"
            )
    inverse = (scaled_inverse_frequencies(depth, max_wavelength, scaling_factor)
               if inverse_frequencies is None else ops.cast(inverse_frequencies, "float32"))
    angles = ops.expand_dims(positions, -1) * inverse  # (B | ., T, d/2)
    if seq_axis > feat_axis:
        angles = ops.swapaxes(angles, -1, -2)  # (B | ., d/2, T)
    shape = [1] * rank
    shape[seq_axis], shape[feat_axis] = -1, depth // 2
    if len(positions.shape) == 2:
        shape[0], shape[seq_axis] = -1, length
    cos = ops.reshape(ops.cos(angles), shape)  # broadcastable to x's half
    sin = ops.reshape(ops.sin(angles), shape)
    if attention_scaling != 1.0:
        cos, sin = cos * attention_scaling, sin * attention_scaling
    first, second = ops.split(ops.cast(x, "float32"), 2, axis=feat_axis)
    rotated = ops.concatenate([first * cos - second * sin, second * cos + first * sin],
                              axis=feat_axis)
    return ops.cast(rotated, x.dtype)


class PositionBias:
    """A bias of the attention scores computed from query and key positions.

    Subclasses implement `tile(query_pos, key_pos, params=None)` → float32 `(H, rows, cols)`
    for int32 `query_pos` `(rows, 1)` and `key_pos` `(1, cols)` (`params` replaces `params`,
    for kernels that take them as inputs of a custom gradient), and, when they have trainable
    parameters (`params`, a tuple of tensors), `tile_grads(d_tile, query_pos, key_pos)`, the
    gradients of `sum(tile ⊙ d_tile)` with respect to each parameter. `relative` says whether
    the bias depends on `key_pos - query_pos` only.
    """

    relative = True
    num_heads: int

    @property
    def params(self) -> tuple:
        return ()

    def tile(self, query_pos, key_pos, params=None):  # pragma: no cover - abstract
        raise NotImplementedError

    def tile_grads(self, d_tile, query_pos, key_pos) -> tuple:
        return ()

    def dense(self, query_len, key_len, offset=0):
        """The whole `(H, T, S)` bias, query `i` at position `i + offset` (any integer)."""
        offset = offset if isinstance(offset, int) else ops.cast(offset, "int32")
        query_pos = ops.expand_dims(ops.arange(query_len, dtype="int32") + offset, -1)
        key_pos = ops.expand_dims(ops.arange(key_len, dtype="int32"), 0)
        return self.tile(query_pos, key_pos)


def alibi_slopes(num_heads: int, max_bias: float = 8.0) -> list[float]:
    """The head slopes of ALiBi (Press et al., 2022), as its reference code builds them.

    For `n` heads, a power of two: `2^(-max_bias · h / n)`, `h = 1..n`; otherwise the slopes
    of the closest lower power of two `c`, followed by every other slope of `2c`, the first
    `n - c` of them.
    """
    check_int("num_heads", num_heads, 1)

    def power_of_two(n):
        return [2.0 ** (-max_bias * (h + 1) / n) for h in range(n)]

    if num_heads & (num_heads - 1) == 0:
        return power_of_two(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return power_of_two(closest) + power_of_two(2 * closest)[0::2][:num_heads - closest]


class AlibiTileBias(PositionBias):
    """ALiBi: `slope_h · (j - p)` for key `j` and a query at position `p` (Press et al.,
    2022), with the head slopes of `alibi_slopes`. On the keys at or before the query this is
    the paper's `-slope_h · (p - j)`; past it the line continues (a causal mask removes those
    keys). `symmetric=True` gives `-slope_h · |p - j|`, for attention without a causal mask.
    No trainable parameters.

    Args:
        num_heads: int, `H`.
        max_bias: float, the exponent scale of the slopes (8 in the paper). Defaults to `8.0`.
        symmetric: bool. Defaults to `False`.
    """

    def __init__(self, num_heads: int, max_bias: float = 8.0, symmetric: bool = False):
        check_number("max_bias", max_bias, 0, strict=True)
        check_bool("symmetric", symmetric)
        self.num_heads = num_heads
        self.slopes = alibi_slopes(num_heads, max_bias)
        self.symmetric = symmetric

    def tile(self, query_pos, key_pos, params=None):
        distance = ops.cast(key_pos - query_pos, "float32")  # (rows, cols)
        if self.symmetric:
            distance = -ops.abs(distance)
        slopes = ops.convert_to_tensor(self.slopes, "float32")[:, None, None]  # (H, 1, 1)
        return slopes * distance[None]  # (H, rows, cols)


def relative_position_bucket(relative_position, bidirectional: bool = True,
                             num_buckets: int = 32, max_distance: int = 128):
    """T5's bucket of `relative_position = key - query` (Raffel et al., 2020).

    Bidirectional: half the buckets for keys after the query, half for those at or before it,
    on `n = |relative_position|`; otherwise `n = max(-relative_position, 0)`. Within `b`
    buckets, `n < b // 2` has a bucket of its own; larger distances share logarithmically
    wider buckets up to `max_distance`, and everything beyond shares the last one.

    Returns:
        int32 tensor of the shape of `relative_position`.
    """
    relative_position = ops.cast(relative_position, "int32")
    buckets = ops.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + ops.cast(relative_position > 0, "int32") * num_buckets
        distance = ops.abs(relative_position)
    else:
        distance = -ops.minimum(relative_position, 0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    far = ops.cast(ops.maximum(distance, max_exact), "float32")
    if_large = max_exact + ops.cast(
        ops.log(far / max_exact) / math.log(max_distance / max_exact)
        * (num_buckets - max_exact), "int32")
    if_large = ops.minimum(if_large, num_buckets - 1)
    return buckets + ops.where(is_small, distance, if_large)


class RelativeTileBias(PositionBias):
    """T5's learned relative position bias: `table[bucket(j - p), h]` (Raffel et al., 2020).

    Args:
        table: float tensor or variable `(num_buckets, H)`, the trainable parameter.
        bidirectional: bool, separate buckets for keys after the query. Defaults to `True`.
        max_distance: int, distances beyond share the last bucket. Defaults to `128`.
    """

    def __init__(self, table, bidirectional: bool = True, max_distance: int = 128):
        check_bool("bidirectional", bidirectional)
        check_int("max_distance", max_distance, 2)
        self.table = table
        self.num_buckets, self.num_heads = table.shape
        self.bidirectional = bidirectional
        self.max_distance = max_distance

    @property
    def params(self) -> tuple:
        return (self.table,)

    def buckets(self, query_pos, key_pos):
        return relative_position_bucket(key_pos - query_pos, self.bidirectional,
                                        self.num_buckets, self.max_distance)  # (rows, cols)

    def tile(self, query_pos, key_pos, params=None):
        table = ops.cast(self.table if params is None else params[0], "float32")
        values = ops.take(table, self.buckets(query_pos, key_pos), axis=0)  # (rows, cols, H)
        return ops.transpose(values, (2, 0, 1))  # (H, rows, cols)

    def tile_grads(self, d_tile, query_pos, key_pos) -> tuple:
        buckets = ops.reshape(self.buckets(query_pos, key_pos), (-1,))  # (rows · cols,)
        per_entry = ops.transpose(ops.reshape(d_tile, (ops.shape(d_tile)[0], -1)))  # (r·c, H)
        return (ops.segment_sum(per_entry, buckets, num_segments=self.num_buckets),)
