"""MultiHead as a drop-in for Keras' MultiHeadAttention and GroupQueryAttention, and
RotaryEmbedding for keras-hub's: the behaviour their own test suites check, written afresh.

The deliberate differences (README, "Differences from keras.layers.MultiHeadAttention") are
not tested as Keras has them: `call(query, key, value)` order, boolean masks only, query and
value widths may differ, zero weights for a query that sees no key, no private hooks.
"""

import os
import re

import keras
import numpy as np
import pytest
import reference as ref
from backend_utils import dense_weights, rand, to_np
from layer_test_utils import run_layer_test

import keras_attn as ka

# ---- construction and weights ------------------------------------------------------------------


@pytest.mark.parametrize("kwargs,count", [
    ({}, 8), ({"use_bias": False, "dropout": 0.5}, 4), ({"use_gate": True}, 10),
    ({"use_bias": False, "dropout": 0.5, "use_gate": True}, 5),
    ({"num_key_value_heads": 1}, 8), ({"num_key_value_heads": 2, "use_gate": True}, 10),
    ({"use_bias": ("query", "key", "value")}, 7),
])
def test_weights_of_each_configuration(kwargs, count, tmp_path):
    """Four projections (five with the gate), with or without biases; grouped heads only
    shrink the key and value projections."""
    layer = ka.MultiHead(num_heads=2, key_dim=2, **kwargs)
    layer(rand(2, 8, 16), rand(2, 4, 16))
    assert len(layer.trainable_weights) == count
    assert not layer.non_trainable_weights
    kv_heads = kwargs.get("num_key_value_heads", 2)
    assert tuple(layer.key_dense.kernel.shape) == (16, kv_heads * 2)
    run_layer_test(ka.MultiHead, {"num_heads": 2, "key_dim": 2, **kwargs},
                   {"query": rand(2, 8, 16), "key": rand(2, 4, 16)}, (2, 8, 16), tmp_path,
                   run_mixed_precision=False)


@pytest.mark.parametrize("kernel", [
    {}, {"implementation": "chunked"}, {"implementation": "chunked", "chunk_size": 2}])
