"""Scaled dot-product attention, the weightless core of the Transformer."""

from __future__ import annotations

import keras

from keras_attn import ops as attn_ops
from keras_attn._checks import check_number
from keras_attn.layers.base import BaseAttention, check_last_dim
from keras_attn.ops.dispatch import weights_request


@keras.saving.register_keras_serializable(package="keras_attn")
class ScaledDotAttention(BaseAttention):
    """Scaled dot-product attention: softmax(Q Kᵀ / √d) V, with no weights of its own.

    Args:
        dropout: float in [0, 1), dropout on the attention weights. Defaults to `0.0`.
        scale: optional float replacing `1 / √d`. Defaults to `None`.
        seed: optional int seed for the dropout. Defaults to `None`.

    Call arguments:
        query: `(B, T, d)`.
        key: `(B, S, d)`, same `d` as the query. Defaults to `query`.
        value: `(B, S, dv)`. Defaults to `key`.
        valid_lens, attention_mask, use_causal_mask, return_attention_scores, training: as in
            every keras_attn attention layer.

    Returns:
        `(B, T, dv)`; with `return_attention_scores=True`, also the weights `(B, T, S)`.

    Example:
    >>> q, k, v = keras.ops.ones((2, 1, 2)), keras.ops.ones((2, 10, 2)), keras.ops.ones((2, 10, 4))
    >>> ScaledDotAttention()(q, k, v, valid_lens=keras.ops.array([2, 6])).shape  # (2, 1, 4)

    References:
        Vaswani et al., 2017, "Attention Is All You Need", https://arxiv.org/abs/1706.03762
    """

    def __init__(
        self, dropout: float = 0.0, scale: float | None = None, seed: int | None = None, **kwargs
    ):
        super().__init__(dropout=dropout, seed=seed, **kwargs)
        check_number("scale", scale, allow_none=True)
        self.scale = scale

    def build(self, query_shape, key_shape=None, value_shape=None):
        key_shape = query_shape if key_shape is None else key_shape
        value_shape = key_shape if value_shape is None else value_shape
        self.check_inputs(query_shape, key_shape, value_shape)
        check_last_dim("key", key_shape, query_shape[-1], "query")

    def attend(self, query, key, value, mask, training, need_weights=True):
        return attn_ops.attend(query, key, value, mask, scale=self.scale,
                               dropout_rate=self.dropout if training else 0.0,
                               seed=self.seed_generator,
                               return_weights=weights_request(need_weights, training))

    def compute_output_shape(self, query_shape, key_shape=None, value_shape=None):
        value_shape = (key_shape or query_shape) if value_shape is None else value_shape
        return tuple(query_shape[:2]) + (value_shape[-1],)

    def get_config(self):
        config = super().get_config()
        config["scale"] = self.scale
        return config
