"""Pure tensor functions for attention, written with `keras.ops`.

- `masks`: the one mask representation, `AttentionMask`, and the small builders
  (`sequence_mask`, `causal_mask`, `local_attention_mask`, `merge_masks`);
- `softmax`, `dropout`: float32 masked softmax, 16-bit dropout masks;
- `heads`: splitting projections into heads and merging them back;
- `position`: rotary embeddings, and position biases (ALiBi, T5 buckets) computed per tile;
- `dispatch`: `attend`, the seam between projected heads and the kernels in `kernels/` (dense
  with a fused backward, blockwise, local, linear, and the backend's own op): grouped-query
  heads, the kernel choice (`"auto"`: measured per backend and device) and its fallback
  (`kernel_for`);
- `attention`: `dot_product_attention`, the same computation as a checked op that zeroes what
  its mask hides;
- `axes`: attention over any axes of inputs of any rank, folded into `(batch, length, dim)`.

Every mask is boolean with **True = attend**. A query row with nothing to attend to gets
all-zero weights and a zero output: never NaN, never uniform attention over padding. Scores and
softmax run in float32 whatever the input dtype.
"""

from keras_attn.ops.attention import dot_product_attention
from keras_attn.ops.dense_masks import (
    causal_mask,
    local_attention_mask,
    merge_masks,
    valid_lens_mask,
)
from keras_attn.ops.dispatch import IMPLEMENTATIONS, attend, kernel_for
from keras_attn.ops.dropout import dropout
from keras_attn.ops.heads import merge_heads, split_heads
from keras_attn.ops.kernels.linear import (
    elu_feature_map,
    linear_attention,
    linear_attention_weights,
)
from keras_attn.ops.local import local_dot_product_attention
from keras_attn.ops.masks import AttentionMask, sequence_mask
from keras_attn.ops.position import (
    AlibiTileBias,
    PositionBias,
    RelativeTileBias,
    alibi_slopes,
    relative_position_bucket,
    rotary_embedding,
    scaled_inverse_frequencies,
)
from keras_attn.ops.rope import rope_inverse_frequencies, yarn_attention_scaling
from keras_attn.ops.softmax import masked_softmax

__all__ = [
    "IMPLEMENTATIONS",
    "AlibiTileBias",
    "AttentionMask",
    "PositionBias",
    "RelativeTileBias",
    "alibi_slopes",
    "attend",
    "causal_mask",
    "dot_product_attention",
    "dropout",
    "elu_feature_map",
    "kernel_for",
    "linear_attention",
    "linear_attention_weights",
    "local_attention_mask",
    "local_dot_product_attention",
    "masked_softmax",
    "merge_heads",
    "merge_masks",
    "relative_position_bucket",
    "rope_inverse_frequencies",
    "rotary_embedding",
    "scaled_inverse_frequencies",
    "sequence_mask",
    "split_heads",
    "valid_lens_mask",
    "yarn_attention_scaling",
]

# keras_attn 0.2's names of the tile biases (the layers keep `AlibiBias` and
# `RelativePositionBias`: one class per name).
_RENAMED = {"AlibiBias": "AlibiTileBias", "RelativePositionBias": "RelativeTileBias"}


def __getattr__(name: str):
    if name not in _RENAMED:
        raise AttributeError(f"module 'keras_attn.ops' has no attribute {name!r}")
    from keras_attn._checks import warn_deprecated

    warn_deprecated(f"keras_attn.ops: `{name}` is `{_RENAMED[name]}` (keras_attn.layers.{name} "
                    "is the layer) (keras_attn 0.3 names, see CHANGELOG.md).")
    return globals()[_RENAMED[name]]
