"""keras_attn.tuning: every switch changes speed or memory, never values; the XLA paths are
identities with the right gradients. TensorFlow only (the switches' TensorFlow paths)."""

import keras
import numpy as np
import pytest
import reference as ref
from backend_utils import to_np, value_and_grads

from keras_attn import ops as attn_ops
from keras_attn import tuning
from keras_attn.ops import AttentionMask

tf = pytest.importorskip("tensorflow")
pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                                reason="TensorFlow's speed paths")

SWITCH_SETTINGS = [
    {"loop_parallelism": 1},
    {"loop_parallelism": None},
    {"fold_row_terms": False},
    {"squeeze_single_matrix": False},
    {"block_budget": 64, "min_chunk_size": 2},
]


@pytest.mark.parametrize("switches", SWITCH_SETTINGS)
@pytest.mark.parametrize("implementation", ["dense", "chunked"])
def test_switches_change_no_values_or_gradients(switches, implementation):
    rng = np.random.default_rng(5)
    q, k, v = (rng.normal(size=(1, 1, 23, 4)).astype("float32") for _ in range(3))
    d_out = rng.normal(size=(1, 1, 23, 4))
    lens = np.array([19])

    def fn(q, k, v):
        mask = AttentionMask.build(23, 23, 1, valid_lens=lens, use_causal_mask=True)
        return attn_ops.dot_product_attention(q, k, v, mask, implementation=implementation,
                                              return_weights=False)[0]

    with tuning.configure(**switches):
        out, grads = value_and_grads(fn, [q, k, v], d_out)
    allowed = ref.length_mask(lens, 23, 23) & ref.causal_mask(23, 23)
    np.testing.assert_allclose(out, ref.attention(q, k, v, allowed)[0], atol=2e-5)
    for got, want in zip(grads, ref.attention_grads(q, k, v, d_out, allowed)[:3]):
        np.testing.assert_allclose(got, want, atol=5e-5)


def test_configure_sets_checks_and_restores():
    before = tuning.SWITCHES.loop_parallelism
    with tuning.configure(loop_parallelism=1):
        assert tuning.SWITCHES.loop_parallelism == 1
    assert tuning.SWITCHES.loop_parallelism == before
    for bad, arg in (({"loop_parallelism": 0}, "loop_parallelism"),
                     ({"fold_row_terms": 1}, "fold_row_terms"),
                     ({"warp_speed": True}, "warp_speed")):
        with pytest.raises(ValueError, match=arg):
            tuning.configure(**bad)
    assert tuning.SWITCHES.loop_parallelism == before


def test_auto_chunk_size_keeps_blocks_within_the_budget():
    sizes = [tuning.auto_chunk_size(t) for t in (1024, 4096, 16384, 32768, 65536, 10**6)]
    assert sizes == [32768, 8192, 2048, 1024, 512, 128]
    assert tuning.auto_chunk_size(None) == 512
    with tuning.configure(block_budget=2**20):
        assert tuning.auto_chunk_size(1024) == 1024
    assert tuning.auto_chunk_size(1, key_len=None) == 2**25  # no key length: the budget alone
    assert tuning.auto_chunk_size(1, key_len=tf.constant(10)) == 1024


def test_auto_chunk_size_budgets_every_sequence_and_head_of_a_block():
    """A block spans the batch and the heads: 4 heads at T = 16,384 get 512 keys (a causal
    LM's training step then stays under 3 GiB, not 5), while the blocks of a short batch stay
    one block (the dense kernel's fused path)."""
    assert [tuning.auto_chunk_size(16384, 16384, lead) for lead in (1, 4, 8)] == [2048, 512, 256]
    assert tuning.auto_chunk_size(32768, 32768, lead=4) == 256
    assert tuning.auto_chunk_size(1024, 1024, lead=2 * 4) >= 1024  # one block
    assert tuning.auto_chunk_size(128, 128, lead=16 * 4) >= 128
    assert tuning.auto_chunk_size(10**6, lead=64) == 128  # never below min_chunk_size


def test_chunked_kernel_sizes_blocks_by_batch_and_heads(monkeypatch):
    """`chunk_size=None` asks `auto_chunk_size` with the scores' batch times heads
    (grouped-query heads counted once per query head)."""
    asked = []
    auto = tuning.auto_chunk_size
    monkeypatch.setattr(tuning, "auto_chunk_size",
                        lambda *args: asked.append(args) or auto(*args))
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 4, 16, 8)).astype("float32")
    k = rng.standard_normal((2, 2, 16, 8)).astype("float32")
    out, _ = attn_ops.attend(q, k, k, implementation="chunked")
    assert asked == [(16, 16, 2 * 4)]
    weights = np.exp(q @ np.repeat(k, 2, axis=1).transpose(0, 1, 3, 2) / np.sqrt(8))
    expected = (weights / weights.sum(-1, keepdims=True)) @ np.repeat(k, 2, axis=1)
    np.testing.assert_allclose(to_np(out), expected, atol=1e-5)


def test_chunked_decoding_step_with_keys_of_unknown_length_stays_small():
    """One query against keys whose length a graph does not know: `chunk_size=None` padded the
    ten keys to a block of 2**25 rows (gigabytes; seq2seq and NAT decoding ran out of memory)."""
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((1, 4, 1, 8)), rng.standard_normal((1, 4, 10, 8))
    attend = tf.function(
        lambda q, k: attn_ops.attend(q, k, k, implementation="chunked")[0],
        input_signature=[tf.TensorSpec((1, 4, 1, 8)), tf.TensorSpec((1, 4, None, 8))])
    got = attend(q.astype("float32"), k.astype("float32"))
    weights = np.exp(q @ k.transpose(0, 1, 3, 2) / np.sqrt(8))
    expected = (weights / weights.sum(-1, keepdims=True)) @ k
    np.testing.assert_allclose(to_np(got), expected, atol=1e-5)


