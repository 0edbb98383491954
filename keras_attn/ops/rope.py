"""Rotary position embedding frequencies, in NumPy: the one computation of `inv_freq` for
`keras_attn.layers.RotaryEmbedding`, `keras_attn.ops.rotary_embedding` and pretrained
checkpoints (`ArchitectureSpec.rope_inverse_frequencies`).

A rotary head of size `d` rotates feature `i` with feature `i + d/2` (the "rotate half" layout
of Hugging Face Llama, keras-hub and `keras_attn.layers.RotaryEmbedding`) by the angle
`position * inv_freq[i]`, `i < d/2`. Checkpoints differ in `inv_freq`, and YaRN also scales the
rotated queries and keys (transformers' `attention_scaling`, which multiplies cos and sin):

| `rope_type` | `inv_freq[i]`                                                                  |
|-------------|--------------------------------------------------------------------------------|
| `"default"` | `f = max_wavelength ** (-2i / d)` (Hugging Face's `rope_theta`)                |
| `"linear"`  | `f / factor` (positions interpolated by `factor`)                             |
| `"llama3"`  | per wavelength `λ = 2π / f`: `f` when `λ < L / high_freq_factor`, `f / factor` |
|             | when `λ > L / low_freq_factor`, else `(1 - s) f / factor + s f` with           |
|             | `s = (L / λ - low) / (high - low)`, `L = original_max_position_embeddings`     |
| `"yarn"`    | `(f / factor) (1 - e_i) + f e_i`, `e_i = 1 - clip((i - lo) / (hi - lo), 0, 1)`: |
|             | `lo`, `hi` the dimensions where a wavelength fits `L` `beta_fast` and          |
|             | `beta_slow` times (`d ln(L / (2π b)) / (2 ln theta)`, floored and ceiled       |
|             | unless `truncate` is false, clipped to `[0, d - 1]`); attention scaling        |
|             | `attention_factor`, or `0.1 ln(factor) + 1` (with `mscale` and                 |
|             | `mscale_all_dim`: the ratio of `0.1 m ln(factor) + 1` for the two)             |

These are the formulas of `transformers.modeling_rope_utils`
(`_compute_linear_scaling_rope_parameters`, `_compute_llama3_parameters`,
`_compute_yarn_parameters` and the models' `compute_default_rope_parameters`); the attention
scaling is 1 but for YaRN. Computed in float64 and returned as float32. The types whose
frequencies depend on the sequence length (`"dynamic"`, `"longrope"`) are not among them.
"""

from __future__ import annotations

import math

import numpy as np

from keras_attn._checks import warn_deprecated

ROPE_TYPES = ("default", "linear", "llama3", "yarn")
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
# YaRN's defaults (transformers: `beta_fast or 32`, `beta_slow or 1`).
YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0


def _default(head_dim: int, theta: float) -> np.ndarray:
    exponents = np.arange(0, head_dim, 2, dtype=np.float64) / head_dim  # (d/2,)
    return 1.0 / (float(theta) ** exponents)