def test_a_layer_of_the_users_that_calls_multi_head_infers_its_output(kernel):
    """A subclassed layer with no `compute_output_spec` that calls MultiHead, in a functional
    model on inputs of unknown batch and length: Keras runs its `call` symbolically (on JAX
    with symbolic sizes, which MultiHead once refused as not a shape, and the chunked kernel
    could not size its blocks from), as it does for `keras.layers.MultiHeadAttention`."""

    class Wrapper(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.attention = ka.MultiHead(num_heads=2, key_dim=4, **kernel)

        def call(self, x, mask):
            return self.attention(x, x, query_mask=mask, key_mask=mask, use_causal_mask=True)

    x, mask = keras.Input((None, 8)), keras.Input((None,), dtype="bool")
    wrapper = Wrapper()
    y = wrapper(x, mask)
    assert tuple(y.shape) == (None, None, 8)
    model = keras.Model([x, mask], y)
    values, visible = rand(2, 5, 8), np.arange(5)[None, :] < np.array([[5], [3]])
    direct = wrapper.attention(values, values, query_mask=visible, key_mask=visible,
                               use_causal_mask=True)
    np.testing.assert_allclose(to_np(model([values, visible])), to_np(direct), atol=1e-6)


def test_dropout_acts_in_training_only():
    layer = ka.MultiHead(num_heads=2, key_dim=4, dropout=0.5, seed=1)
    x = rand(2, 6, 8)
    inference = to_np(layer(x))
    np.testing.assert_array_equal(to_np(layer(x, training=False)), inference)
    assert np.abs(to_np(layer(x, training=True)) - inference).max() > 1e-3


@pytest.mark.parametrize("bad", [0, -2, 1.5])
@pytest.mark.parametrize("name", ["num_heads", "key_dim", "value_dim"])
def test_invalid_sizes_name_the_argument(name, bad):
    kwargs = {"num_heads": 4, "key_dim": 4, name: bad}
    with pytest.raises(ValueError, match=f"argument `{name}`"):
        ka.MultiHead(**kwargs)


def test_value_dim_none_is_key_dim_and_output_shapes():
    assert ka.MultiHead(num_heads=4, key_dim=4, value_dim=None).value_dim == 4
    x = rand(2, 4, 16)
    assert ka.MultiHead(2, 16, output_shape=8)(x).shape == (2, 4, 8)
    assert ka.MultiHead(2, 16, output_shape=(8, 3))(x).shape == (2, 4, 8, 3)
    with pytest.raises(ValueError, match="output_shape"):
        ka.MultiHead(2, 16, output_shape=8.0)


def test_constraints_reach_every_projection():
    layer = ka.MultiHead(num_heads=2, key_dim=2, use_gate=True, kernel_constraint="non_neg",
                         bias_constraint="non_neg")
    layer.build((1, 2, 2), (1, 2, 2), (1, 2, 2))
    for dense in (layer.query_dense, layer.key_dense, layer.value_dense, layer.gate_dense,
                  layer.output_dense):
        assert isinstance(dense.kernel.constraint, keras.constraints.NonNeg)
        assert isinstance(dense.bias.constraint, keras.constraints.NonNeg)


def test_per_projection_biases_as_qwen2_has_them():
    """`use_bias=("query", "key", "value")`: biased q/k/v projections, no output bias."""
    layer = ka.MultiHead(num_heads=2, key_dim=3, use_bias=("query", "key", "value"))
    layer(rand(1, 4, 6))
    assert layer.query_dense.bias is not None and layer.value_dense.bias is not None
    assert layer.output_dense.bias is None
    assert ka.MultiHead.from_config(layer.get_config()).use_bias == ("query", "key", "value")
    with pytest.raises(ValueError, match="use_bias"):
        ka.MultiHead(2, 3, use_bias=("qkv",))


# ---- masks -----------------------------------------------------------------------------------


def embedded(ids, vocab):
    return keras.layers.Embedding(vocab, 8, mask_zero=True)(np.array(ids))


@pytest.mark.parametrize("kv_heads", [None, 1])
@pytest.mark.parametrize("causal", [False, True])
def test_implicit_masks_equal_the_same_mask_given_explicitly(causal, kv_heads):
    layer = ka.MultiHead(num_heads=2, key_dim=2, num_key_value_heads=kv_heads)
    query = embedded([[1, 2, 3, 0, 0], [3, 3, 1, 1, 2], [1, 0, 0, 0, 0]], 4)
    value = embedded([[5, 4, 0], [3, 0, 0], [2, 1, 1]], 6)
    implicit = to_np(layer(query, value, use_causal_mask=causal))
    query_valid = np.array([[1, 1, 1, 0, 0], [1] * 5, [1, 0, 0, 0, 0]], bool)
    value_valid = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1]], bool)
    mask = query_valid[:, :, None] & value_valid[:, None, :]
    if causal:
        mask &= ref.causal_mask(5, 3)
    plain_q, plain_v = (keras.ops.convert_to_tensor(to_np(x)) for x in (query, value))
    explicit = to_np(layer(plain_q, plain_v, attention_mask=mask))
    np.testing.assert_allclose(implicit, explicit, atol=1e-6)


def test_the_query_mask_reaches_the_outputs():
    """The output carries the query's padding: a masked average downstream skips it."""
    ids = keras.Input((5,), dtype="int32")
    query = keras.layers.Embedding(4, 8, mask_zero=True)(ids)
    out = ka.MultiHead(num_heads=2, key_dim=2)(query, keras.ops.ones((3, 3, 8)))
    model = keras.Model(ids, [out, keras.layers.GlobalAveragePooling1D()(out)])
    tokens = np.array([[1, 2, 3, 0, 0], [3, 3, 1, 1, 2], [1, 0, 0, 0, 0]])
    sequence, pooled = (to_np(x) for x in model(tokens))
    for row, length in enumerate((3, 5, 1)):
        np.testing.assert_allclose(pooled[row], sequence[row, :length].mean(0), atol=1e-5)


def test_masks_of_every_rank_agree():
    x = rand(2, 5, 8)
    layer = ka.MultiHead(num_heads=2, key_dim=4)
    tril = np.tril(np.ones((5, 5), bool))
    outputs = [to_np(layer(x, attention_mask=mask)) for mask in
               (tril, np.tile(tril[None], (2, 1, 1)), np.tile(tril[None, None], (2, 2, 1, 1)))]
    for out in outputs[1:]:
        np.testing.assert_allclose(out, outputs[0], atol=1e-6)


