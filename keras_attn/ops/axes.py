"""Attention over any axes of inputs of any rank, as Keras' `MultiHeadAttention` attends.

Inputs `(B, d_1, ..., d_n, dim)` attend over some of the axes `1..n` (the attention axes) and
are independent along the others. `AttentionAxes` folds them into the `(batch, length, dim)`
form every kernel takes: the other axes go into the batch, the attention axes (in the order
given) into one sequence axis, so the softmax normalises jointly over all the key attention
axes, as Keras' does. The scores of Keras' layer, `(B, others..., H, T..., S...)`, come back
in the same layout.
"""

from __future__ import annotations

import math

from keras import ops

from keras_attn._checks import check_int


def normalize_axes(attention_axes, rank: int) -> tuple[int, ...]:
    """`attention_axes` (None, an int or a sequence of ints, negative counting from the end
    of the input) as a tuple of axes in `[1, rank - 2]`; None means every axis but the batch
    and feature axes. Raises a ValueError naming `attention_axes` for anything else (an axis
    beyond the rank included: never taken modulo the rank, as Keras refuses it too)."""
    if attention_axes is None:
        return tuple(range(1, rank - 1))
    axes = (attention_axes,) if isinstance(attention_axes, int) else attention_axes
    expected = (f"an int, a tuple of ints in [1, {rank - 2}] or [{1 - rank}, -2] naming "
                f"distinct axes of the rank-{rank} inputs other than the batch and features")
    error = ValueError(f"Received an invalid value for argument `attention_axes`, expected "
                       f"{expected}. Received: attention_axes={attention_axes!r}")
    if not isinstance(axes, (tuple, list)) or not axes:
        raise error
    normalized = []
    for axis in axes:
        check_int("attention_axes", axis, -rank)
        if axis >= rank:
            raise error
        axis = int(axis) % rank
        if not 1 <= axis <= rank - 2 or axis in normalized:
            raise error
        normalized.append(axis)
    return tuple(normalized)


def check_axes_argument(attention_axes) -> None:
    """Refuse an `attention_axes` that no input rank could take (at construction)."""
    if attention_axes is None:
        return
    axes = (attention_axes,) if isinstance(attention_axes, int) else attention_axes
    if (not isinstance(axes, (tuple, list)) or not axes or any(
            isinstance(a, bool) or not isinstance(a, int) or a == 0 for a in axes)
            or len(set(axes)) != len(axes)):
        raise ValueError(
            "Received an invalid value for argument `attention_axes`, expected None, an int or "
            "a tuple of distinct ints naming axes other than the batch axis. Received: "
            f"attention_axes={attention_axes!r}"
        )


def _prod(dims):
    """The product of static ints (an int) or of some tensors (a scalar tensor)."""
    if all(isinstance(d, int) for d in dims):
        return math.prod(dims)
    out = 1
    for d in dims:
        out = out * d
    return out


