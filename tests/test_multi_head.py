"""MultiHead and LocalMultiHead on every kernel: same weights, same numbers, every mask, the
cache, the fused backward, dropout, and the argument checks."""

import keras
import numpy as np
import pytest
from backend_utils import layer_value_and_grads, rand, to_np
from layer_test_utils import (
    assert_same_values_and_gradients,
    build_alike,
    run_layer_test,
)

import keras_attn as ka

rng = np.random.default_rng(0)



def twins(cls=ka.MultiHead, implementations=("dense", "chunked"), **kwargs):
    """One layer per implementation, all with the first one's weights."""
    layers = []
    for implementation in implementations:
        extra = {"chunk_size": 3} if implementation == "chunked" else {}
        layers.append(cls(num_heads=3, key_dim=4, value_dim=5, output_shape=7,
                          implementation=implementation, **extra, **kwargs))
    return layers


MASKINGS = ["none", "valid_lens", "valid_lens_2d", "causal", "lens_and_causal",
            "attention_mask", "padding", "bias"]


def call_for(masking, batch, query_len, key_len):
    call = {}
    if masking in ("valid_lens", "lens_and_causal"):
        call["valid_lens"] = np.array([key_len, 0][:batch], "int32")
    if masking == "valid_lens_2d":
        call["valid_lens"] = rng.integers(0, key_len + 1, (batch, query_len)).astype("int32")
    if "causal" in masking:
        call["use_causal_mask"] = True
    if masking == "attention_mask":
        call["attention_mask"] = rng.random((batch, query_len, key_len)) < 0.5
    if masking == "padding":
        call["query_mask"] = np.arange(query_len)[None] < np.array([[query_len], [3]])
    if masking == "bias":
        call["attention_bias"] = rand(1, 3, query_len, key_len)
    return call