def test_keras_masks_raise_no_warning(recwarn):
    layer = ka.MultiHead(num_heads=2, key_dim=2)
    layer(embedded([[1, 2, 0]], 4), embedded([[5, 4, 0]], 6))
    assert not [w for w in recwarn if not issubclass(w.category, DeprecationWarning)]


@pytest.mark.parametrize("dropout,scores", [(0.0, True), (0.1, False), (0.1, True)])
def test_the_causal_mask_holds_on_every_path(dropout, scores):
    """Alone, with another mask, with dropout, with the weights returned: future keys get no
    weight, and the causal flag equals the same mask given explicitly."""
    x = rand(1, 6, 8)
    layer = ka.MultiHead(num_heads=2, key_dim=4, dropout=dropout)
    future = ~ref.causal_mask(6, 6)
    if scores:
        _, weights = layer(x, use_causal_mask=True, return_attention_scores=True)
        assert to_np(weights)[..., future].max() == 0.0
    np.testing.assert_allclose(to_np(layer(x, use_causal_mask=True)),
                               to_np(layer(x, attention_mask=~future[None])), atol=1e-6)
    extra = np.ones((1, 6, 6), bool)
    extra[:, 2, 1] = False
    np.testing.assert_allclose(to_np(layer(x, attention_mask=extra, use_causal_mask=True)),
                               to_np(layer(x, attention_mask=extra & ~future)), atol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
def test_sliding_window_sees_what_keras_says(causal):
    x = rand(1, 6, 8)
    layer = ka.MultiHead(num_heads=2, key_dim=4, sliding_window=3)
    _, weights = layer(x, use_causal_mask=causal, return_attention_scores=True)
    visible = ref.keras_sliding_window_mask(6, 6, 3) & (ref.causal_mask(6, 6) if causal
                                                        else True)
    np.testing.assert_array_equal(to_np(weights)[0] > 0, np.broadcast_to(visible, (2, 6, 6)))
    for bad in (0, -3):
        with pytest.raises(ValueError, match="sliding_window"):
            ka.MultiHead(num_heads=2, key_dim=4, sliding_window=bad)
    assert ka.MultiHead.from_config(layer.get_config()).sliding_window == 3


# ---- inputs of any rank ----------------------------------------------------------------------

HIGH_RANK = [  # (query dims, value dims, attention axes, attention mask shapes)
    ((3, 4), (3, 2), (2,), [(4, 2), (3, 4, 2), (3, 3, 4, 2), (3, 3, 2, 4, 2)]),
    ((3, 4), (3, 2), (1, 2), [(3, 4, 3, 2), (3, 3, 4, 3, 2)]),
    ((5, 3, 4), (5, 3, 2), (2, 3), [(3, 4, 3, 2), (3, 5, 3, 4, 3, 2)]),
    ((3, 4), (3, 2), (-2,), [(3, 1, 4, 2)]),
    ((5, 3, 4), (5, 3, 2), (3, 2), [(3, 5, 4, 3, 2, 3)]),
    ((4, 2, 3), (1, 1, 5), None, [(4, 2, 3, 1, 1, 5)]),
]


@pytest.mark.parametrize("q_dims,v_dims,axes,mask_shapes", HIGH_RANK)
def test_high_rank_inputs_equal_keras_exactly(q_dims, v_dims, axes, mask_shapes):
    """Inputs of rank 4 and 5, attention over one or two axes (negative, out of order), the
    softmax joint over the key's attention axes, masks of several ranks: `from_keras` gives
    Keras' outputs and weights (the batch of 3 lets a mask's first axis be the batch)."""
    query = rand(3, *q_dims, 8)
    value = rand(3, *v_dims, 8)
    theirs = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, attention_axes=axes,
                                             use_gate=True)
    want, want_weights = theirs(query, value, return_attention_scores=True)
    ours = ka.MultiHead.from_keras(theirs)
    got, weights = ours(query, value, return_attention_scores=True)
    assert tuple(weights.shape) == tuple(want_weights.shape)
    np.testing.assert_allclose(to_np(got), to_np(want), atol=1e-5)
    np.testing.assert_allclose(to_np(weights), to_np(want_weights), atol=1e-6)
    assert ours.compute_output_shape(query.shape, value.shape) == query.shape
    rng = np.random.default_rng(0)
    for shape in mask_shapes:
        mask = rng.random(shape) < 0.7
        mask[..., 0] = True  # no row without keys (Keras would average those uniformly)
        np.testing.assert_allclose(to_np(ours(query, value, attention_mask=mask)),
                                   to_np(theirs(query, value, attention_mask=mask)), atol=1e-5)


