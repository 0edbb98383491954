"""LayerNorm and tanh-GELU with hand-written gradients: the same functions as Keras'
`LayerNormalization` and `gelu(approximate=True)`, in fewer TensorFlow ops.

TensorFlow differentiates Keras' LayerNorm and tanh-GELU op by op (moments with broadcasts and
tiles, the GELU polynomial term by term); the gradients below are the closed forms, a few
passes over the tensor each. Values and gradients equal Keras' up to float rounding. They
apply under TensorFlow outside XLA (which fuses the elementwise passes itself) while
`keras_attn.tuning`'s `fused_norm_gelu` is on (`use_fused`); the layers fall back to Keras'
own functions otherwise. Measured in `benchmarks/RESULTS.md` ("Language-model training step").
"""

from __future__ import annotations

import math

import keras
from keras import ops

from keras_attn import tuning

# GELU's tanh approximation: 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³))).
_GELU_SCALE = math.sqrt(2.0 / math.pi)
_GELU_CUBIC = 0.044715


def use_fused() -> bool:
    """Whether the hand-written gradients apply: TensorFlow, outside XLA, `fused_norm_gelu`."""
    return (tuning.SWITCHES.fused_norm_gelu and keras.backend.backend() == "tensorflow"
            and not tuning.in_xla_context())


def layer_norm(x, gamma, beta, epsilon: float):
    """`(x - mean) / sqrt(var + epsilon) * gamma + beta` over the last axis, in float32, with a
    closed-form gradient (TensorFlow only; see `use_fused`).

    Args:
        x: `(..., d)` float tensor.
        gamma: `(d,)` scale.
        beta: `(d,)` offset.
        epsilon: float added to the variance.

    Returns:
        `(..., d)` in the dtype of `x` (computed in float32, as Keras' LayerNormalization).
    """
    import tensorflow as tf

    dtype = x.dtype

    @tf.custom_gradient
    def norm(x, gamma, beta):
        mean = tf.reduce_mean(x, axis=-1, keepdims=True)  # (..., 1)
        centered = x - mean
        inv = tf.math.rsqrt(tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
                            + epsilon)  # (..., 1)
        normed = centered * inv  # (..., d)

        def grad(upstream):
            # A scope of its own: the backward ops would otherwise be unnamed in profiles.
            with tf.name_scope("layer_norm_grad"):
                d_normed = upstream * gamma  # (..., d)
                rows = list(range(len(x.shape) - 1))
                d_gamma = tf.reduce_sum(upstream * normed, axis=rows)  # (d,)
                d_beta = tf.reduce_sum(upstream, axis=rows)  # (d,)
                d_x = inv * (d_normed - tf.reduce_mean(d_normed, axis=-1, keepdims=True)
                             - normed * tf.reduce_mean(d_normed * normed, axis=-1,
                                                       keepdims=True))
                return d_x, d_gamma, d_beta

        return normed * gamma + beta, grad

    outputs = norm(tf.cast(x, "float32"), tf.cast(gamma, "float32"), tf.cast(beta, "float32"))
    return tf.cast(outputs, dtype)


def gelu_tanh(x):
    """`0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))` with a closed-form gradient (TensorFlow
    only; see `use_fused`); `keras.activations.gelu(x, approximate=True)` in value."""
    import tensorflow as tf

    @tf.custom_gradient
    def gelu(x):
        t = tf.tanh(_GELU_SCALE * (x + _GELU_CUBIC * x * x * x))

        def grad(upstream):
            # d/dx: 0.5 (1 + t) + 0.5 x (1 - t²) √(2/π) (1 + 3 · 0.044715 x²)
            with tf.name_scope("gelu_tanh_grad"):
                slope = 0.5 * x * (1.0 - t * t) * (
                    _GELU_SCALE * (1.0 + 3.0 * _GELU_CUBIC * x * x))
                return upstream * (0.5 * (1.0 + t) + slope)

        return 0.5 * x * (1.0 + t), grad

    return gelu(ops.convert_to_tensor(x))
