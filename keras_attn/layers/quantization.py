"""Quantized sublayers that survive a `.keras` round trip.

A composite layer (`MultiHead`, `FFN`, a block, a stack) creates its `Dense` sublayers from its
own dtype policy. After `quantize("int8")` those sublayers hold int8 kernels and scales, but the
composite's config still names a float policy, so a loaded copy would rebuild float variables
and fail to take the saved ones. The fix is Keras' own (`keras.dtype_policies.DTypePolicyMap`,
as keras-hub's backbones use it): the composite's config carries a map from each quantized
sublayer's path to its policy; loaded, the composite hands the map to its sublayers, and each
looks its own path up and builds quantized variables.

`QuantizedSublayers` gives a layer both halves: `quantize(mode)` over its sublayers, and
`dtype_config()` for its `get_config`. Any composite layer that passes `dtype=self.dtype_policy`
to its sublayers can reuse it.
"""

from __future__ import annotations

import keras


def _own_policy(layer):
    """The policy that applies to `layer` itself (its entry when it holds a map)."""
    policy = layer.dtype_policy
    if isinstance(policy, keras.dtype_policies.DTypePolicyMap) and layer.path:
        return policy[layer.path]
    return policy


def quantized_dtype_policy(layer):
    """`layer`'s dtype policy, or, when some of its sublayers are quantized, a
    `DTypePolicyMap` with the layer's policy as default and each quantized sublayer's policy
    under its path."""
    quantized = {sub.path: _own_policy(sub) for sub in layer._flatten_layers(include_self=False)
                 if sub.quantization_mode is not None and sub.path}
    policy = layer.dtype_policy
    if not quantized:
        return policy
    if not isinstance(policy, keras.dtype_policies.DTypePolicyMap):
        policy = keras.dtype_policies.DTypePolicyMap(default_policy=policy)
    for path, sub_policy in quantized.items():
        if path not in policy:
            policy[path] = sub_policy
    return policy


def _supports_quantization(layer) -> bool:
    return type(layer).quantize is not keras.layers.Layer.quantize


class QuantizedSublayers:
    """Mixin for a composite layer whose quantizable sublayers (`Dense`, `EinsumDense`,
    `Embedding`) should quantize with it and load back quantized from `.keras` files."""

    def quantize(self, mode=None, type_check=True, config=None, **kwargs):
        """Quantize every sublayer that supports it (see `keras.layers.Dense.quantize`).

        Args:
            mode: e.g. `"int8"`, `"int4"`, `"float8"`.
            type_check: passed to each sublayer's `quantize`.
            config: optional `keras.quantizers.QuantizationConfig`.
        """
        if not self.built:
            raise ValueError(
                f"Layer {self.name!r} must be built before `quantize` (call it once on inputs)."
            )
        for sub in self._flatten_layers(include_self=False):
            if getattr(sub, "_is_quantized", False) or not _supports_quantization(sub):
                continue
            if isinstance(sub, QuantizedSublayers):
                continue  # its own sublayers come next in the walk
            sub.quantize(mode, type_check=type_check, config=config, **kwargs)

    def dtype_config(self):
        """The serialized dtype for `get_config`: the policy, or the map of quantized
        sublayers (`quantized_dtype_policy`)."""
        return keras.dtype_policies.serialize(quantized_dtype_policy(self))