def test_exact_products_only_for_float32_without_tf32_on_a_gpu(monkeypatch):
    x = tf.zeros((2, 3))
    assert tuning.exact_float32_products(x, x)  # float32 on this CPU
    assert not tuning.exact_float32_products(x, tf.cast(x, "bfloat16"))
    visible = tf.config.list_physical_devices
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: ["a GPU"] if kind == "GPU" else visible(kind))
    before = tf.config.experimental.tensor_float_32_execution_enabled()
    try:
        tf.config.experimental.enable_tensor_float_32_execution(True)
        assert not tuning.exact_float32_products(x, x)
        tf.config.experimental.enable_tensor_float_32_execution(False)
        assert tuning.exact_float32_products(x, x)
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(before)


def test_xla_barrier_is_an_identity_with_identity_gradients_to_second_order():
    x = tf.constant([0.5, -1.0, 2.0])

    def fn(x):
        with tf.GradientTape() as outer:
            outer.watch(x)
            with tf.GradientTape() as inner:
                inner.watch(x)
                y = tf.reduce_sum(tuning.xla_barrier(x) ** 3)
            grad = inner.gradient(y, x)  # 3 x²
        return grad, outer.gradient(grad, x)  # 6 x

    assert tuning.xla_barrier(x) is x  # eagerly nothing is added
    for compiled in (tf.function(fn, jit_compile=True), tf.function(fn)):
        grad, hess = compiled(x)
        np.testing.assert_allclose(to_np(grad), 3 * to_np(x) ** 2, rtol=1e-6)
        np.testing.assert_allclose(to_np(hess), 6 * to_np(x), rtol=1e-6)


@pytest.mark.parametrize(
    "policy,use_bias,activation,atol",
    [("float32", True, None, 1e-5), ("float32", False, "relu", 1e-5),
     ("mixed_bfloat16", True, "relu", 3e-2)],
)
def test_xla_dense_equals_the_formula_under_xla_with_gradients(policy, use_bias, activation,
                                                               atol):
    rng = np.random.default_rng(11)
    x = rng.normal(size=(3, 5, 8)).astype("float32")
    g = rng.normal(size=(3, 5, 6)).astype("float32")
    layer = keras.layers.Dense(6, use_bias=use_bias, activation=activation, dtype=policy,
                               bias_initializer="random_normal")
    layer.build((3, 5, 8))

    @tf.function(jit_compile=True)
    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tuning.xla_dense(layer, x)
            loss = tf.reduce_sum(tf.cast(y, "float32") * g)
        return y, tape.gradient(loss, [x] + layer.trainable_variables)

    y, grads = run(tf.constant(x))
    assert y.dtype == layer.compute_dtype
    # NumPy, from y = act(x W + b): dz = g ⊙ act'(z), dx = dz Wᵀ, dW = xᵀ dz, db = Σ dz.
    w = to_np(layer.kernel)
    z = x @ w + (to_np(layer.bias) if use_bias else 0.0)
    dz = g * (z > 0) if activation == "relu" else g
    want = [np.maximum(z, 0) if activation == "relu" else z]
    want += [dz @ w.T, x.reshape(-1, 8).T @ dz.reshape(-1, 6)]
    want += [dz.sum(axis=(0, 1))] if use_bias else []
    for got, expected in zip([y, *grads], want):
        np.testing.assert_allclose(to_np(got), expected,
                                   atol=atol * max(1.0, np.abs(expected).max()))


def test_xla_dense_with_lora_is_the_layers_own_call():
    layer = keras.layers.Dense(4)
    layer.build((2, 3))
    layer.enable_lora(2, b_initializer="ones")
    x = tf.constant(np.random.default_rng(12).normal(size=(2, 3)).astype("float32"))
    xla = tf.function(lambda x: tuning.xla_dense(layer, x), jit_compile=True)
    np.testing.assert_allclose(to_np(xla(x)), to_np(layer(x)), rtol=1e-6)


@pytest.mark.parametrize("implementation", ["dense", "chunked"])
def test_kernels_under_xla_and_with_unknown_shapes_equal_the_reference(implementation):
    rng = np.random.default_rng(2)
    q, k, v = (rng.normal(size=(2, 3, 10, 4)).astype("float32") for _ in range(3))
    g = rng.normal(size=(2, 3, 10, 4)).astype("float32")
    lens = np.array([10, 4], "int32")
    blocks = {"chunk_size": 3, "query_chunk_size": 4} if implementation == "chunked" else {}

    def loss_and_grads(q, k, v, lens):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            mask = AttentionMask.build(tf.shape(q)[2], tf.shape(k)[2], q.shape[0],
                                       valid_lens=lens, use_causal_mask=True)
            out = attn_ops.dot_product_attention(
                q, k, v, mask, implementation=implementation, return_weights=False, **blocks)[0]
            loss = tf.reduce_sum(out * g)
        return out, tape.gradient(loss, [q, k, v])

    spec = tf.TensorSpec([None, 3, None, 4])
    dynamic = tf.function(loss_and_grads, input_signature=[spec, spec, spec,
                                                            tf.TensorSpec([None], "int32")])
    allowed = (ref.length_mask(lens, 10, 10) & ref.causal_mask(10, 10))[:, None]
    want = [ref.attention(q, k, v, allowed)[0]] + list(
        ref.attention_grads(q, k, v, g, allowed)[:3])
    for compiled in (dynamic, tf.function(loss_and_grads, jit_compile=True)):
        out, grads = compiled(*(tf.constant(x) for x in (q, k, v, lens)))
        for got, expected in zip([out, *grads], want):
            np.testing.assert_allclose(to_np(got), expected, atol=5e-5)
