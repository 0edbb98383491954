"""Position encodings added to or applied on embeddings: sinusoidal (Vaswani et al.) and rotary
(`RotaryEmbedding`); learned positions: `keras_attn.layers.embedding`."""

from __future__ import annotations

import keras
from keras import ops

from keras_attn import ops as attn_ops
from keras_attn._checks import as_int, check_number, check_rate
from keras_attn.layers.dropout import Dropout


def sinusoidal_table(length, dim: int, max_wavelength: float = 10000.0, start_index=0):
    """The float32 table P with P[i, 2j] = sin(i / w^(2j/d)), P[i, 2j+1] = cos(i / w^(2j/d)).

    Args:
        length: int or scalar tensor, number of positions.
        dim: int, feature size `d` (odd sizes drop the last cosine column).
        max_wavelength: float, `w`. Defaults to `10000`.
        start_index: int or scalar tensor (any integer dtype), position of the first row.
            Defaults to `0`.

    Returns:
        float32 tensor of shape `(length, dim)`.
    """
    half = (dim + 1) // 2
    positions = ops.arange(length, dtype="float32") + ops.cast(start_index, "float32")  # (L,)
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


@keras.saving.register_keras_serializable(package="keras_attn")
class RotaryEmbedding(keras.layers.Layer):
    """Rotary position embedding (RoPE; Su et al., 2021) of queries or keys.

    Rotates pairs of features (feature `i` of the first half with `i + d/2`) by angles
    `θᵢ = position · fᵢ`, inverse frequencies `fᵢ = max_wavelength^(-2i/d) / scaling_factor`,
    so that the score of a query and a key depends on their relative position. The same layout
    and arguments as `keras_hub.layers.RotaryEmbedding` (its default, linear scaling).
    `MultiHead` takes it as `position_encoding="rope"` (or an instance), applied to the
    projected queries and keys. Other scalings of RoPE override `inverse_frequencies`.

    Args:
        max_wavelength: float, the base of the angles. Defaults to `10000`.
        scaling_factor: float >= 1, divides every angle (linear position interpolation).
            Defaults to `1.0`.
        sequence_axis: int, the axis of positions. Defaults to `1`.
        feature_axis: int, the axis of the rotated features. Defaults to `-1`.

    Call arguments:
        inputs: a tensor with the two axes, e.g. `(B, T, d)` or `(B, T, H, d)`, `d` even.
        start_index: int or scalar tensor (any integer dtype), the position of the first
            element. Defaults to `0`.
        positions: optional `(T,)` or per-batch `(B, T)` positions, instead of
            `start_index + arange(T)`. Defaults to `None`.

    Returns:
        Tensor of the shape and dtype of `inputs`.

    Example:
    >>> RotaryEmbedding()(keras.ops.ones((2, 10, 4, 16))).shape  # (2, 10, 4, 16)
    >>> RotaryEmbedding()(keras.ops.ones((2, 3, 8)), positions=keras.ops.array([[0, 1, 2],
    ...                                                                        [5, 6, 7]]))

    References:
        Su et al., 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding",
        https://arxiv.org/abs/2104.09864
    """

    def __init__(self, max_wavelength: float = 10000, scaling_factor: float = 1.0,
                 sequence_axis: int = 1, feature_axis: int = -1, **kwargs):
        super().__init__(**kwargs)
        check_number("max_wavelength", max_wavelength, 0, strict=True)
        check_number("scaling_factor", scaling_factor, 1)
        self.sequence_axis = as_int("sequence_axis", sequence_axis, -64)
        self.feature_axis = as_int("feature_axis", feature_axis, -64)
        self.max_wavelength = max_wavelength
        self.scaling_factor = scaling_factor
        self.supports_masking = True
        # No weights: built from the start, so that `model.quantize` can walk past it when an
        # attention layer owns it and never calls it as a layer.
        self.built = True

    # What cos and sin are multiplied by (YaRN scales them: `FrequencyRotaryEmbedding`).
    attention_scaling = 1.0

    def inverse_frequencies(self, depth: int):
        """The float32 inverse frequencies `(depth / 2,)` of the rotation; the one place a
        subclass changes them (Llama 3's or other `rope_scaling`)."""
        return attn_ops.scaled_inverse_frequencies(depth, self.max_wavelength,
                                                   self.scaling_factor)

    def rotate(self, x, start_index=0, sequence_axis=None, positions=None):
        """`x` rotated, its positions along `sequence_axis` (default: the layer's)."""
        axis = self.sequence_axis if sequence_axis is None else sequence_axis
        depth = x.shape[self.feature_axis] if -len(x.shape) <= self.feature_axis < len(
            x.shape) else None
        return attn_ops.rotary_embedding(
            x, start_index, sequence_axis=axis, positions=positions,
            feature_axis=self.feature_axis,
            inverse_frequencies=None if depth is None else self.inverse_frequencies(depth),
            attention_scaling=self.attention_scaling)

    def call(self, inputs, start_index=0, positions=None):
        return self.rotate(inputs, start_index, positions=positions)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update({"max_wavelength": self.max_wavelength,
                       "scaling_factor": self.scaling_factor,
                       "sequence_axis": self.sequence_axis,
                       "feature_axis": self.feature_axis})
        return config
