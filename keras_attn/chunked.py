"""Memory-efficient exact attention: blockwise over keys with an online softmax.

`chunked_dot_product_attention` computes exactly `softmax(Q Kᵀ · scale) V` (the same numbers as
`keras_attn.ops.dot_product_attention`, up to float rounding) without ever holding the
`(T, S)` score or weight matrix. Keys (and, optionally, queries) are visited in blocks of
`chunk_size`; each query row keeps a running maximum `m`, a running sum `l` and a running
weighted sum of values, rescaled whenever the maximum grows (Milakov & Gimelshein, 2018;
Rabe & Staats, 2021). With exact float32 products (not 16-bit inputs, not TF32 on a GPU) the
same state rides along as one more key (score: the log-sum-exp so far, value: the output so
far), so that each block is one fused softmax (`_forward_rows_as_key`). Peak memory grows
with `T · chunk_size` instead of `T · S`.

The gradient is a custom one (FlashAttention's backward, Dao et al., 2022): the forward pass
keeps only the output and the per-row log-sum-exp `lse = m + log l`; the backward pass
recomputes each block's weights `P = exp(Q Kⱼᵀ · scale - lse)` and accumulates
`dVⱼ = Pᵀ dO`, `dS = P ⊙ (dO Vⱼᵀ - rowsum(dO ⊙ O))`, `dQ += dS Kⱼ`, `dKⱼ = dSᵀ Q`. Nothing of
size `T · S` is stored for the backward pass either.

When every key fits in one block (short sequences), the weights are kept instead of
recomputed: `fused_dot_product_attention` is that case on its own, dense attention with the
same fused backward, which `MultiHead` uses when nobody asks for the weights.

Masks never have to be materialized as `(T, S)`: `valid_lens` (key lengths per sequence or per
query) and `causal=True` become one per-row key limit, compared with the key positions of a
block at a time; key blocks past the longest sequence are skipped. A dense boolean `mask` is
accepted too (it is sliced per block), for masks that have no such structure.

Everything is written with `keras.ops` (`custom_gradient`, `fori_loop`, `slice`,
`slice_update`) except backend-specific pieces, each documented where it is defined:
`_fori_loop`'s `parallel_iterations=2`, without which TensorFlow keeps ten blocks in flight;
`xla_barrier` and `xla_dense`, which under `jit_compile=True` keep XLA from rewriting a
product into a form its CPU kernels run slowly (with other backends they do nothing); and
`_exact_products`, which asks each backend whether float32 products may run in TF32.

Not supported by the blockwise path (use the dense implementation): dropout on the attention
weights (a block's dropout mask would have to be regenerated identically in the backward pass,
which Keras' seeded random ops cannot do portably; `fused_dot_product_attention`, one block
kept whole, does take dropout) and returning the `(T, S)` weights (that is the matrix this
implementation exists to avoid).
"""

from __future__ import annotations

import math
from typing import Any

import keras
from keras import ops

from keras_attn._checks import as_rate, check_positive_int

# Same masking constant as keras_attn.ops (in float32): exp() of it is exactly 0 next to any
# real score, and `score - max` never overflows.
_MASK_VALUE = -1e30
# Log-sum-exp given to rows with nothing to attend to: every recomputed weight of such a row is
# exp(-1e30 - 1e30) = 0 in the backward pass, so its gradient is exactly zero.
_EMPTY_ROW_LSE = 1e30

# `chunk_size=None` picks the largest power of two (at least 128) keeping a block at or below
# this many scores per sequence and head: 128 MiB per float32 block, whatever the length. At
# T = 16k that is 2048 keys per block, at 32k 1024; up to T = 4k every key fits in one block.
# (Measured at B1 h1 d64: 2**25 instead of 2**24 takes forward + backward at 16k from 1.29x to
# 1.23x the dense time, and peak RSS at 32k from 1.27 to 1.48 GiB; benchmarks/RESULTS.md.)
BLOCK_BUDGET = 2**25
MIN_CHUNK_SIZE = 128


def _fori_loop(upper, body, init):
    """`keras.ops.fori_loop(0, upper, body, init)` with at most two iterations in flight.

    With TensorFlow, `keras.ops.fori_loop` is a `tf.while_loop` with `parallel_iterations=10`:
    the next iterations' score blocks, which do not depend on the running sums (in the
    backward pass, and in the 16-bit forward pass), are computed ahead, up to ten
    `(T, chunk)` blocks alive at once (measured at T = 32k, chunk 512: 1.4 GiB
    above the baseline instead of 0.4-0.6 GiB). One at a time is slower (about 1.8x at T = 8k:
    the small per-row operations leave a core idle); two keeps both cores busy. Other
    backends loop sequentially anyway.
    """
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.while_loop(lambda i, _: i < upper, lambda i, carry: (i + 1, body(i, carry)),
                             (0, init), parallel_iterations=2)[1]
    return ops.fori_loop(0, upper, body, init)


def auto_chunk_size(query_len) -> int:
    """The `chunk_size` that `chunk_size=None` means for `query_len` rows per block."""
    if not isinstance(query_len, int) or query_len <= 0:
        return 512  # unknown length (symbolic): a middle-sized block
    size = MIN_CHUNK_SIZE
    while size * 2 * query_len <= BLOCK_BUDGET:
        size *= 2
    return size


def _pad_axis(x, axis: int, amount, value=0):
    """Pad `amount` (int or scalar tensor) entries at the end of `axis`."""
    if isinstance(amount, int) and amount == 0:
        return x
    rank = len(x.shape)
    axis = axis % rank
    widths = [[0, 0] for _ in range(rank)]
    widths[axis][1] = amount
    return ops.pad(x, widths, constant_values=value)


