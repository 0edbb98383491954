"""Quantized composite layers that save and load back: the dtype part of their config.

`model.quantize("int8")` quantizes the leaf layers (`Dense`, `Embedding`): each gets a
quantized dtype policy (`"int8_from_float32"`) and integer variables. A composite layer
(a block, a stack) rebuilds its sublayers from its own config when loaded, with its own dtype
policy, so they would come back as float layers and the integer variables would not fit. The
remedy keras-hub's backbones use: the composite layer's config stores a
`keras.dtype_policies.DTypePolicyMap` from each quantized sublayer's path to its policy; loaded
with that map as its `dtype`, the layer hands it to its sublayers (`dtype=self.dtype_policy`),
and each sublayer looks its own policy up by path when it is built.

Every keras_attn layer that creates sublayers calls `serialize_dtype(self)` in `get_config`.
"""

from __future__ import annotations

import keras


def serialize_dtype(layer: keras.layers.Layer):
    """The `"dtype"` entry of `layer`'s config.

    Args:
        layer: a built or unbuilt Keras layer.

    Returns:
        The serialized dtype policy of `layer`, or, when some of its sublayers are quantized, a
        serialized `DTypePolicyMap` (default: `layer`'s policy) from their paths to their
        quantized policies.
    """
    policy = layer.dtype_policy
    if isinstance(policy, keras.dtype_policies.DTypePolicyMap):
        return keras.dtype_policies.serialize(policy)
    quantized = [sub for sub in layer._flatten_layers(include_self=False)
                 if sub.path is not None and sub.quantization_mode is not None]
    if not quantized:
        return keras.dtype_policies.serialize(policy)
    policy_map = keras.dtype_policies.DTypePolicyMap(default_policy=policy)
    for sub in quantized:
        policy_map[sub.path] = sub.dtype_policy
    return keras.dtype_policies.serialize(policy_map)
