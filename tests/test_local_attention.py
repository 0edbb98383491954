"""Sliding-window attention: the blockwise computation equals dense attention with the band
mask, the band mask equals its definition, no (T, T) tensor is formed, and the layer contract."""

import keras
import numpy as np
import pytest
import reference as ref
import tensorflow as tf
from backend_utils import as_np, assert_allclose, assert_array_equal, rand, to_np
from layer_test_utils import run_layer_test

import keras_attn as ka
from keras_attn import ops as attn_ops
from keras_attn.ops import local_attention_mask, local_dot_product_attention

rng = np.random.default_rng(0)




@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window,num_global,offset", [(0, 0, 0), (2, 0, 3), (3, 2, 0)])
def test_band_mask_matches_definition(window, num_global, causal, offset):
    got = to_np(local_attention_mask(6, 11, window, causal, num_global, offset))
    assert_array_equal(got, ref.local_band(6, 11, window, causal, num_global, offset))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "seq_len,window,num_global",
    [(1, 2, 0), (7, 0, 0), (12, 3, 0), (13, 4, 0), (13, 3, 2), (10, 16, 1)],
)
def test_blockwise_equals_dense_band(seq_len, window, num_global, causal):
    q, k, v = rand(2, 3, seq_len, 4), rand(2, 3, seq_len, 4), rand(2, 3, seq_len, 5)
    lens = np.array([seq_len, max(seq_len - 3, 0)], "int32")
    got = local_dot_product_attention(q, k, v, window, causal=causal, key_valid_lens=lens,
                                      num_global=num_global)
    mask = ref.local_band(seq_len, seq_len, window, causal, num_global)[None] & (
        np.arange(seq_len)[None, None, :] < lens[:, None, None]
    )  # (B, T, T)
    expected, _ = attn_ops.dot_product_attention(q, k, v, mask=mask[:, None])
    assert_allclose(to_np(got), to_np(expected), rtol=1e-5, atol=1e-6)
    assert np.all(np.isfinite(to_np(got)))


def test_fully_masked_rows_are_zero():
    q = k = v = rand(1, 2, 9, 4)
    key_mask = np.array([[True, True, True, False, False, False, False, False, False]])
    out = to_np(local_dot_product_attention(q, k, v, 2, causal=False, key_mask=key_mask))
    assert_array_equal(out[:, :, 6:], 0.0)  # nothing valid within 2 positions
    assert np.all(np.abs(out[:, :, :5]).sum(-1) > 0)


@pytest.mark.tf_only
def test_never_forms_a_quadratic_tensor():
    # A structural check on purpose: O(T · window) memory is what the local kernel is for, and
    # the largest tensor in its graph is the direct measure of it.
    seq_len, window = 512, 8
    fn = tf.function(lambda q: local_dot_product_attention(q, q, q, window, causal=True,
                                                           num_global=2))
    graph = fn.get_concrete_function(tf.TensorSpec((1, 2, seq_len, 16))).graph
    sizes = [
        out.shape.num_elements() for op in graph.get_operations() for out in op.outputs
        if out.shape.is_fully_defined()
    ]
    assert max(sizes) < seq_len * seq_len // 4, max(sizes)


@pytest.mark.parametrize("causal", [False, True])
def test_layer_equals_multi_head_with_band_mask(causal):
    x, lens = rand(2, 10, 6), np.array([10, 6], "int32")
    local = ka.LocalMultiHead(num_heads=2, key_dim=3, sliding_window=3, num_global=1)
    dense = ka.MultiHead(num_heads=2, key_dim=3)
    dense(x), local(x)
    local.set_weights(dense.get_weights())
    band = ref.local_band(10, 10, 2, causal, 1)[None]
    expected = dense(x, valid_lens=lens, attention_mask=band, use_causal_mask=causal)
    got = local(x, valid_lens=lens, use_causal_mask=causal)
    assert_allclose(to_np(got), to_np(expected), rtol=1e-5, atol=1e-5)
    got_dense, weights = local(x, valid_lens=lens, use_causal_mask=causal,
                               return_attention_scores=True)
    assert_allclose(to_np(got_dense), to_np(expected), rtol=1e-5, atol=1e-5)
    assert np.all(to_np(weights)[:, :, ~band[0]] == 0)


