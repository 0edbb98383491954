"""Additive (Bahdanau) attention with its own query and key projections."""

from __future__ import annotations

import keras
from keras import ops

from keras_attn._checks import as_int
from keras_attn.layers.base import BaseAttention
from keras_attn.layers.initializers import sublayer_initializer
from keras_attn.layers.quantization import QuantizedSublayers


@keras.saving.register_keras_serializable(package="keras_attn")
class AdditiveAttention(QuantizedSublayers, BaseAttention):
    """Additive attention: a(q, k) = w_vᵀ tanh(W_q q + W_k k).

    Queries and keys are projected to a common size `units` by their own weights, so they may
    have different sizes (unlike `keras.layers.AdditiveAttention`). The weights then pool the
    values.

    Args:
        units: int, size of the hidden layer of the scoring MLP.
        dropout: float in [0, 1), dropout on the attention weights. Defaults to `0.0`.
        kernel_initializer: initializer of the three kernels, each drawing from its own copy
            (`sublayer_initializer`). Defaults to `"glorot_uniform"`.
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
        self.units = as_int("units", units)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

        def dense(units, name):
            return keras.layers.Dense(
                units, use_bias=False, name=name, dtype=self.dtype_policy,
                kernel_initializer=sublayer_initializer(self.kernel_initializer, name))

        self.query_dense = dense(self.units, "query_dense")  # W_q
        self.key_dense = dense(self.units, "key_dense")  # W_k
        self.score_dense = dense(1, "score_dense")  # w_v

    def build(self, query_shape, key_shape=None, value_shape=None):
        key_shape = query_shape if key_shape is None else key_shape
        value_shape = key_shape if value_shape is None else value_shape
        self.check_inputs(query_shape, key_shape, value_shape)
        self.query_dense.build(query_shape)
        self.key_dense.build(key_shape)
        self.score_dense.build(tuple(key_shape[:-1]) + (self.units,))

    def scores(self, query, projected_keys):
        """The scores `w_vᵀ tanh(W_q q + W_k k)` `(B, T, S)` of queries `(B, T, dq)` against
        keys already projected, `W_k k` `(B, S, units)` (a decoder computes them once per
        sequence)."""
        # W_q and w_v as 2-D products: a Dense on a 3-D or 4-D tensor is a tensordot whose
        # gradient XLA cannot compile when a length is unknown at trace time (in a decoder loop).
        batch, length = ops.shape(query)[0], ops.shape(query)[1]
        q = self.query_dense(ops.reshape(query, (-1, query.shape[-1])))  # (B · T, u)
        q = ops.reshape(q, (batch, length, 1, self.units))  # (B, T, 1, u)
        energy = ops.tanh(q + ops.expand_dims(projected_keys, 1))  # (B, T, S, u)
        flat = self.score_dense(ops.reshape(energy, (-1, self.units)))  # (B · T · S, 1)
        return ops.reshape(flat, ops.shape(energy)[:3])  # (B, T, S)

    def attend(self, query, key, value, mask, training, need_weights=True):
        scores = self.scores(query, self.key_dense(key))  # (B, T, S)
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
                "dtype": self.dtype_config(),
            }
        )
        return config