def _blocks(length, block: int):
    """Number of blocks of size `block` covering `length` (int or scalar tensor) and padding."""
    if isinstance(length, int):
        num = -(-length // block)
        return num, num * block - length
    num = (length + block - 1) // block
    return num, num * block - length


def _slice_axis(x, axis: int, start, size: int):
    """`x[..., start:start + size, ...]` along `axis`; broadcast axes (size 1) stay whole."""
    rank = len(x.shape)
    axis = axis % rank
    if x.shape[axis] == 1:
        return x
    starts = [0] * rank
    starts[axis] = start
    shape = list(ops.shape(x))
    shape[axis] = size
    return ops.slice(x, starts, shape)


def _row_lengths(valid_lens, rank: int):
    """d2l-style key lengths `(B,)` or `(B, T)` as int32 broadcastable to `(..., T)`."""
    lens = ops.cast(ops.convert_to_tensor(valid_lens), "int32")
    lens_rank = len(lens.shape)
    if lens_rank == 1:
        return ops.reshape(lens, (-1,) + (1,) * (rank - 2))  # (B, 1, ..., 1)
    if lens_rank == 2:
        for _ in range(rank - 3):
            lens = ops.expand_dims(lens, 1)  # (B, 1, ..., T)
        return lens
    raise ValueError(
        "Argument `valid_lens` must have shape (batch_size,) or (batch_size, query_len). "
        f"Received: valid_lens.shape={tuple(lens.shape)}"
    )


def _dense_mask(mask, rank: int):
    """Bring a boolean mask to rank `rank` the way the dense path does: a `(B, T, S)` mask gets
    a broadcast head axis after the batch axis, a `(T, S)` mask leading broadcast axes."""
    mask = ops.cast(ops.convert_to_tensor(mask), "bool")
    if len(mask.shape) > rank:
        raise ValueError(
            f"Argument `mask` has rank {len(mask.shape)}, more than the scores (rank {rank}). "
            f"Received: mask.shape={tuple(mask.shape)}"
        )
    while len(mask.shape) < rank:
        mask = ops.expand_dims(mask, 1 if len(mask.shape) == 3 else 0)
    return mask


class _Blocking:
    """What the forward and backward passes share: sizes, blocks and the structured masks."""

    def __init__(self, q, key_len, chunk, q_chunk, mask, row_lens, causal, causal_offset,
                 single: bool = False):
        self.rank = len(q.shape)
        self.key_len = key_len  # true S (int or scalar tensor), before padding
        self.chunk = key_len if single else chunk
        self.q_chunk = None if single else q_chunk
        if single:  # one block of every key and query, whatever the (possibly dynamic) sizes
            self.num_key_blocks, self.key_padded = 1, False
        else:
            self.num_key_blocks, key_pad = _blocks(key_len, chunk)
            self.key_padded = not (isinstance(key_pad, int) and key_pad == 0)
        self.single_key_block = isinstance(self.num_key_blocks, int) and self.num_key_blocks == 1
        self.single_query_block = self.q_chunk is None
        if q_chunk is not None:
            self.num_query_blocks = _num_rows(q) // q_chunk  # the query is already padded
        self.mask = mask
        self.row_lens = row_lens
        self.causal = causal
        self.causal_offset = causal_offset
        self.any_mask = mask is not None or row_lens is not None or causal or self.key_padded

    def row_limits(self, row_start, rows):
        """Per-row key limits of a block of query rows.

        `valid_lens`, `causal` and the padding of the last key block all say "query `i` sees
        keys `j < limit_i`", so one comparison per block entry builds all three masks.

        Returns `(limit, num_blocks)`: `limit` int32 broadcastable to `(..., rows, 1)` (None
        when nothing limits the keys) and the number of leading key blocks any of these rows
        can see (later blocks are skipped: a causal block above the diagonal or keys past
        the longest sequence cost nothing).
        """
        limit = None
        if self.key_padded:
            limit = ops.convert_to_tensor(self.key_len, "int32")  # ()
        if self.row_lens is not None:
            lens = self.row_lens
            if not self.single_query_block:
                lens = _slice_axis(lens, -1, row_start, rows)  # (..., rows) or (..., 1)
            limit = lens if limit is None else ops.minimum(limit, lens)
        if self.causal:
            ends = row_start + ops.arange(rows, dtype="int32") + self.causal_offset + 1  # (rows,)
            limit = ends if limit is None else ops.minimum(limit, ends)
        if limit is None:
            return None, self.num_key_blocks
        num_blocks = self.num_key_blocks
        if not self.single_key_block and (self.causal or self.row_lens is not None):
            furthest = ops.max(limit)  # no row of this block sees a key at or after it
            needed = (furthest + self.chunk - 1) // self.chunk
            num_blocks = ops.clip(needed, 0, self.num_key_blocks)
        if len(limit.shape) > 0:
            limit = ops.expand_dims(limit, -1)  # (..., rows, 1)
        return limit, num_blocks

    def block_mask(self, limit, row_start, rows, col_start):
        """Boolean mask of the block `[row_start, row_start + rows) × [col_start, col_start +
        chunk)`, broadcastable to `(..., rows, chunk)`; None when nothing is masked."""
        out = None
        if limit is not None:
            cols = col_start + ops.arange(self.chunk, dtype="int32")  # (c,)
            out = ops.less(cols, limit)  # (..., rows, c)
        if self.mask is not None:
            block = self.mask
            if not self.single_query_block:
                block = _slice_axis(block, -2, row_start, rows)
            if not self.single_key_block:
                block = _slice_axis(block, -1, col_start, self.chunk)  # (..., rows, c)
            out = block if out is None else ops.logical_and(out, block)
        return out


def _matmul(a, b):
    """`a @ b` over the last two axes.

    With every leading axis of size 1 (one sequence, one head) it runs as a 2D product:
    TensorFlow's CPU batched product of a single matrix is about 1.5x slower than its 2D one.
    """
    lead = tuple(a.shape[:-2]) + tuple(b.shape[:-2])
    if not lead or any(dim != 1 for dim in lead) or len(a.shape) != len(b.shape):
        return ops.matmul(a, b)
    batch_axes = tuple(range(len(a.shape) - 2))
    out = ops.matmul(ops.squeeze(a, axis=batch_axes), ops.squeeze(b, axis=batch_axes))
    for _ in batch_axes:
        out = ops.expand_dims(out, 0)
    return out


def _in_xla_context() -> bool:
    """Whether the ops being traced will be compiled by XLA (TensorFlow's `jit_compile=True`).

    Reads TensorFlow's own check (`control_flow_util.GraphOrParentsInXlaContext`, the one its
    gradient code uses), which is not public API: if it moves, this reads as "no XLA".
    """
    if keras.backend.backend() != "tensorflow":
        return False
    try:
        import tensorflow as tf
        from tensorflow.python.ops import control_flow_util

        if tf.executing_eagerly():
            return False
        return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))
    except (ImportError, AttributeError):  # a moved private API must not break attention
        return False


