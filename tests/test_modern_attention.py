"""MultiHead as current models use it: grouped-query heads, rotary positions, ALiBi and T5
biases, the gate, Keras' sliding window, tuple outputs, regularizers; equal to Keras' layers,
the NumPy reference and torch, on every kernel and through the cache."""

import keras
import numpy as np
import pytest
import reference as ref
from backend_utils import rand, to_np
from layer_test_utils import (
    assert_same_values_and_gradients,
    build_alike,
    run_layer_test,
)

import keras_attn as ka

rng = np.random.default_rng(0)



def visible_mask(batch, t, s):
    """A random mask in which every query sees key 0 and the key at its own position (no
    fully masked row, even inside a sliding window: Keras gives those uniform weights,
    keras_attn zero weights)."""
    mask = rng.random((batch, t, s)) < 0.6
    mask[..., 0] = True
    diagonal = np.arange(min(t, s))
    mask[:, diagonal, diagonal] = True
    return mask


# ---- importing Keras' layers exactly ---------------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    {"use_gate": True}, {"sliding_window": 2}, {"output_shape": (2, 5)},
    {"kernel_regularizer": "l2", "bias_regularizer": "l1", "bias_constraint": "non_neg"},
])
def test_from_keras_multi_head_attention_with_its_options(kwargs):
    x = rand(2, 7, 16)
    theirs = keras.layers.MultiHeadAttention(num_heads=4, key_dim=4, **kwargs)
    theirs(x, x)
    ours = ka.MultiHead.from_keras(theirs)
    mask = visible_mask(2, 7, 7)
    np.testing.assert_allclose(to_np(ours(x, attention_mask=mask)),
                               to_np(theirs(x, x, attention_mask=mask)), atol=1e-5)
    np.testing.assert_allclose([float(loss) for loss in ours.losses],
                               [float(loss) for loss in theirs.losses], rtol=1e-6)
    if "bias_constraint" in kwargs:
        assert ours.query_dense.bias_constraint is not None


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("kv_heads", [1, 2])
def test_from_keras_group_query_attention_is_exact(masked, kv_heads):
    x, memory = rand(2, 5, 16), rand(2, 9, 12)
    theirs = keras.layers.GroupQueryAttention(head_dim=4, num_query_heads=8,
                                              num_key_value_heads=kv_heads)
    theirs(x, memory)
    ours = ka.MultiHead.from_keras(theirs)
    call = {"attention_mask": visible_mask(2, 5, 9)} if masked else {}
    np.testing.assert_allclose(to_np(ours(x, memory, **call)),
                               to_np(theirs(x, memory, **call)), atol=1e-5)
    assert ours.key_dense.kernel.shape == (12, kv_heads * 4)


# ---- grouped-query heads against the reference and torch -----------------------------------

def test_grouped_query_heads_equal_the_reference_and_torch():
    layer = ka.MultiHead(num_heads=8, key_dim=4, num_key_value_heads=2, use_bias=False)
    x = rand(2, 6, 16)
    lens = np.array([6, 4])
    out, weights = layer(x, valid_lens=lens, use_causal_mask=True, return_attention_scores=True)
    wq, wk, wv, wo = (to_np(d.kernel) for d in (layer.query_dense, layer.key_dense,
                                                 layer.value_dense, layer.output_dense))
    q = (x @ wq).reshape(2, 6, 2, 4, 4).transpose(0, 2, 3, 1, 4)  # (B, H_kv, G, T, d)
    k = (x @ wk).reshape(2, 6, 2, 1, 4).transpose(0, 2, 3, 1, 4)  # (B, H_kv, 1, S, d)
    v = (x @ wv).reshape(2, 6, 2, 1, 4).transpose(0, 2, 3, 1, 4)
    allowed = (ref.length_mask(lens, 6, 6) & ref.causal_mask(6, 6))[:, None, None]
    context, want_weights = ref.attention(q, k, v, allowed)
    want = context.reshape(2, 8, 6, 4).transpose(0, 2, 1, 3).reshape(2, 6, 32) @ wo
    np.testing.assert_allclose(to_np(out), want, atol=1e-5)
    np.testing.assert_allclose(to_np(weights), want_weights.reshape(2, 8, 6, 6), atol=1e-6)
    torch = pytest.importorskip("torch")
    q8 = torch.tensor(q.reshape(2, 8, 6, 4).astype("float64"))
    k2 = torch.tensor(k[:, :, 0].astype("float64"))
    v2 = torch.tensor(v[:, :, 0].astype("float64"))
    attn_mask = torch.tensor(allowed[:, :, 0])  # (B, 1, T, S)
    theirs = torch.nn.functional.scaled_dot_product_attention(q8, k2, v2, attn_mask=attn_mask,
                                                              enable_gqa=True)
    np.testing.assert_allclose(context.reshape(2, 8, 6, 4), theirs.numpy(), atol=1e-10)