@pytest.mark.parametrize("masking", MASKINGS)
def test_chunked_equals_dense_values_and_gradients_with_the_same_weights(masking):
    causal = masking in ("causal", "lens_and_causal", "padding")
    q = rand(2, 8, 6)
    key = q if causal else rand(2, 10, 9)  # self-attention when causal, else cross
    inputs = [q] if causal else [q, key]
    call = call_for(masking, 2, 8, key.shape[1])
    layers = twins()
    build_alike(layers, *inputs)
    _, (out_c, _) = assert_same_values_and_gradients(layers, inputs, rand(2, 8, 7), atol=1e-4,
                                                     **call)
    if masking == "padding":  # padded queries: the output projection of a zero context
        np.testing.assert_allclose(out_c[1, 3:], np.broadcast_to(
            to_np(layers[1].output_dense.bias), (5, 7)), atol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masking", ["none", "valid_lens", "padding", "attention_mask"])
def test_local_kernels_equal_dense_with_the_band(causal, masking):
    """LocalMultiHead on the local, blockwise and dense kernels: one set of numbers (the
    attention mask makes the local kernel fall back to dense)."""
    x = rand(2, 13, 6)
    call = call_for(masking, 2, 13, 13)
    layers = twins(ka.LocalMultiHead, ("dense", "local", "chunked"), sliding_window=3,
                   num_global=1)
    build_alike(layers, x)
    assert_same_values_and_gradients(layers, [x], rand(2, 13, 7), atol=1e-4,
                                     use_causal_mask=causal, **call)


@pytest.mark.parametrize("training", [False, True])
def test_fused_backward_equals_the_weights_path(training):
    """Without returned weights the dense kernel keeps them for its own backward pass; with
    dropout it drops the same weights from the same seed."""
    x = rand(2, 6, 8)
    layers = [ka.MultiHead(num_heads=2, key_dim=3, dropout=0.4 if training else 0.0, seed=11)
              for _ in range(2)]
    build_alike(layers, x)
    call = {"valid_lens": np.array([6, 0], "int32"), "use_causal_mask": True,
            "training": training}
    d_out = rand(2, 6, 8)

    def run(layer, with_weights):
        class Wrapped(keras.layers.Layer):
            def call(self, x):
                out = layer(x, return_attention_scores=with_weights, **call)
                return out[0] if with_weights else out

        wrapped = Wrapped()
        wrapped(x)
        return layer_value_and_grads(wrapped, [x], d_out)

    (out_w, grads_w), (out_f, grads_f) = run(layers[0], True), run(layers[1], False)
    np.testing.assert_allclose(out_f, out_w, atol=1e-5)
    for got, want in zip(grads_f, grads_w):
        np.testing.assert_allclose(got, want, atol=5e-5)
    np.testing.assert_array_equal(out_f[1], np.broadcast_to(to_np(layers[1].output_dense.bias),
                                                            (6, 8)))


@pytest.mark.parametrize("implementation", ["dense", "chunked"])
def test_cached_decoding_equals_the_full_pass(implementation):
    x = rand(2, 5, 6)
    layers = twins()
    build_alike(layers, x)
    full = to_np(layers[0](x, use_causal_mask=True))
    layer = layers[implementation == "chunked"]
    cache = layer.init_cache(2, 5)
    steps = []
    for i in range(5):
        out, cache = layer(x[:, i:i + 1], cache=cache, cache_update_index=i,
                           use_causal_mask=True)
        steps.append(to_np(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)


@pytest.mark.parametrize("implementation", ["dense", "chunked"])
def test_a_cache_of_encoder_keys_honours_key_and_implicit_masks(implementation):
    """Cross-attention over a precomputed cache hides padded keys as the plain call does."""
    query, memory = rand(2, 4, 6), rand(2, 7, 9)
    key_mask = np.arange(7)[None] < np.array([[7], [3]])
    layers = twins()
    build_alike(layers, query, memory)
    layer = layers[implementation == "chunked"]
    want = to_np(layers[0](query, memory, key_mask=key_mask))
    cache = layer.compute_cache(memory)
    got, _ = layer(query, cache=cache, key_mask=key_mask)
    np.testing.assert_allclose(to_np(got), want, atol=1e-5)
    # A cache computed with the mask holds nothing of the hidden positions, even non-finite.
    dirty = memory.copy()
    dirty[1, 3] = np.nan
    dirty[1, 4:] = np.inf
    got_dirty, _ = layer(query, cache=layer.compute_cache(dirty, key_mask=key_mask),
                         key_mask=key_mask)
    np.testing.assert_allclose(to_np(got_dirty), want, atol=1e-5)


def test_chunked_layer_contract(tmp_path):
    out = run_layer_test(
        ka.MultiHead,
        {"num_heads": 2, "key_dim": 4, "implementation": "chunked", "chunk_size": 3},
        {"query": rand(2, 7, 6), "valid_lens": np.array([7, 2], "int32")},
        (2, 7, 6),
        tmp_path,
        call_kwargs={"use_causal_mask": True},
    )
    assert np.all(np.isfinite(out))


@pytest.mark.parametrize(
    "kwargs,arg",
    [({"implementation": "flash"}, "implementation"),
     ({"implementation": "chunked", "chunk_size": 0}, "chunk_size"),
     ({"chunk_size": 64}, "chunk_size"),
     ({"implementation": "chunked", "dropout": 0.1}, "implementation"),
     ({"implementation": "local"}, "implementation")],
)
def test_bad_implementation_arguments(kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        ka.MultiHead(num_heads=2, key_dim=4, **kwargs)


def test_chunked_refuses_to_return_weights():
    layer = ka.MultiHead(num_heads=2, key_dim=4, implementation="chunked")
    with pytest.raises(ValueError, match="return_attention_scores"):
        layer(rand(1, 3, 8), return_attention_scores=True)


@pytest.mark.parametrize("implementation", ["dense", "chunked"])
def test_a_cache_implies_its_causal_offset(implementation):
    """Without `use_causal_mask` (26.6) the cache still hides the slots after each query
    (they are not written yet): step by step equals the causal full pass."""
    x = rand(2, 5, 6)
    layers = twins()
    build_alike(layers, x)
    layer = layers[implementation == "chunked"]
    full = to_np(layers[0](x, use_causal_mask=True))
    cache = layer.init_cache(2, 5)
    steps = []
    for i in range(5):
        out, cache = layer(x[:, i:i + 1], cache=cache, cache_update_index=i)
        steps.append(to_np(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)
    chunk, _ = layer(x[:, 2:4], cache=layer.init_cache(2, 5), cache_update_index=2)
    window, _ = layer(x[:, 2:4], cache=layer.init_cache(2, 5), cache_update_index=2,
                      use_causal_mask=True)
    np.testing.assert_allclose(to_np(chunk), to_np(window), atol=1e-6)


@pytest.mark.parametrize("kwargs", [{}, {"num_key_value_heads": 1, "position_encoding": "rope"},
                                    {"use_bias": False}])
def test_fused_self_projections_equal_the_three_products(kwargs, monkeypatch):
    """Self-attention projects queries, keys and values by one product (the switch
    `fuse_projections`): same outputs and gradients (inputs and every kernel and bias) as the
    three products, in a padded causal call and in cached decoding."""
    from keras_attn import tuning

    fused_calls = []
    fused_dense = tuning.fused_dense
    monkeypatch.setattr(tuning, "fused_dense",
                        lambda layers, x: fused_calls.append(len(layers)) or fused_dense(layers, x))
    x = rand(2, 6, 8)
    layer = ka.MultiHead(num_heads=3, key_dim=4, output_shape=8, **kwargs)
    layer(x)
    call = {"use_causal_mask": True, "query_mask": np.arange(6)[None] < np.array([[6], [4]])}
    d_out = rand(2, 6, 8)
    out_3, grads_3 = layer_value_and_grads(layer, [x], d_out, **call)
    assert not fused_calls  # off by default
    with tuning.configure(fuse_projections=True):
        out_1, grads_1 = layer_value_and_grads(layer, [x], d_out, **call)
        assert fused_calls and set(fused_calls) == {3}
        cache, steps = layer.init_cache(2, 6), []
        for i in range(6):
            out, cache = layer(x[:, i:i + 1], cache=cache, cache_update_index=i)
            steps.append(to_np(out))
    np.testing.assert_allclose(out_1, out_3, atol=1e-5)
    assert len(grads_1) == len(grads_3) == 1 + len(layer.trainable_variables)
    for got, want in zip(grads_1, grads_3):
        np.testing.assert_allclose(got, want, atol=5e-5)
    full = to_np(layer(x, use_causal_mask=True))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)


def test_projections_with_lora_or_mixed_biases_are_not_fused(monkeypatch):
    from keras_attn import tuning

    x = rand(2, 5, 8)
    mixed = ka.MultiHead(num_heads=2, key_dim=4, use_bias=("query", "value"))
    lora = ka.MultiHead(num_heads=2, key_dim=4)
    lora(x)
    lora.query_dense.enable_lora(2)
    monkeypatch.setattr(tuning, "fused_dense", lambda *args: pytest.fail("fused"))
    with tuning.configure(fuse_projections=True):
        for layer in (mixed, lora):
            assert to_np(layer(x)).shape == (2, 5, 8)