def test_negative_attention_axes_equal_positive_ones():
    x = rand(2, 3, 8, 4)
    layers = [ka.MultiHead(num_heads=2, key_dim=4, attention_axes=axis, use_gate=True)
              for axis in (2, -2)]
    layers[0](x)
    layers[1](x)
    layers[1].set_weights(layers[0].get_weights())
    (out_p, w_p), (out_n, w_n) = (layer(x, return_attention_scores=True) for layer in layers)
    np.testing.assert_array_equal(to_np(out_p), to_np(out_n))
    np.testing.assert_array_equal(to_np(w_p), to_np(w_n))


def test_high_rank_causal_and_padding_masks():
    """Attention over axis 1 of `(B, T, 3, d)`: the causal mask hides future keys along that
    axis, and a padding mask `(B, T, 3)` hides keys independently per column."""
    x = rand(2, 5, 3, 8)
    layer = ka.MultiHead(num_heads=2, key_dim=4, attention_axes=1)
    _, weights = layer(x, use_causal_mask=True, return_attention_scores=True)  # (B, 3, H, T, T)
    assert to_np(weights)[..., ~ref.causal_mask(5, 5)].max() == 0.0
    key_valid = np.random.default_rng(1).random((2, 5, 3)) < 0.7
    key_valid[:, 0] = True
    _, weights = layer(x, key_mask=key_valid, return_attention_scores=True)
    hidden = ~np.transpose(key_valid, (0, 2, 1))[:, :, None, None, :]  # (B, 3, 1, 1, S)
    assert to_np(weights)[np.broadcast_to(hidden, weights.shape)].max() == 0.0


def test_high_rank_symbolic_call_and_layer_contract(tmp_path):
    run_layer_test(ka.MultiHead, {"num_heads": 2, "key_dim": 2, "attention_axes": (2, 3),
                                  "use_gate": True},
                   {"query": rand(2, 3, 4, 2, 8), "key": rand(2, 3, 2, 3, 8)}, (2, 3, 4, 2, 8),
                   tmp_path, run_mixed_precision=False)
    layer = ka.MultiHead(num_heads=2, key_dim=2)
    inputs = keras.Input((3, 4, 8))
    out, weights = layer(inputs, return_attention_scores=True)
    assert tuple(out.shape) == (None, 3, 4, 8) and tuple(weights.shape) == (None, 2, 3, 4, 3, 4)


@pytest.mark.parametrize("query,value,key", [
    ((2, 4, 8), (2, 2, 8), (2, 1, 8)),  # keys and values of different lengths
    ((2, 4, 2, 3, 8), (2, 1, 1, 5, 8), (2, 1, 15, 5, 2)),
    ((2, 4, 8), (3, 2, 8), None),  # different batches
])
def test_shape_mismatches_are_refused_by_the_call_and_the_shape_function(query, value, key):
    layer = ka.MultiHead(num_heads=4, key_dim=2, value_dim=2)
    key = value if key is None else key
    with pytest.raises(ValueError, match="`key` and `value`|`query` and `key`"):
        layer.compute_output_shape(query, key, value)
    with pytest.raises(ValueError, match="`key` and `value`|`query` and `key`"):
        layer(np.ones(query, "float32"), np.ones(key, "float32"), np.ones(value, "float32"))


@pytest.mark.parametrize("shapes,name", [
    (((2, 4, 8), 2, (2, 2, 8)), "key"),  # a bare int, as Keras' own GQA test passes one
    (((2, 4, 8), (2, 2, 8), "(2, 2, 8)"), "value"),
    ((None, (2, 2, 8), (2, 2, 8)), "query"),
])
def test_a_shape_that_is_not_a_shape_is_named(shapes, name):
    """`compute_output_shape` with something that is not a tuple of sizes: a ValueError naming
    the argument, not a TypeError from inside."""
    layer = ka.MultiHead(num_heads=4, key_dim=2)
    with pytest.raises(ValueError, match=f"`{name}_shape`"):
        layer.compute_output_shape(*shapes)


