"""Rotary position embedding frequencies of pretrained checkpoints, in NumPy.

A rotary head of size `d` rotates feature `i` with feature `i + d/2` (the "rotate half" layout
of Hugging Face Llama, keras-hub and `keras_attn.layers.RotaryEmbedding`) by the angle
`position * inv_freq[i]`, `i < d/2`. Checkpoints differ only in `inv_freq`:

| `rope_type` | `inv_freq[i]`                                                                  |
|-------------|--------------------------------------------------------------------------------|
| `"default"` | `theta ** (-2i / d)`                                                           |
| `"linear"`  | `theta ** (-2i / d) / factor` (positions interpolated by `factor`)            |
| `"llama3"`  | per wavelength `λ = 2π / f`, `f = theta ** (-2i / d)`: `f` when               |
|             | `λ < L / high_freq_factor`, `f / factor` when `λ > L / low_freq_factor`, else  |
|             | `(1 - s) f / factor + s f` with `s = (L / λ - low) / (high - low)`,            |
|             | `L = original_max_position_embeddings`                                         |

These are the formulas of `transformers.modeling_rope_utils`
(`_compute_linear_scaling_rope_parameters`, `_compute_llama3_parameters`, and the models'
`compute_default_rope_parameters`); all three keep the attention scaling at 1. Computed in float64 and returned as float32.
"""

from __future__ import annotations

import math

import numpy as np

ROPE_TYPES = ("default", "linear", "llama3")
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _default(head_dim: int, theta: float) -> np.ndarray:
    exponents = np.arange(0, head_dim, 2, dtype=np.float64) / head_dim  # (d/2,)
    return 1.0 / (float(theta) ** exponents)


def rope_inverse_frequencies(head_dim: int, theta: float, rope_type: str = "default",
                             factor: float | None = None, low_freq_factor: float | None = None,
                             high_freq_factor: float | None = None,
                             original_max_position_embeddings: int | None = None) -> np.ndarray:
    """The inverse frequencies of a rotary embedding, as Hugging Face computes them.

    Args:
        head_dim: int, even, the rotated size of a head.
        theta: float > 0, the base (`rope_theta`, keras' `max_wavelength`).
        rope_type: `"default"`, `"linear"` or `"llama3"`. Defaults to `"default"`.
        factor: float >= 1, the scaling factor (`"linear"` and `"llama3"`). Defaults to `None`.
        low_freq_factor: float, `"llama3"` only. Defaults to `None`.
        high_freq_factor: float > `low_freq_factor`, `"llama3"` only. Defaults to `None`.
        original_max_position_embeddings: int, the pretraining length, `"llama3"` only.
            Defaults to `None`.

    Returns:
        float32 array of shape `(head_dim // 2,)`.

    Example:
    >>> rope_inverse_frequencies(4, 10000.0)  # array([1.  , 0.01], dtype=float32)
    """
    if isinstance(head_dim, bool) or not isinstance(head_dim, (int, np.integer)) or (
            head_dim < 2 or head_dim % 2):
        raise ValueError("Received an invalid value for argument `head_dim`, expected an even "
                         f"integer >= 2. Received: head_dim={head_dim!r}")
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or not theta > 0:
        raise ValueError("Received an invalid value for argument `theta`, expected a number "
                         f"> 0. Received: theta={theta!r}")
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"Received an invalid value for argument `rope_type`, expected one of "
                         f"{ROPE_TYPES}. Received: rope_type={rope_type!r}")
    inv_freq = _default(int(head_dim), theta)
    if rope_type == "default":
        return inv_freq.astype(np.float32)
    if factor is None or not factor >= 1:
        raise ValueError("Received an invalid value for argument `factor`, expected a number "
                         f">= 1 for rope_type={rope_type!r}. Received: factor={factor!r}")
    if rope_type == "linear":
        return (inv_freq / factor).astype(np.float32)
    values = dict(zip(LLAMA3_KEYS, (factor, low_freq_factor, high_freq_factor,
                                    original_max_position_embeddings)))
    for name, value in values.items():
        if value is None or isinstance(value, bool) or not value > 0:
            raise ValueError(f"Received an invalid value for argument `{name}`, expected a "
                             f"number > 0 for rope_type='llama3'. Received: {name}={value!r}")
    if not high_freq_factor > low_freq_factor:
        raise ValueError("Received an invalid value for argument `high_freq_factor`, expected "
                         f"a number > low_freq_factor={low_freq_factor!r}. Received: "
                         f"high_freq_factor={high_freq_factor!r}")
    context = float(original_max_position_embeddings)
    low_freq_wavelen = context / low_freq_factor
    high_freq_wavelen = context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)