def xla_barrier(x: Any) -> Any:
    """`x` itself; under XLA, `x` behind an optimization barrier, in both passes.

    XLA may not fuse or rewrite across the barrier, so `x` is materialized as it is written:
    a boundary where a layout change (a transpose between `(B, T, H·d)` and `(B, H, T, d)`)
    is done once instead of being folded into the products on either side, which XLA's CPU
    kernels run slower (`benchmarks/RESULTS.md`). The gradient passes through a barrier too.
    Outside an XLA compilation, and with other backends, nothing is added.

    Args:
        x: a tensor.

    Returns:
        A tensor equal to `x`.
    """
    if not _in_xla_context():
        return x
    import tensorflow as tf

    try:
        from tensorflow.compiler.tf2xla.ops import gen_xla_ops
    except ImportError:  # not public API either: without it, no barrier
        return x

    def barrier(t):
        return gen_xla_ops.xla_optimization_barrier([t])[0]

    @tf.custom_gradient
    def identity(t):
        # The gradient is this function again, so that it can be differentiated in turn.
        return barrier(t), identity

    return identity(x)


def xla_dense(layer: keras.layers.Dense, inputs: Any) -> Any:
    """`layer(inputs)` for a built `keras.layers.Dense`; under XLA, with its own backward.

    The kernel gradient of `y = x W` is `xᵀ dy`, a product over the `B·T` rows of both
    operands. XLA's CPU kernel for that form (left operand transposed) runs 1.2-1.5x slower
    than `(xᵀ) dy` with `xᵀ` a transposed copy, copy included, at `MultiHead`'s and the
    FFN's sizes (`benchmarks/xla_products.py`); under XLA this computes the layer's product
    with a gradient of that form (the copy behind `xla_barrier`, or XLA folds it back).
    `MultiHead` uses it for its four projections. It is not faster everywhere: a ReLU FFN
    trained slower with it on its second Dense (`benchmarks/RESULTS.md`), so the FFN does not
    use it. Outside XLA, and for a Dense with LoRA, quantized weights or an activity
    regularizer, it is `layer(inputs)`.

    Args:
        layer: a built `keras.layers.Dense`.
        inputs: `(..., m)` with `m` the layer's input size.

    Returns:
        `(..., units)`, `layer(inputs)`.
    """
    if (not _in_xla_context() or getattr(layer, "lora_enabled", False)
            or getattr(layer, "quantization_mode", None) is not None or not layer.built
            or layer.activity_regularizer is not None):
        return layer(inputs)
    import tensorflow as tf

    dtype = layer.compute_dtype
    kernel = ops.cast(layer.kernel, dtype)  # (m, n)
    m, n = kernel.shape
    params = (kernel,) if layer.bias is None else (kernel, ops.cast(layer.bias, dtype))

    @tf.custom_gradient
    def dense(x, kernel, *bias):
        rows = ops.reshape(x, (-1, m))  # (B·T, m)
        y = ops.matmul(rows, kernel)
        if bias:
            y = y + bias[0]
        y = ops.reshape(y, tuple(ops.shape(x)[:-1]) + (n,))

        def grad(upstream):
            d_rows = ops.reshape(upstream, (-1, n))  # (B·T, n)
            d_x = ops.reshape(ops.matmul(d_rows, ops.transpose(kernel)), ops.shape(x))
            d_kernel = ops.matmul(xla_barrier(ops.transpose(rows)), d_rows)  # (m, n)
            if not bias:
                return d_x, d_kernel
            d_bias = ops.cast(ops.sum(ops.cast(d_rows, "float32"), axis=0), dtype)
            return d_x, d_kernel, d_bias

        return y, grad

    return layer.activation(dense(ops.cast(inputs, dtype), *params))


def _matmul_at(a, b):
    """`aᵀ @ b` for a tall `a` `(..., n, m)`, as `(bᵀ a)ᵀ`: the big operand is read in its
    stored order (a transposed big operand is the slow case of the CPU kernels).

    XLA folds the outer transpose back into a product with `a` transposed, the form its CPU
    kernel runs about 3x slower than `bᵀ a` (`benchmarks/xla_products.py`: 55.4 against 18.4
    ms at 32 x 1024 x 1024 x 32); a barrier on `bᵀ a` keeps the fast form.
    """
    return ops.swapaxes(xla_barrier(_matmul(ops.swapaxes(b, -1, -2), a)), -1, -2)


def _block_scores(q_rows, k_block, block_mask):
    """Float32 scores of one block, with masked entries at -1e30."""
    scores = ops.cast(_matmul(q_rows, ops.swapaxes(k_block, -1, -2)), "float32")  # (.., r, c)
    if block_mask is not None:
        scores = ops.where(block_mask, scores, _MASK_VALUE)
    return scores


def _num_rows(x):
    return x.shape[-2] if x.shape[-2] is not None else ops.shape(x)[-2]


