"""Nadaraya–Watson kernel regression as attention pooling."""

from __future__ import annotations

import keras
from keras import ops

from keras_attn.layers.base import BaseAttention


@keras.saving.register_keras_serializable(package="keras_attn")
class NWPooling(BaseAttention):
    """Nadaraya–Watson attention pooling with a Gaussian kernel.

    f(x) = Σᵢ softmax(-½((x - xᵢ)·w)²) yᵢ: the query `x` attends to keys `xᵢ` with weights that
    fall off with distance, and pools the values `yᵢ`. With `learnable=False` the width is fixed
    at `w = 1` and the layer has no weights (the nonparametric estimator); with `learnable=True`
    `w` is a trainable scalar (the parametric form of d2l eq. 10.2.7). For vector keys the squared
    distance is summed over the feature axis.

    Args:
        learnable: bool, whether the kernel width `w` is a trainable weight. Defaults to `False`.
        width_initializer: initializer of `w` when learnable. Defaults to `"ones"`.
        dropout: float in [0, 1), dropout on the attention weights. Defaults to `0.0`.
        seed: optional int seed for the dropout. Defaults to `None`.

    Call arguments:
        query: `(B, T)` scalar queries or `(B, T, d)` vector queries.
        key: `(B, S)` or `(B, S, d)`, same rank as `query`. Defaults to `query`.
        value: `(B, S)` scalar values or `(B, S, dv)` vector values. Defaults to `key`.
        valid_lens: optional `(B,)` or `(B, T)` number of valid keys.
        attention_mask: optional boolean `(B, T, S)`, True = attend. Leave-one-out training
            masks the diagonal.
        use_causal_mask: bool, hide keys after each query. Defaults to `False`.
        return_attention_scores: bool, also return the weights. Defaults to `False`.
        training: bool, whether dropout is active.

    Returns:
        `(B, T)` for scalar values or `(B, T, dv)` for vector values; with
        `return_attention_scores=True`, also the weights `(B, T, S)`.

    Example:
    >>> x_train = keras.random.uniform((1, 50), 0, 5)
    >>> y_train = 2 * keras.ops.sin(x_train) + x_train ** 0.8
    >>> x_test = keras.ops.expand_dims(keras.ops.arange(0, 5, 0.1), 0)
    >>> y_hat = NWPooling()(x_test, x_train, y_train)  # (1, 50)

    References:
        Nadaraya, 1964; Watson, 1964; d2l.ai section 11.2 "Attention Pooling".
    """

    input_ranks = (2, 3)

    def __init__(
        self,
        learnable: bool = False,
        width_initializer="ones",
        dropout: float = 0.0,
        seed: int | None = None,
        **kwargs,
    ):
        super().__init__(dropout=dropout, seed=seed, **kwargs)
        if not isinstance(learnable, bool):
            raise ValueError(  # noqa: TRY004 (the project raises ValueError for bad arguments)
                f"Received an invalid value for argument `learnable`, expected a bool. "
                f"Received: learnable={learnable!r}"
            )
        self.learnable = learnable
        self.width_initializer = keras.initializers.get(width_initializer)

    def build(self, query_shape, key_shape=None, value_shape=None):
        key_shape = query_shape if key_shape is None else key_shape
        value_shape = key_shape if value_shape is None else value_shape
        self.check_inputs(query_shape, key_shape, value_shape)
        known = len(query_shape) == 3 and None not in (query_shape[-1], key_shape[-1])
        if known and query_shape[-1] != key_shape[-1]:
            raise ValueError(
                "Arguments `query` and `key` must have the same feature size. Received: "
                f"query.shape={tuple(query_shape)}, key.shape={tuple(key_shape)}"
            )
        if self.learnable:
            self.width = self.add_weight(
                name="width", shape=(), initializer=self.width_initializer
            )

    def check_inputs(self, query_shape, key_shape, value_shape) -> None:
        super().check_inputs(query_shape, key_shape, value_shape)
        if len(key_shape) != len(query_shape):
            raise ValueError(
                "Arguments `query` and `key` must both be (batch_size, len) scalars or both "
                "(batch_size, len, dim) vectors. Received: "
                f"query.shape={tuple(query_shape)}, key.shape={tuple(key_shape)}"
            )

    def attend(self, query, key, value, mask, training, need_weights=True):
        diff = ops.expand_dims(query, 2) - ops.expand_dims(key, 1)  # (B, T, S[, d])
        if self.learnable:
            diff = diff * ops.cast(self.width, diff.dtype)
        diff = ops.cast(diff, "float32")
        squared = ops.square(diff)
        if len(diff.shape) == 4:
            squared = ops.sum(squared, axis=-1)  # (B, T, S)
        weights = self.masked_weights(-0.5 * squared, mask)  # (B, T, S)
        weights = ops.cast(weights, value.dtype)
        pooled = self.dropout_weights(weights, training)
        if len(value.shape) == 2:
            # A product, not einsum("bts,bs->bt"): LiteRT has no builtin einsum.
            outputs = ops.squeeze(ops.matmul(pooled, ops.expand_dims(value, -1)), -1)  # (B, T)
        else:
            outputs = ops.matmul(pooled, value)  # (B, T, dv)
        return outputs, weights

    def compute_output_shape(self, query_shape, key_shape=None, value_shape=None):
        value_shape = (key_shape or query_shape) if value_shape is None else value_shape
        return tuple(query_shape[:2]) + tuple(value_shape[2:])

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "learnable": self.learnable,
                "width_initializer": keras.initializers.serialize(self.width_initializer),
            }
        )
        return config
