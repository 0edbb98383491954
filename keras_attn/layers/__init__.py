"""The keras_attn layers, one family per module.

The model stacks (`TransformerEncoder`, `TransformerDecoder`, `TransformerDecoderOnly`,
`CMLMDecoder`, `LengthPredictor`, `BahdanauEncoder`, `BahdanauDecoder`) moved to
`keras_attn.models`; importing them from here still works, with a DeprecationWarning.
"""


from keras_attn._checks import warn_deprecated
from keras_attn.layers.add_norm import AddNorm
from keras_attn.layers.additive_attention import AdditiveAttention
from keras_attn.layers.bahdanau import BahdanauCell
from keras_attn.layers.base import BaseAttention
from keras_attn.layers.config import AttentionConfig, BlockConfig
from keras_attn.layers.decoder_only import TransformerDecoderOnlyBlock
from keras_attn.layers.dropout import Dropout
from keras_attn.layers.embedding import (
    OutputHead,
    TokenAndPositionEmbedding,
    TokenEmbedding,
)
from keras_attn.layers.ffn import FFN
from keras_attn.layers.linear_attention import LinearAttention
from keras_attn.layers.local_attention import LocalMultiHead
from keras_attn.layers.multi_head import MultiHead
from keras_attn.layers.nw_pooling import NWPooling
from keras_attn.layers.position_bias import AlibiBias, RelativePositionBias
from keras_attn.layers.position_encoding import (
    RotaryEmbedding,
    SinusoidalPositionEncoding,
    sinusoidal_table,
)
from keras_attn.layers.rotary_frequencies import FrequencyRotaryEmbedding
from keras_attn.layers.scaled_dot_attention import ScaledDotAttention
from keras_attn.layers.swin import (
    PatchEmbedding,
    PatchMerging,
    SwinBlock,
    WindowAttention,
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
    "AttentionConfig",
    "BahdanauCell",
    "BaseAttention",
    "BlockConfig",
    "Dropout",
    "FrequencyRotaryEmbedding",
    "LinearAttention",
    "LocalMultiHead",
    "MultiHead",
    "NWPooling",
    "OutputHead",
    "PatchEmbedding",
    "PatchMerging",
    "RelativePositionBias",
    "RotaryEmbedding",
    "ScaledDotAttention",
    "SinusoidalPositionEncoding",
    "SwinBlock",
    "TokenAndPositionEmbedding",
    "TokenEmbedding",
    "TransformerDecoderBlock",
    "TransformerDecoderOnlyBlock",
    "TransformerEncoderBlock",
    "WindowAttention",
    "linear_attention",
    "local_attention_mask",
    "local_dot_product_attention",
    "sinusoidal_table",
]

# Stacks that earlier releases exported from here; they live in keras_attn.models.
_MOVED_TO_MODELS = ("BahdanauDecoder", "BahdanauEncoder", "CMLMDecoder", "LengthPredictor",
                    "TransformerDecoder", "TransformerDecoderOnly", "TransformerEncoder")


def __getattr__(name: str):
    """`keras_attn.layers.TransformerEncoder` and the other moved stacks, deprecated."""
    if name not in _MOVED_TO_MODELS:
        raise AttributeError(f"module 'keras_attn.layers' has no attribute {name!r}")
    warn_deprecated(
        f"keras_attn.layers.{name} is deprecated: use keras_attn.models.{name} (or "
        f"keras_attn.{name}).")
    # The one import from layers/ up to models/, at use only (tests/test_structure.py).
    from keras_attn import models

    return getattr(models, name)
