"""Initialisation as Keras does it: each sublayer draws from its own initializer
(`keras_attn.layers.initializers.sublayer_initializer`), so no two kernels of a layer start
equal, and a seeded initializer gives the same layer every time.

The checks walk any layer's kernels (every weight of rank >= 2) generically, so they cover the
blocks as well as the attention layers and the FFN.
"""

import itertools

import keras
import numpy as np
import pytest
from backend_utils import rand, to_np

import keras_attn as ka
from keras_attn.layers.initializers import sublayer_initializer

# name -> (make(**init) -> layer, the call's inputs); `init` is {"kernel_initializer": ...}.
LAYERS = {
    "MultiHead": (lambda **i: ka.MultiHead(4, 16, use_gate=True, **i), [rand(2, 5, 64)]),
    "MultiHead_grouped": (lambda **i: ka.MultiHead(4, 16, num_key_value_heads=4, **i),
                          [rand(2, 5, 64), rand(2, 7, 64)]),
    "LocalMultiHead": (lambda **i: ka.LocalMultiHead(4, 16, sliding_window=3, **i),
                       [rand(2, 6, 64)]),
    "LinearAttention": (lambda **i: ka.LinearAttention(4, 16, **i), [rand(2, 5, 64)]),
    "AdditiveAttention": (lambda **i: ka.AdditiveAttention(16, **i),
                          [rand(2, 1, 16), rand(2, 5, 16)]),
    "FFN_swiglu": (lambda **i: ka.FFN(64, activation="swiglu", **i), [rand(2, 3, 64)]),
    "FFN_square": (lambda **i: ka.FFN(64, **i), [rand(2, 3, 64)]),
    # The blocks compose the layers above; a seeded block derives a seed per sublayer too.
    "TransformerEncoderBlock": (lambda **i: ka.TransformerEncoderBlock(4, 64, **i),
                                [rand(2, 5, 64)]),
    "TransformerDecoderBlock": (lambda **i: ka.TransformerDecoderBlock(4, 64, **i),
                                [rand(2, 5, 64), rand(2, 6, 64)]),
    "TransformerDecoderOnlyBlock": (lambda **i: ka.TransformerDecoderOnlyBlock(4, 64, **i),
                                    [rand(2, 5, 64)]),
}


def kernels(layer) -> dict:
    """Every weight of rank >= 2 of a built layer, by its path inside the layer."""
    return {variable.path.split("/", 1)[1]: to_np(variable) for variable in layer.weights
            if len(variable.shape) >= 2}


def built(name, **init):
    make, inputs = LAYERS[name]
    layer = make(**init)
    layer(*inputs)
    return layer


INITIALIZERS = {
    "default": {},
    "seeded": {"kernel_initializer": keras.initializers.GlorotUniform(seed=3)},
    "truncated_normal": {"kernel_initializer": keras.initializers.TruncatedNormal(stddev=0.02)},
}


@pytest.mark.parametrize("init", sorted(INITIALIZERS))
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_no_two_kernels_start_equal(name, init):
    found = kernels(built(name, **INITIALIZERS[init]))
    assert len(found) >= 2
    for (path_a, a), (path_b, b) in itertools.combinations(found.items(), 2):
        if a.shape == b.shape:
            assert not np.allclose(a, b), f"{path_a} and {path_b} start equal"


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_a_seeded_initializer_gives_the_same_layer(name):
    init = {"kernel_initializer": keras.initializers.GlorotUniform(seed=3)}
    first, second = (kernels(built(name, **init)) for _ in range(2))
    assert list(first) == list(second)
    for path in first:
        np.testing.assert_array_equal(first[path], second[path], err_msg=path)
    other = kernels(built(name, kernel_initializer=keras.initializers.GlorotUniform(seed=4)))
    assert any(not np.array_equal(first[p], other[p]) for p in first)


@pytest.mark.parametrize("name", ["MultiHead", "FFN_swiglu"])
def test_the_global_seed_makes_unseeded_layers_reproducible(name):
    keras.utils.set_random_seed(11)
    first = kernels(built(name))
    keras.utils.set_random_seed(11)
    second = kernels(built(name))
    for path in first:
        np.testing.assert_array_equal(first[path], second[path], err_msg=path)


def test_sublayer_initializer_is_deterministic_per_name_and_keeps_the_class():
    init = keras.initializers.TruncatedNormal(stddev=0.5, seed=7)
    a, b = sublayer_initializer(init, "a"), sublayer_initializer(init, "b")
    assert isinstance(a, keras.initializers.TruncatedNormal) and a.stddev == 0.5
    np.testing.assert_array_equal(to_np(a((3, 3))), to_np(sublayer_initializer(init, "a")((3,
                                                                                           3))))
    assert not np.allclose(to_np(a((3, 3))), to_np(b((3, 3))))
    assert sublayer_initializer("zeros", "a").__class__ is keras.initializers.Zeros


# Whole models: every weight by its full path, so two stacks' blocks of one name stay apart.
SEEDED = keras.initializers.GlorotUniform(seed=3)
MODELS = {
    "transformer_seq2seq": lambda: ka.models.transformer_seq2seq(
        20, 20, num_layers=2, hidden_dim=16, num_heads=2, intermediate_dim=16,
        kernel_initializer=SEEDED),
    "causal_lm": lambda: ka.models.causal_lm(
        20, num_layers=2, hidden_dim=16, num_heads=2, intermediate_dim=16,
        kernel_initializer=SEEDED),
}


def model_kernels(model) -> dict:
    """Every weight of rank >= 2 but the (zero) biases, by its full path in the model."""
    return {variable.path: to_np(variable) for variable in model.weights
            if len(variable.shape) >= 2 and "bias" not in variable.path}


def called(name):
    model = MODELS[name]()
    ids = np.array([[2, 5, 7, 0]], "int32")
    model([ids, ids] if len(model.inputs) == 2 else ids)
    return model


@pytest.mark.parametrize("name", sorted(MODELS))
def test_no_two_kernels_of_a_seeded_model_start_equal(name):
    """A seeded model's stacks derive their own seeds too: the encoder and the decoder of
    `transformer_seq2seq` do not start as copies of each other."""
    found = model_kernels(called(name))
    for (path_a, a), (path_b, b) in itertools.combinations(found.items(), 2):
        if a.shape == b.shape:
            assert not np.allclose(a, b), f"{path_a} and {path_b} start equal"
    again = model_kernels(called(name))
    for path in found:
        np.testing.assert_array_equal(found[path], again[path], err_msg=path)