def test_keys_and_values_of_different_lengths_in_keras_words():
    """Keras' message says "must be equal"; ours does too, and names both shapes."""
    with pytest.raises(ValueError, match=r"must be equal.*key.shape=\(2, 1, 8\)"):
        ka.MultiHead(num_heads=2, key_dim=2).compute_output_shape((2, 4, 8), (2, 1, 8),
                                                                  (2, 2, 8))


@pytest.mark.parametrize("kwargs,arg", [
    ({"attention_axes": 0}, "attention_axes"), ({"attention_axes": (1, 1)}, "attention_axes"),
    ({"attention_axes": "1"}, "attention_axes"),
])
def test_bad_attention_axes_name_the_argument(kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        ka.MultiHead(2, 4, **kwargs)


def test_attention_axes_outside_the_inputs_and_rank_3_only_options_are_refused():
    with pytest.raises(ValueError, match="attention_axes"):
        ka.MultiHead(2, 4, attention_axes=3)(rand(1, 2, 3, 4))
    layer = ka.MultiHead(2, 4, attention_axes=(1, 2))
    for call in ({"valid_lens": np.array([1])}, {"attention_bias": np.zeros((2, 6, 6), "f")}):
        with pytest.raises(ValueError, match=next(iter(call))):
            layer(rand(1, 2, 3, 4), **call)
    with pytest.raises(ValueError, match="position_encoding"):
        ka.MultiHead(2, 4, attention_axes=(1, 2), position_encoding="rope")(rand(1, 2, 3, 4))


@pytest.mark.parametrize("axes", [7, 5, (7,), (2, 6)])
def test_attention_axes_beyond_the_rank_are_refused_not_wrapped(axes):
    """Axis 7 of rank-5 inputs was taken modulo 5 and attended over axis 2; Keras refuses."""
    with pytest.raises(IndexError):
        keras.layers.MultiHeadAttention(2, 4, attention_axes=7)(rand(1, 2, 3, 4, 8),
                                                                rand(1, 2, 3, 4, 8))
    with pytest.raises(ValueError, match=r"attention_axes.*rank-5"):
        ka.MultiHead(2, 4, attention_axes=axes)(rand(1, 2, 3, 4, 8))


@pytest.mark.parametrize("mask_shape", [(2, 3, 4, 5, 4, 4), (2, 3, 2, 4, 5, 4, 3),
                                        (2, 2, 4, 5, 4, 5), (1, 3, 4, 1, 6, 5)])
def test_masks_of_other_sizes_over_several_axes_are_refused_by_name(mask_shape):
    """A mask of the scores' rank but other sizes reached a raw BroadcastTo error."""
    x = rand(2, 3, 4, 5, 8)  # attention over axes 2 and 3: scores (2, 3, [H,] 4, 5, 4, 5)
    layer = ka.MultiHead(2, 4, attention_axes=(2, 3))
    mask = np.ones(mask_shape, bool)
    with pytest.raises(ValueError, match=r"attention_mask.*" + re.escape(str(mask_shape))):
        layer(x, attention_mask=mask)
    layer(x, attention_mask=np.ones((2, 3, 4, 5, 4, 5), bool))  # the scores' shape
    layer(x, attention_mask=np.ones((1, 3, 2, 1, 5, 1, 5), bool))  # sizes of 1 broadcast


# ---- numbers, LoRA, quantization, dtype policies -----------------------------------------------


def test_identity_projections_give_the_formula():
    """Identity kernels, no biases: each head attends with softmax(q kᵀ / √d) on the inputs
    themselves (the computation Keras checks with hand numbers, here against the formula)."""
    d = 8
    query = key = np.eye(d, dtype="float32")[None]
    value = (np.arange(d * d, dtype="float32").reshape(1, d, d) / 100.0)
    layer = ka.MultiHead(num_heads=1, key_dim=d, use_bias=False)
    layer.build(query.shape, key.shape, value.shape)
    layer.set_weights([np.eye(d, dtype="float32")] * 4)
    out, weights = layer(query, key, value, return_attention_scores=True)
    want, want_weights = ref.attention(query, key, value)
    np.testing.assert_allclose(to_np(out), want, atol=1e-6)
    np.testing.assert_allclose(to_np(weights)[:, 0], want_weights, atol=1e-6)


def test_lora_on_the_projections_trains_saves_and_loads(tmp_path):
    q = np.array([[[1.0, 0.0], [0.0, 1.0]]], "float32")
    k = np.array([[[0.0, 1.0], [1.0, 0.0]]], "float32")
    v = np.array([[[1.0, 2.0], [3.0, 4.0]]], "float32")

    def model_of(layer):
        inputs = {name: keras.Input((2, 2), name=name) for name in ("query", "key", "value")}
        return keras.Model(inputs, layer(inputs["query"], inputs["key"], inputs["value"]))

    layer = ka.MultiHead(num_heads=3, key_dim=8, use_bias=False, use_gate=True)
    layer.build(q.shape, k.shape, v.shape)
    for dense in (layer.query_dense, layer.key_dense, layer.value_dense):
        dense.enable_lora(2)
    assert len(layer.trainable_variables) == 8 and len(layer.non_trainable_variables) == 3
    model = model_of(layer)
    data = {"query": q, "key": k, "value": v}
    model.compile(optimizer="sgd", loss="mse")
    model.fit(data, np.random.random((1, 2, 2)), verbose=0)
    path = os.path.join(tmp_path, "lora.keras")
    model.save(path)
    np.testing.assert_allclose(to_np(keras.saving.load_model(path).predict(data, verbose=0)),
                               to_np(model.predict(data, verbose=0)), atol=1e-6)
    plain = model_of(ka.MultiHead(num_heads=3, key_dim=8, use_bias=False, use_gate=True))
    weights_path = os.path.join(tmp_path, "lora.weights.h5")
    model.save_weights(weights_path)
    plain.load_weights(weights_path)
    np.testing.assert_allclose(to_np(plain.predict(data, verbose=0)),
                               to_np(model.predict(data, verbose=0)), atol=1e-6)


def test_a_dtype_policy_map_quantizes_the_projections_it_names():
    policy = keras.dtype_policies.DTypePolicyMap()
    for name in ("query_dense", "key_dense", "value_dense"):
        policy[f"mha/{name}"] = keras.dtype_policies.QuantizedDTypePolicy("int8", "float32")
    layer = ka.MultiHead(num_heads=3, key_dim=8, use_bias=False, dtype=policy, name="mha")
    layer.build((1, 2, 2), (1, 2, 2), (1, 2, 2))
    for dense in (layer.query_dense, layer.key_dense, layer.value_dense):
        assert dense.quantization_mode == "int8"
        assert keras.backend.standardize_dtype(dense.kernel.dtype) == "int8"
    assert layer.output_dense.quantization_mode is None


def test_from_keras_keeps_the_dtype_policy():
    theirs = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, dtype="float16")
    x = np.ones((1, 3, 8), "float16")
    theirs(x, x)
    ours = ka.MultiHead.from_keras(theirs)
    assert ours.dtype_policy.name == "float16"
    assert keras.backend.standardize_dtype(ours(x).dtype) == "float16"
    grouped = keras.layers.GroupQueryAttention(head_dim=4, num_query_heads=2,
                                               num_key_value_heads=1, dtype="mixed_bfloat16")
    grouped(x, x)
    assert ka.MultiHead.from_keras(grouped).dtype_policy.name == "mixed_bfloat16"


