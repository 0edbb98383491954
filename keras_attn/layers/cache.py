"""The static key/value cache of multi-head attention, for decoding one token at a time.

A cache is a pair `(key_cache, value_cache)` of `(B, H_kv, S_max, ·)` tensors preallocated to the
longest sequence: each call writes its projected keys and values at `cache_update_index` (a
slice update, static shape) and attends over the whole cache, so one step at a time equals the
whole sequence at once.
"""

from __future__ import annotations

import contextlib
import contextvars

import keras
from keras import ops

from keras_attn._checks import check_positive_int, concrete_value, static_int
from keras_attn.ops.masks import hide_positions

# Set while an exporter traces a decode step (`gathered_cache_writes`): caches are then
# written by a gather and a select, not a slice update.
_GATHERED_WRITES = contextvars.ContextVar("keras_attn_gathered_cache_writes", default=False)


@contextlib.contextmanager
def gathered_cache_writes():
    """Within this context, `KeyValueCache.write_cache` writes a call's keys and values by a
    gather and a select over the cache's positions (`where(offset <= p < offset + T,
    k[p - offset], cache)`), the same numbers as the slice update: the cache write that the
    ONNX and LiteRT converters take (tf2onnx 1.17 has no `XlaDynamicUpdateSlice`, the op
    TensorFlow's slice update becomes). The exporters of `keras_attn.export_decoding` trace
    the decode step inside it; every other call keeps the slice update."""
    token = _GATHERED_WRITES.set(True)
    try:
        yield
    finally:
        _GATHERED_WRITES.reset(token)


def _gathered_write(cache, new, offset):
    """`cache` `(B, H, S_max, d)` with `new` `(B, H, T, d)` at positions `offset, ...,
    offset + T - 1`, by a gather and a select (`gathered_cache_writes`)."""
    length, steps = ops.shape(cache)[2], ops.shape(new)[2]
    shift = ops.arange(length, dtype="int32") - ops.cast(offset, "int32")  # (S_max,)
    inside = ops.logical_and(shift >= 0, shift < steps)  # (S_max,)
    gathered = ops.take(new, ops.clip(shift, 0, steps - 1), axis=2)  # (B, H, S_max, d)
    return ops.where(ops.reshape(inside, (1, 1, -1, 1)), gathered, cache)


def as_cache_index(index):
    """A cache index as a Python int, or an int32 scalar tensor (any integer dtype in)."""
    static = static_int(index)
    return static if static is not None else ops.cast(index, "int32")


class KeyValueCache:
    """The cache methods of `MultiHead` (which has `project_keys`, `num_key_value_heads`,
    `key_dim`, `value_dim`): making a cache, checking it, writing a call's keys and values
    into it, and the cache in the symbolic outputs."""

    def write_cache(self, cache, k, v, cache_update_index, offset):
        """The keys and values `(B, H_kv, S_max, ·)` a cached call attends to: the cache as it
        is (`cache_update_index=None`), or with this call's `k`, `v` `(B, H_kv, T, ·)` written
        at `offset` (the index as `as_cache_index` gives it)."""
        if cache_update_index is None:
            return cache
        if _GATHERED_WRITES.get():
            return (_gathered_write(cache[0], ops.cast(k, cache[0].dtype), offset),
                    _gathered_write(cache[1], ops.cast(v, cache[1].dtype), offset))
        start = (0, 0, offset, 0)
        return (ops.slice_update(cache[0], start, ops.cast(k, cache[0].dtype)),
                ops.slice_update(cache[1], start, ops.cast(v, cache[1].dtype)))

    def compute_output_spec(self, *args, **kwargs):
        spec = super().compute_output_spec(*args, **kwargs)
        cache = kwargs.get("cache")
        if cache is None:
            return spec
        cache_spec = tuple(keras.KerasTensor(c.shape, dtype=c.dtype) for c in cache)
        if isinstance(spec, tuple):
            return spec[0], cache_spec, spec[1]
        return spec, cache_spec

    def compute_cache(self, key, value=None, key_mask=None):
        """Project fixed keys/values once, e.g. the encoder outputs for cross-attention.

        The keys get the same rotary positions as in a call with `key` (their place in the key
        sequence), so a call on the cache equals the call on `key`.

        Args:
            key: `(B, S, dk)`.
            value: `(B, S, dv)`. Defaults to `key`.
            key_mask: optional boolean `(B, S)`, False at padded keys: those positions are
                zeroed before projecting, so a non-finite number there cannot reach the
                outputs of later calls (which trust the cache and do not check it again).
                Defaults to the implicit mask of `key`.

        Returns:
            `(key_cache, value_cache)` of shapes `(B, H_kv, S, key_dim)`,
            `(B, H_kv, S, value_dim)`.
        """
        value = key if value is None else value
        key_mask = getattr(key, "_keras_mask", None) if key_mask is None else key_mask
        if key_mask is not None:  # the cache's entry: zeroed here, as `prepare` does for calls
            key, value = hide_positions(key, key_mask), hide_positions(value, key_mask)
        return self.project_keys(key, value, 0)

    def init_cache(self, batch_size, max_length: int, dtype=None):
        """An all-zero self-attention cache of static length `max_length`."""
        check_positive_int("max_length", max_length)
        dtype = dtype or self.compute_dtype
        heads = self.num_key_value_heads
        return (
            ops.zeros((batch_size, heads, max_length, self.key_dim), dtype),
            ops.zeros((batch_size, heads, max_length, self.value_dim), dtype),
        )

    def check_cache(self, cache, query, key, cache_update_index):
        """The cache is a pair of `(B, H, S_max, ·)` tensors matching the query's batch, and
        the update index fits it."""
        if not isinstance(cache, (tuple, list)) or len(cache) != 2:
            raise ValueError(
                "Argument `cache` must be a pair (key_cache, value_cache). "
                f"Received: cache={type(cache).__name__}"
            )
        key_cache, value_cache = cache
        for name, tensor, depth in (("key_cache", key_cache, self.key_dim),
                                    ("value_cache", value_cache, self.value_dim)):
            heads = self.num_key_value_heads
            expected = (query.shape[0], heads, key_cache.shape[2], depth)
            shape = tuple(tensor.shape)
            if len(shape) != 4 or any(None not in (got, want) and got != want
                                      for got, want in zip(shape, expected)):
                raise ValueError(
                    f"Argument `cache` must hold {name} of shape (batch_size={query.shape[0]}, "
                    f"num_heads={heads}, max_length, {depth}) for this query. Received: "
                    f"{name}.shape={shape}"
                )
        if cache_update_index is None:
            if key is not None:
                raise ValueError(
                    "Arguments `key` and `value` must be None when `cache` is used as the keys "
                    "and values (cache_update_index=None). Received: key.shape="
                    f"{tuple(key.shape)}"
                )
            return
        index = concrete_value(cache_update_index)
        length, max_length = query.shape[1], key_cache.shape[2]
        if index is not None and index.ndim != 0:
            raise ValueError(
                "Argument `cache_update_index` must be a scalar. Received: "
                f"cache_update_index.shape={index.shape}"
            )
        if index is not None and None not in (length, max_length) and not (
                0 <= int(index) <= max_length - length):
            raise ValueError(
                f"Argument `cache_update_index` must place the {length} new keys inside the cache "
                f"of length {max_length}, in [0, {max_length - length}]. Received: "
                f"cache_update_index={int(index)}"
            )
