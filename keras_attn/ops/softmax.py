"""Softmax that gives masked positions exactly zero weight, in float32."""

from __future__ import annotations

from keras import ops

from keras_attn.ops.masks import MASK_VALUE, AttentionMask


def softmax(x, axis: int = -1):
    """`keras.ops.softmax` (one fused kernel), or written out on an axis of size 1, where
    `keras.ops.softmax` warns."""
    if x.shape[axis] != 1:
        return ops.softmax(x, axis=axis)
    shifted = x - ops.stop_gradient(ops.max(x, axis=axis, keepdims=True))
    exps = ops.exp(shifted)
    return exps / ops.sum(exps, axis=axis, keepdims=True)


def masked_softmax(scores, mask=None, valid_lens=None, axis: int = -1):
    """Softmax over `axis` that gives masked positions exactly zero weight.

    Computed in float32 and cast back to the dtype of `scores`. A row with no valid position
    gets all zeros (not NaN, not a uniform distribution), and its gradient is zero.

    Args:
        scores: float tensor, e.g. `(B, S)`, `(B, T, S)` or `(B, H, T, S)`.
        mask: optional boolean tensor broadcastable to `scores`, True = keep.
        valid_lens: optional `(B,)` or `(B, T)` integer lengths along the last axis, as in
            d2l's `masked_softmax`; merged with `mask`. Requires `axis=-1`.
        axis: int, the axis to normalize. Defaults to `-1`.

    Returns:
        Tensor with the shape and dtype of `scores`.
    """
    scores = ops.convert_to_tensor(scores)
    out_dtype = scores.dtype
    x = ops.cast(scores, "float32")
    rank = len(x.shape)
    if valid_lens is not None:
        if axis not in (-1, rank - 1) or rank < 2:
            raise ValueError(
                "Argument `valid_lens` masks the last axis of scores of rank >= 2. Received: "
                f"axis={axis}, scores.shape={tuple(x.shape)}"
            )
        query_len = x.shape[-2] if rank >= 3 else 1
        lens_mask = AttentionMask.build(query_len, ops.shape(x)[-1], x.shape[0],
                                        valid_lens=valid_lens).block(rank=max(rank, 3))
        if rank == 2:
            lens_mask = lens_mask[:, 0, :]  # (B, S)
        mask = lens_mask if mask is None else ops.logical_and(ops.cast(mask, "bool"), lens_mask)
    if mask is None:
        return ops.cast(softmax(x, axis), out_dtype)
    mask = ops.cast(mask, "bool")
    weights = softmax(ops.where(mask, x, MASK_VALUE), axis)
    # A row with nothing to attend to softmaxes to uniform over -1e30: zero it explicitly.
    return ops.cast(weights * ops.cast(mask, "float32"), out_dtype)
