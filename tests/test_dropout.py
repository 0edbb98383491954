"""keras_attn.ops.dropout and the Dropout layer: the 16-bit mask keeps the dropout contract."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from layer_test_utils import run_layer_test

from keras_attn import ops as attn_ops
from keras_attn.layers import Dropout

pytestmark = pytest.mark.tf_only  # TensorFlow's 16-bit dropout mask


def _keep_fraction_bounds(rate, n, sigmas=6.0):
    threshold = round(rate * 65536)
    keep = 1.0 - threshold / 65536
    spread = sigmas * np.sqrt(keep * (1.0 - keep) / n)
    return keep, keep - spread, keep + spread


@pytest.mark.parametrize("shape", [(64, 50, 40), (64, 50, 39), (1000,)])
@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_kept_fraction_and_scale(shape, rate):
    x = np.random.default_rng(0).uniform(1.0, 2.0, size=shape).astype("float32")
    y = keras.ops.convert_to_numpy(attn_ops.dropout(x, rate, seed=3))
    assert y.shape == x.shape and y.dtype == np.float32
    kept = y != 0
    keep, low, high = _keep_fraction_bounds(rate, x.size)
    assert low < kept.mean() < high, (kept.mean(), keep)
    # Kept elements are scaled by exactly 1 / P(keep); the rest are exactly zero.
    np.testing.assert_allclose(y[kept], x[kept] / keep, rtol=1e-6)


def _random_bits(x_shape, seed):
    """The 16 random bits per element, rebuilt: halves of the seeded uint32 words."""
    tf_seed = keras.random.randint((2,), 0, 2**31 - 1, seed=seed, dtype="int32")
    if x_shape[-1] % 2 == 0:
        words = tf.random.stateless_uniform(tuple(x_shape[:-1]) + (x_shape[-1] // 2,), tf_seed,
                                            minval=None, maxval=None, dtype=tf.uint32)
        bits = tf.bitcast(words, tf.uint16).numpy().reshape(x_shape)
    else:
        size = int(np.prod(x_shape))
        words = tf.random.stateless_uniform(((size + 1) // 2,), tf_seed, minval=None,
                                            maxval=None, dtype=tf.uint32)
        bits = tf.bitcast(words, tf.uint16).numpy().reshape(-1)[:size].reshape(x_shape)
    return bits.astype(np.int64)


@pytest.mark.parametrize("shape", [(6, 10, 8), (6, 10, 7)])
@pytest.mark.parametrize("rate", [0.1, 0.37])
def test_mask_is_the_16_bit_threshold_exactly(shape, rate):
    # Element kept <=> its 16 random bits >= round(rate * 65536): P(keep) = 1 - threshold/65536.
    x = np.random.default_rng(3).uniform(1.0, 2.0, size=shape).astype("float32")
    y = keras.ops.convert_to_numpy(attn_ops.dropout(x, rate, seed=5))
    bits = _random_bits(shape, 5)
    np.testing.assert_array_equal(y != 0, bits >= round(rate * 65536))
    # A rate whose threshold equals the first element's bits: that element is kept (>=, not >).
    tie = float(bits.flat[0]) / 65536
    y = keras.ops.convert_to_numpy(attn_ops.dropout(x, tie, seed=5))
    assert y.flat[0] != 0
    np.testing.assert_array_equal(y != 0, bits >= bits.flat[0])


def test_expectation_is_the_input():
    x = np.full((200_000,), 3.0, "float32")
    y = keras.ops.convert_to_numpy(attn_ops.dropout(x, 0.3, seed=1))
    assert abs(y.mean() - 3.0) < 6 * 3.0 * np.sqrt(0.3 / 0.7 / x.size)


@pytest.mark.parametrize("size", [400_000, 400_001])  # even and odd last axis
def test_the_two_halves_of_a_random_word_are_independent(size):
    # Elements 2i and 2i+1 share one 32-bit draw; their keep decisions must not correlate.
    y = keras.ops.convert_to_numpy(attn_ops.dropout(np.ones((size,), "float32"), 0.5, seed=2))
    kept = (y[: size // 2 * 2] != 0).reshape(-1, 2).astype("float64")
    corr = np.corrcoef(kept[:, 0], kept[:, 1])[0, 1]
    assert abs(corr) < 6 / np.sqrt(kept.shape[0]), corr


def test_seeds_behave_like_keras_random():
    x = np.ones((32, 64), "float32")
    a = keras.ops.convert_to_numpy(attn_ops.dropout(x, 0.5, seed=7))
    b = keras.ops.convert_to_numpy(attn_ops.dropout(x, 0.5, seed=7))
    c = keras.ops.convert_to_numpy(attn_ops.dropout(x, 0.5, seed=8))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    generator = keras.random.SeedGenerator(0)
    d = keras.ops.convert_to_numpy(attn_ops.dropout(x, 0.5, seed=generator))
    e = keras.ops.convert_to_numpy(attn_ops.dropout(x, 0.5, seed=generator))
    assert not np.array_equal(d, e)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_keeps_dtype_and_values(dtype):
    x = keras.ops.cast(np.linspace(1.0, 2.0, 4096).reshape(64, 64), dtype)
    y = attn_ops.dropout(x, 0.25, seed=0)
    assert keras.backend.standardize_dtype(y.dtype) == dtype
    y = keras.ops.convert_to_numpy(keras.ops.cast(y, "float32"))
    x = keras.ops.convert_to_numpy(keras.ops.cast(x, "float32"))
    kept = y != 0
    assert 0.6 < kept.mean() < 0.9
    np.testing.assert_allclose(y[kept], x[kept] / 0.75, rtol=1e-2)


def test_gradient_is_the_mask_times_the_scale():
    x = tf.constant(np.random.default_rng(1).normal(size=(8, 16, 6)).astype("float32"))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = attn_ops.dropout(x, 0.2, seed=5)
        loss = tf.reduce_sum(y)
    grad = tape.gradient(loss, x).numpy()
    kept = y.numpy() != 0
    keep = 1.0 - round(0.2 * 65536) / 65536
    np.testing.assert_allclose(grad, kept / keep, rtol=1e-6)


def test_dynamic_shapes_in_a_graph():
    @tf.function(input_signature=[tf.TensorSpec((None, None, 5), tf.float32)])
    def fn(x):
        return attn_ops.dropout(x, 0.5, seed=0)

    for shape in [(3, 7, 5), (1, 1, 5), (40, 50, 5)]:
        y = fn(tf.ones(shape)).numpy()
        assert y.shape == shape and set(np.unique(y)) <= {0.0, 2.0}
    assert 0.4 < (y != 0).mean() < 0.6


def test_small_rates_and_bad_rates():
    x = np.ones((4, 4), "float32")
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(attn_ops.dropout(x, 0.0)), x)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(attn_ops.dropout(x, 1e-6)), x)
    for rate in (1.0, -0.1, "half"):
        with pytest.raises(ValueError, match="rate"):
            attn_ops.dropout(x, rate)
    with pytest.raises(ValueError, match="floating-point"):
        attn_ops.dropout(np.ones((4, 4), "int32"), 0.5)
    # NumPy scalars are rates too; a rate within 2**-17 of 1 (threshold 65536) takes Keras' path.
    assert attn_ops.dropout(x, np.float32(0.5), seed=0).shape == (4, 4)
    y = keras.ops.convert_to_numpy(attn_ops.dropout(np.ones((64, 64), "float32"), 0.999995, 0))
    assert np.all(np.isfinite(y)) and (y != 0).mean() < 0.01


def test_layer_matches_the_function_and_is_identity_in_inference():
    x = np.random.default_rng(2).normal(size=(4, 10, 8)).astype("float32")
    layer = Dropout(0.4, seed=11)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer(x)), x)
    y = keras.ops.convert_to_numpy(layer(x, training=True))
    same_seed = keras.random.SeedGenerator(11)
    np.testing.assert_array_equal(
        y, keras.ops.convert_to_numpy(attn_ops.dropout(x, 0.4, seed=same_seed)))
    kept = y != 0
    keep = 1.0 - round(0.4 * 65536) / 65536
    np.testing.assert_allclose(y[kept], x[kept] / keep, rtol=1e-6)
    assert 0.3 < kept.mean() < 0.9
    # A second call draws a new mask (the layer's seed generator advances).
    z = keras.ops.convert_to_numpy(layer(x, training=True))
    assert not np.array_equal(y != 0, z != 0)
    # With a noise_shape the Keras implementation runs: masks shared along axis 1.
    shared = keras.ops.convert_to_numpy(Dropout(0.5, noise_shape=(4, 1, 8), seed=1)(
        x, training=True))
    assert np.all((shared != 0) == (shared[:, :1] != 0))
    # rate=1 is legal for keras.layers.Dropout (everything dropped); so it is here.
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(Dropout(1.0)(x, training=True)), np.zeros_like(x))


def test_layer_contract(tmp_path):
    run_layer_test(Dropout, {"rate": 0.3, "seed": 1},
                   {"inputs": np.ones((2, 5, 4), "float32")}, expected_output_shape=(2, 5, 4),
                   tmp_path=tmp_path)
