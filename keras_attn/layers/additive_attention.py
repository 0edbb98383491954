"""Additive (Bahdanau) attention with its own query and key projections."""

from __future__ import annotations

import keras
from keras import ops

from keras_attn.layers.base import BaseAttention, check_positive_int


@keras.saving.register_keras_serializable(package="keras_attn")
class AdditiveAttention(BaseAttention):
    """Additive attention: a(q, k) = w_vᵀ tanh(W_q q + W_k k).

    Queries and keys are projected to a common size `units` by their own weights, so they may
    have different sizes (unlike `keras.layers.AdditiveAttention`). The weights then pool the
    values.

    Args:
        units: int, size of the hidden layer of the scoring MLP.
        dropout: float in [0, 1), dropout on the attention weights. Defaults to `0.0`.
        kernel_initializer: initializer of the three kernels. Defaults to `"glorot_uniform"`.
        seed: optional int seed for the dropout. Defaults to `None`.

    Call arguments:
        query: `(B, T, dq)`.
        key: `(B, S, dk)`. Defaults to `query`.
        value: `(B, S, dv)`. Defaults to `key`.
        valid_lens, attention_mask, use_causal_mask, return_attention_scores, training: as in
            every keras_attn attention layer (masks are boolean, True = attend).

    Returns:
        `(B, T, dv)`; with `return_attention_scores=True`, also the weights `(B, T, S)`.

    Example:
    >>> layer = AdditiveAttention(units=8)
    >>> out = layer(keras.ops.ones((2, 1, 20)), keras.ops.ones((2, 10, 2)),
    ...             keras.ops.ones((2, 10, 4)), valid_lens=keras.ops.array([2, 6]))  # (2, 1, 4)

    References:
        Bahdanau et al., 2015, "Neural Machine Translation by Jointly Learning to Align and
        Translate", https://arxiv.org/abs/1409.0473
    """

    def __init__(
        self,
        units: int,
        dropout: float = 0.0,
        kernel_initializer="glorot_uniform",
        seed: int | None = None,
        **kwargs,
    ):
        super().__init__(dropout=dropout, seed=seed, **kwargs)
        check_positive_int("units", units)
        self.units = units
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        dense = {
            "use_bias": False,
            "kernel_initializer": self.kernel_initializer,
            "dtype": self.dtype_policy,
        }
        self.query_dense = keras.layers.Dense(units, name="query_dense", **dense)
        self.key_dense = keras.layers.Dense(units, name="key_dense", **dense)
        self.score_dense = keras.layers.Dense(1, name="score_dense", **dense)

    def build(self, query_shape, key_shape=None, value_shape=None):
        key_shape = query_shape if key_shape is None else key_shape
        value_shape = key_shape if value_shape is None else value_shape
        self.check_inputs(query_shape, key_shape, value_shape)
        self.query_dense.build(query_shape)
        self.key_dense.build(key_shape)
        self.score_dense.build(tuple(key_shape[:-1]) + (self.units,))

    def attend(self, query, key, value, mask, training, need_weights=True):
        q = ops.expand_dims(self.query_dense(query), 2)  # (B, T, 1, u)
        k = ops.expand_dims(self.key_dense(key), 1)  # (B, 1, S, u)
        scores = ops.squeeze(self.score_dense(ops.tanh(q + k)), -1)  # (B, T, S)
        weights = ops.cast(self.masked_weights(scores, mask), value.dtype)
        outputs = ops.matmul(self.dropout_weights(weights, training), value)  # (B, T, dv)
        return outputs, weights

    def compute_output_shape(self, query_shape, key_shape=None, value_shape=None):
        value_shape = (key_shape or query_shape) if value_shape is None else value_shape
        return tuple(query_shape[:2]) + (value_shape[-1],)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "units": self.units,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config