def test_grouped_query_symbolic_shapes():
    layer = ka.MultiHead(num_heads=4, key_dim=8, num_key_value_heads=2)
    out, scores = layer(keras.Input((10, 32)), keras.Input((15, 32)),
                        return_attention_scores=True)
    assert tuple(out.shape) == (None, 10, 32) and tuple(scores.shape) == (None, 4, 10, 15)
    assert tuple(layer(keras.Input((10, 32)), keras.Input((15, 32))).shape) == (None, 10, 32)


# ---- RotaryEmbedding as keras-hub's ---------------------------------------------------------


@pytest.mark.parametrize("kwargs,shape", [
    ({"max_wavelength": 1000, "scaling_factor": 2.0, "sequence_axis": 1, "feature_axis": -1},
     (2, 4, 6)),
    ({"max_wavelength": 1000}, (2, 8, 4, 6)),
])
def test_rotary_layer_contract(kwargs, shape, tmp_path):
    run_layer_test(ka.RotaryEmbedding, kwargs, {"inputs": rand(*shape)}, shape, tmp_path,
                   run_mixed_precision=False)


def test_rotary_symbolic_shapes_keep_unknown_axes():
    assert tuple(ka.RotaryEmbedding()(keras.Input((None, 32))).shape) == (None, None, 32)
    assert tuple(ka.RotaryEmbedding()(keras.Input((None, 100, 32))).shape) == (
        None, None, 100, 32)


