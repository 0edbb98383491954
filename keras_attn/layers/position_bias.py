"""Position biases of the attention scores as layers: ALiBi and T5's relative buckets.

Each layer adds its bias to `(B, H, T, S)` scores when called, and gives attention layers the
`keras_attn.ops.PositionBias` that the kernels compute tile by tile (`position_bias`), which
is how `MultiHead(position_encoding=...)` uses it.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_attn import ops as attn_ops
from keras_attn._checks import check_bool, check_int, check_number
from keras_attn.layers.position_encoding import RotaryEmbedding


def _check_scores(scores_shape) -> None:
    if len(scores_shape) != 4 or scores_shape[1] is None:
        raise ValueError(
            "Argument `scores` must be attention scores of shape (batch_size, num_heads, "
            f"query_len, key_len) with a known num_heads. Received: "
            f"scores.shape={tuple(scores_shape)}"
        )


class _ScoresBias(keras.layers.Layer):
    """Shared: `call(scores, start_index=0)` adds the bias to `(B, H, T, S)` scores."""

    def build(self, scores_shape):
        _check_scores(scores_shape)

    def call(self, scores, start_index=0):
        _check_scores(scores.shape)
        num_heads, query_len, key_len = scores.shape[1], ops.shape(scores)[2], ops.shape(
            scores)[3]
        bias = self.position_bias(num_heads).dense(query_len, key_len, start_index)  # (H, T, S)
        return scores + ops.cast(bias[None], scores.dtype)

    def compute_output_shape(self, scores_shape):
        _check_scores(scores_shape)
        return scores_shape


@keras.saving.register_keras_serializable(package="keras_attn")
class AlibiBias(_ScoresBias):
    """ALiBi: attention with linear biases (Press et al., 2022), no weights.

    Adds `slope_h · (j - p)` to the score of the query at position `p` for key `j`, head `h`
    (the paper's `-slope_h · (p - j)` on the keys at or before the query; a causal mask removes
    the others), or `-slope_h · |p - j|` with `symmetric=True`. The slopes are the paper's for
    any head count (`keras_attn.ops.alibi_slopes`). Per row this differs from
    `keras_hub.layers.AlibiBias` by a constant, which the softmax ignores.

    Args:
        max_bias: float, the exponent scale of the slopes. Defaults to `8.0`.
        symmetric: bool, for attention without a causal mask. Defaults to `False`.

    Call arguments:
        scores: `(B, H, T, S)` attention scores.
        start_index: int or scalar tensor, the position of the first query. Defaults to `0`.

    Returns:
        `scores` plus the bias.

    Example:
    >>> AlibiBias()(keras.ops.zeros((1, 8, 5, 5))).shape  # (1, 8, 5, 5)

    References:
        Press et al., 2022, "Train Short, Test Long: Attention with Linear Biases Enables Input
        Length Extrapolation", https://arxiv.org/abs/2108.12409
    """

    def __init__(self, max_bias: float = 8.0, symmetric: bool = False, **kwargs):
        super().__init__(**kwargs)
        check_number("max_bias", max_bias, 0, strict=True)
        check_bool("symmetric", symmetric)
        self.max_bias = max_bias
        self.symmetric = symmetric
        self.built = True  # no weights (see RotaryEmbedding)

    def position_bias(self, num_heads: int) -> attn_ops.AlibiTileBias:
        """The bias over `num_heads` heads, for the kernels."""
        return attn_ops.AlibiTileBias(num_heads, self.max_bias, self.symmetric)

    def get_config(self):
        config = super().get_config()
        config.update({"max_bias": self.max_bias, "symmetric": self.symmetric})
        return config


@keras.saving.register_keras_serializable(package="keras_attn")
class RelativePositionBias(_ScoresBias):
    """T5's learned relative position bias (Raffel et al., 2020): `table[bucket(j - p), h]`.

    Relative distances share buckets, exactly below `num_buckets // 2` (or a quarter of the
    buckets each way when `bidirectional`) and logarithmically wider up to `max_distance`
    (`keras_attn.ops.relative_position_bucket`); each bucket has a learned bias per head. The
    table is built for the heads of the first input (or by the attention layer that owns it).

    Args:
        num_buckets: int. Defaults to `32`.
        max_distance: int, distances beyond share the last bucket. Defaults to `128`.
        bidirectional: bool, separate buckets for keys after the query (encoders); False for
            causal attention. Defaults to `True`.
        embeddings_initializer: initializer of the table. Defaults to `"zeros"`.

    Call arguments:
        scores: `(B, H, T, S)` attention scores.
        start_index: int or scalar tensor, the position of the first query. Defaults to `0`.

    Returns:
        `scores` plus the bias.

    Example:
    >>> RelativePositionBias(bidirectional=False)(keras.ops.zeros((1, 4, 6, 6))).shape

    References:
        Raffel et al., 2020, "Exploring the Limits of Transfer Learning with a Unified
        Text-to-Text Transformer", https://arxiv.org/abs/1910.10683
    """

    def __init__(self, num_buckets: int = 32, max_distance: int = 128,
                 bidirectional: bool = True, embeddings_initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        check_int("num_buckets", num_buckets, 2 if not bidirectional else 4)
        check_int("max_distance", max_distance, 2)
        check_bool("bidirectional", bidirectional)
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)

    def build(self, scores_shape):
        _check_scores(scores_shape)
        num_heads = scores_shape[1]
        check_int("num_heads", num_heads, 1)
        self.table = self.add_weight(name="table", shape=(self.num_buckets, num_heads),
                                     initializer=self.embeddings_initializer)

    def position_bias(self, num_heads: int) -> attn_ops.RelativeTileBias:
        """The bias for the kernels (its table is this layer's weight)."""
        if self.table.shape[1] != num_heads:
            raise ValueError(
                f"This RelativePositionBias was built for {self.table.shape[1]} heads. "
                f"Received: num_heads={num_heads}"
            )
        return attn_ops.RelativeTileBias(self.table, self.bidirectional, self.max_distance)

    def get_config(self):
        config = super().get_config()
        config.update({
            "num_buckets": self.num_buckets,
            "max_distance": self.max_distance,
            "bidirectional": self.bidirectional,
            "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
        })
        return config


def serialize_position_layer(layer):
    """A position layer's config for its attention layer's `get_config` (None stays None).

    One layer may serve several attention layers (T5 shares one relative bias across the
    blocks). Keras keeps such an object once in a `.keras` file when every config that holds
    it carries the same `shared_object_id`, which `keras.saving.serialize_keras_object` adds to
    an object it meets a second time while a model is saved. The config handed out here is
    therefore the layer's second serialization: while saving it carries the id (so loading
    gives back one shared layer, whose weights the file holds once); anywhere else the two
    serializations are the same plain config.
    """
    if layer is None:
        return None
    keras.saving.serialize_keras_object(layer)
    return keras.saving.serialize_keras_object(layer)


def position_layer(position_encoding, dtype=None):
    """The position layer of an attention layer from a name (`"rope"`, `"alibi"`,
    `"relative"`), a layer or a serialized layer; None stays None."""
    layers = {"rope": RotaryEmbedding, "alibi": AlibiBias, "relative": RelativePositionBias}
    if position_encoding is None:
        return None
    if isinstance(position_encoding, str):
        if position_encoding not in layers:
            raise ValueError(
                "Received an invalid value for argument `position_encoding`, expected None, "
                f"one of {sorted(layers)} or such a layer. Received: "
                f"position_encoding={position_encoding!r}"
            )
        return layers[position_encoding](name="position_encoding", dtype=dtype)
    if isinstance(position_encoding, dict):
        position_encoding = keras.layers.deserialize(position_encoding)
    if not isinstance(position_encoding, tuple(layers.values())):
        raise ValueError(  # noqa: TRY004 - the project raises ValueError for bad arguments
            "Received an invalid value for argument `position_encoding`, expected None, "
            f"one of {sorted(layers)} or such a layer. Received: "
            f"position_encoding={position_encoding!r}"
        )
    return position_encoding
