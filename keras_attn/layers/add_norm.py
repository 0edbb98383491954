"""Residual connection followed by layer normalization."""

from __future__ import annotations

import keras

from keras_attn._checks import check_number, check_one_of, check_rate
from keras_attn.layers.dropout import Dropout
from keras_attn.ops import fused

NORMS = ("layer", "rms")


@keras.saving.register_keras_serializable(package="keras_attn")
class LayerNorm(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` (same arguments, weights `gamma` and `beta`, config and
    values), whose last-axis form runs with a hand-written gradient under TensorFlow outside
    XLA (`keras_attn.ops.fused.layer_norm`, switch `fused_norm_gelu` of `keras_attn.tuning`).

    Example:
    >>> LayerNorm(epsilon=1e-5)(keras.ops.ones((2, 3, 4))).shape  # (2, 3, 4)
    """

    def call(self, inputs):
        axis = self.axis if isinstance(self.axis, (list, tuple)) else [self.axis]
        rank = len(inputs.shape)
        if (fused.use_fused() and self.center and self.scale and not self.rms_scaling
                and [a % rank for a in axis] == [rank - 1]):
            # Keras' layer takes its inputs uncast (`autocast=False`) and casts its output.
            outputs = fused.layer_norm(inputs, self.gamma, self.beta, self.epsilon)
            return keras.ops.cast(outputs, self.compute_dtype)
        return super().call(inputs)


def make_norm(norm: str, epsilon: float, name: str, dtype):
    """`LayerNorm` (`"layer"`, Keras' `LayerNormalization`) or `keras.layers.RMSNormalization`
    (`"rms"`) over the last axis."""
    check_one_of("norm", norm, NORMS)
    if norm == "rms":
        return keras.layers.RMSNormalization(epsilon=epsilon, name=name, dtype=dtype)
    return LayerNorm(epsilon=epsilon, name=name, dtype=dtype)


@keras.saving.register_keras_serializable(package="keras_attn")
class AddNorm(keras.layers.Layer):
    """Residual add and normalization: Norm(X + Dropout(Y)).

    Args:
        dropout: float in [0, 1), dropout on the sublayer output `Y`. Defaults to `0.0`.
        epsilon: float, the norm's epsilon. Defaults to `1e-5`.
        seed: optional int seed for the dropout. Defaults to `None`.
        norm: `"layer"` (`keras.layers.LayerNormalization`) or `"rms"`
            (`keras.layers.RMSNormalization`). Defaults to `"layer"`.

    Call arguments:
        inputs: `X`, the residual branch, `(B, T, d)`.
        sublayer_output: `Y`, same shape as `X`.
        training: bool, whether dropout is active.

    Returns:
        `(B, T, d)`. The implicit mask of `X` passes through.

    Example:
    >>> x = keras.ops.ones((2, 3, 4))
    >>> AddNorm(dropout=0.5)(x, x).shape  # (2, 3, 4)
    """

    def __init__(self, dropout: float = 0.0, epsilon: float = 1e-5, seed: int | None = None,
                 norm: str = "layer", **kwargs):
        super().__init__(**kwargs)
        check_rate("dropout", dropout)
        check_number("epsilon", epsilon, 0, strict=True)
        self.dropout = dropout
        self.epsilon = epsilon
        self.seed = seed
        self.supports_masking = True
        self.dropout_layer = Dropout(dropout, seed=seed, name="dropout", dtype=self.dtype_policy)
        self.norm = norm
        self.layer_norm = make_norm(norm, epsilon, "layer_norm", self.dtype_policy)

    def build(self, inputs_shape, sublayer_output_shape=None):
        if sublayer_output_shape is not None and tuple(inputs_shape[1:]) != tuple(
            sublayer_output_shape[1:]
        ):
            raise ValueError(
                "Arguments `inputs` and `sublayer_output` must have the same shape. Received: "
                f"inputs.shape={tuple(inputs_shape)}, "
                f"sublayer_output.shape={tuple(sublayer_output_shape)}"
            )
        self.layer_norm.build(inputs_shape)

    def call(self, inputs, sublayer_output, training=None):
        return self.layer_norm(inputs + self.dropout_layer(sublayer_output, training=training))

    def compute_output_shape(self, inputs_shape, sublayer_output_shape=None):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update({"dropout": self.dropout, "epsilon": self.epsilon, "seed": self.seed,
                       "norm": self.norm})
        return config
