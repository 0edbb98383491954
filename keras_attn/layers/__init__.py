"""The keras_attn layers, one family per module."""

from keras_attn.layers.add_norm import AddNorm
from keras_attn.layers.additive_attention import AdditiveAttention
from keras_attn.layers.bahdanau import BahdanauCell, BahdanauDecoder, BahdanauEncoder
from keras_attn.layers.base import BaseAttention
from keras_attn.layers.cmlm import CMLMDecoder, LengthPredictor
from keras_attn.layers.decoder_only import (
    TransformerDecoderOnly,
    TransformerDecoderOnlyBlock,
)
from keras_attn.layers.dropout import Dropout
from keras_attn.layers.ffn import FFN
from keras_attn.layers.linear_attention import LinearAttention
from keras_attn.layers.local_attention import LocalMultiHead
from keras_attn.layers.multi_head import MultiHead
from keras_attn.layers.nw_pooling import NWPooling
from keras_attn.layers.position_bias import AlibiBias, RelativePositionBias
from keras_attn.layers.position_encoding import (
    RotaryEmbedding,
    SinusoidalPositionEncoding,
    TokenAndPositionEmbedding,
    sinusoidal_table,
)
from keras_attn.layers.scaled_dot_attention import ScaledDotAttention
from keras_attn.layers.swin import (
    PatchEmbedding,
    PatchMerging,
    SwinBlock,
    WindowAttention,
)
from keras_attn.layers.transformer import (
    TransformerDecoder,
    TransformerEncoder,
)
from keras_attn.layers.transformer_blocks import (
    TransformerDecoderBlock,
    TransformerEncoderBlock,
)

# Kernels that earlier releases exported from here; they live in keras_attn.ops.
from keras_attn.ops import (
    linear_attention,
    local_attention_mask,
    local_dot_product_attention,
)

__all__ = [
    "FFN",
    "AddNorm",
    "AdditiveAttention",
    "AlibiBias",
    "BahdanauCell",
    "BahdanauDecoder",
    "BahdanauEncoder",
    "BaseAttention",
    "CMLMDecoder",
    "Dropout",
    "LengthPredictor",
    "LinearAttention",
    "LocalMultiHead",
    "MultiHead",
    "NWPooling",
    "PatchEmbedding",
    "PatchMerging",
    "RelativePositionBias",
    "RotaryEmbedding",
    "ScaledDotAttention",
    "SinusoidalPositionEncoding",
    "SwinBlock",
    "TokenAndPositionEmbedding",
    "TransformerDecoder",
    "TransformerDecoderBlock",
    "TransformerDecoderOnly",
    "TransformerDecoderOnlyBlock",
    "TransformerEncoder",
    "TransformerEncoderBlock",
    "WindowAttention",
    "linear_attention",
    "local_attention_mask",
    "local_dot_product_attention",
    "sinusoidal_table",
]