def test_from_keras_with_a_window_equals_keras_with_a_band_mask():
    x = np.random.default_rng(4).normal(size=(2, 24, 16)).astype("float32")
    reference = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)
    reference(x, x)
    band = np.abs(np.arange(24)[:, None] - np.arange(24)[None, :]) <= 3
    want = reference(x, x, attention_mask=np.broadcast_to(band, (2, 24, 24)))
    want = keras.ops.convert_to_numpy(want)
    layer = ka.LocalMultiHead.from_keras(reference, sliding_window=4)
    assert_allclose(keras.ops.convert_to_numpy(layer(x)), want, atol=1e-5)


def test_per_query_valid_lens_fall_back_to_dense_band():
    x, lens = rand(2, 6, 6), np.array([[1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1]], "int32")
    local = ka.LocalMultiHead(num_heads=2, key_dim=3, sliding_window=2)
    dense = ka.MultiHead(2, 3)
    dense(x), local(x)
    local.set_weights(dense.get_weights())
    expected = dense(x, valid_lens=lens, attention_mask=ref.local_band(6, 6, 1, False, 0)[None])
    assert_allclose(to_np(local(x, valid_lens=lens)), to_np(expected), atol=1e-6)


def test_incremental_decoding_equals_full_sequence():
    layer = ka.LocalMultiHead(num_heads=2, key_dim=4, sliding_window=3)
    x = rand(2, 7, 8)
    full = to_np(layer(x, use_causal_mask=True))
    cache = layer.init_cache(2, 7)
    steps = []
    for i in range(7):
        out, cache = layer(x[:, i:i + 1], cache=cache, cache_update_index=i,
                           use_causal_mask=True)
        steps.append(to_np(out))
    assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-5, atol=1e-5)


def test_implicit_mask_equals_valid_lens():
    ids = np.array([[5, 6, 7, 8, 0, 0], [4, 3, 0, 0, 0, 0]])
    embed = keras.layers.Embedding(10, 6, mask_zero=True)
    layer = ka.LocalMultiHead(num_heads=2, key_dim=4, sliding_window=2)
    x = embed(ids)
    implicit = to_np(layer(x))
    explicit = to_np(layer(keras.ops.convert_to_tensor(to_np(x)), valid_lens=np.array([4, 2]),
                           query_mask=ids != 0))
    assert_allclose(implicit, explicit, rtol=1e-6, atol=1e-6)


def test_dynamic_length_functional_model():
    inputs = keras.Input((None, 6))
    layer = ka.LocalMultiHead(num_heads=2, key_dim=4, sliding_window=4, num_global=1)
    model = keras.Model(inputs, layer(inputs, use_causal_mask=True))
    for length in (2, 11):
        x = rand(1, length, 6)
        band = ref.local_band(length, length, 3, True, 1)[None]
        expected = to_np(layer(x, attention_mask=band))  # dense fallback, same weights
        assert_allclose(to_np(model(x)), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "init_kwargs,call_kwargs",
    [({"num_heads": 2, "key_dim": 4, "sliding_window": 3, "num_global": 1, "dropout": 0.1,
       "output_shape": 5}, {"use_causal_mask": True}),
     ({"num_heads": 2, "key_dim": 4, "sliding_window": 4, "value_dim": 3}, {})],
    ids=["causal_global_dropout", "bidirectional"],
)
def test_layer_contract(init_kwargs, call_kwargs, tmp_path):
    inputs = {"query": rand(2, 9, 6), "valid_lens": np.array([9, 4], "int32")}
    expected = (2, 9, init_kwargs.get("output_shape", 6))
    run_layer_test(ka.LocalMultiHead, init_kwargs, inputs, expected, tmp_path,
                   call_kwargs=call_kwargs)


