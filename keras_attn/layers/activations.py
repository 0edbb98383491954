"""The activations of FFNs by name: Keras' own, the tanh GELU, and the gated ones.

A gated name (Shazeer, 2020) is the activation of the gate: `act(x W_g) ⊙ (x W_1)`. `"swiglu"`
(SiLU: LLaMA, Mistral, Qwen2), `"geglu"` (exact GELU), `"geglu_tanh"` (tanh GELU: Gemma),
`"reglu"` (ReLU).
"""

from __future__ import annotations

import keras

from keras_attn.ops import fused

# Gated name -> the gate's activation.
GATED = {"swiglu": "silu", "geglu": "gelu", "geglu_tanh": "gelu_tanh", "reglu": "relu"}


@keras.saving.register_keras_serializable(package="keras_attn")
def gelu_tanh(x):
    """GELU with the tanh approximation (GPT-2's `gelu_new`, PyTorch's `approximate="tanh"`).
    Blocks and stacks take it as `activation="gelu_tanh"`. Under TensorFlow outside XLA its
    gradient is the closed form (`keras_attn.ops.fused.gelu_tanh`)."""
    if fused.use_fused():
        return fused.gelu_tanh(x)
    return keras.activations.gelu(x, approximate=True)


@keras.saving.register_keras_serializable(package="keras_attn")
def gelu_erf(x):
    """Exact GELU, `x Φ(x) = ½ x (1 + erf(x / √2))`, written with `erf`: Keras' `"gelu"` on
    TensorFlow computes `erfc`, which tf2onnx (1.17, Keras' ONNX export) writes as an ONNX op
    that does not exist. The same function to a float32 rounding error."""
    return 0.5 * x * (1.0 + keras.ops.erf(x * _INV_SQRT2))


_INV_SQRT2 = 0.7071067811865476


def get_activation(activation, gated_names: bool = True):
    """A Keras activation or `"gelu_tanh"` as a function; with `gated_names`, a name of `GATED`
    as it is. Anything else is a ValueError naming `activation`."""
    if gated_names and isinstance(activation, str) and activation in GATED:
        return activation
    if activation in ("gelu_tanh", "keras_attn>gelu_tanh"):
        return gelu_tanh
    try:
        return keras.activations.get(activation)
    except (ValueError, TypeError) as error:
        raise ValueError(
            "Received an invalid value for argument `activation`, expected a Keras activation, "
            f"\"gelu_tanh\" or one of {sorted(GATED)}. Received: activation={activation!r}"
        ) from error


def serialize_activation(activation):
    """The config form of what `get_activation` returns."""
    if activation is gelu_tanh:
        return "gelu_tanh"
    return activation if isinstance(activation, str) else keras.activations.serialize(activation)


def gated_name(activation) -> str:
    """The gated name whose gate is `activation` (keras_attn 0.2's `gated_ffn=True`)."""
    name = serialize_activation(get_activation(activation))
    name = {"keras_attn>gelu_tanh": "gelu_tanh"}.get(name, name)
    if name in GATED:
        return name
    for gated, gate in GATED.items():
        if gate == name:
            return gated
    raise ValueError(
        f"A gated FFN takes a gate activation among {sorted(set(GATED.values()))}. Received: "
        f"activation={activation!r}")
