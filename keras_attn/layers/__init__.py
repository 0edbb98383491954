"""The keras_attn layers, one family per module."""

from keras_attn.layers.add_norm import AddNorm
from keras_attn.layers.additive_attention import AdditiveAttention
from keras_attn.layers.base import BaseAttention
from keras_attn.layers.ffn import FFN
from keras_attn.layers.multi_head import MultiHead
from keras_attn.layers.nw_pooling import NWPooling
from keras_attn.layers.position_encoding import (
    SinusoidalPositionEncoding,
    sinusoidal_table,
)
from keras_attn.layers.scaled_dot_attention import ScaledDotAttention

__all__ = [
    "FFN",
    "AddNorm",
    "AdditiveAttention",
    "BaseAttention",
    "MultiHead",
    "NWPooling",
    "ScaledDotAttention",
    "SinusoidalPositionEncoding",
    "sinusoidal_table",
]
