"""Positions: rotary embeddings, ALiBi and T5 relative position biases, on every kernel."""

import keras
import numpy as np
import pytest
import reference as ref
from backend_utils import to_np, value_and_grads

from keras_attn import ops as attn_ops
from keras_attn.ops import AttentionMask


@pytest.mark.parametrize("start,wavelength,scaling", [(0, 10000, 1.0), (5, 100, 2.0)])
def test_rotary_embedding_equals_the_reference(start, wavelength, scaling):
    x = np.random.default_rng(0).normal(size=(2, 3, 7, 8)).astype("float32")
    got = attn_ops.rotary_embedding(x, start, wavelength, scaling)
    want = ref.rope(x, start + np.arange(7), wavelength, scaling)
    np.testing.assert_allclose(to_np(got), want, atol=1e-5)
    with pytest.raises(ValueError, match="even"):
        attn_ops.rotary_embedding(np.ones((1, 2, 3), "float32"))


@pytest.mark.parametrize("start", [0, 4])
def test_rotary_embedding_equals_keras_hub(start):
    keras_hub = pytest.importorskip("keras_hub")
    x = np.random.default_rng(1).normal(size=(2, 6, 3, 8)).astype("float32")  # (B, T, H, d)
    theirs = keras_hub.layers.RotaryEmbedding(max_wavelength=500, scaling_factor=1.5)
    got = attn_ops.rotary_embedding(x, start, 500, 1.5, sequence_axis=1)
    np.testing.assert_allclose(to_np(got), to_np(theirs(x, start_index=start)), atol=1e-5)


@pytest.mark.parametrize("num_heads", [1, 5, 6, 8, 12, 16])
def test_alibi_slopes_follow_the_paper(num_heads):
    np.testing.assert_allclose(attn_ops.alibi_slopes(num_heads), ref.alibi_slopes(num_heads),
                               rtol=1e-12)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 20)])
def test_relative_position_buckets_follow_t5(bidirectional, num_buckets, max_distance):
    relative = np.arange(-300, 301)
    got = attn_ops.relative_position_bucket(relative, bidirectional, num_buckets, max_distance)
    want = ref.t5_relative_position_bucket(relative, bidirectional, num_buckets, max_distance)
    np.testing.assert_array_equal(to_np(got).astype(int), want)


KERNELS = {
    "dense": {"implementation": "dense", "return_weights": True},
    "fused": {"implementation": "dense", "return_weights": False},
    "blockwise": {"implementation": "chunked", "chunk_size": 3},
    "blockwise_rows": {"implementation": "chunked", "chunk_size": 4, "query_chunk_size": 3},
}


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("kind", ["alibi", "alibi_symmetric", "t5"])
def test_position_biases_on_every_kernel_equal_the_reference(kernel, kind):
    """Grouped heads (2 key/value heads, 3 queries each), causal, an offset (a cache's); the
    T5 table's gradient follows the formula, tile by tile in the blockwise kernel."""
    rng = np.random.default_rng(3)
    batch, kv_heads, group, t, s, d = 2, 2, 3, 7, 10, 4
    q = rng.normal(size=(batch, kv_heads, group, t, d)).astype("float32")
    k = rng.normal(size=(batch, kv_heads, 1, s, d)).astype("float32")
    v = rng.normal(size=(batch, kv_heads, 1, s, d)).astype("float32")
    table = rng.normal(size=(8, kv_heads * group)).astype("float32")
    d_out = rng.normal(size=q.shape)
    offset, lens = 3, np.array([10, 6])
    heads = kv_heads * group

    def fn(q, k, v, table):
        if kind == "t5":
            bias = attn_ops.RelativeTileBias(table, bidirectional=False, max_distance=20)
        else:
            bias = attn_ops.AlibiTileBias(heads, symmetric=kind == "alibi_symmetric")
        mask = AttentionMask.build(t, s, batch, valid_lens=lens, use_causal_mask=True,
                                   causal_offset=offset)
        return attn_ops.dot_product_attention(q, k, v, mask,
                                              position_bias=bias, **KERNELS[kernel])[0]

    out, grads = value_and_grads(fn, [q, k, v, table], d_out)
    if kind == "t5":
        dense = ref.t5_bias(table, t, s, False, 8, 20, offset)
    else:
        dense = ref.alibi_bias(heads, t, s, offset, symmetric=kind == "alibi_symmetric")
    bias = dense.reshape(1, kv_heads, group, t, s)
    allowed = (ref.length_mask(lens, t, s) & ref.causal_mask(t, s, offset))[:, None, None]
    np.testing.assert_allclose(out, ref.attention(q, k, v, allowed, bias)[0], atol=2e-5)
    dq, dk, dv, dbias = ref.attention_grads(q, k, v, d_out, allowed, bias)
    for name, got, want in zip(("dq", "dk", "dv"), grads, (dq, dk, dv)):
        np.testing.assert_allclose(got, want, atol=5e-5, err_msg=name)
    if kind == "t5":  # d table[b, h] = sum of dS over the entries of bucket b
        rel = np.arange(s)[None, :] - (np.arange(t)[:, None] + offset)
        buckets = ref.t5_relative_position_bucket(rel, False, 8, 20)
        d_scores = dbias.sum(0).reshape(heads, t, s)
        want_table = np.zeros((8, heads))
        for h in range(heads):
            np.add.at(want_table[:, h], buckets, d_scores[h])
        np.testing.assert_allclose(grads[3], want_table, atol=5e-5)


@pytest.mark.parametrize("kind", ["alibi", "t5"])
@pytest.mark.parametrize("num_global", [0, 2])
def test_relative_biases_on_the_local_kernel(kind, num_global):
    rng = np.random.default_rng(4)
    q, k, v = (rng.normal(size=(2, 4, 13, 4)).astype("float32") for _ in range(3))
    table = rng.normal(size=(16, 4)).astype("float32")
    d_out = rng.normal(size=q.shape)

    def bias_of(table):
        if kind == "t5":
            return attn_ops.RelativeTileBias(table, bidirectional=True, max_distance=16)
        return attn_ops.AlibiTileBias(4, symmetric=True)

    def fn(q, k, v, table):
        mask = AttentionMask.build(13, 13, 2, window=3, num_global=num_global)
        return attn_ops.dot_product_attention(q, k, v, mask, implementation="local",
                                              position_bias=bias_of(table))[0]

    def dense_fn(q, k, v, table):
        mask = AttentionMask.build(13, 13, 2, window=3, num_global=num_global)
        return attn_ops.dot_product_attention(q, k, v, mask, position_bias=bias_of(table))[0]

    local_out, local_grads = value_and_grads(fn, [q, k, v, table], d_out)
    dense_out, dense_grads = value_and_grads(dense_fn, [q, k, v, table], d_out)
    np.testing.assert_allclose(local_out, dense_out, atol=2e-5)
    for got, want in zip(local_grads, dense_grads):
        np.testing.assert_allclose(got, want, atol=5e-5)
    if kind == "t5":
        assert np.abs(local_grads[3]).max() > 1e-3  # the table does get a gradient


def test_a_position_bias_that_is_not_relative_is_refused_by_the_local_kernel():
    class Absolute(attn_ops.PositionBias):
        relative = False
        num_heads = 1

        def tile(self, query_pos, key_pos, params=None):
            return keras.ops.cast(query_pos + 0 * key_pos, "float32")[None]

    x = np.ones((1, 1, 6, 4), "float32")
    with pytest.raises(ValueError, match="key - query"):
        attn_ops.dot_product_attention(x, x, x, AttentionMask.build(6, 6, window=1),
                                       implementation="local", position_bias=Absolute())
