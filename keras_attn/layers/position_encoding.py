"""Sinusoidal position encoding of "Attention Is All You Need"."""

from __future__ import annotations

import keras
from keras import ops

from keras_attn._checks import check_number, check_rate
from keras_attn.layers.dropout import Dropout


def sinusoidal_table(length, dim: int, max_wavelength: float = 10000.0, start_index=0):
    """The float32 table P with P[i, 2j] = sin(i / w^(2j/d)), P[i, 2j+1] = cos(i / w^(2j/d)).

    Args:
        length: int or scalar tensor, number of positions.
        dim: int, feature size `d` (odd sizes drop the last cosine column).
        max_wavelength: float, `w`. Defaults to `10000`.
        start_index: int or scalar tensor, position of the first row. Defaults to `0`.

    Returns:
        float32 tensor of shape `(length, dim)`.
    """
    half = (dim + 1) // 2
    positions = ops.cast(ops.arange(length) + start_index, "float32")  # (L,)
    two_j = ops.arange(half, dtype="float32") * 2.0  # (d/2,)
    inverse_freq = ops.power(float(max_wavelength), -two_j / float(dim))  # (d/2,)
    angles = ops.expand_dims(positions, -1) * ops.expand_dims(inverse_freq, 0)  # (L, d/2)
    table = ops.stack([ops.sin(angles), ops.cos(angles)], axis=-1)  # (L, d/2, 2)
    table = ops.reshape(table, (-1, 2 * half))  # (L, 2 * ceil(d/2)): sin, cos interleaved
    return table[:, :dim]


@keras.saving.register_keras_serializable(package="keras_attn")
class SinusoidalPositionEncoding(keras.layers.Layer):
    """Adds the sinusoidal position table to its input: X + P.

    P[i, 2j] = sin(i / 10000^(2j/d)) and P[i, 2j+1] = cos(i / 10000^(2j/d)). The table is
    computed in float32 for whatever length comes in (no maximum length), added in float32 and
    cast back to the compute dtype, then dropout is applied.

    Args:
        max_wavelength: float, the base `10000` of the formula. Defaults to `10000`.
        dropout: float in [0, 1), dropout after the addition. Defaults to `0.0`.
        seed: optional int seed for the dropout. Defaults to `None`.

    Call arguments:
        inputs: `(B, T, d)`.
        start_index: int or scalar tensor, position of the first row (used when decoding one
            token at a time). Defaults to `0`.
        training: bool, whether dropout is active.

    Returns:
        `(B, T, d)`, same dtype as the input. A Keras implicit mask passes through.

    Example:
    >>> SinusoidalPositionEncoding()(keras.ops.zeros((1, 60, 32))).shape  # (1, 60, 32)

    References:
        Vaswani et al., 2017, "Attention Is All You Need", https://arxiv.org/abs/1706.03762
    """

    def __init__(
        self,
        max_wavelength: float = 10000,
        dropout: float = 0.0,
        seed: int | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_number("max_wavelength", max_wavelength, 0, strict=True)
        check_rate("dropout", dropout)
        self.max_wavelength = max_wavelength
        self.dropout = dropout
        self.seed = seed
        self.dropout_layer = Dropout(dropout, seed=seed, name="dropout", dtype=self.dtype_policy)
        self.supports_masking = True

    def build(self, input_shape):
        if len(input_shape) != 3 or input_shape[-1] is None:
            raise ValueError(
                "Argument `inputs` must have shape (batch_size, seq_len, dim) with a known dim. "
                f"Received: inputs.shape={tuple(input_shape)}"
            )

    def call(self, inputs, start_index=0, training=None):
        dtype = keras.backend.standardize_dtype(inputs.dtype)
        if not keras.backend.is_float_dtype(dtype):
            if "int" not in dtype and dtype != "bool":
                raise ValueError(
                    f"Argument `inputs` must be numeric. Received: inputs.dtype={dtype}"
                )
            inputs = ops.cast(inputs, self.compute_dtype)  # never add in integers
        length, dim = ops.shape(inputs)[1], inputs.shape[-1]
        table = sinusoidal_table(length, dim, self.max_wavelength, start_index)  # (T, d)
        outputs = ops.cast(ops.cast(inputs, "float32") + table, inputs.dtype)  # (B, T, d)
        return self.dropout_layer(outputs, training=training)

    def compute_output_shape(self, input_shape):
        return input_shape

    def compute_output_spec(self, inputs, start_index=0, training=None):
        return keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {"max_wavelength": self.max_wavelength, "dropout": self.dropout, "seed": self.seed}
        )
        return config