def test_rotary_values_follow_the_formula_and_start_index_continues_them():
    x = rand(2, 5, 8)
    layer = ka.RotaryEmbedding(max_wavelength=100)
    full = to_np(layer(x))
    np.testing.assert_allclose(full, ref.rope(x, np.arange(5), 100), atol=1e-5)
    steps = [to_np(layer(x[:, i:i + 1], start_index=i)) for i in range(5)]
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-6)
    scaled = ka.RotaryEmbedding(scaling_factor=5.0)(np.ones((1, 1, 2, 4), "f"), start_index=12)
    np.testing.assert_allclose(to_np(scaled), ref.rope(np.ones((1, 1, 2, 4)).swapaxes(1, 2),
                                                       [12], 10000, 5.0).swapaxes(1, 2),
                               atol=1e-5)


def test_rotary_permuted_axes_equal_the_plain_layout():
    x = rand(2, 3, 4)
    plain = to_np(ka.RotaryEmbedding()(x))
    permuted = ka.RotaryEmbedding(sequence_axis=-1, feature_axis=-2)(np.swapaxes(x, 1, 2))
    np.testing.assert_allclose(np.swapaxes(to_np(permuted), 1, 2), plain, atol=1e-6)


@pytest.mark.parametrize("positions", [[0.0, 0.0], [[0, 0], [0, 1]], [3, 9]])
def test_rotary_positions_one_or_per_batch(positions):
    """`positions` `(T,)` or `(B, T)` replace `start_index + arange(T)`, any dtype."""
    x = rand(2, 2, 1, 16)  # (B, T, H, d)
    positions = np.asarray(positions)
    got = to_np(ka.RotaryEmbedding()(x, positions=positions))
    per_batch = np.broadcast_to(positions, (2, 2))
    want = np.stack([ref.rope(x[b].swapaxes(0, 1), per_batch[b]).swapaxes(0, 1)
                     for b in range(2)])
    np.testing.assert_allclose(got, want, atol=1e-5)
    with pytest.raises(ValueError, match="start_index"):
        ka.RotaryEmbedding()(x, positions=positions, start_index=2)


@pytest.mark.parametrize("shape", [(3,), (1,), (2, 3), (3, 2), (1, 2)])
def test_rotary_positions_of_another_length_or_batch_are_refused(shape):
    """They reached a raw Mul or Reshape error (or broadcast a batch of 1)."""
    x = rand(2, 2, 1, 16)  # (B, T, H, d)
    with pytest.raises(ValueError, match=r"positions.*" + re.escape(str(shape))):
        ka.RotaryEmbedding()(x, positions=np.zeros(shape, "int32"))


def test_rotary_keeps_float16_and_refuses_axes_outside_the_input():
    assert keras.backend.standardize_dtype(
        ka.RotaryEmbedding(dtype="float16")(keras.Input((100, 32))).dtype) == "float16"
    for kwargs in ({"sequence_axis": 4}, {"feature_axis": 3}, {"sequence_axis": -4},
                   {"sequence_axis": 2, "feature_axis": -1}):
        with pytest.raises(ValueError, match="sequence_axis|feature_axis"):
            ka.RotaryEmbedding(**kwargs)(rand(1, 3, 4))


def test_rotary_inverse_frequencies_are_one_overridable_method():
    """A subclass that changes `inverse_frequencies` (other RoPE scalings) changes the
    rotation, in the layer and inside MultiHead."""

    class Halved(ka.RotaryEmbedding):
        def inverse_frequencies(self, depth):
            return super().inverse_frequencies(depth) / 2.0

    x = rand(1, 4, 8)
    np.testing.assert_allclose(to_np(Halved()(x)), ref.rope(x, np.arange(4) / 2.0), atol=1e-5)
    plain, halved = (ka.MultiHead(2, 4, position_encoding=p) for p in ("rope", Halved()))
    plain(x)
    halved(x)
    halved.set_weights(plain.get_weights())
    assert np.abs(to_np(plain(x)) - to_np(halved(x))).max() > 1e-4
    assert dense_weights(halved.query_dense)[0].shape == (8, 8)
