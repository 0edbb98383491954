"""Inputs of any rank, attending over any axes, as Keras' `MultiHeadAttention` takes them.

`AnyRankInputs` gives an attention layer whose core works on `(batch, length, dim)` inputs the
whole of Keras' `attention_axes`: inputs `(B, d_1, ..., d_n, dim)` are folded by
`keras_attn.ops.axes.AttentionAxes` (the other axes into the batch, the attention axes into one
sequence), run through the layer's rank-3 call `_call`, and unfolded; the weights come back in
Keras' layout `(B, others..., H, T..., S...)`. Masks come in Keras' layout too.
"""

from __future__ import annotations

from keras import ops

from keras_attn.layers.base import as_shape, padding_masks
from keras_attn.ops.axes import AttentionAxes, normalize_axes


class AnyRankInputs:
    """Mixin of `MultiHead` (which has `attention_axes`, `num_heads`, `output_shape_`,
    `position_encoding`, `sliding_window` and the rank-3 `_call`)."""

    def axes_for(self, rank: int) -> AttentionAxes:
        """How inputs of `rank` fold into `(batch, length, dim)` for this layer's axes."""
        if rank < 3:
            raise ValueError(
                "Argument `query` must have rank 3 or more: (batch_size, length, dim). "
                f"Received: a rank-{rank} query"
            )
        return AttentionAxes(rank, normalize_axes(self.attention_axes, rank))

    def _call_folded(self, axes, query, key, value, valid_lens, attention_mask,
                     use_causal_mask, return_attention_scores, training, query_mask, key_mask,
                     value_mask, attention_bias, cache):
        """Inputs of rank > 3 (or other axes): the other axes folded into the batch, the
        attention axes into one sequence, the rank-3 call, and the results unfolded."""
        refused = {"valid_lens": valid_lens, "attention_bias": attention_bias, "cache": cache}
        for name, given in refused.items():
            if given is not None:
                raise ValueError(
                    f"Argument `{name}` applies to (batch, length, dim) inputs attending over "
                    f"axis 1; use `attention_mask` (Keras' layout) here. Received: "
                    f"query.shape={tuple(query.shape)}, attention_axes={self.attention_axes!r}"
                )
        if len(axes.axes) > 1 and (self.position_encoding is not None
                                   or self.sliding_window is not None):
            raise ValueError(
                "Arguments `position_encoding` and `sliding_window` place keys along one axis; "
                f"this layer attends over the axes {axes.axes} jointly. Received: "
                f"position_encoding={self.position_encoding!r}, "
                f"sliding_window={self.sliding_window!r}"
            )
        self_attention = key is None
        key = query if key is None else key
        value = key if value is None else value
        self.check_inputs(query.shape, key.shape, value.shape)
        query_mask, key_mask = padding_masks(query, key, value, query_mask, key_mask,
                                             value_mask, self_attention)
        shapes = [ops.shape(x) for x in (query, key)]
        if attention_mask is not None:
            attention_mask = axes.fold_attention_mask(
                ops.convert_to_tensor(attention_mask), *shapes, self.num_heads)
        folded_query_mask = None if query_mask is None else axes.fold(
            ops.convert_to_tensor(query_mask), features=False)  # (B · others, T)
        folded_key_mask = folded_query_mask if key_mask is query_mask else (
            None if key_mask is None else axes.fold(ops.convert_to_tensor(key_mask),
                                                    features=False))  # (B · others, S)
        results = self._call(
            axes.fold(query), None if self_attention else axes.fold(key),
            None if self_attention else axes.fold(value), None, attention_mask,
            use_causal_mask, return_attention_scores, training, folded_query_mask,
            folded_key_mask, None, None, None, None,
        )
        outputs = results[0] if return_attention_scores else results
        outputs = axes.unfold(outputs, shapes[0], trailing=len(self.output_shape_ or (1,)))
        if not return_attention_scores:
            return outputs
        return outputs, axes.unfold_weights(results[1], *shapes)

    def check_inputs(self, query_shape, key_shape, value_shape) -> None:
        """As every attention layer for rank-3 inputs; for inputs of rank > 3, the same rank,
        batch and other axes, and keys and values of one shape but the features."""
        query_shape, key_shape, value_shape = (as_shape(n, s) for n, s in (
            ("query", query_shape), ("key", key_shape), ("value", value_shape)))
        if len(query_shape) == 3 and len(key_shape) == 3 and len(value_shape) == 3:
            super().check_inputs(query_shape, key_shape, value_shape)
            axes = AttentionAxes(3, (1,))
        else:
            axes = self.axes_for(len(query_shape))
        for name, shape in (("key", key_shape), ("value", value_shape)):
            if len(shape) != len(query_shape):
                raise ValueError(
                    f"Arguments `query` and `{name}` must have the same rank. Received: "
                    f"query.shape={query_shape}, {name}.shape={shape}"
                )
            for axis in (0,) + axes.others:
                if None not in (shape[axis], query_shape[axis]) and (
                        shape[axis] != query_shape[axis]):
                    raise ValueError(
                        f"Arguments `query` and `{name}` must be equal on axis {axis} (the "
                        f"batch and the axes not attended over). Received: "
                        f"query.shape={query_shape}, {name}.shape={shape}"
                    )
        if any(None not in (a, b) and a != b for a, b in zip(key_shape[1:-1],
                                                             value_shape[1:-1])):
            raise ValueError(
                "Arguments `key` and `value` must be equal on every axis but the last (the "
                f"same positions). Received: key.shape={key_shape}, value.shape={value_shape}"
            )
        for name, shape in (("query", query_shape), ("key", key_shape), ("value", value_shape)):
            if shape[-1] is None:
                raise ValueError(
                    f"Argument `{name}` must have a known last dimension. "
                    f"Received: {name}.shape={shape}"
                )
