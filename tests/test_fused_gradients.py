"""keras_attn.ops.fused: LayerNorm and tanh-GELU with hand-written gradients equal Keras'
functions in value and gradient (TensorFlow), and the layers that use them equal the formulas
on every backend."""

import keras
import numpy as np
import pytest
import reference as ref
from backend_utils import assert_allclose, layer_value_and_grads, value_and_grads

from keras_attn import tuning
from keras_attn.layers import TransformerDecoderOnlyBlock
from keras_attn.layers.add_norm import LayerNorm
from keras_attn.layers.block_base import gelu_tanh

ON_TF = keras.backend.backend() == "tensorflow"


def _layer_norm(epsilon=1e-5):
    layer = LayerNorm(epsilon=epsilon)
    layer.build((None, None, 6))
    rng = np.random.default_rng(1)
    layer.gamma.assign(rng.normal(size=(6,)).astype("float32"))
    layer.beta.assign(rng.normal(size=(6,)).astype("float32"))
    return layer


@pytest.mark.parametrize("fused", [True, False])
def test_layer_norm_equals_the_formula_with_its_gradients(fused):
    layer = _layer_norm()
    rng = np.random.default_rng(0)
    x = (3.0 * rng.normal(size=(2, 5, 6)) + 1.5).astype("float32")
    cotangent = rng.normal(size=(2, 5, 6)).astype("float32")
    with tuning.configure(fused_norm_gelu=fused):
        out, grads = layer_value_and_grads(layer, [x], cotangent)
    gamma, beta = (keras.ops.convert_to_numpy(v) for v in (layer.gamma, layer.beta))
    assert_allclose(out, ref.layer_norm(x, gamma, beta, epsilon=1e-5), atol=1e-5)
    # The gradients against float64 central differences of the NumPy formula.
    d_x = ref.numeric_gradient(
        lambda t: np.sum(cotangent * ref.layer_norm(t, gamma, beta, 1e-5)), x, step=1e-4)
    normed = ref.layer_norm(x, epsilon=1e-5)
    assert_allclose(grads[0], d_x, atol=2e-4)
    assert_allclose(grads[1], np.sum(cotangent * normed, axis=(0, 1)), atol=1e-4)  # gamma
    assert_allclose(grads[2], np.sum(cotangent, axis=(0, 1)), atol=1e-4)  # beta


@pytest.mark.skipif(not ON_TF, reason="the hand-written gradients are TensorFlow's")
@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_fused_layer_norm_equals_keras_layer_normalization(policy):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(3, 4, 6)).astype("float32")
    cotangent = rng.normal(size=(3, 4, 6)).astype("float32")
    ours, theirs = LayerNorm(epsilon=1e-5, dtype=policy), keras.layers.LayerNormalization(
        epsilon=1e-5, dtype=policy)
    ours.build((None, None, 6))
    theirs.build((None, None, 6))
    ours.set_weights([rng.normal(size=(6,)).astype("float32") for _ in range(2)])
    theirs.set_weights(ours.get_weights())
    with tuning.configure(fused_norm_gelu=True):
        out, grads = layer_value_and_grads(ours, [x], cotangent)
    want, want_grads = layer_value_and_grads(theirs, [x], cotangent)
    tol = 1e-5 if policy == "float32" else 2e-2
    assert out.dtype == want.dtype
    assert_allclose(out, want, atol=tol, rtol=tol)
    for got, expected in zip(grads, want_grads):
        assert_allclose(got, expected, atol=10 * tol, rtol=tol)


@pytest.mark.parametrize("fused", [True, False])
def test_gelu_tanh_equals_the_formula_with_its_gradient(fused):
    x = np.linspace(-4.0, 4.0, 97).astype("float32").reshape(1, 97)
    cotangent = np.random.default_rng(3).normal(size=x.shape).astype("float32")
    with tuning.configure(fused_norm_gelu=fused):
        out, (d_x,) = value_and_grads(gelu_tanh, [x], cotangent)
    step, x64 = 1e-4, x.astype("float64")
    numeric = (ref.gelu(x64 + step, approximate=True)
               - ref.gelu(x64 - step, approximate=True)) / (2 * step)
    assert_allclose(out, ref.gelu(x, approximate=True), atol=1e-6)
    assert_allclose(d_x, cotangent * numeric, atol=1e-5)


@pytest.mark.skipif(not ON_TF, reason="the hand-written gradients are TensorFlow's")
def test_gpt2_block_values_and_gradients_do_not_depend_on_the_switch():
    block = TransformerDecoderOnlyBlock(2, intermediate_dim=16, norm="layer",
                                        activation="gelu_tanh", kernel_initializer=
                                        keras.initializers.GlorotUniform(seed=4))
    block.build((2, 5, 8))
    rng = np.random.default_rng(4)
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    cotangent = rng.normal(size=(2, 5, 8)).astype("float32")
    results = {}
    for fused in (True, False):
        with tuning.configure(fused_norm_gelu=fused):
            results[fused] = layer_value_and_grads(block, [x], cotangent)
    (out, grads), (want, want_grads) = results[True], results[False]
    assert np.abs(want).max() > 0.1  # a nontrivial block
    assert_allclose(out, want, atol=1e-5)
    assert len(grads) == len(want_grads) == 1 + len(block.trainable_variables)
    for got, expected in zip(grads, want_grads):
        assert_allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize("fused", [True, False])
def test_layer_norm_returns_the_compute_dtype_like_keras(fused):
    x = keras.ops.ones((2, 3, 6), dtype="float32")  # float32 into a bfloat16 layer
    with tuning.configure(fused_norm_gelu=fused):
        ours = LayerNorm(dtype="mixed_bfloat16")(x)
    theirs = keras.layers.LayerNormalization(dtype="mixed_bfloat16")(x)
    assert keras.backend.standardize_dtype(ours.dtype) == "bfloat16"
    assert keras.backend.standardize_dtype(theirs.dtype) == "bfloat16"


def test_layer_norm_keeps_keras_config_and_weight_names():
    layer = _layer_norm(epsilon=1e-3)
    assert [v.path.rsplit("/", 1)[-1] for v in layer.weights] == ["gamma", "beta"]
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert isinstance(clone, LayerNorm)
    assert clone.get_config() == layer.get_config()
    assert clone.epsilon == 1e-3