class AttentionAxes:
    """How inputs of rank `rank` attending over `axes` fold into `(batch, length, dim)`.

    Args:
        rank: the rank of the inputs, `>= 3`.
        axes: attention axes as `normalize_axes` returns them.

    Attributes:
        others: the axes folded into the batch (besides axis 0), in order.
        is_plain: True when nothing needs folding (rank 3, attention over axis 1).
    """

    def __init__(self, rank: int, axes: tuple[int, ...]):
        self.rank = rank
        self.axes = axes
        self.others = tuple(a for a in range(1, rank - 1) if a not in axes)
        self.order = (0,) + self.others + axes  # the input axes, features last
        self.is_plain = rank == 3 and axes == (1,)

    def parts(self, shape):
        """`(batch, others, attention)` sizes of an input's `shape` (static where known)."""
        return (shape[0], tuple(shape[a] for a in self.others),
                tuple(shape[a] for a in self.axes))

    def fold(self, x, features: bool = True):
        """`(B, d_1.., d_n[, dim])` -> `(B · others, T[, dim])`."""
        order = self.order + ((self.rank - 1,) if features else ())
        shape = tuple(ops.shape(x))
        x = ops.transpose(x, order)  # (B, others.., attention..[, dim])
        length = _prod([shape[a] for a in self.axes])
        return ops.reshape(x, (-1, length) + ((shape[-1],) if features else ()))

    def unfold(self, y, shape, trailing: int = 1):
        """The inverse of `fold` for an output `(B · others, T, *trailing axes)` of an input of
        runtime shape `shape` (`keras.ops.shape`): `(B, d_1.., d_n, *trailing axes)`."""
        batch, others, attention = self.parts(shape)
        tail = tuple(ops.shape(y)[2:])
        y = ops.reshape(y, (batch,) + others + attention + tail)  # (B, others.., attn.., *t)
        inverse = [0] * (self.rank - 1)
        for position, axis in enumerate(self.order):
            inverse[axis] = position
        inverse += list(range(self.rank - 1, self.rank - 1 + trailing))
        return ops.transpose(y, inverse)

    def unfold_weights(self, weights, query_shape, key_shape):
        """`(B · others, H, T, S)` -> Keras' layout `(B, others.., H, T.., S..)` (runtime
        shapes of the inputs)."""
        batch, others, query_axes = self.parts(query_shape)
        key_axes = self.parts(key_shape)[2]
        heads = weights.shape[1]
        return ops.reshape(weights, (batch,) + others + (heads,) + query_axes + key_axes)

    def weights_shape(self, query_shape, key_shape, heads: int) -> tuple:
        """The static shape `unfold_weights` gives."""
        batch, others, query_axes = self.parts(query_shape)
        return (batch,) + others + (heads,) + query_axes + self.parts(key_shape)[2]

    def fold_attention_mask(self, mask, query_shape, key_shape, num_heads: int):
        """A boolean mask of Keras' layout as `(B · others, T, S)` (or `(B · others, H, T, S)`
        when it has a head axis); `query_shape` and `key_shape` are the inputs' runtime shapes
        (`keras.ops.shape`).

        As Keras lays it out: the last `2n` axes are the query's and the key's attention axes;
        the leading ones are the batch and the other axes from the left (missing trailing
        ones broadcast), optionally followed by the head axis.
        """
        n = len(self.axes)
        batch, others, query_axes = self.parts(query_shape)
        key_axes = self.parts(key_shape)[2]
        shape = tuple(mask.shape)
        lead, rest = shape[:len(shape) - 2 * n], shape[len(shape) - 2 * n:]
        has_heads = len(lead) == 2 + len(others)
        error = ValueError(
            "Argument `attention_mask` must have the layout of the attention scores without "
            f"or with the head axis: (batch_size, {', '.join(str(o) for o in others)}"
            f"{', ' if others else ''}[num_heads, ]{query_axes + key_axes}), leading "
            f"axes broadcasting. Received: attention_mask.shape={shape}"
        )
        if len(shape) < 2 * n or len(lead) > 2 + len(others):
            raise error
        if not has_heads:  # (B, others..) from the left, the missing trailing ones of size 1
            lead = lead + (1,) * (1 + len(others) - len(lead))
            mask = ops.reshape(mask, lead + rest)
        heads = (num_heads,) if has_heads else ()
        target = (batch,) + others + heads + query_axes + key_axes
        for have, want in zip(lead + rest, target):  # sizes known now: 1 or the scores'
            if isinstance(have, int) and isinstance(want, int) and have not in (1, want):
                raise error
        sizes = lead + rest
        if all(isinstance(size, int) for size in sizes):
            # Repeated, not broadcast: TensorFlow broadcasts at most 5 axes that differ once
            # adjacent ones are merged ("not supported yet"), and a mask over two attention
            # axes with others and heads has more.
            mask = ops.tile(mask, [want if have == 1 else 1 for have, want in zip(sizes, target)])
        else:
            mask = ops.broadcast_to(mask, target)
        return ops.reshape(mask, (-1,) + heads + (_prod(query_axes), _prod(key_axes)))