# ---- positions -------------------------------------------------------------------------------

def test_rotary_multi_head_equals_the_reference():
    layer = ka.MultiHead(num_heads=2, key_dim=8, position_encoding="rope", use_bias=False)
    x = rand(1, 5, 6)
    out = to_np(layer(x, use_causal_mask=True))
    wq, wk, wv, wo = (to_np(d.kernel) for d in (layer.query_dense, layer.key_dense,
                                                 layer.value_dense, layer.output_dense))
    heads = [(x @ w).reshape(1, 5, 2, 8).transpose(0, 2, 1, 3) for w in (wq, wk, wv)]
    q, k = (ref.rope(h, np.arange(5)) for h in heads[:2])
    context, _ = ref.attention(q, k, heads[2], ref.causal_mask(5, 5))
    np.testing.assert_allclose(out, context.transpose(0, 2, 1, 3).reshape(1, 5, 16) @ wo,
                               atol=1e-5)


@pytest.mark.parametrize("position_encoding", ["rope", "alibi", "relative"])
@pytest.mark.parametrize("implementation", ["dense", "chunked", "fused"])
def test_cached_steps_equal_the_full_pass_with_groups_and_positions(position_encoding,
                                                                    implementation):
    layer = ka.MultiHead(num_heads=4, key_dim=4, num_key_value_heads=2,
                         position_encoding=position_encoding, implementation=implementation)
    x = rand(2, 7, 8)
    layer(x)
    if position_encoding == "relative":  # a table that is not all zeros
        layer.position_encoding.table.assign(rand(32, 4))
    full = to_np(layer(x, use_causal_mask=True))
    cache = layer.init_cache(2, 7)
    assert cache[0].shape == (2, 2, 7, 4)  # only the key/value heads
    steps = []
    for i in range(7):
        out, cache = layer(x[:, i:i + 1], cache=cache, cache_update_index=i,
                           use_causal_mask=True)
        steps.append(to_np(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)


@pytest.mark.parametrize("position_encoding", ["alibi", "relative"])
def test_chunked_equals_dense_with_position_biases_values_and_gradients(position_encoding):
    """ALiBi and T5 biases are computed per block by the chunked kernel: the same values
    and gradients (the T5 table's included) as the dense kernel."""
    layers = [ka.MultiHead(num_heads=4, key_dim=4, num_key_value_heads=2,
                           position_encoding=position_encoding, implementation=impl,
                           **({"chunk_size": 3} if impl == "chunked" else {}))
              for impl in ("dense", "chunked")]
    x = rand(2, 11, 8)
    for layer in layers:
        layer(x)
    if position_encoding == "relative":
        layers[0].position_encoding.table.assign(rand(32, 4))
    layers[1].set_weights(layers[0].get_weights())
    _, (_, grads_c) = assert_same_values_and_gradients(
        layers, [x], rand(2, 11, 8), use_causal_mask=True,
        valid_lens=np.array([11, 7], "int32"))
    if position_encoding == "relative":
        assert np.abs(grads_c[-1]).max() > 1e-4  # the table learns


def test_alibi_layer_equals_keras_hub_up_to_a_row_constant():
    keras_hub = pytest.importorskip("keras_hub")
    scores = rand(2, 8, 5, 5)
    ours = to_np(ka.AlibiBias()(scores))
    theirs = to_np(keras_hub.layers.AlibiBias()(scores))
    np.testing.assert_allclose(to_np(keras.ops.softmax(ours)), to_np(keras.ops.softmax(theirs)),
                               atol=1e-6)
    np.testing.assert_allclose(ours - scores, np.broadcast_to(ref.alibi_bias(8, 5, 5), ours.shape),
                               atol=1e-6)


def test_rotary_layer_equals_keras_hub():
    keras_hub = pytest.importorskip("keras_hub")
    x = rand(2, 6, 3, 8)
    np.testing.assert_allclose(
        to_np(ka.RotaryEmbedding(max_wavelength=100)(x, start_index=3)),
        to_np(keras_hub.layers.RotaryEmbedding(max_wavelength=100)(x, start_index=3)),
        atol=1e-5)


# ---- the rest of Keras' constructor ----------------------------------------------------------

def test_sliding_window_means_what_it_means_in_keras():
    x = rand(1, 9, 8)
    layer = ka.MultiHead(num_heads=2, key_dim=4, sliding_window=3)
    _, weights = layer(x, return_attention_scores=True)
    visible = to_np(weights)[0, 0] > 0
    np.testing.assert_array_equal(visible, ref.keras_sliding_window_mask(9, 9, 3))
    local = ka.MultiHead(num_heads=2, key_dim=4, sliding_window=3, implementation="local")
    local(x)
    local.set_weights(layer.get_weights())
    np.testing.assert_allclose(to_np(local(x)), to_np(layer(x)), atol=1e-5)


def test_a_tuple_output_shape_and_the_gate():
    layer = ka.MultiHead(num_heads=2, key_dim=4, output_shape=(3, 5), use_gate=True)
    out = layer(rand(2, 4, 6))
    assert out.shape == (2, 4, 3, 5)
    assert layer.compute_output_shape((2, 4, 6)) == (2, 4, 3, 5)


@pytest.mark.parametrize("kwargs", [
    {"num_key_value_heads": 2, "position_encoding": "rope"},
    {"position_encoding": "alibi", "implementation": "chunked"},
    {"position_encoding": "relative", "use_gate": True},
    {"sliding_window": 2, "implementation": "local", "output_shape": (2, 3)},
    {"kernel_regularizer": "l2", "kernel_constraint": "max_norm"},
])
def test_layer_contract_with_the_new_options(kwargs, tmp_path):
    shape = (4, 6, 2, 3) if kwargs.get("output_shape") else (4, 6, 8)
    run_layer_test(ka.MultiHead, {"num_heads": 4, "key_dim": 4, **kwargs},
                   {"query": rand(4, 6, 8)}, shape, tmp_path,
                   call_kwargs={"use_causal_mask": True})


@pytest.mark.parametrize("layer_cls,kwargs,inputs,shape", [
    (ka.RotaryEmbedding, {"max_wavelength": 500}, {"inputs": rand(2, 5, 8)}, (2, 5, 8)),
    (ka.TokenAndPositionEmbedding, {"vocabulary_size": 10, "sequence_length": 8,
                                    "embedding_dim": 6, "mask_zero": True},
     {"inputs": rng.integers(0, 10, (2, 5)).astype("int32")}, (2, 5, 6)),
    (ka.AlibiBias, {"symmetric": True}, {"scores": rand(2, 4, 5, 5)}, (2, 4, 5, 5)),
    (ka.RelativePositionBias, {"num_buckets": 8, "max_distance": 16,
                               "embeddings_initializer": "random_normal"},
     {"scores": rand(2, 4, 5, 5)}, (2, 4, 5, 5)),
])
def test_position_layers_keep_the_contract(layer_cls, kwargs, inputs, shape, tmp_path):
    run_layer_test(layer_cls, kwargs, inputs, shape, tmp_path, run_mixed_precision=False)


def test_token_and_position_embedding_adds_the_position_rows():
    layer = ka.TokenAndPositionEmbedding(10, 8, 4)
    ids = np.array([[3, 4, 5]], "int32")
    out = to_np(layer(ids, start_index=2))
    tokens = to_np(layer.token_embedding.embeddings)[ids[0]]
    positions = to_np(layer.position_embedding.embeddings)[2:5]
    np.testing.assert_allclose(out[0], tokens + positions, atol=1e-6)
    with pytest.raises(ValueError, match="sequence_length=8"):
        layer(np.zeros((1, 7), "int32"), start_index=2)


@pytest.mark.parametrize("make,arg", [
    (lambda: ka.MultiHead(4, 4, num_key_value_heads=3), "num_key_value_heads"),
    (lambda: ka.MultiHead(4, 4, position_encoding="sinusoidal"), "position_encoding"),
    (lambda: ka.MultiHead(4, 4, output_shape=(0, 2)), "output_shape"),
    (lambda: ka.MultiHead(4, 4, sliding_window=0), "sliding_window"),
    (lambda: ka.MultiHead(4, 4, use_gate="yes"), "use_gate"),
    (lambda: ka.RotaryEmbedding(scaling_factor=0.5), "scaling_factor"),
    (lambda: ka.RelativePositionBias(num_buckets=1), "num_buckets"),
    (lambda: ka.AlibiBias(max_bias=float("nan")), "max_bias"),
])
def test_bad_arguments_name_the_argument(make, arg):
    with pytest.raises(ValueError, match=arg):
        make()


# ---- issue 26: cross-attention positions, shared biases, grouped heads ------------------------

def test_rotary_cross_attention_is_the_same_with_or_without_the_cache():
    """One rule (26.4): keys are rotated at their place in the key sequence, whether they come
    in as `key` or through `compute_cache`; queries at `cache_update_index + t` (0 here)."""
    layer = ka.MultiHead(num_heads=2, key_dim=8, position_encoding="rope", use_bias=False)
    query, memory = rand(2, 3, 6), rand(2, 5, 6)
    direct = to_np(layer(query, memory))
    cached, _ = layer(query, cache=layer.compute_cache(memory))
    np.testing.assert_allclose(to_np(cached), direct, atol=1e-5)
    wq, wk, wv, wo = (to_np(d.kernel) for d in (layer.query_dense, layer.key_dense,
                                                 layer.value_dense, layer.output_dense))

    def heads(x, w):
        return (x @ w).reshape(2, -1, 2, 8).transpose(0, 2, 1, 3)  # (B, H, L, d)

    q = ref.rope(heads(query, wq), np.arange(3))
    k = ref.rope(heads(memory, wk), np.arange(5))
    context, _ = ref.attention(q, k, heads(memory, wv))
    np.testing.assert_allclose(direct, context.transpose(0, 2, 1, 3).reshape(2, 3, 16) @ wo,
                               atol=1e-5)


def test_one_relative_bias_shared_by_several_layers_saves_and_loads(tmp_path):
    """The T5 arrangement (26.14): one RelativePositionBias serves every layer; the `.keras`
    file holds it once and loads back one shared layer with the same outputs."""
    shared = ka.RelativePositionBias(embeddings_initializer="random_normal", name="t5_bias")
    x = keras.Input((5, 8))
    h = ka.MultiHead(2, 4, position_encoding=shared, name="first")(x)
    h = ka.MultiHead(2, 4, position_encoding=shared, name="second")(h, use_causal_mask=True)
    model = keras.Model(x, h)
    data = rand(2, 5, 8)
    want = to_np(model(data))
    path = str(tmp_path / "t5.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(to_np(loaded(data)), want)
    first, second = loaded.get_layer("first"), loaded.get_layer("second")
    assert first.position_encoding is second.position_encoding
    first.position_encoding.table.assign(np.zeros((32, 2), "float32"))
    assert np.abs(to_np(loaded(data)) - want).max() > 1e-4  # one table moves both layers
    loaded.save(str(tmp_path / "again.keras"))  # still shared when saved again
    again = keras.saving.load_model(str(tmp_path / "again.keras"))
    assert again.get_layer("first").position_encoding is again.get_layer(
        "second").position_encoding


@pytest.mark.parametrize("causal", [False, True])
def test_grouped_heads_on_the_local_kernel_equal_the_dense_band(causal):
    """Grouped-query attention with a sliding window on the local kernel (26.16: TensorFlow
    refused its 6-D softmax), values and gradients as the dense kernel's."""
    layers = [ka.MultiHead(num_heads=4, key_dim=4, num_key_value_heads=2, sliding_window=3,
                           implementation=impl) for impl in ("dense", "local")]
    x = rand(2, 11, 8)
    build_alike(layers, x)
    assert_same_values_and_gradients(layers, [x], rand(2, 11, 8), use_causal_mask=causal,
                                     valid_lens=np.array([11, 6], "int32"))


@pytest.mark.parametrize("implementation", ["dense", "chunked"])
def test_a_per_head_bias_follows_the_query_heads_under_grouping(implementation):
    """`attention_bias` of shape (H, T, S) or (B, H, T, S) with grouped heads (26.17): each
    query head gets its own slice, as the per-head reference computes it."""
    layer = ka.MultiHead(num_heads=4, key_dim=4, num_key_value_heads=2, use_bias=False,
                         implementation=implementation)
    x = rand(2, 5, 8)
    bias = rand(4, 5, 5)
    got = to_np(layer(x, attention_bias=bias))
    np.testing.assert_allclose(to_np(layer(x, attention_bias=np.broadcast_to(
        bias, (2, 4, 5, 5)))), got, atol=1e-5)
    wq, wk, wv, wo = (to_np(d.kernel) for d in (layer.query_dense, layer.key_dense,
                                                 layer.value_dense, layer.output_dense))
    q = (x @ wq).reshape(2, 5, 2, 2, 4).transpose(0, 2, 3, 1, 4)  # (B, H_kv, G, T, d)
    k = (x @ wk).reshape(2, 5, 2, 1, 4).transpose(0, 2, 3, 1, 4)  # (B, H_kv, 1, S, d)
    v = (x @ wv).reshape(2, 5, 2, 1, 4).transpose(0, 2, 3, 1, 4)
    context, _ = ref.attention(q, k, v, bias=bias.reshape(1, 2, 2, 5, 5))
    want = context.reshape(2, 4, 5, 4).transpose(0, 2, 1, 3).reshape(2, 5, 16) @ wo
    np.testing.assert_allclose(got, want, atol=1e-5)
