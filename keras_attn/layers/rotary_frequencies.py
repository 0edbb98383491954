"""Rotary position embedding with given inverse frequencies: any `rope_scaling` of a pretrained
checkpoint (Llama 3's, linear, YaRN's, none) written down as the numbers it computes."""

from __future__ import annotations

import keras
import numpy as np

from keras_attn._checks import check_number
from keras_attn.layers.position_encoding import RotaryEmbedding
from keras_attn.ops.position import constant


@keras.saving.register_keras_serializable(package="keras_attn")
class FrequencyRotaryEmbedding(RotaryEmbedding):
    """`RotaryEmbedding` whose inverse frequencies `f_i` are given, not derived.

    The rotation is `RotaryEmbedding`'s ("rotate half": feature `i` pairs with `i + d/2`,
    angle `θᵢ = position · fᵢ`); only the `d/2` frequencies come from the argument, so that a
    checkpoint's scaled RoPE (`rope_scaling` `"llama3"`, `"linear"`, ... as
    `keras_attn.ops.rope_inverse_frequencies` computes them) is applied exactly.

    Args:
        inverse_frequencies: sequence of `d / 2` positive floats, `f_0 ... f_{d/2 - 1}`.
        sequence_axis: int, the axis of positions. Defaults to `1`.
        feature_axis: int, the axis of the rotated features. Defaults to `-1`.
        attention_scaling: float > 0, multiplies cos and sin, so the rotated features (YaRN's
            `attention_factor`; transformers' `attention_scaling`). Defaults to `1.0`.

    Call arguments:
        inputs: a tensor with the two axes, e.g. `(B, T, H, d)` with `d = 2 *
            len(inverse_frequencies)`.
        start_index: int or scalar tensor, the position of the first element. Defaults to `0`.
        positions: optional `(T,)` or `(B, T)` positions. Defaults to `None`.

    Returns:
        Tensor of the shape and dtype of `inputs`.

    Example:
    >>> rope = FrequencyRotaryEmbedding([1.0, 0.01])
    >>> rope(keras.ops.ones((2, 5, 3, 4))).shape  # (2, 5, 3, 4)

    References:
        Su et al., 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding",
        https://arxiv.org/abs/2104.09864
    """

    def __init__(self, inverse_frequencies, sequence_axis: int = 1, feature_axis: int = -1,
                 attention_scaling: float = 1.0, **kwargs):
        kwargs.pop("max_wavelength", None)  # not this layer's: the frequencies are given
        kwargs.pop("scaling_factor", None)
        super().__init__(sequence_axis=sequence_axis, feature_axis=feature_axis, **kwargs)
        check_number("attention_scaling", attention_scaling, 0, strict=True)
        self.attention_scaling = float(attention_scaling)
        frequencies = np.asarray(inverse_frequencies, dtype="float64")
        if (frequencies.ndim != 1 or frequencies.size == 0
                or not np.all(np.isfinite(frequencies)) or np.any(frequencies <= 0)):
            raise ValueError(
                "Received an invalid value for argument `inverse_frequencies`, expected a "
                "non-empty sequence of positive finite floats. Received: "
                f"inverse_frequencies={inverse_frequencies!r}")
        self._frequencies = [float(f) for f in frequencies]

    def inverse_frequencies(self, depth: int):
        if depth != 2 * len(self._frequencies):
            raise ValueError(
                f"The rotated features must number twice the {len(self._frequencies)} "
                f"inverse frequencies. Received: inputs with {depth} features")
        frequencies = tuple(self._frequencies)
        return constant(("frequencies", frequencies),
                        lambda: np.asarray(frequencies, "float32"))  # (d/2,)

    def get_config(self):
        config = super().get_config()
        for name in ("max_wavelength", "scaling_factor"):
            config.pop(name)
        config["inverse_frequencies"] = list(self._frequencies)
        config["attention_scaling"] = self.attention_scaling
        return config
