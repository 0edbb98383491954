"""Every input right or a clear error: the inputs that used to pass silently wrong."""

import keras
import numpy as np
import pytest
import reference as ref
from backend_utils import layer_value_and_grads, rand, to_np

import keras_attn as ka

rng = np.random.default_rng(0)



ATTENTION_LAYERS = {
    "ScaledDotAttention": lambda: ka.ScaledDotAttention(),
    "AdditiveAttention": lambda: ka.AdditiveAttention(units=5),
    "NWPooling": lambda: ka.NWPooling(learnable=True),
    "MultiHead": lambda: ka.MultiHead(num_heads=2, key_dim=3),
    "MultiHead_chunked": lambda: ka.MultiHead(num_heads=2, key_dim=3, implementation="chunked",
                                              chunk_size=2),
    "LocalMultiHead": lambda: ka.LocalMultiHead(num_heads=2, key_dim=3, sliding_window=3),
    "LinearAttention": lambda: ka.LinearAttention(num_heads=2, key_dim=3),
}


# ---- masks ------------------------------------------------------------------------------------

def test_a_float_attention_mask_is_refused_and_attention_bias_takes_additive_masks():
    layer = ka.MultiHead(num_heads=2, key_dim=3)
    x = rand(2, 4, 6)
    additive = np.where(rng.random((2, 1, 4, 4)) < 0.6, 0.0, -np.inf).astype("float32")
    additive[..., 0] = 0.0  # every row sees key 0
    with pytest.raises(ValueError, match="attention_mask.*attention_bias"):
        layer(x, attention_mask=additive[:, 0])
    got = to_np(layer(x, attention_bias=additive))
    want = to_np(layer(x, attention_mask=additive[:, 0] == 0))
    np.testing.assert_allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("name", sorted(ATTENTION_LAYERS))
def test_every_attention_layer_checks_mask_and_length_shapes_the_same_way(name):
    x = rand(2, 5, 4)
    layer = ATTENTION_LAYERS[name]()
    with pytest.raises(ValueError, match="valid_lens.*batch_size"):
        layer(x, valid_lens=np.array([5, 5, 5], "int32"))
    with pytest.raises(ValueError, match="valid_lens.*key_len=5"):
        layer(x, valid_lens=np.array([5, 9], "int32"))
    with pytest.raises(ValueError, match="query_mask.*query_len"):
        layer(x, query_mask=np.ones((2, 4), bool))


# ---- dtypes and ranks -------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["ScaledDotAttention", "AdditiveAttention", "NWPooling"])
def test_integer_inputs_are_cast_to_the_compute_dtype(name):
    ints = rng.integers(-3, 4, (2, 5, 4)).astype("int32")
    layer = ATTENTION_LAYERS[name]()
    out_int, w_int = layer(ints, return_attention_scores=True)
    out_float, w_float = layer(ints.astype("float32"), return_attention_scores=True)
    assert keras.backend.standardize_dtype(out_int.dtype) == "float32"
    np.testing.assert_allclose(to_np(out_int), to_np(out_float), atol=1e-6)
    np.testing.assert_allclose(to_np(w_int), to_np(w_float), atol=1e-6)
    assert np.any(to_np(w_int) != 0.0) and np.any(to_np(out_int) != np.round(to_np(out_int)))


