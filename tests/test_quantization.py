"""Quantized layers survive a `.keras` round trip (issue 26.15): `layer.quantize("int8")` or
`model.quantize("int8")` on MultiHead, FFN, LinearAttention and AdditiveAttention, then save and
load, gives the same outputs, with int8 kernels again (not rebuilt float variables)."""

import os
import warnings

import keras
import numpy as np
import pytest
from backend_utils import rand, to_np

import keras_attn as ka
from keras_attn.layers.quantization import quantized_dtype_policy

CASES = {
    "MultiHead": (lambda: ka.MultiHead(4, 4, num_key_value_heads=2, position_encoding="rope",
                                       use_gate=True), {"use_causal_mask": True}),
    "MultiHead_cross": (lambda: ka.MultiHead(2, 4, use_bias=("query", "key", "value")), {}),
    "FFN": (lambda: ka.FFN(16, activation="swiglu"), {}),
    "LinearAttention": (lambda: ka.LinearAttention(2, 4), {}),
    "AdditiveAttention": (lambda: ka.AdditiveAttention(6), {}),
}


def model_of(name):
    make, call = CASES[name]
    x = keras.Input((5, 8), name="x")
    layer = make()
    if name == "MultiHead_cross":
        memory = keras.Input((3, 8), name="memory")
        return keras.Model([x, memory], layer(x, memory, **call)), layer
    return keras.Model(x, layer(x, **call)), layer


def inputs_of(name):
    x = rand(2, 5, 8)
    return [x, rand(2, 3, 8)] if name == "MultiHead_cross" else x


def int8_kernels(layer):
    return [v.path for v in layer.weights if keras.backend.standardize_dtype(v.dtype) == "int8"]


@pytest.mark.parametrize("how", ["layer", "model"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_quantized_layers_save_and_load_with_identical_outputs(name, how, tmp_path):
    model, layer = model_of(name)
    inputs = inputs_of(name)
    before = to_np(model(inputs))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # layers without weights cannot be quantized
        (layer if how == "layer" else model).quantize("int8")
    quantized = to_np(model(inputs))
    assert int8_kernels(layer)
    assert np.abs(quantized - before).max() < 0.1 * np.abs(before).max() + 1e-2
    path = os.path.join(tmp_path, "quantized.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(to_np(loaded(inputs)), quantized)
    loaded_layer = loaded.get_layer(layer.name)
    assert sorted(p.split("/", 1)[1] for p in int8_kernels(loaded_layer)) == sorted(
        p.split("/", 1)[1] for p in int8_kernels(layer))


def test_the_config_names_the_quantized_sublayers_only():
    _, layer = model_of("MultiHead")
    assert quantized_dtype_policy(layer) is layer.dtype_policy  # nothing quantized yet
    layer.quantize("int8")
    policy = quantized_dtype_policy(layer)
    assert isinstance(policy, keras.dtype_policies.DTypePolicyMap)
    assert policy[f"{layer.name}/query_dense"].quantization_mode == "int8"
    assert policy[layer.name].name == "float32"
    assert ka.MultiHead.from_config(layer.get_config()).get_config()["dtype"] == (
        layer.get_config()["dtype"])


def test_an_unbuilt_layer_refuses_to_quantize():
    with pytest.raises(ValueError, match="built"):
        ka.FFN(8).quantize("int8")
