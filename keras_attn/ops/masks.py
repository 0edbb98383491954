"""One mask representation for every attention kernel.

Masks reach attention in many forms: d2l-style `valid_lens`, a boolean `attention_mask`
(True = attend), `use_causal_mask` (offset by the position of the first query during cached
decoding), a sliding window, query and key padding masks, Keras implicit masks. An
`AttentionMask` takes all of them once per call, checks them against the sizes of the call, and
keeps each in the form it came in, so that no kernel materializes a structured mask as `(T, S)`
unless it needs a dense block:

- a dense kernel asks for `block()` over every query and key;
- the blockwise kernel asks for `block(rows, cols)` one tile at a time, and for `key_range`, the
  keys a group of queries can see at all (the blocks outside it are skipped);
- local and linear kernels ask for the `(B, S)` key padding (`key_padding`), and refuse masks
  they cannot apply.

Padded queries (`query_valid`) are kept apart: every kernel gives them a zero output after
attention instead of widening a `(B, 1, S)` key mask to `(B, T, S)`.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from keras_attn._checks import check_int, concrete_value, static_int

# Added to the scores of masked positions (in float32): exp() of it is exactly 0 next to any
# real score, and `score - max` never overflows.
MASK_VALUE = -1e30


def sequence_mask(valid_lens, maxlen: int):
    """Boolean mask of the first `valid_lens` positions along a new last axis.

    Args:
        valid_lens: integer tensor of any shape `(...)`: how many leading positions are valid.
        maxlen: int or scalar int tensor, length of the masked axis.

    Returns:
        Boolean tensor of shape `(..., maxlen)`, True where `position < valid_lens`.

    Example:
    >>> sequence_mask([1, 3], 4)  # [[T, F, F, F], [T, T, T, F]]
    """
    static = static_int(maxlen)
    if (static is None and len(getattr(maxlen, "shape", (None,))) != 0) or (
            static is not None and static < 0):
        raise ValueError(
            "Argument `maxlen` must be a non-negative integer or a scalar integer tensor. "
            f"Received: maxlen={maxlen}"
        )
    positions = ops.arange(maxlen if static is None else static, dtype="int32")
    return ops.less(positions, ops.expand_dims(ops.cast(valid_lens, "int32"), -1))


def _as_bool_mask(name: str, mask):
    """A boolean tensor from a boolean or 0/1 integer mask; floats are refused."""
    mask = ops.convert_to_tensor(mask)
    dtype = keras.backend.standardize_dtype(mask.dtype)
    if dtype == "bool":
        return mask
    if "int" in dtype:
        values = concrete_value(mask)
        if values is not None and not np.isin(values, (0, 1)).all():
            raise ValueError(
                f"Argument `{name}` must be boolean (True = attend) or hold only 0 and 1. "
                f"Received: {name} with values {np.unique(values)[:6].tolist()}"
            )
        return ops.cast(mask, "bool")
    raise ValueError(
        f"Argument `{name}` must be boolean, True = attend. Received: {name}.dtype={dtype}. "
        "An additive float mask (0 to attend, -inf to hide, as torch takes it) goes through "
        "`attention_bias` instead; a float 0/1 mask becomes boolean with `mask > 0.5`."
    )


def _check_dim(name: str, shape, axis: int, expected, what: str, allow_one: bool = True):
    got = shape[axis]
    if isinstance(got, int) and isinstance(expected, int) and got != expected and not (
            allow_one and got == 1):
        raise ValueError(
            f"Argument `{name}` must have {what} {expected}"
            f"{' (or 1 to broadcast)' if allow_one else ''} on axis {axis % len(shape)}. "
            f"Received: {name}.shape={tuple(shape)}"
        )


class AttentionMask:
    """Which keys each query may attend to, kept in the structured form each part came in.

    A query `i` (at key position `p = i + offset`) may attend key `j` when every part allows
    it:

    - `key_lens` `(B,)` or `(B, T)`: `j < key_lens[b]` (or `key_lens[b, i]`);
    - `causal`: `j <= p`;
    - `window` (with `num_global`): `|p - j| <= window`, or `p` or `j` among the first
      `num_global` positions;
    - `dense`: a boolean `(B|1, T|1, S|1)` or `(B|1, H|1, T|1, S|1)` block;
    - `key_valid` `(B, S)`: key padding.

    `query_valid` `(B, T)` marks padded queries, which get zero weights and a zero output.

    Build it with `AttentionMask.build`, which checks every part against the sizes of the call.

    Example:
    >>> mask = AttentionMask.build(4, 6, valid_lens=[6, 3], use_causal_mask=True, causal_offset=2)
    >>> mask.block().shape  # (2, 4, 6)
    """

    def __init__(self, query_len, key_len, batch_size=None, key_lens=None, causal=False,
                 offset=0, window=None, num_global=0, dense=None, query_valid=None,
                 key_valid=None, true_key_len=None):
        self.query_len = query_len
        self.key_len = key_len
        self.batch_size = batch_size
        self.key_lens = key_lens
        self.causal = bool(causal)
        self.offset = offset
        self.window = window
        self.num_global = num_global
        self.dense = dense
        self.query_valid = query_valid
        self.key_valid = key_valid
        # Keys at or after `true_key_len` are a kernel's padding to whole blocks (`padded`).
        self.true_key_len = true_key_len

    # ---- construction --------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        query_len,
        key_len,
        batch_size=None,
        valid_lens=None,
        attention_mask=None,
        use_causal_mask: bool = False,
        causal_offset=0,
        window: int | None = None,
        num_global: int = 0,
        query_mask=None,
        key_mask=None,
        mask_name: str = "attention_mask",
    ) -> AttentionMask:
        """Check every way a mask can come in against the sizes of one call, and keep them.

        Args:
            query_len: `T`, int or scalar tensor.
            key_len: `S`, int or scalar tensor (a decoding cache's length, not the new keys').
            batch_size: optional `B` to check the masks against. Defaults to `None`.
            valid_lens: optional integer `(B,)` or `(B, T)` number of valid keys.
            attention_mask: optional boolean `(T, S)`, `(B, T, S)` or `(B, H, T, S)` (axes of
                size 1 broadcast), True = attend.
            use_causal_mask: bool, query `i` sees keys `j <= i + causal_offset`.
            causal_offset: int or scalar int tensor, key position of query 0 (cached
                decoding); also places the window. Defaults to `0`.
            window: optional int >= 0, query `i` sees keys `|i + causal_offset - j| <= window`.
            num_global: int >= 0, leading positions outside the window rule. Defaults to `0`.
            query_mask: optional boolean `(B, T)`, False at padded queries.
            key_mask: optional boolean `(B, S)`, False at padded keys.
            mask_name: the name the caller gave `attention_mask`, for error messages.

        Returns:
            An `AttentionMask`.
        """
        batch = static_int(batch_size) if batch_size is not None else None
        t, s = static_int(query_len), static_int(key_len)
        key_lens = None
        if valid_lens is not None:
            key_lens = cls._check_valid_lens(valid_lens, batch, t, s)
        dense = None
        if attention_mask is not None:
            dense = _as_bool_mask(mask_name, attention_mask)
            shape = tuple(dense.shape)
            if len(shape) not in (2, 3, 4):
                raise ValueError(
                    f"Argument `{mask_name}` must have shape (query_len, key_len), (batch_size, "
                    "query_len, key_len) or (batch_size, num_heads, query_len, key_len). "
                    f"Received: {mask_name}.shape={shape}"
                )
            _check_dim(mask_name, shape, -2, t, "query_len")
            _check_dim(mask_name, shape, -1, s, "key_len")
            if len(shape) >= 3:
                _check_dim(mask_name, shape, 0, batch, "batch_size")
            if len(shape) == 2:
                dense = ops.expand_dims(dense, 0)
        if window is not None:
            check_int("window", window, 0)
        check_int("num_global", num_global, 0)
        if static_int(causal_offset) is None and not hasattr(causal_offset, "shape"):
            raise ValueError(
                "Argument `causal_offset` must be an integer or a scalar integer tensor. "
                f"Received: causal_offset={causal_offset!r}"
            )
        return cls(
            query_len, key_len, batch, key_lens, use_causal_mask,
            ops.cast(causal_offset, "int32") if static_int(causal_offset) is None
            else static_int(causal_offset),
            window, num_global if window is not None else 0, dense,
            cls._check_padding("query_mask", query_mask, batch, t, "query_len"),
            cls._check_padding("key_mask", key_mask, batch, s, "key_len"),
        )

    @staticmethod
    def _check_valid_lens(valid_lens, batch, t, s):
        lens = ops.convert_to_tensor(valid_lens)
        dtype = keras.backend.standardize_dtype(lens.dtype)
        if "int" not in dtype:
            raise ValueError(
                "Argument `valid_lens` must hold integer lengths. Received: "
                f"valid_lens.dtype={dtype}"
            )
        shape = tuple(lens.shape)
        if len(shape) not in (1, 2):
            raise ValueError(
                "Argument `valid_lens` must have shape (batch_size,) or (batch_size, query_len). "
                f"Received: valid_lens.shape={shape}"
            )
        _check_dim("valid_lens", shape, 0, batch, "batch_size", allow_one=False)
        if len(shape) == 2:
            _check_dim("valid_lens", shape, 1, t, "query_len", allow_one=False)
        values = concrete_value(lens)
        if values is not None and values.size and (
                values.min() < 0 or (s is not None and values.max() > s)):
            raise ValueError(
                f"Argument `valid_lens` must lie in [0, key_len={s}]. Received: valid_lens with "
                f"values from {values.min()} to {values.max()}"
            )
        return ops.cast(lens, "int32")

    @staticmethod
    def _check_padding(name, mask, batch, length, what):
        if mask is None:
            return None
        mask = _as_bool_mask(name, mask)
        shape = tuple(mask.shape)
        if len(shape) != 2:
            raise ValueError(
                f"Argument `{name}` must have shape (batch_size, {what}). "
                f"Received: {name}.shape={shape}"
            )
        _check_dim(name, shape, 0, batch, "batch_size", allow_one=False)
        _check_dim(name, shape, 1, length, what, allow_one=False)
        return mask

    # ---- what kernels ask ------------------------------------------------------------------

    @property
    def masks_keys(self) -> bool:
        """Whether any part hides keys (everything except `query_valid`)."""
        return (self.key_lens is not None or self.causal or self.window is not None
                or self.dense is not None or self.key_valid is not None
                or self.true_key_len is not None)

    def padded(self, query_pad, key_pad) -> AttentionMask:
        """The mask over queries and keys padded at the end by `query_pad` and `key_pad`
        (ints or scalar tensors), for kernels that cut them into whole blocks: padded keys are
        hidden from every query, padded queries see nothing."""
        def pad(x, axis, amount, value):
            if x is None or x.shape[axis] == 1 or (isinstance(amount, int) and amount == 0):
                return x
            widths = [[0, 0] for _ in x.shape]
            widths[axis][1] = amount
            return ops.pad(x, widths, constant_values=value)

        key_lens = self.key_lens
        if key_lens is not None and len(key_lens.shape) == 2:
            key_lens = pad(key_lens, 1, query_pad, 0)
        dense = pad(pad(self.dense, -2, query_pad, False), -1, key_pad, False)
        hidden = isinstance(key_pad, int) and key_pad == 0
        return AttentionMask(
            self.query_len + query_pad, self.key_len + key_pad, self.batch_size, key_lens,
            self.causal, self.offset, self.window, self.num_global, dense,
            pad(self.query_valid, 1, query_pad, False), pad(self.key_valid, 1, key_pad, False),
            self.true_key_len if hidden or self.true_key_len is not None else self.key_len,
        )

    @property
    def rank(self) -> int:
        """The rank of `block()` without an explicit rank: 3, or a per-head dense mask's."""
        return 3 if self.dense is None else max(3, len(self.dense.shape))

    def with_dense(self, dense) -> AttentionMask:
        """The same mask with its dense part replaced (e.g. its head axis regrouped)."""
        return AttentionMask(self.query_len, self.key_len, self.batch_size, self.key_lens,
                             self.causal, self.offset, self.window, self.num_global, dense,
                             self.query_valid, self.key_valid, self.true_key_len)

    def block(self, row_start=0, rows=None, col_start=0, cols=None, rank: int | None = None):
        """The boolean mask of a tile of queries × keys, or None when nothing is hidden in it.

        Args:
            row_start, rows: the queries `[row_start, row_start + rows)`. Defaults to all.
            col_start, cols: the keys `[col_start, col_start + cols)`. Defaults to all.
            rank: rank of the result; axes of size 1 are inserted after the batch axis (a
                head axis). Defaults to `self.rank`.

        Returns:
            Boolean tensor broadcastable to `(B, ..., rows, cols)`, or None.
        """
        rows = self.query_len if rows is None else rows
        cols = self.key_len if cols is None else cols
        rank = self.rank if rank is None else rank
        parts = []
        query_pos = col_pos = None
        key_len = self.true_key_len
        if self.causal or self.window is not None or self.key_lens is not None or (
                key_len is not None):
            query_pos = ops.expand_dims(row_start + ops.arange(rows, dtype="int32"), -1)
            query_pos = query_pos + self.offset  # (rows, 1) key position of each query
            col_pos = ops.expand_dims(col_start + ops.arange(cols, dtype="int32"), 0)  # (1, c)
        if key_len is not None:
            parts.append(ops.less(col_pos, key_len)[None])  # (1, 1, c)
        if self.causal:
            parts.append(ops.less_equal(col_pos, query_pos)[None])  # (1, rows, c)
        if self.window is not None:
            band = ops.less_equal(ops.abs(query_pos - col_pos), self.window)
            if self.num_global:
                band = ops.logical_or(band, ops.logical_or(
                    ops.less(query_pos, self.num_global), ops.less(col_pos, self.num_global)))
            parts.append(band[None])  # (1, rows, c)
        if self.key_lens is not None:
            lens = self.key_lens
            if len(lens.shape) == 1:
                lens = lens[:, None, None]  # (B, 1, 1)
            else:
                lens = _slice(lens, 1, row_start, rows, self.query_len)[:, :, None]  # (B, r, 1)
            parts.append(ops.less(col_pos[None], lens))  # (B, rows | 1, c)
        if self.key_valid is not None:
            # expand_dims, not [:, None, :]: LiteRT has no builtin strided slice of booleans
            # with a new axis (its converter falls back to the Flex delegate).
            parts.append(ops.expand_dims(
                _slice(self.key_valid, 1, col_start, cols, self.key_len), 1))  # (B, 1, c)
        if self.dense is not None:
            dense = _slice(self.dense, -2, row_start, rows, self.query_len)
            parts.append(_slice(dense, -1, col_start, cols, self.key_len))
        if not parts:
            return None
        rank = max(rank, max(len(part.shape) for part in parts))
        mask = None
        for part in parts:
            while len(part.shape) < rank:
                part = ops.expand_dims(part, 1 if len(part.shape) >= 3 else 0)
            mask = part if mask is None else ops.logical_and(mask, part)
        return mask

    def key_range(self, row_start, rows):
        """`(first, end)`: the keys `[first, end)` that the queries `[row_start, row_start +
        rows)` may see at all, as scalar int32 tensors; `first` is 0 and `end` the key length
        where no structured part bounds them."""
        key_len = self.key_len if self.true_key_len is None else self.true_key_len
        end = ops.convert_to_tensor(key_len, "int32")
        first = ops.zeros((), "int32")
        last_pos = row_start + rows - 1 + self.offset  # key position of the last query
        if self.causal:
            end = ops.minimum(end, last_pos + 1)
        if self.window is not None and not self.num_global:
            end = ops.minimum(end, last_pos + self.window + 1)
            first = ops.maximum(first, row_start + self.offset - self.window)
        if self.key_lens is not None:
            lens = self.key_lens
            if len(lens.shape) == 2:
                lens = _slice(lens, 1, row_start, rows, self.query_len)
            end = ops.minimum(end, ops.max(lens))
        return ops.cast(first, "int32"), ops.maximum(ops.cast(end, "int32"), 0)

    def key_visible(self):
        """`(B, S)` boolean, False at keys that no query may see (padding), or None when that
        is not known from the structured parts. Kernels zero such keys and values so that a
        non-finite number there cannot reach outputs or gradients."""
        parts = []
        if self.key_valid is not None:
            parts.append(self.key_valid)
        if self.key_lens is not None:
            lens = self.key_lens if len(self.key_lens.shape) == 1 else ops.max(
                self.key_lens, axis=1)
            parts.append(sequence_mask(lens, self.key_len))
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else ops.logical_and(*parts)

    def key_padding(self, kernel: str, allow_causal: bool = True, allow_window: bool = False):
        """`(B, S)` boolean key padding (lengths and key masks), or None, for kernels that
        take nothing else; raises for the parts `kernel` cannot apply."""
        refused = []
        if self.dense is not None:
            refused.append("`attention_mask`")
        if self.key_lens is not None and len(self.key_lens.shape) == 2:
            refused.append("`valid_lens` of shape (batch_size, query_len)")
        if self.causal and not allow_causal:
            refused.append("`use_causal_mask`")
        if self.window is not None and not allow_window:
            refused.append("a sliding window")
        if refused:
            raise ValueError(
                f"{kernel} cannot apply " + " or ".join(refused) + ": it never forms the "
                "(query_len, key_len) matrix. Use `valid_lens` of shape (batch_size,), key "
                f"padding masks{' or `use_causal_mask`' if allow_causal else ''} instead."
            )
        return self.key_visible()

    def hide_inputs(self, query, key=None, value=None):
        """`(query, key, value)` with zeros where the mask hides them everywhere: padded
        queries (`query_valid`) and keys no query may see (`key_visible`), so that a
        non-finite number there reaches neither outputs nor gradients. Tensors are
        `(B, ..., L, d)`; None stays None.

        Called once per call, where the tensors come in: an attention layer on its inputs
        before projecting them (so weight gradients stay finite too), the op
        `dot_product_attention` on its arguments.
        """
        if self.query_valid is not None:
            query = hide_positions(query, self.query_valid)
        visible = self.key_visible()
        if visible is not None:
            same = value is key
            key = None if key is None else hide_positions(key, visible)
            value = key if same else (None if value is None else hide_positions(value, visible))
        return query, key, value

    def append_keys(self, count: int) -> AttentionMask:
        """The same mask over `count` more keys at the end, visible to every query (torch's
        `add_bias_kv` / `add_zero_attn`). The structured parts become one dense block."""
        block = self.block()
        if block is None:
            return AttentionMask(self.query_len, self.key_len + count, self.batch_size,
                                 query_valid=self.query_valid)
        shape = tuple(ops.shape(block)[:-2]) + (self.query_len, self.key_len)
        block = ops.broadcast_to(block, shape)
        extra = ops.ones(tuple(shape[:-1]) + (count,), "bool")
        return AttentionMask(self.query_len, self.key_len + count, self.batch_size,
                             dense=ops.concatenate([block, extra], axis=-1),
                             query_valid=self.query_valid)


def _slice(x, axis: int, start, size, full):
    """`x[..., start:start + size, ...]` along `axis`; an axis of size 1 (broadcast) or a
    slice covering the whole axis is returned as it is."""
    rank = len(x.shape)
    axis %= rank
    if x.shape[axis] == 1:
        return x
    if isinstance(start, int) and start == 0 and (
            size is full or (isinstance(size, int) and size in (full, x.shape[axis]))):
        return x
    starts = [0] * rank
    starts[axis] = start
    shape = list(ops.shape(x))
    shape[axis] = size
    return ops.slice(x, starts, shape)


def hide_positions(x, valid):
    """`x` `(B, ..., L, d)` with zeros where `valid` `(B, L)` is False."""
    valid = ops.expand_dims(ops.cast(valid, "bool"), -1)  # (B, L, 1)
    while len(valid.shape) < len(x.shape):
        valid = ops.expand_dims(valid, 1)  # (B, 1.., L, 1)
    return ops.where(valid, x, ops.zeros_like(x))