def _forward_rows(q_rows, k, v, blocking, row_start):
    """Online softmax over the key blocks for one block of query rows.

    Returns `(outputs, lse)`: `(..., rows, dv)` and `(..., rows, 1)`, both float32.
    """
    chunk = blocking.chunk
    rows = _num_rows(q_rows)
    limit, num_blocks = blocking.row_limits(row_start, rows)
    lead = tuple(ops.shape(q_rows)[:-1])  # (..., rows)
    value_depth = v.shape[-1]
    # In float32 the row sums ride along in the product with the values, one pass less over
    # each block: P [V, 1] = [P V, rowsum(P)].
    fold = _exact_products(q_rows, v)
    if fold and not blocking.single_key_block:
        return _forward_rows_as_key(q_rows, k, v, blocking, row_start, limit, num_blocks)
    values = _append_column(v, 1.0) if fold else v  # (..., S, dv [+ 1])

    def body(j, carry):
        row_max, row_sum, acc = carry
        col_start = j * chunk
        k_block = _slice_axis(k, -2, col_start, chunk)  # (..., c, d)
        v_block = _slice_axis(values, -2, col_start, chunk)  # (..., c, dv [+ 1])
        block_mask = blocking.block_mask(limit, row_start, rows, col_start)
        scores = _block_scores(q_rows, k_block, block_mask)  # (..., rows, c)
        new_max = ops.maximum(row_max, ops.max(scores, axis=-1, keepdims=True))  # (.., rows, 1)
        # Masked entries are exp(-1e30 - max) = 0 once a row has seen a real score; before
        # that they count 1 each, and the rescale exp(-1e30 - max) = 0 wipes them later.
        probs = ops.exp(scores - new_max)  # (..., rows, c)
        rescale = ops.exp(row_max - new_max)  # (..., rows, 1)
        context = ops.cast(_matmul(ops.cast(probs, v.dtype), v_block), "float32")
        if fold:
            block_sum, context = context[..., value_depth:], context[..., :value_depth]
        else:
            block_sum = ops.sum(probs, axis=-1, keepdims=True)  # (..., rows, 1)
        return new_max, rescale * row_sum + block_sum, rescale * acc + context

    init = (
        ops.full(lead + (1,), _MASK_VALUE, "float32"),
        ops.zeros(lead + (1,), "float32"),
        ops.zeros(lead + (v.shape[-1],), "float32"),
    )
    if blocking.single_key_block:
        row_max, row_sum, acc = body(0, init)
    else:
        row_max, row_sum, acc = _fori_loop(num_blocks, body, init)
    if not blocking.any_mask:
        return acc / row_sum, row_max + ops.log(row_sum)
    # A row whose running max never left -1e30 had nothing to attend to: zero output, and an
    # lse that makes every recomputed weight of the row 0 in the backward pass.
    has_keys = ops.greater(row_max, 0.5 * _MASK_VALUE)  # (..., rows, 1)
    safe_sum = ops.where(has_keys, row_sum, 1.0)
    outputs = ops.where(has_keys, acc / safe_sum, 0.0)
    lse = ops.where(has_keys, row_max + ops.log(safe_sum), _EMPTY_ROW_LSE)
    return outputs, lse


def _forward_rows_as_key(q_rows, k, v, blocking, row_start, limit, num_blocks):
    """`_forward_rows` in float32 over several key blocks: the blocks seen so far ride along
    as one more key, so each block is one fused softmax.

    Carry the log-sum-exp `L` and the normalized output `A` of the keys seen so far. They act
    as one more key with score `L` and value `A`: with the scores `s` of the next block and
    `p = softmax([s, L])`, the new carry is `A' = p [V; 0] + p_L A` and `L' = L - log p_L`,
    where `p_L` (the last column of `p`) is the earlier keys' share. The score `L` rides along
    in the product, `[Q, L] [K, 0; 0, 1]ᵀ`. That is one softmax kernel per block instead of a
    max, a subtraction and an exponential (303 -> 260 ms for the forward pass at T = 16k,
    `benchmarks/RESULTS.md`). Where `p_L` underflows (a block's scores about 70 or more above
    everything before) that block's `L'` is the log-sum-exp of `[s, L]` instead. `L` takes
    one rounding per block: against float64, outputs and gradients were about as accurate as
    with the running-max form at 8 blocks (T = 16k by default), 2-3x less at 128 (64k) and
    about 5x less at 1024 (relative errors of 1e-6 to 4e-6 against 3e-7 to 8e-7). Only for
    exact float32 products (`_exact_products`); 16-bit inputs and TF32 products take the
    running-max form.

    The carry starts from a reference score `r` (the row's score against key 0 when only
    lengths and causality mask the keys, so every row that has keys sees key 0; else -1e30)
    with output 0, a pretend key removed at the end: its share `f = exp(r - L)` is at most
    1/2 for a row that sees key 0, and 1 for a row with no keys at all.
    """
    chunk = blocking.chunk
    rows = _num_rows(q_rows)
    lead = tuple(ops.shape(q_rows)[:-1])  # (..., rows)
    # The carry's key [0, ..., 0, 1] and value 0, after each block's keys and values.
    k_carry = _append_column(ops.zeros_like(k[..., :1, :]), 1.0)  # (..., 1, d + 1)
    v_carry = ops.zeros_like(v[..., :1, :])  # (..., 1, dv)

    def body(j, carry):
        lse, acc = carry
        col_start = j * chunk
        k_block = _append_column(_slice_axis(k, -2, col_start, chunk), 0.0)  # (..., c, d + 1)
        keys = ops.concatenate([k_block, k_carry], axis=-2)  # (..., c + 1, d + 1)
        values = ops.concatenate([_slice_axis(v, -2, col_start, chunk), v_carry], axis=-2)
        block_mask = blocking.block_mask(limit, row_start, rows, col_start)
        if block_mask is not None:
            # A (..., rows, 1) mask (a query mask) broadcasts over the keys, not the carry.
            block_mask = ops.broadcast_to(block_mask,
                                          tuple(ops.shape(block_mask)[:-1]) + (chunk,))
            block_mask = _append_column(block_mask, True)  # the carry is always seen
        scores = _block_scores(ops.concatenate([q_rows, lse], axis=-1), keys, block_mask)
        probs = ops.softmax(scores, axis=-1)  # (..., rows, c + 1)
        share = probs[..., chunk:]  # (..., rows, 1): p_L, the earlier keys' share
        acc = _matmul(probs, values) + share * acc  # (..., rows, dv)
        lse = ops.cond(
            ops.any(share < 1e-30),
            lambda: ops.logsumexp(scores, axis=-1, keepdims=True),
            lambda: lse - ops.log(share),
        )
        return lse, acc

    if blocking.mask is None:
        # Lengths, causality and key padding each hide keys j >= limit: a row with keys sees
        # key 0, so its log-sum-exp is at least this score.
        reference = ops.sum(q_rows * k[..., :1, :], axis=-1, keepdims=True)  # (..., rows, 1)
    else:
        reference = ops.full(lead + (1,), _MASK_VALUE, "float32")
    lse, acc = _fori_loop(num_blocks, body, (reference, ops.zeros(lead + (v.shape[-1],),
                                                                  "float32")))
    pretend = ops.exp(reference - lse)  # (..., rows, 1): <= 1/2 with keys, 1 without
    has_keys = ops.less(pretend, 0.75)
    real = ops.where(has_keys, 1.0 - pretend, 1.0)
    outputs = ops.where(has_keys, acc / real, 0.0)
    return outputs, ops.where(has_keys, lse + ops.log(real), _EMPTY_ROW_LSE)