def test_sinusoidal_position_encoding_adds_to_integers_in_floating_point():
    ints = rng.integers(0, 5, (1, 6, 8)).astype("int32")
    out = ka.SinusoidalPositionEncoding()(ints)
    assert keras.backend.standardize_dtype(out.dtype) == "float32"
    positions = np.arange(6)[:, None] / 10000 ** (2 * (np.arange(8) // 2) / 8)
    table = np.where(np.arange(8) % 2 == 0, np.sin(positions), np.cos(positions))
    np.testing.assert_allclose(to_np(out), ints + table, atol=1e-5)


@pytest.mark.parametrize("name", sorted(ATTENTION_LAYERS))
def test_inputs_of_the_wrong_rank_name_the_argument(name):
    layer = ATTENTION_LAYERS[name]()
    bad = rand(2, 4) if name != "NWPooling" else rand(2, 4, 3, 2)
    with pytest.raises(ValueError, match="`query`.*rank"):
        layer(bad)


@pytest.mark.tf_only
def test_strings_are_not_attended():
    with pytest.raises(ValueError, match="query.*numeric"):
        ka.ScaledDotAttention()(np.array([[["a"], ["b"]]]))


# ---- non-finite numbers at hidden positions ------------------------------------------------------

@pytest.mark.parametrize("name", sorted(ATTENTION_LAYERS))
def test_non_finite_keys_and_values_behind_padding_reach_neither_outputs_nor_gradients(name):
    query, memory = rand(2, 5, 4), rand(2, 6, 4)
    key_mask = np.arange(6)[None] < np.array([[6], [4]])
    dirty = memory.copy()
    dirty[1, 4] = np.nan
    dirty[1, 5] = np.inf
    layer = ATTENTION_LAYERS[name]()
    if name == "LocalMultiHead":  # aligned positions: self-attention with padded positions
        query, clean_in, dirty_in = memory, memory.copy(), dirty
        clean_in[1, 4:] = 0.0
        inputs_clean, inputs_dirty = [clean_in], [dirty_in]
        call = {"query_mask": key_mask}
    else:
        clean = memory.copy()
        clean[1, 4:] = 0.0
        inputs_clean, inputs_dirty = [query, clean], [query, dirty]
        call = {"key_mask": key_mask}
    layer(*inputs_clean, **call)
    d_out = rand(*to_np(layer(*inputs_clean, **call)).shape)
    out_clean, grads_clean = layer_value_and_grads(layer, inputs_clean, d_out, **call)
    out_dirty, grads_dirty = layer_value_and_grads(layer, inputs_dirty, d_out, **call)
    assert np.all(np.isfinite(out_dirty))
    np.testing.assert_allclose(out_dirty, out_clean, atol=1e-6)
    for got, want in zip(grads_dirty, grads_clean):
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, want, atol=1e-5)


# ---- symbolic weights, mixed precision ---------------------------------------------------------

@pytest.mark.parametrize("name", sorted(set(ATTENTION_LAYERS) - {"MultiHead_chunked"}))
def test_return_attention_scores_on_symbolic_inputs_gives_the_weights(name):
    x = rand(2, 6, 4)
    layer = ATTENTION_LAYERS[name]()
    inputs = keras.Input((6, 4))
    out, weights = layer(inputs, return_attention_scores=True)
    model = keras.Model(inputs, [out, weights])
    got_out, got_weights = model(x)
    want_out, want_weights = layer(x, return_attention_scores=True)
    assert tuple(weights.shape[1:]) == tuple(want_weights.shape[1:])
    np.testing.assert_allclose(to_np(got_weights), to_np(want_weights), atol=1e-6)
    np.testing.assert_allclose(to_np(got_out), to_np(want_out), atol=1e-6)


@pytest.mark.parametrize("implementation", ["dense", "chunked"])
def test_mixed_float16_inputs_in_the_hundreds_stay_finite(implementation):
    """Projected queries and keys of a few hundred give float16 scores past 65504; they are a
    float32 product, so outputs and gradients stay finite and close to float32's."""
    x = rand(2, 8, 16, scale=300.0)
    layer32 = ka.MultiHead(num_heads=2, key_dim=32, implementation=implementation)
    layer16 = ka.MultiHead(num_heads=2, key_dim=32, implementation=implementation,
                           dtype="mixed_float16")
    build = {"use_causal_mask": True}
    layer32(x, **build)
    layer16(x, **build)
    layer16.set_weights(layer32.get_weights())
    d_out = rand(2, 8, 16)
    out16, grads16 = layer_value_and_grads(layer16, [x], d_out, **build)
    out32, _ = layer_value_and_grads(layer32, [x], d_out, **build)
    assert np.all(np.isfinite(out16)) and all(np.all(np.isfinite(g)) for g in grads16)
    assert np.abs(out16 - out32).max() < 0.05 * np.abs(out32).max()


# ---- caches ---------------------------------------------------------------------------------

def test_bad_caches_are_errors_not_clamps_or_broadcasts():
    layer = ka.MultiHead(num_heads=2, key_dim=3)
    x = rand(2, 1, 6)
    layer(x)
    cache = layer.init_cache(2, 5)
    with pytest.raises(ValueError, match="cache.*batch_size=2"):
        layer(x, cache=layer.init_cache(1, 5), cache_update_index=0)
    with pytest.raises(ValueError, match="cache.*num_heads=2"):
        layer(x, cache=(np.zeros((2, 3, 5, 3), "float32"),) * 2, cache_update_index=0)
    for index in (5, -1):
        with pytest.raises(ValueError, match="cache_update_index"):
            layer(x, cache=cache, cache_update_index=index)
    with pytest.raises(ValueError, match="`key`"):
        layer(x, rand(2, 4, 6), cache=cache)
    with pytest.raises(ValueError, match="cache"):
        layer(x, cache=cache[0], cache_update_index=0)
    out, _ = layer(x, cache=cache, cache_update_index=4)  # the last slot fits
    assert out.shape == (2, 1, 6)


def test_zero_keys_give_zero_context_in_a_layer():
    layer = ka.MultiHead(num_heads=2, key_dim=3, implementation="chunked")
    query = rand(2, 3, 4)
    out = to_np(layer(query, np.zeros((2, 0, 4), "float32")))
    np.testing.assert_allclose(out, np.broadcast_to(to_np(layer.output_dense.bias), out.shape))


# ---- options a class cannot honour -------------------------------------------------------------

@pytest.mark.parametrize("option", ["add_bias_kv", "add_zero_attn"])
def test_local_multi_head_refuses_appended_keys(option):
    with pytest.raises(ValueError, match=option):
        ka.LocalMultiHead(num_heads=2, key_dim=3, sliding_window=3, **{option: True})
    config = ka.LocalMultiHead(num_heads=2, key_dim=3, sliding_window=3).get_config()
    assert option not in config
    ka.LocalMultiHead.from_config(config)


def keras_mha(**kwargs):
    layer = keras.layers.MultiHeadAttention(num_heads=2, key_dim=3, **kwargs)
    query = keras.ops.ones((1, 4, 6)) if kwargs.get("attention_axes") is None else (
        keras.ops.ones((1, 2, 4, 6)))
    layer(query, query)
    return layer


def test_from_keras_imports_attention_over_other_axes_exactly():
    theirs = keras_mha(attention_axes=(1, 2))
    x = rand(2, 2, 4, 6)
    np.testing.assert_allclose(to_np(ka.MultiHead.from_keras(theirs)(x)), to_np(theirs(x, x)),
                               atol=1e-5)


def test_from_keras_reproduces_the_layer_it_accepts():
    theirs = keras_mha(output_shape=5, dropout=0.1, seed=3)
    ours = ka.MultiHead.from_keras(theirs)
    x = rand(2, 4, 6)
    np.testing.assert_allclose(to_np(ours(x)), to_np(theirs(x, x)), atol=1e-5)
    assert ours.dropout == 0.1 and ours.seed == 3


# ---- numbers that must be finite ------------------------------------------------------------------

@pytest.mark.parametrize(
    "make,arg",
    [(lambda: ka.ScaledDotAttention(scale=float("nan")), "scale"),
     (lambda: ka.ScaledDotAttention(scale=float("inf")), "scale"),
     (lambda: ka.AddNorm(epsilon=float("inf")), "epsilon"),
     (lambda: ka.AddNorm(epsilon=float("nan")), "epsilon"),
     (lambda: ka.TransformerEncoderBlock(2, 8, layer_norm_epsilon=float("nan")),
      "layer_norm_epsilon"),
     (lambda: ka.SinusoidalPositionEncoding(max_wavelength=float("inf")), "max_wavelength")],
)
def test_non_finite_numbers_are_refused(make, arg):
    with pytest.raises(ValueError, match=arg):
        make()


def test_the_reference_agrees_on_what_scaled_dot_attention_computes():
    """A control for the tests above: ScaledDotAttention is the reference formula."""
    q, k, v = rand(2, 3, 4), rand(2, 5, 4), rand(2, 5, 2)
    lens = np.array([5, 2])
    out = to_np(ka.ScaledDotAttention()(q, k, v, valid_lens=lens))
    np.testing.assert_allclose(out, ref.attention(q, k, v, ref.length_mask(lens, 3, 5))[0],
                               atol=1e-5)


# ---- issue 26: integer dtypes, NumPy integers, score ranks -----------------------------------

@pytest.mark.parametrize("as_index", [np.int64, lambda i: keras.ops.convert_to_tensor(i, "int64"),
                                      np.int32])
def test_start_and_cache_indices_of_any_integer_dtype(as_index):
    """int64 indices, NumPy or tensors (26.18), give what int32 ones give."""
    x = rand(2, 1, 8)
    layer = ka.MultiHead(num_heads=2, key_dim=4, position_encoding="rope")
    layer(x)
    cache = layer.init_cache(2, 4)
    want, _ = layer(x, cache=cache, cache_update_index=2)
    got, _ = layer(x, cache=cache, cache_update_index=as_index(2))
    np.testing.assert_allclose(to_np(got), to_np(want), atol=1e-6)
    for position_layer, inputs in ((ka.RotaryEmbedding(), rand(2, 3, 4)),
                                   (ka.SinusoidalPositionEncoding(), rand(2, 3, 4)),
                                   (ka.AlibiBias(), rand(2, 2, 3, 3)),
                                   (ka.RelativePositionBias(), rand(2, 2, 3, 3))):
        np.testing.assert_allclose(to_np(position_layer(inputs, start_index=as_index(2))),
                                   to_np(position_layer(inputs, start_index=2)), atol=1e-6)


def test_numpy_integers_are_integers_everywhere():
    """NumPy integer sizes (26.19) build the same layers as Python ints."""
    x = rand(1, 3, 8)
    for make in (lambda i: ka.MultiHead(i(4), i(4), num_key_value_heads=i(2), value_dim=i(3),
                                        output_shape=i(6), sliding_window=i(2)),
                 lambda i: ka.LocalMultiHead(i(2), i(4), sliding_window=i(2), num_global=i(1)),
                 lambda i: ka.LinearAttention(i(2), i(4), chunk_size=i(2)),
                 lambda i: ka.AdditiveAttention(i(5)), lambda i: ka.FFN(i(6), output_dim=i(3))):
        layer = make(np.int64)
        assert tuple(layer(x).shape) == tuple(make(int)(x).shape)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        ka.MultiHead(4, 4, num_key_value_heads=np.float32(2))


@pytest.mark.parametrize("layer", [ka.AlibiBias(), ka.RelativePositionBias()])
def test_position_bias_layers_take_scores_of_rank_4_only(layer):
    """3-D scores (26.20) are a ValueError naming `scores`, not an IndexError."""
    with pytest.raises(ValueError, match="scores"):
        layer(rand(2, 3, 3))
    with pytest.raises(ValueError, match="scores"):
        layer.compute_output_shape((2, 3, 3))
