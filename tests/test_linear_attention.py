"""LinearAttention: the explicit n × n formula with the same φ (NumPy), causal prefix sums,
padding masks, fully masked rows, and the layer contract."""

import keras
import numpy as np
import pytest
import reference as ref
import tensorflow as tf
from backend_utils import assert_allclose, assert_array_equal, dtype_of, rand, to_np
from layer_test_utils import run_layer_test

import keras_attn as ka
from keras_attn.ops import linear_attention, linear_attention_weights

rng = np.random.default_rng(0)




@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq_len,chunk_size", [(13, 4), (16, 16), (9, 64)])
def test_matches_explicit_formula(causal, seq_len, chunk_size):
    q, k, v = rand(2, 3, seq_len, 5), rand(2, 3, seq_len, 5), rand(2, 3, seq_len, 4)
    key_mask = np.arange(seq_len)[None, :] < np.array([[seq_len], [seq_len - 4]])
    out = linear_attention(q, k, v, key_mask=key_mask, causal=causal, chunk_size=chunk_size)
    expected = ref.linear_attention(q, k, v, key_mask, causal)
    assert_allclose(to_np(out), expected, rtol=1e-4, atol=1e-5)
    weights = linear_attention_weights(q, k, key_mask=key_mask, causal=causal)
    assert_allclose(to_np(weights) @ v, expected, rtol=1e-4, atol=1e-5)


def test_cross_attention_lengths_differ():
    q, k, v = rand(2, 2, 3, 4), rand(2, 2, 7, 4), rand(2, 2, 7, 6)
    assert_allclose(
        to_np(linear_attention(q, k, v)), ref.linear_attention(q, k, v), rtol=1e-4, atol=1e-5
    )


def test_layer_matches_formula_with_its_projections():
    layer = ka.LinearAttention(num_heads=2, key_dim=3, value_dim=4, output_dim=5)
    x, lens = rand(2, 6, 7), np.array([6, 2], "int32")
    out = to_np(layer(x, valid_lens=lens, use_causal_mask=True))
    wq, bq, wk, bk, wv, bv, wo, bo = (to_np(w) for w in (
        layer.query_dense.kernel, layer.query_dense.bias, layer.key_dense.kernel,
        layer.key_dense.bias, layer.value_dense.kernel, layer.value_dense.bias,
        layer.output_dense.kernel, layer.output_dense.bias))

    def heads(y, depth):  # (B, T, H * depth) -> (B, H, T, depth)
        return y.reshape(2, 6, 2, depth).transpose(0, 2, 1, 3)

    key_mask = np.arange(6)[None, :] < lens[:, None]
    ctx = ref.linear_attention(heads(x @ wq + bq, 3), heads(x @ wk + bk, 3),
                              heads(x @ wv + bv, 4), key_mask, causal=True)
    expected = ctx.transpose(0, 2, 1, 3).reshape(2, 6, 8) @ wo + bo
    assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.tf_only
def test_fully_masked_rows_are_zero_with_finite_gradients(causal):
    q = keras.Variable(rand(2, 2, 5, 3))
    k, v = rand(2, 2, 5, 3), rand(2, 2, 5, 3)
    key_mask = np.array([[False] * 5, [True] * 5])
    with tf.GradientTape() as tape:
        out = linear_attention(q, k, v, key_mask=key_mask, causal=causal)
        loss = keras.ops.sum(out)
    out = to_np(out)
    assert np.all(np.isfinite(out))
    assert_array_equal(out[0], 0.0)
    assert np.all(np.isfinite(to_np(tape.gradient(loss, q))))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_inputs_stay_finite(dtype):
    q, k, v = (keras.ops.cast(rand(1, 2, 300, 8) * 4, dtype) for _ in range(3))
    out = linear_attention(q, k, v, causal=True, chunk_size=32)
    assert dtype_of(out) == dtype
    assert np.all(np.isfinite(to_np(keras.ops.cast(out, "float32"))))


def test_implicit_mask_equals_valid_lens():
    ids = np.array([[5, 6, 7, 0, 0], [4, 3, 0, 0, 0]])
    embed = keras.layers.Embedding(10, 6, mask_zero=True)
    layer = ka.LinearAttention(num_heads=2, key_dim=4)
    x = embed(ids)
    implicit = to_np(layer(x))
    explicit = to_np(layer(keras.ops.convert_to_tensor(to_np(x)),
                           valid_lens=np.array([3, 2]),
                           query_mask=ids != 0))
    assert_allclose(implicit, explicit, rtol=1e-6, atol=1e-6)
    bias = to_np(layer.output_dense.bias)
    assert_allclose(implicit[1, 2:], np.broadcast_to(bias, (3, 6)), atol=1e-6)


def test_dynamic_length_functional_model():
    inputs = keras.Input((None, 6))
    outputs = ka.LinearAttention(num_heads=2, key_dim=4, chunk_size=4)(
        inputs, use_causal_mask=True
    )
    model = keras.Model(inputs, outputs)
    for length in (3, 10):
        x = rand(2, length, 6)
        out = to_np(model(x))
        assert out.shape == (2, length, 6)
        # Causality: changing the last position leaves the earlier outputs alone.
        x2 = x.copy()
        x2[:, -1] += 1.0
        assert_allclose(to_np(model(x2))[:, :-1], out[:, :-1], atol=1e-5)


@pytest.mark.parametrize(
    "case",
    [
        {"init_kwargs": {"num_heads": 2, "key_dim": 4, "value_dim": 3, "output_dim": 7},
         "inputs": {"query": rand(2, 3, 6), "key": rand(2, 5, 5), "value": rand(2, 5, 4),
                    "valid_lens": np.array([3, 5], "int32")},
         "shape": (2, 3, 7), "call_kwargs": {}},
        {"init_kwargs": {"num_heads": 2, "key_dim": 4, "chunk_size": 3},
         "inputs": {"query": rand(2, 7, 6)}, "shape": (2, 7, 6),
         "call_kwargs": {"use_causal_mask": True}},
    ],
    ids=["cross_valid_lens", "causal_chunked"],
)
def test_layer_contract(case, tmp_path):
    run_layer_test(ka.LinearAttention, case["init_kwargs"], case["inputs"], case["shape"],
                   tmp_path, call_kwargs=case["call_kwargs"])


def test_return_attention_scores_rows_sum_to_one():
    layer = ka.LinearAttention(num_heads=2, key_dim=4)
    _, weights = layer(rand(2, 5, 6), valid_lens=np.array([5, 0]),
                       return_attention_scores=True)
    weights = to_np(weights)
    assert weights.shape == (2, 2, 5, 5)
    assert_allclose(weights[0].sum(-1), 1.0, rtol=1e-5)
    assert_array_equal(weights[1], 0.0)


@pytest.mark.parametrize(
    "kwargs,name",
    [({"num_heads": 0, "key_dim": 4}, "num_heads"),
     ({"num_heads": 2, "key_dim": 4, "chunk_size": 0}, "chunk_size"),
     ({"num_heads": 2, "key_dim": 4, "dropout": 0.1}, "dropout"),
     ({"num_heads": 2, "key_dim": 4, "use_bias": 1}, "use_bias")],
)
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        ka.LinearAttention(**kwargs)


def test_quadratic_masks_are_refused():
    layer = ka.LinearAttention(num_heads=2, key_dim=4)
    x = rand(2, 3, 6)
    with pytest.raises(ValueError, match="attention_mask"):
        layer(x, attention_mask=np.ones((2, 3, 3), bool))
    with pytest.raises(ValueError, match="valid_lens"):
        layer(x, valid_lens=np.ones((2, 3), "int32"))