@pytest.mark.parametrize(
    "kwargs,name",
    [({"num_heads": 2, "key_dim": 4, "sliding_window": 0}, "sliding_window"),
     ({"num_heads": 2, "key_dim": 4, "sliding_window": 1.5}, "sliding_window"),
     ({"num_heads": 2, "key_dim": 4}, "sliding_window"),
     ({"num_heads": 2, "key_dim": 4, "window": -1}, "window"),
     ({"num_heads": 2, "key_dim": 4, "sliding_window": 3, "num_global": -1}, "num_global"),
     ({"num_heads": 0, "key_dim": 4, "sliding_window": 3}, "num_heads")],
)
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        ka.LocalMultiHead(**kwargs)


def test_unaligned_keys_run_the_dense_band():
    """Keys that are not the queries' positions cannot be cut into the window's tiles: the
    dense kernel applies the same band (`keras_attn.ops.kernel_for`)."""
    q, k, v = rand(1, 1, 4, 2), rand(1, 1, 5, 2), rand(1, 1, 5, 2)
    band = ref.local_band(4, 5, 1, False, 0)
    want, _ = attn_ops.dot_product_attention(q, k, v, mask=band)
    assert_allclose(to_np(local_dot_product_attention(q, k, v, 1)), to_np(want), atol=1e-6)


# ---- inside the Transformer ----------------------------------------------------------------


def test_transformer_blocks_with_attention_window_equal_band_masked_full_blocks():
    """`sliding_window=w + 1` in a block's attention equals the full block given the band
    mask |i-j| <= w."""
    from keras_attn.layers import (
        AttentionConfig,
        TransformerDecoderBlock,
        TransformerEncoderBlock,
    )

    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 9, 8)).astype("float32")
    memory = rng.standard_normal((2, 5, 8)).astype("float32")
    padding = np.arange(9)[None] < np.array([[9], [6]])  # (B, T)
    i, j = np.arange(9)[:, None], np.arange(9)[None]
    band = np.abs(i - j) <= 2

    local = TransformerEncoderBlock(AttentionConfig(2, sliding_window=3), 16)
    full = TransformerEncoderBlock(2, 16)
    local.build(x.shape), full.build(x.shape)
    full.set_weights(local.get_weights())
    out = local(x, padding_mask=padding)
    ref = full(x, padding_mask=padding, attention_mask=np.broadcast_to(band, (2, 9, 9)))
    assert_allclose(as_np(out), as_np(ref), atol=1e-5)

    # Decoder: position t sees only t-2..t, so changing x[:, 0] leaves positions >= 3 as they
    # were (with full causal attention it would change every position).
    local = TransformerDecoderBlock(AttentionConfig(2, sliding_window=3), 16)
    full = TransformerDecoderBlock(2, 16)
    local.build(x.shape, memory.shape), full.build(x.shape, memory.shape)
    full.set_weights(local.get_weights())
    changed = x.copy()
    changed[:, 0] += 1.0
    for block, unchanged_from in ((local, 3), (full, 9)):
        before, after = as_np(block(x, memory)), as_np(block(changed, memory))
        assert_allclose(after[:, unchanged_from:], before[:, unchanged_from:],
                                   atol=1e-6)
        assert not np.allclose(after[:, :unchanged_from], before[:, :unchanged_from],
                               atol=1e-4)


def test_windowed_transformer_cached_decoding_equals_full_pass():
    from keras_attn import decoding
    from keras_attn.models import transformer_seq2seq

    model = transformer_seq2seq(12, 12, num_layers=1, hidden_dim=16, num_heads=2,
                                intermediate_dim=32, dropout=0.0, sliding_window=3)
    source = np.array([[4, 5, 6, 7, 0], [8, 9, 10, 0, 0]], "int32")
    tokens = as_np(decoding.generate(model, source, 6, stop_token_ids=None))
    prefix = np.concatenate([np.full((2, 1), 2, "int32"), tokens[:, :-1]], 1)
    logits = as_np(model([source, prefix])).copy()
    logits[..., [0, 2]] = -np.inf  # never emitted by the search
    assert_array_equal(tokens, logits.argmax(-1))