def _append_column(x, value):
    """`(..., n, m)` -> `(..., n, m + 1)` with `value` (broadcast) as the last column."""
    column = ops.broadcast_to(ops.cast(value, x.dtype), tuple(ops.shape(x)[:-1]) + (1,))
    return ops.concatenate([x, column], axis=-1)


def _backward_rows(q_rows, k, v, d_out, delta, lse, blocking, row_start, dk, dv):
    """Gradients for one block of query rows; adds this block's share into `dk`, `dv`.

    `d_out` `(..., rows, dv)` is the upstream gradient, `delta = rowsum(dO ⊙ O)` and `lse` are
    `(..., rows, 1)`. Returns `(dq_rows, dk, dv)` in float32.
    """
    chunk = blocking.chunk
    rows = _num_rows(q_rows)
    limit, num_blocks = blocking.row_limits(row_start, rows)
    accumulate = not blocking.single_query_block  # other query blocks add to the same keys
    zeros_lead = [0] * (blocking.rank - 2)
    # In float32 the row terms ride along in the products, one pass less over each block each:
    # [Q, -lse] [K, 1]ᵀ = Q Kᵀ - lse and [dO, -delta] [V, 1]ᵀ = dO Vᵀ - delta. (In 16-bit
    # inputs, or TF32 products, lse and delta would lose their precision, so they are
    # subtracted in float32.)
    fold = _exact_products(q_rows, v)
    if fold:
        q_lse = _append_column(q_rows, -lse)  # (..., rows, d + 1)
        d_out_delta = _append_column(d_out, -delta)  # (..., rows, dv + 1)

    def body(j, carry):
        dq_rows, dk, dv = carry
        col_start = j * chunk
        k_block = _slice_axis(k, -2, col_start, chunk)  # (..., c, d)
        v_block = _slice_axis(v, -2, col_start, chunk)  # (..., c, dv)
        block_mask = blocking.block_mask(limit, row_start, rows, col_start)
        if fold:
            shifted = _block_scores(q_lse, _append_column(k_block, 1.0), block_mask)
            probs = ops.exp(shifted)  # (..., rows, c): the block's weights, recomputed
            d_v = _matmul_at(probs, d_out)  # (..., c, dv)
            d_probs = _matmul(d_out_delta, ops.swapaxes(_append_column(v_block, 1.0), -1, -2))
            d_scores = probs * d_probs  # (..., rows, c)
        else:
            scores = _block_scores(q_rows, k_block, block_mask)  # (..., rows, c)
            probs = ops.exp(scores - lse)  # (..., rows, c): the block's weights, recomputed
            d_v = _matmul_at(ops.cast(probs, d_out.dtype), d_out)  # (..., c, dv)
            d_probs = _matmul(d_out, ops.swapaxes(v_block, -1, -2))  # (..., rows, c)
            d_scores = probs * (ops.cast(d_probs, "float32") - delta)  # (..., rows, c)
        d_scores = ops.cast(d_scores, q_rows.dtype)
        d_q = _matmul(d_scores, k_block)  # (..., rows, d)
        d_k = _matmul_at(d_scores, q_rows)  # (..., c, d)
        dq_rows = dq_rows + ops.cast(d_q, "float32")
        d_k = ops.cast(d_k, "float32")
        d_v = ops.cast(d_v, "float32")
        if accumulate:
            d_k = d_k + _slice_axis(dk, -2, col_start, chunk)
            d_v = d_v + _slice_axis(dv, -2, col_start, chunk)
        starts = zeros_lead + [col_start, 0]
        return dq_rows, ops.slice_update(dk, starts, d_k), ops.slice_update(dv, starts, d_v)

    init = (ops.zeros(ops.shape(q_rows), "float32"), dk, dv)
    if blocking.single_key_block:
        return body(0, init)
    return _fori_loop(num_blocks, body, init)


def _scores_exceed(scores, budget: int) -> bool:
    """Whether the last two axes of `scores` may hold more than `budget` entries (unknown
    sizes count as more)."""
    rows, cols = scores.shape[-2], scores.shape[-1]
    return rows is None or cols is None or rows * cols > budget


def _exact_products(*tensors) -> bool:
    """Whether products of these tensors are exact float32 ones, so that a row term (a
    log-sum-exp, `rowsum(dO ⊙ O)`) may ride along in them as an extra column.

    Not for 16-bit tensors, and not where float32 products may run at lower precision: TF32
    on a GPU (TensorFlow's and JAX's default, torch's when allowed) rounds the operands to 10
    mantissa bits, and a row term of size `|L|` would carry an error of about `|L| / 1000`
    into every weight of its row; TPUs round to bfloat16. So: TensorFlow with no TPU and no
    GPU, or TF32 off; JAX on the CPU; torch without CUDA, or with TF32 off and "highest"
    precision.
    """
    if any(ops.dtype(t) != "float32" for t in tensors):
        return False
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        if tf.config.list_physical_devices("TPU"):
            return False
        return not (tf.config.list_physical_devices("GPU")
                    and tf.config.experimental.tensor_float_32_execution_enabled())
    if backend == "jax":
        import jax

        return jax.default_backend() == "cpu"
    if backend == "torch":
        import torch

        return not torch.cuda.is_available() or (
            torch.get_float32_matmul_precision() == "highest"
            and not torch.backends.cuda.matmul.allow_tf32)
    return True