def rope_inverse_frequencies(head_dim: int, max_wavelength: float = 10000.0,
                             rope_type: str = "default", factor: float | None = None,
                             low_freq_factor: float | None = None,
                             high_freq_factor: float | None = None,
                             original_max_position_embeddings: int | None = None,
                             beta_fast: float | None = None, beta_slow: float | None = None,
                             truncate: bool = True, **kwargs) -> np.ndarray:
    """The inverse frequencies of a rotary embedding, as Hugging Face computes them.

    Args:
        head_dim: int, even, the rotated size of a head.
        max_wavelength: float > 0, the base (Keras' name; Hugging Face's `rope_theta`, the
            `theta` of keras_attn 0.2's `keras_attn.checkpoints.rope_inverse_frequencies`).
            Defaults to `10000.0`.
        rope_type: `"default"`, `"linear"`, `"llama3"` or `"yarn"`. Defaults to `"default"`.
        factor: float >= 1, the scaling factor (all but `"default"`). Defaults to `None`.
        low_freq_factor: float, `"llama3"` only. Defaults to `None`.
        high_freq_factor: float > `low_freq_factor`, `"llama3"` only. Defaults to `None`.
        original_max_position_embeddings: int, the pretraining length, `"llama3"` and
            `"yarn"`. Defaults to `None`.
        beta_fast: float, `"yarn"` only: None means 32. Defaults to `None`.
        beta_slow: float, `"yarn"` only: None means 1. Defaults to `None`.
        truncate: bool, `"yarn"` only: whether the correction range is floored and ceiled to
            whole dimensions. Defaults to `True`.

    Returns:
        float32 array of shape `(head_dim // 2,)`.

    Example:
    >>> rope_inverse_frequencies(4, 10000.0)  # array([1.  , 0.01], dtype=float32)
    """
    if "theta" in kwargs:  # keras_attn 0.2's name
        warn_deprecated("rope_inverse_frequencies: `theta` is `max_wavelength` (keras_attn "
                        "0.3 names, see CHANGELOG.md).")
        max_wavelength = kwargs.pop("theta")
    if kwargs:
        raise TypeError(f"rope_inverse_frequencies() got unexpected keyword arguments "
                        f"{sorted(kwargs)}")
    theta = max_wavelength
    if isinstance(head_dim, bool) or not isinstance(head_dim, (int, np.integer)) or (
            head_dim < 2 or head_dim % 2):
        raise ValueError("Received an invalid value for argument `head_dim`, expected an even "
                         f"integer >= 2. Received: head_dim={head_dim!r}")
    if not isinstance(theta, (int, float, np.floating, np.integer)) or isinstance(
            theta, bool) or not theta > 0:
        raise ValueError("Received an invalid value for argument `max_wavelength`, expected a "
                         f"number > 0. Received: max_wavelength={theta!r}")
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
    if rope_type == "yarn":
        return _yarn(inv_freq, int(head_dim), float(theta), float(factor),
                     original_max_position_embeddings, beta_fast, beta_slow, truncate)
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


def _yarn(inv_freq: np.ndarray, dim: int, theta: float, factor: float, context, beta_fast,
          beta_slow, truncate: bool) -> np.ndarray:
    """YaRN's blend of interpolated (`f / factor`) and extrapolated (`f`) frequencies."""
    if isinstance(context, bool) or not isinstance(context, (int, float)) or not context > 0:
        raise ValueError("Received an invalid value for argument "
                         "`original_max_position_embeddings`, expected a number > 0 for "
                         "rope_type='yarn'. Received: original_max_position_embeddings="
                         f"{context!r}")
    betas = {"beta_fast": beta_fast or YARN_BETA_FAST, "beta_slow": beta_slow or YARN_BETA_SLOW}
    for name, value in betas.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"Received an invalid value for argument `{name}`, expected a "
                             f"number > 0 for rope_type='yarn'. Received: {name}={value!r}")

    def correction_dim(rotations: float) -> float:  # the dimension turning `rotations` times
        return dim * math.log(context / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(betas["beta_fast"]), correction_dim(betas["beta_slow"])
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: no division by zero
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp  # (d/2,): 1 keeps f, 0 interpolates
    return (inv_freq / factor * (1 - extrapolation) + inv_freq * extrapolation).astype(
        np.float32)


def yarn_attention_scaling(factor: float, attention_factor: float | None = None,
                           mscale: float | None = None,
                           mscale_all_dim: float | None = None) -> float:
    """YaRN's multiplier of cos and sin (so of the rotated queries and keys), as transformers'
    `_compute_yarn_parameters` returns it: `attention_factor` when given, else
    `0.1 ln(factor) + 1` (1 for `factor <= 1`), or with `mscale` and `mscale_all_dim` both
    non-zero the ratio of `0.1 m ln(factor) + 1` for `m = mscale` and `m = mscale_all_dim`.

    Example:
    >>> round(yarn_attention_scaling(4.0), 4)  # 1.1386
    """
    if attention_factor is not None:
        return float(attention_factor)

    def get_mscale(m: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    if mscale and mscale_all_dim:
        return float(get_mscale(mscale) / get_mscale(mscale_all_dim))
    return get_mscale(1.0)