def _single_block_fn(blocking, dropout_rate: float = 0.0, seed=None):
    """All keys and queries in one block: the `(..., T, S)` weights fit, so keep them.

    Dense attention with a fused backward: the forward pass stores the weights `P` (one fused
    softmax), the backward pass uses `dS = P ⊙ (dO Vᵀ - rowsum(dO ⊙ O))` and recomputes
    nothing. That is fewer passes over the `(T, S)` matrix than differentiating the softmax
    (`rowsum(dP ⊙ P)` reads two `(T, S)` tensors; `rowsum(dO ⊙ O)` reads two `(T, dv)` ones).

    With dropout, `O = D V` for the dropped weights `D = M ⊙ P · s` (mask `M`, scale `s`, about
    `1 / (1 - rate)`: `keras_attn.ops.dropout`'s). Then `dP = M ⊙ dD · s` with `dD = dO Vᵀ`, and
    `rowsum(dP ⊙ P) = rowsum(dD ⊙ D) = rowsum(dO ⊙ O)`, so `dS = P ⊙ (dP - rowsum(dO ⊙ O))`,
    the same form, and `P ⊙ dP = D ⊙ dD`. In float32 that last product is used as it is; a 16-bit
    `D` (kept for `dV = Dᵀ dO`) is `P` rounded, so there the mask is read back from `D` instead:
    where `D` is 0, either the weight was dropped or `P` itself is 0 (masked, or below the 16-bit
    range), and `P ⊙ dP` is 0 either way.
    """

    @ops.custom_gradient
    def attend(q, k, v):
        rows = _num_rows(q)
        limit, _ = blocking.row_limits(0, rows)
        block_mask = blocking.block_mask(limit, 0, rows, 0)
        scores = _block_scores(q, k, block_mask)  # (..., T, S)
        if scores.shape[-1] == 1:  # one key: weight 1 (keras.ops.softmax warns on this)
            weights = ops.ones_like(scores)
        else:
            weights = ops.softmax(scores, axis=-1)  # (..., T, S) float32
        attended = ops.cast(weights, v.dtype)  # (..., T, S), P or D
        if dropout_rate > 0.0:
            from keras_attn.ops import dropout  # keras_attn.ops imports this module

            attended = dropout(attended, dropout_rate, seed=seed)
        outputs = _matmul(attended, v)  # (..., T, dv)
        has_keys = None
        if block_mask is not None:
            # A row with nothing to attend to softmaxes to uniform over -1e30: zero its output
            # here and its upstream gradient below instead of touching the (T, S) weights.
            has_keys = ops.any(block_mask, axis=-1, keepdims=True)  # (..., T, 1)
            outputs = ops.where(has_keys, outputs, ops.zeros_like(outputs))

        def grad(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            d_out = ops.cast(upstream, v.dtype)
            if has_keys is not None:
                d_out = ops.where(has_keys, d_out, ops.zeros_like(d_out))
            delta = ops.sum(ops.cast(d_out, "float32") * ops.cast(outputs, "float32"), axis=-1,
                            keepdims=True)  # (..., T, 1)
            # Without dropout, P cast again rather than a 16-bit copy kept since the forward
            # pass; with it, the dropped weights D, which hold the mask.
            kept = ops.cast(weights, v.dtype) if dropout_rate == 0.0 else attended
            d_v = _matmul_at(kept, d_out)  # (..., S, dv)
            if (dropout_rate == 0.0 and _exact_products(q, v) and not _in_xla_context()
                    and not _scores_exceed(weights, BLOCK_BUDGET)):
                # [dO, -delta] [V, 1]ᵀ = dO Vᵀ - delta, as in the blockwise backward: no pass
                # over (T, S) of its own for the subtraction. Not under XLA (it fuses that
                # pass into the next one; the product form was slower at T = 128) and not
                # for scores longer than a block of the chunked path, or of unknown length:
                # there the peak memory of this form varied from run to run
                # (benchmarks/RESULTS.md).
                d_probs = _matmul(_append_column(d_out, -delta),
                                  ops.swapaxes(_append_column(v, 1.0), -1, -2))
                d_scores = weights * d_probs  # (..., T, S)
            else:
                d_attended = ops.cast(_matmul(d_out, ops.swapaxes(v, -1, -2)), "float32")
                if dropout_rate == 0.0:
                    d_scores = weights * (d_attended - delta)  # (..., T, S)
                elif ops.dtype(kept) == "float32":
                    # P ⊙ dP = D ⊙ dD: two products instead of reading the mask back.
                    d_scores = kept * d_attended - weights * delta
                else:
                    # A 16-bit D is P rounded: read the mask back instead, so that P ⊙ dP and
                    # P ⊙ rowsum(dO ⊙ O) cancel in float32 as they should.
                    from keras_attn.ops import _dropout_scale

                    # s as dropout applied it (rounded to the value dtype).
                    scale = ops.cast(ops.cast(_dropout_scale(dropout_rate), v.dtype), "float32")
                    d_probs = ops.where(kept != 0, d_attended * scale, 0.0)
                    d_scores = weights * (d_probs - delta)
            d_scores = ops.cast(d_scores, q.dtype)
            d_q = _matmul(d_scores, k)  # (..., T, d)
            d_k = _matmul_at(d_scores, q)  # (..., S, d)
            return d_q, ops.cast(d_k, k.dtype), ops.cast(d_v, v.dtype)

        return outputs, grad

    return attend


def _attention_fn(blocking):
    """The custom-gradient function of (scaled query, padded key, padded value)."""
    if blocking.single_key_block and blocking.single_query_block:
        return _single_block_fn(blocking)

    def forward(q, k, v):
        if blocking.single_query_block:
            return _forward_rows(q, k, v, blocking, 0)
        q_chunk = blocking.q_chunk
        lead = ops.shape(q)[:-1]

        def body(i, carry):
            outputs, lse = carry
            row_start = i * q_chunk
            q_rows = _slice_axis(q, -2, row_start, q_chunk)  # (..., rq, d)
            out_rows, lse_rows = _forward_rows(q_rows, k, v, blocking, row_start)
            starts = [0] * (blocking.rank - 2) + [row_start, 0]
            return (ops.slice_update(outputs, starts, out_rows),
                    ops.slice_update(lse, starts, lse_rows))

        init = (
            ops.zeros(tuple(lead) + (v.shape[-1],), "float32"),
            ops.zeros(tuple(lead) + (1,), "float32"),
        )
        return _fori_loop(blocking.num_query_blocks, body, init)

    def backward(q, k, v, outputs, lse, d_out):
        d_out = ops.cast(d_out, v.dtype)
        # rowsum(dO ⊙ O): the softmax Jacobian's diagonal correction, one number per row.
        delta = ops.sum(ops.cast(d_out, "float32") * outputs, axis=-1, keepdims=True)  # (.., T, 1)
        dk = ops.zeros(ops.shape(k), "float32")
        dv = ops.zeros(ops.shape(v), "float32")
        if blocking.single_query_block:
            dq, dk, dv = _backward_rows(q, k, v, d_out, delta, lse, blocking, 0, dk, dv)
            return dq, dk, dv
        q_chunk = blocking.q_chunk

        def body(i, carry):
            dq, dk, dv = carry
            row_start = i * q_chunk
            rows = [_slice_axis(x, -2, row_start, q_chunk) for x in (q, d_out, delta, lse)]
            dq_rows, dk, dv = _backward_rows(*rows[:1], k, v, rows[1], rows[2], rows[3],
                                             blocking, row_start, dk, dv)
            starts = [0] * (blocking.rank - 2) + [row_start, 0]
            return ops.slice_update(dq, starts, dq_rows), dk, dv

        init = (ops.zeros(ops.shape(q), "float32"), dk, dv)
        return _fori_loop(blocking.num_query_blocks, body, init)

    @ops.custom_gradient
    def attend(q, k, v):
        outputs, lse = forward(q, k, v)

        def grad(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            dq, dk, dv = backward(q, k, v, outputs, lse, upstream)
            return ops.cast(dq, q.dtype), ops.cast(dk, k.dtype), ops.cast(dv, v.dtype)

        return ops.cast(outputs, v.dtype), grad

    return attend


def _prepare(query, key, value, mask, valid_lens, scale):
    """Check the inputs; return the scaled query, key, value and the masks in block form."""
    query = ops.convert_to_tensor(query)
    key = ops.convert_to_tensor(key)
    value = ops.convert_to_tensor(value)
    rank = len(query.shape)
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if len(tensor.shape) < 2 or len(tensor.shape) != rank:
            raise ValueError(
                f"Arguments `query`, `key` and `value` must have the same rank >= 2. Received: "
                f"query.shape={tuple(query.shape)}, {name}.shape={tuple(tensor.shape)}"
            )
    depth = query.shape[-1]
    if key.shape[-1] is not None and depth is not None and key.shape[-1] != depth:
        raise ValueError(
            "Arguments `query` and `key` must have the same last dimension. "
            f"Received: query.shape={tuple(query.shape)}, key.shape={tuple(key.shape)}"
        )
    if scale is None:
        scale = 1.0 / math.sqrt(depth)
    row_lens = None if valid_lens is None else _row_lengths(valid_lens, rank)
    query_len = query.shape[-2]
    if query_len is not None and row_lens is not None and row_lens.shape[-1] not in (
        None, 1, query_len
    ):
        raise ValueError(
            "Argument `valid_lens` of rank 2 must have shape (batch_size, query_len="
            f"{query_len}). Received: valid_lens.shape={tuple(ops.shape(valid_lens))}"
        )
    dense = None if mask is None else _dense_mask(mask, rank)
    # Scale the query before the product (as the dense path) so float16 scores do not overflow.
    query = query * ops.cast(scale, query.dtype)
    return query, key, value, dense, row_lens


def fused_dot_product_attention(
    query,
    key,
    value,
    mask=None,
    valid_lens=None,
    causal: bool = False,
    causal_offset=0,
    scale: float | None = None,
    dropout_rate: float = 0.0,
    seed: int | keras.random.SeedGenerator | None = None,
):
    """Dense attention, `softmax(Q Kᵀ · scale) V`, with a fused backward pass.

    The `(..., T, S)` weights are formed in one piece, as in
    `keras_attn.ops.dot_product_attention`, and kept for the backward pass, which computes
    `dS = P ⊙ (dO Vᵀ - rowsum(dO ⊙ O))` instead of differentiating the softmax: fewer passes
    over the `(T, S)` matrix, so forward + backward is faster at the same memory. For when
    the weights themselves are not wanted (`MultiHead` uses it then). Masks as in
    `chunked_dot_product_attention`.

    Dropout on the weights (`dropout_rate > 0`, what `dot_product_attention(...,
    training=True)` applies) uses `keras_attn.ops.dropout` on the weights in the dtype of
    `value`, so the same `seed` drops the same weights as `dot_product_attention`; the
    backward pass then uses `dS = P ⊙ (dP - rowsum(dO ⊙ O))` with `dP = M ⊙ (dO Vᵀ) · s` for the
    dropout mask `M` and scale `s`, and keeps the dropped weights as well as `P`.

    Args:
        query: `(..., T, d)`.
        key: `(..., S, d)`, same leading axes as `query`.
        value: `(..., S, dv)`.
        mask: optional boolean, broadcastable to `(..., T, S)`, True = attend. Defaults to
            `None`.
        valid_lens: optional `(B,)` or `(B, T)` key lengths. Defaults to `None`.
        causal: bool, query `i` sees keys `j <= i + causal_offset`. Defaults to `False`.
        causal_offset: int or scalar int tensor. Defaults to `0`.
        scale: float multiplying the scores. Defaults to `1 / sqrt(d)`.
        dropout_rate: float in [0, 1), the probability of dropping each weight; `0` means no
            dropout (callers pass `0` outside training). Defaults to `0.0`.
        seed: int, `keras.random.SeedGenerator` or `None`, the dropout's seed, as in
            `keras_attn.ops.dropout`. Defaults to `None`.

    Returns:
        Outputs `(..., T, dv)` in the dtype of `value`; rows with nothing to attend to are
        zero, with zero gradient.

    Example:
    >>> q = keras.random.normal((2, 4, 128, 16))
    >>> out = fused_dot_product_attention(q, q, q, causal=True)  # (2, 4, 128, 16)

    References:
        Dao et al., 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention with
        IO-Awareness", https://arxiv.org/abs/2205.14135 (the backward pass, Algorithm 4)
    """
    dropout_rate = as_rate("dropout_rate", dropout_rate)
    query, key, value, dense, row_lens = _prepare(query, key, value, mask, valid_lens, scale)
    blocking = _Blocking(query, _num_rows(key), None, None, dense, row_lens, bool(causal),
                         ops.cast(causal_offset, "int32"), single=True)
    return _single_block_fn(blocking, dropout_rate, seed)(query, key, value)


def chunked_dot_product_attention(
    query,
    key,
    value,
    mask=None,
    valid_lens=None,
    causal: bool = False,
    causal_offset=0,
    scale: float | None = None,
    chunk_size: int | None = None,
    query_chunk_size: int | None = None,
):
    """Exact scaled dot-product attention in blocks of keys, with an online softmax.

    Computes `softmax(Q Kᵀ · scale) V` like `keras_attn.ops.dot_product_attention`, but
    visits the keys `chunk_size` at a time, so memory grows with `T · chunk_size` instead of
    `T · S` in the forward and the backward pass (the gradient recomputes each block's weights
    from the saved log-sum-exp). Masks are generated per block from `valid_lens` and `causal`;
    a dense `mask` is sliced per block. Rows with nothing to attend to get a zero output and a
    zero gradient, as in the dense path.

    Args:
        query: `(..., T, d)`, e.g. `(B, T, d)` or `(B, H, T, d)`.
        key: `(..., S, d)`, same leading axes as `query`.
        value: `(..., S, dv)`.
        mask: optional boolean, broadcastable to `(..., T, S)`, True = attend; a `(B, T, S)`
            mask is broadcast over the head axis of 4D inputs. Axes of size 1 are not
            expanded, so `(B, 1, S)` key masks and `(B, T, 1)` query masks cost no `(T, S)`
            memory. Defaults to `None`.
        valid_lens: optional integer key lengths, `(B,)` (one per sequence) or `(B, T)` (one
            per query), the d2l form: query `i` of sequence `b` sees keys `j < valid_lens[b]`
            (or `valid_lens[b, i]`). Defaults to `None`.
        causal: bool, query `i` sees keys `j <= i + causal_offset`. Defaults to `False`.
        causal_offset: int or scalar int tensor, key position of the first query (cached
            decoding). Defaults to `0`.
        scale: float multiplying the scores. Defaults to `1 / sqrt(d)`.
        chunk_size: optional int, number of keys per block; `None` picks the largest power of
            two (at least 128) that keeps a block at `2**25` scores per sequence and head
            (128 MiB in float32): 2048 at T = 16k, 1024 at 32k, every key at once up to 4k
            (one block: the weights are kept for the backward pass, nothing is recomputed).
            Defaults to `None`.
        query_chunk_size: optional int, number of queries per block: a block then holds
            `query_chunk_size · chunk_size` scores per head instead of `T · chunk_size`, and
            causal attention skips the blocks above the diagonal (about half the work). But
            the backward pass then adds each block's key gradients into an `(S, d)` buffer
            (a full copy per block with TensorFlow), so `None`, all queries of a key block at
            once, is faster unless causal. Defaults to `None`.

    Returns:
        Outputs `(..., T, dv)` in the dtype of `value`. The weights are not returned (that is
        the `(T, S)` matrix this function avoids).

    Example:
    >>> q = keras.random.normal((2, 4, 1000, 16))
    >>> out = chunked_dot_product_attention(q, q, q, valid_lens=[1000, 10], causal=True,
    ...                                     chunk_size=256)  # (2, 4, 1000, 16)

    References:
        Rabe & Staats, 2021, "Self-attention Does Not Need O(n²) Memory",
        https://arxiv.org/abs/2112.05682;
        Dao et al., 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention with
        IO-Awareness", https://arxiv.org/abs/2205.14135
    """
    check_positive_int("chunk_size", chunk_size, allow_none=True)
    check_positive_int("query_chunk_size", query_chunk_size, allow_none=True)
    query, key, value, dense, row_lens = _prepare(query, key, value, mask, valid_lens, scale)
    query_len, key_len = _num_rows(query), _num_rows(key)
    # Blocks never exceed the sequence: a short sequence is one block, unpadded.
    q_chunk = query_chunk_size
    if q_chunk is not None and isinstance(query_len, int) and q_chunk >= query_len:
        q_chunk = None
    if chunk_size is None:
        chunk_size = auto_chunk_size(query_len if q_chunk is None else q_chunk)
    chunk = min(chunk_size, key_len) if isinstance(key_len, int) else chunk_size
    _, key_pad = _blocks(key_len, chunk)
    key = _pad_axis(key, -2, key_pad)  # (..., S_pad, d)
    value = _pad_axis(value, -2, key_pad)  # (..., S_pad, dv)
    if dense is not None and dense.shape[-1] != 1:
        dense = _pad_axis(dense, -1, key_pad, value=False)  # (..., T|1, S_pad)
    query_pad = 0
    if q_chunk is not None:
        _, query_pad = _blocks(query_len, q_chunk)
        query = _pad_axis(query, -2, query_pad)  # (..., T_pad, d); padded rows are dropped
        if row_lens is not None and row_lens.shape[-1] != 1:
            row_lens = _pad_axis(row_lens, -1, query_pad)
        if dense is not None and dense.shape[-2] != 1:
            dense = _pad_axis(dense, -2, query_pad, value=False)

    blocking = _Blocking(query, key_len, chunk, q_chunk, dense, row_lens, bool(causal),
                         ops.cast(causal_offset, "int32"))
    outputs = _attention_fn(blocking)(query, key, value)  # (..., T_pad, dv)
    if q_chunk is not None and not (isinstance(query_pad, int) and query_pad == 0):
        outputs = _slice_axis(outputs, -2, 0, query_len)  # (..., T, dv)
    return outputs
