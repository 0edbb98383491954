"""Memory-efficient (chunked) attention equals dense attention: values and gradients.

References are NumPy, written from the formulas: outputs softmax(Q Kᵀ/√d) V with masked entries
at zero weight, and the gradients of <outputs, G> for a fixed G:
dV = Pᵀ G, dP = G Vᵀ, dS = P ⊙ (dP - rowsum(dP ⊙ P)), dQ = dS K / √d, dK = dSᵀ Q / √d.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from layer_test_utils import op_types, run_layer_test

import keras_attn as ka
from keras_attn import ops as attn_ops
from keras_attn.chunked import (
    auto_chunk_size,
    chunked_dot_product_attention,
    fused_dot_product_attention,
    xla_barrier,
    xla_dense,
)


def to_np(x):
    return keras.ops.convert_to_numpy(keras.ops.cast(x, "float32"))


def np_structured_mask(batch, query_len, key_len, valid_lens=None, causal=False, offset=0,
                       mask=None):
    """(B, T, S) boolean mask from the three ways in, written out directly."""
    allowed = np.ones((batch, query_len, key_len), bool)
    cols = np.arange(key_len)
    if valid_lens is not None:
        lens = np.asarray(valid_lens)
        lens = lens[:, None] if lens.ndim == 1 else lens  # (B, 1) or (B, T)
        allowed &= cols[None, None, :] < lens[:, :, None]
    if causal:
        allowed &= cols[None, None, :] <= np.arange(query_len)[None, :, None] + offset
    if mask is not None:
        allowed &= np.broadcast_to(mask, allowed.shape)
    return allowed


def np_attention_and_grads(q, k, v, allowed, g):
    """Outputs and d<outputs, g>/d(q, k, v) in float64; `allowed` broadcasts to (..., T, S)."""
    q, k, v, g = (x.astype(np.float64) for x in (q, k, v, g))
    scale = 1.0 / np.sqrt(q.shape[-1])
    scores = np.where(allowed, q @ np.swapaxes(k, -1, -2) * scale, -np.inf)
    row_max = np.max(scores, axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    e = np.where(allowed, np.exp(scores - row_max), 0.0)
    total = e.sum(-1, keepdims=True)
    p = np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)  # (..., T, S)
    out = p @ v
    dv = np.swapaxes(p, -1, -2) @ g
    dp = g @ np.swapaxes(v, -1, -2)
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    dq = ds @ k * scale
    dk = np.swapaxes(ds, -1, -2) @ q * scale
    return out, (dq, dk, dv)


def chunked_with_grads(q, k, v, g, fn=chunked_dot_product_attention, **kwargs):
    q, k, v = (tf.constant(x) for x in (q, k, v))
    with tf.GradientTape() as tape:
        tape.watch([q, k, v])
        out = fn(q, k, v, **kwargs)
        loss = tf.reduce_sum(tf.cast(out, "float32") * g)
    return to_np(out), [to_np(x) for x in tape.gradient(loss, [q, k, v])]


def check_against_numpy(out, grads, ref_out, ref_grads, atol=1e-4):
    np.testing.assert_allclose(out, ref_out, atol=atol)
    for name, got, want in zip("qkv", grads, ref_grads):
        assert np.all(np.isfinite(got)), f"non-finite d{name}"
        np.testing.assert_allclose(got, want, atol=atol, err_msg=f"d{name}")


@st.composite
def attention_problems(draw):
    batch, heads = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    query_len, key_len = draw(st.integers(1, 9)), draw(st.integers(1, 11))
    depth, value_depth = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**16))
    kind = draw(st.sampled_from(["none", "lens", "lens2d", "causal", "dense", "all"]))
    chunk = draw(st.integers(1, 6))
    query_chunk = draw(st.one_of(st.none(), st.integers(1, 5)))
    return batch, heads, query_len, key_len, depth, value_depth, seed, kind, chunk, query_chunk


@settings(max_examples=30, deadline=None)
@given(attention_problems())
def test_chunked_equals_numpy_reference_values_and_gradients(problem):
    batch, heads, query_len, key_len, depth, value_depth, seed, kind, chunk, q_chunk = problem
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(batch, heads, query_len, depth)).astype("float32")
    k = rng.normal(size=(batch, heads, key_len, depth)).astype("float32")
    v = rng.normal(size=(batch, heads, key_len, value_depth)).astype("float32")
    g = rng.normal(size=(batch, heads, query_len, value_depth)).astype("float32")
    kwargs = {}
    if kind in ("lens", "all"):
        kwargs["valid_lens"] = rng.integers(0, key_len + 1, size=(batch,))
    if kind == "lens2d":
        kwargs["valid_lens"] = rng.integers(0, key_len + 1, size=(batch, query_len))
    if kind in ("causal", "all"):
        kwargs["causal"] = True
        kwargs["causal_offset"] = int(rng.integers(-2, 3))
    if kind in ("dense", "all"):
        kwargs["mask"] = rng.random((batch, query_len, key_len)) < 0.6  # (B, T, S)
    allowed = np_structured_mask(batch, query_len, key_len, kwargs.get("valid_lens"),
                                 kwargs.get("causal", False), kwargs.get("causal_offset", 0),
                                 kwargs.get("mask"))[:, None]  # (B, 1, T, S)
    ref_out, ref_grads = np_attention_and_grads(q, k, v, allowed, g)
    out, grads = chunked_with_grads(q, k, v, g, chunk_size=chunk, query_chunk_size=q_chunk,
                                    **kwargs)
    check_against_numpy(out, grads, ref_out, ref_grads)
    # The one-block form (weights kept, fused backward) on the same problem.
    out, grads = chunked_with_grads(q, k, v, g, fn=fused_dot_product_attention, **kwargs)
    check_against_numpy(out, grads, ref_out, ref_grads)


def test_auto_chunk_size_keeps_blocks_within_budget():
    assert [auto_chunk_size(t) for t in (1024, 4096, 16384, 32768, 65536, 10**6)] == [
        32768, 8192, 2048, 1024, 512, 128]
    assert auto_chunk_size(None) == 512


@pytest.mark.parametrize("query_chunk", [None, 3])
def test_fully_masked_rows_are_zero_with_zero_gradient(query_chunk):
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(2, 7, 4)).astype("float32") for _ in range(3))
    g = rng.normal(size=(2, 7, 4)).astype("float32")
    lens = np.array([0, 3])  # sequence 0 has no keys at all
    mask = np.ones((2, 7, 7), bool)
    mask[1, 5] = False  # one fully masked query row in sequence 1
    out, (dq, dk, dv) = chunked_with_grads(q, k, v, g, valid_lens=lens, mask=mask, chunk_size=2,
                                           query_chunk_size=query_chunk)
    assert np.all(out[0] == 0.0) and np.all(out[1, 5] == 0.0)
    assert np.all(dq[0] == 0.0) and np.all(dk[0] == 0.0) and np.all(dv[0] == 0.0)
    assert np.all(dq[1, 5] == 0.0)
    assert np.all(dk[1, 3:] == 0.0) and np.all(dv[1, 3:] == 0.0)  # keys nobody may see
    allowed = np_structured_mask(2, 7, 7, lens, mask=mask)
    ref_out, ref_grads = np_attention_and_grads(q, k, v, allowed, g)
    check_against_numpy(out, [dq, dk, dv], ref_out, ref_grads)


@pytest.mark.parametrize("budget", [None, 16])
def test_fused_backward_both_forms_of_the_shifted_product_equal_numpy(budget, monkeypatch):
    """Without dropout the float32 backward forms dO Vᵀ - rowsum(dO ⊙ O) as one product, except
    for scores longer than a chunked block; a small budget takes the other form here."""
    import keras_attn.chunked as chunked_module

    if budget is not None:
        monkeypatch.setattr(chunked_module, "BLOCK_BUDGET", budget)
    rng = np.random.default_rng(22)
    q, k, v = (rng.normal(size=(2, 3, 5, 4)).astype("float32") for _ in range(3))
    g = rng.normal(size=(2, 3, 5, 4)).astype("float32")
    allowed = np_structured_mask(2, 5, 5, [5, 3], causal=True)[:, None]
    ref_out, ref_grads = np_attention_and_grads(q, k, v, allowed, g)
    out, grads = chunked_with_grads(q, k, v, g, fn=fused_dot_product_attention,
                                    valid_lens=np.array([5, 3]), causal=True)
    check_against_numpy(out, grads, ref_out, ref_grads)
    # The product form appends a column to dO and V: a concatenation in the graph. Scores of
    # unknown length count as long.
    def grad_fn(q):
        return tf.gradients(fused_dot_product_attention(q, q, q), q)

    assert ("ConcatV2" in op_types(tf.function(grad_fn), tf.constant(q))) == (budget is None)
    unknown = tf.function(grad_fn, input_signature=[tf.TensorSpec((2, 3, None, 4))])
    assert "ConcatV2" not in op_types(unknown)


@pytest.mark.parametrize("mask_shape", [(2, 8, 1), (2, 1, 1), (2, 1, 8)])
def test_masks_broadcast_over_a_key_or_query_axis(mask_shape):
    """Query masks (B, T, 1), sequence masks (B, 1, 1) and key masks (B, 1, S), alone (no
    lengths, no causality, S a whole number of blocks), in the float32 blockwise forward."""
    rng = np.random.default_rng(23)
    q, k, v = (rng.normal(size=(2, 2, 8, 4)).astype("float32") for _ in range(3))
    g = rng.normal(size=(2, 2, 8, 4)).astype("float32")
    mask = rng.random(mask_shape) < 0.7
    mask[0] = True  # sequence 0 sees everything; sequence 1 a random part
    allowed = np.broadcast_to(mask, (2, 8, 8))[:, None]
    ref_out, ref_grads = np_attention_and_grads(q, k, v, allowed, g)
    out, grads = chunked_with_grads(q, k, v, g, mask=mask, chunk_size=4)
    check_against_numpy(out, grads, ref_out, ref_grads)


def test_without_exact_float32_products_the_row_terms_stay_out(monkeypatch):
    """Where float32 products may run in TF32 (a GPU with TensorFlow's default), no
    log-sum-exp or rowsum(dO ⊙ O) rides along in a product: the paths taken then (here
    forced) follow the formulas too."""
    import keras_attn.chunked as chunked_module

    monkeypatch.setattr(chunked_module, "_exact_products", lambda *tensors: False)
    rng = np.random.default_rng(24)
    q, k, v = (rng.normal(size=(2, 2, 9, 4)).astype("float32") for _ in range(3))
    g = rng.normal(size=(2, 2, 9, 4)).astype("float32")
    lens = np.array([9, 4])
    allowed = np_structured_mask(2, 9, 9, lens, causal=True)[:, None]
    ref_out, ref_grads = np_attention_and_grads(q, k, v, allowed, g)
    for fn, kwargs in ((chunked_dot_product_attention, {"chunk_size": 4}),
                       (fused_dot_product_attention, {})):
        out, grads = chunked_with_grads(q, k, v, g, fn=fn, valid_lens=lens, causal=True,
                                        **kwargs)
        check_against_numpy(out, grads, ref_out, ref_grads)
    for fn, kwargs in ((fused_dot_product_attention, {}),
                       (chunked_dot_product_attention, {"chunk_size": 4, "causal": True})):
        graph = tf.function(lambda q, fn=fn, kwargs=kwargs: tf.gradients(
            fn(q, q, q, **kwargs), q))
        assert "ConcatV2" not in op_types(graph, tf.constant(q)), fn.__name__


def test_exact_products_only_for_float32_without_tf32_on_a_gpu(monkeypatch):
    from keras_attn.chunked import _exact_products

    x = tf.zeros((2, 3))
    assert _exact_products(x, x)  # float32 on this CPU
    assert not _exact_products(x, tf.cast(x, "bfloat16"))
    visible = tf.config.list_physical_devices
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: ["a GPU"] if kind == "GPU" else visible(kind))
    before = tf.config.experimental.tensor_float_32_execution_enabled()
    try:
        tf.config.experimental.enable_tensor_float_32_execution(True)
        assert not _exact_products(x, x)
        tf.config.experimental.enable_tensor_float_32_execution(False)
        assert _exact_products(x, x)
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(before)


@pytest.mark.parametrize("masking", ["lens", "dense"])
def test_far_apart_key_blocks_stay_exact(masking):
    """The float32 forward carries the earlier blocks as one more key whose share of a new
    block's softmax underflows when the new scores are far larger (here by about 200): that
    block takes the log-sum-exp path. With a dense mask key 0, the reference score of the
    lengths-only path, is hidden, here with the largest score of its row."""
    rng = np.random.default_rng(21)
    q = rng.normal(size=(2, 2, 6, 4)).astype("float32")
    k = rng.normal(size=(2, 2, 12, 4)).astype("float32")
    v = rng.normal(size=(2, 2, 12, 3)).astype("float32")
    g = rng.normal(size=(2, 2, 6, 3)).astype("float32")
    q[..., 0] = 20.0
    k[..., 0] = 0.1  # scores about 1 in the first blocks ...
    k[..., 8:, 0] = 20.0  # ... and about 200 in the last one
    k[..., 0, 0] = 30.0  # key 0 scores about 300
    kwargs = {"valid_lens": np.array([12, 11])}
    allowed = np_structured_mask(2, 6, 12, kwargs["valid_lens"])
    if masking == "dense":
        mask = np.ones((2, 6, 12), bool)
        mask[:, :, 0] = False  # no row sees key 0
        mask[1, 2] = False  # and one row sees nothing
        kwargs["mask"] = mask
        allowed = allowed & mask
    else:
        k[..., 0, 0] = 0.1
    ref_out, ref_grads = np_attention_and_grads(q, k, v, allowed[:, None], g)
    out, grads = chunked_with_grads(q, k, v, g, chunk_size=4, **kwargs)
    check_against_numpy(out, grads, ref_out, ref_grads, atol=2e-4)


def test_causal_block_skipping_with_offset_and_per_query_lengths():
    """Query blocks skip key blocks above the diagonal and past the longest sequence."""
    rng = np.random.default_rng(1)
    q = rng.normal(size=(2, 2, 37, 8)).astype("float32")
    k = rng.normal(size=(2, 2, 45, 8)).astype("float32")
    v = rng.normal(size=(2, 2, 45, 3)).astype("float32")
    g = rng.normal(size=(2, 2, 37, 3)).astype("float32")
    lens = np.array([45, 20])
    for offset in (0, 8):
        out, grads = chunked_with_grads(q, k, v, g, valid_lens=lens, causal=True,
                                        causal_offset=offset, chunk_size=4, query_chunk_size=8)
        allowed = np_structured_mask(2, 37, 45, lens, causal=True, offset=offset)[:, None]
        ref_out, ref_grads = np_attention_and_grads(q, k, v, allowed, g)
        check_against_numpy(out, grads, ref_out, ref_grads)


def test_compiled_dynamic_shapes_and_xla_equal_eager():
    rng = np.random.default_rng(2)
    q, k, v = (tf.constant(rng.normal(size=(2, 3, 10, 4)).astype("float32")) for _ in range(3))
    lens = tf.constant([10, 4])

    def loss_and_grads(q, k, v, lens):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            out = chunked_dot_product_attention(q, k, v, valid_lens=lens, causal=True,
                                                chunk_size=3, query_chunk_size=4)
            loss = tf.reduce_sum(out * out)
        return out, tape.gradient(loss, [q, k, v])

    spec = tf.TensorSpec([None, 3, None, 4])
    dynamic = tf.function(loss_and_grads, input_signature=[spec, spec, spec,
                                                            tf.TensorSpec([None], "int32")])
    xla = tf.function(loss_and_grads, jit_compile=True)
    eager_out, eager_grads = loss_and_grads(q, k, v, lens)
    for compiled in (dynamic, xla):
        out, grads = compiled(q, k, v, lens)
        np.testing.assert_allclose(to_np(out), to_np(eager_out), atol=1e-5)
        for got, want in zip(grads, eager_grads):
            np.testing.assert_allclose(to_np(got), to_np(want), atol=1e-5)


def test_xla_barrier_is_identity_with_identity_gradient_and_only_under_xla():
    x = tf.constant(np.random.default_rng(4).normal(size=(2, 5)).astype("float32"))

    def fn(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = xla_barrier(x * 3.0)
            loss = tf.reduce_sum(y * y)
        return y, tape.gradient(loss, x)

    xla, graph = tf.function(fn, jit_compile=True), tf.function(fn)
    assert op_types(xla, x).count("XlaOptimizationBarrier") == 2  # forward and backward
    assert "XlaOptimizationBarrier" not in op_types(graph, x)
    assert xla_barrier(x) is x  # eager: nothing added
    for compiled in (xla, graph):
        y, grad = compiled(x)
        np.testing.assert_allclose(to_np(y), 3.0 * to_np(x), rtol=1e-6)
        np.testing.assert_allclose(to_np(grad), 18.0 * to_np(x), rtol=1e-6)


def test_xla_barrier_second_order_gradient_under_xla():
    x = tf.constant([0.5, -1.0, 2.0])

    @tf.function(jit_compile=True)
    def second(x):
        with tf.GradientTape() as outer:
            outer.watch(x)
            with tf.GradientTape() as inner:
                inner.watch(x)
                y = tf.reduce_sum(xla_barrier(x) ** 3)
            grad = inner.gradient(y, x)  # 3 x²
        return grad, outer.gradient(grad, x)  # 6 x

    grad, hess = second(x)
    np.testing.assert_allclose(to_np(grad), 3 * to_np(x) ** 2, rtol=1e-6)
    np.testing.assert_allclose(to_np(hess), 6 * to_np(x), rtol=1e-6)


@pytest.mark.parametrize(
    "policy,use_bias,activation,atol",
    [("float32", True, None, 1e-5), ("float32", False, "relu", 1e-5),
     ("mixed_bfloat16", True, "relu", 3e-2)],
)
def test_xla_dense_equals_the_layer_under_xla_with_gradients(policy, use_bias, activation, atol):
    """Under XLA the Dense product runs with its own kernel gradient (from a transposed copy of
    the input); values and the gradients of input, kernel and bias follow the formulas."""
    rng = np.random.default_rng(11)
    x = rng.normal(size=(3, 5, 8)).astype("float32")
    g = rng.normal(size=(3, 5, 6)).astype("float32")
    layer = keras.layers.Dense(6, use_bias=use_bias, activation=activation, dtype=policy,
                               bias_initializer="random_normal")
    layer.build((3, 5, 8))

    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = xla_dense(layer, x)
            loss = tf.reduce_sum(tf.cast(y, "float32") * g)
        return y, tape.gradient(loss, [x] + layer.trainable_variables)

    xla = tf.function(run, jit_compile=True)
    y, grads = xla(tf.constant(x))
    assert y.dtype == layer.compute_dtype
    assert "XlaOptimizationBarrier" in op_types(xla, tf.constant(x))
    assert "XlaOptimizationBarrier" not in op_types(tf.function(run), tf.constant(x))
    # NumPy, from y = act(x W + b): dz = g ⊙ act'(z), dx = dz Wᵀ, dW = xᵀ dz, db = Σ dz.
    w = to_np(layer.kernel)
    z = x @ w + (to_np(layer.bias) if use_bias else 0.0)
    dz = g * (z > 0) if activation == "relu" else g
    want = [np.maximum(z, 0) if activation == "relu" else z]
    want += [dz @ w.T, x.reshape(-1, 8).T @ dz.reshape(-1, 6)]
    want += [dz.sum(axis=(0, 1))] if use_bias else []
    assert len(grads) == len(want) - 1
    for got, ref in zip([y, *grads], want):
        np.testing.assert_allclose(to_np(got), ref, atol=atol * max(1.0, np.abs(ref).max()))


def test_xla_dense_is_the_layer_call_outside_xla_and_with_lora():
    layer = keras.layers.Dense(4)
    layer.build((2, 3))
    x = tf.constant(np.random.default_rng(12).normal(size=(2, 3)).astype("float32"))
    np.testing.assert_array_equal(to_np(xla_dense(layer, x)), to_np(layer(x)))
    layer.enable_lora(2, b_initializer="ones")  # the layer's own call handles LoRA
    xla = tf.function(lambda x: xla_dense(layer, x), jit_compile=True)
    np.testing.assert_allclose(to_np(xla(x)), to_np(layer(x)), rtol=1e-6)
    assert "XlaOptimizationBarrier" not in op_types(xla, x)


def test_fused_backward_under_xla_equals_numpy():
    """The transposed products of the backward (dV = Pᵀ dO, dK = dSᵀ Q) sit behind a barrier
    under XLA; values and gradients still follow the formulas."""
    rng = np.random.default_rng(5)
    q, k, v = (rng.normal(size=(2, 3, 6, 4)).astype("float32") for _ in range(3))
    g = rng.normal(size=(2, 3, 6, 4)).astype("float32")
    allowed = np.broadcast_to(np_structured_mask(2, 6, 6, [6, 2], causal=True)[:, None],
                              (2, 3, 6, 6))

    @tf.function(jit_compile=True)
    def run(q, k, v):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            out = fused_dot_product_attention(q, k, v, valid_lens=tf.constant([6, 2]),
                                              causal=True)
            loss = tf.reduce_sum(out * g)
        return out, tape.gradient(loss, [q, k, v])

    inputs = [tf.constant(a) for a in (q, k, v)]
    out, grads = run(*inputs)
    assert "XlaOptimizationBarrier" in op_types(run, *inputs)
    ref_out, ref_grads = np_attention_and_grads(q, k, v, allowed, g)
    check_against_numpy(out, grads, ref_out, ref_grads)


@pytest.mark.parametrize("dtype,atol", [("float16", 5e-3), ("bfloat16", 3e-2)])
def test_low_precision_inputs_keep_dtype_and_accuracy(dtype, atol):
    rng = np.random.default_rng(3)
    q, k, v = (rng.normal(size=(2, 9, 8)).astype("float32") for _ in range(3))
    lens = np.array([0, 6])
    out = chunked_dot_product_attention(*(keras.ops.cast(x, dtype) for x in (q, k, v)),
                                        valid_lens=lens, causal=True, chunk_size=4)
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    ref, _ = np_attention_and_grads(q, k, v, np_structured_mask(2, 9, 9, lens, causal=True),
                                    np.zeros((2, 9, 8), "float32"))
    assert np.all(np.isfinite(to_np(out)))
    np.testing.assert_allclose(to_np(out), ref, atol=atol)


@pytest.mark.parametrize(
    "kwargs,arg",
    [({"chunk_size": 0}, "chunk_size"), ({"chunk_size": 2.5}, "chunk_size"),
     ({"query_chunk_size": -1}, "query_chunk_size"), ({"valid_lens": np.ones((2, 3, 4))},
                                                      "valid_lens"),
     ({"valid_lens": np.ones((2, 5))}, "valid_lens")],
)
def test_bad_arguments_name_the_argument(kwargs, arg):
    x = np.ones((2, 3, 4), "float32")
    with pytest.raises(ValueError, match=arg):
        chunked_dot_product_attention(x, x, x, **kwargs)


# ---------------------------------------------------------------- ops and MultiHead wiring

def test_ops_dot_product_attention_chunked_equals_dense():
    rng = np.random.default_rng(4)
    q, k, v = (rng.normal(size=(2, 3, 6, 4)).astype("float32") for _ in range(3))
    mask = rng.random((2, 6, 6)) < 0.7
    dense, weights = attn_ops.dot_product_attention(q, k, v, mask=mask)
    chunked, none = attn_ops.dot_product_attention(q, k, v, mask=mask, implementation="chunked",
                                                   chunk_size=4)
    assert none is None and weights.shape == (2, 3, 6, 6)
    np.testing.assert_allclose(to_np(chunked), to_np(dense), atol=1e-5)


@pytest.mark.parametrize("implementation", ["dense", "chunked"])
def test_ops_structured_masks_match_numpy(implementation):
    """valid_lens and use_causal_mask, alone or with a dense mask, in both implementations."""
    rng = np.random.default_rng(9)
    q, k, v = (rng.normal(size=(2, 3, 6, 4)).astype("float32") for _ in range(3))
    lens = np.array([[1, 2, 0, 6, 6, 3], [6, 5, 4, 3, 2, 1]])
    mask = rng.random((2, 6, 6)) < 0.8
    out, _ = attn_ops.dot_product_attention(q, k, v, mask=mask, valid_lens=lens,
                                            use_causal_mask=True, implementation=implementation,
                                            chunk_size=4)
    allowed = np_structured_mask(2, 6, 6, lens, causal=True, mask=mask)[:, None]
    ref, _ = np_attention_and_grads(q, k, v, allowed, np.zeros((2, 3, 6, 4), "float32"))
    np.testing.assert_allclose(to_np(out), ref, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs,arg",
    [({"implementation": "flash"}, "implementation"), ({"chunk_size": 0}, "chunk_size"),
     ({"implementation": "chunked", "dropout_rate": 0.1, "training": True}, "implementation")],
)
def test_ops_bad_implementation_arguments(kwargs, arg):
    x = np.ones((2, 3, 4), "float32")
    with pytest.raises(ValueError, match=arg):
        attn_ops.dot_product_attention(x, x, x, **kwargs)


def multi_head_pair(**kwargs):
    dense = ka.MultiHead(num_heads=3, key_dim=4, value_dim=5, output_dim=7, **kwargs)
    chunked = ka.MultiHead(num_heads=3, key_dim=4, value_dim=5, output_dim=7,
                           implementation="chunked", chunk_size=3, **kwargs)
    return dense, chunked


@pytest.mark.parametrize("masking", ["none", "valid_lens", "causal", "lens_and_causal",
                                     "attention_mask"])
def test_multi_head_chunked_equals_dense_with_same_weights(masking):
    rng = np.random.default_rng(5)
    q, kv = rng.normal(size=(2, 8, 6)).astype("float32"), rng.normal(size=(2, 10, 9))
    kv = kv.astype("float32")
    dense, chunked = multi_head_pair()
    causal = "causal" in masking
    key_len = 8 if causal else 10  # causal self-attention; otherwise cross-attention
    key = q if causal else kv
    call = {"use_causal_mask": causal}
    if "lens" in masking:
        call["valid_lens"] = np.array([key_len, 0])
    if masking == "attention_mask":
        call["attention_mask"] = rng.random((2, 8, key_len)) < 0.5
    dense(q, key)
    chunked(q, key)
    chunked.set_weights(dense.get_weights())
    q_t, key_t = tf.constant(q), tf.constant(key)
    results = []
    for layer in (dense, chunked):
        with tf.GradientTape() as tape:
            tape.watch([q_t, key_t])
            out = layer(q_t, key_t, **call)
            loss = tf.reduce_sum(out * out)
        grads = tape.gradient(loss, [q_t, key_t] + layer.trainable_variables)
        results.append((to_np(out), [to_np(x) for x in grads]))
    np.testing.assert_allclose(results[1][0], results[0][0], atol=1e-4)
    for got, want in zip(results[1][1], results[0][1]):
        np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_multi_head_chunked_padding_masks_equal_dense_without_a_query_by_key_mask(
        causal, monkeypatch):
    # Embedding(mask_zero=True) padding on self-attention (passed as `query_mask`, as the
    # implicit mask would be): the dense path merges a (B, T, S) mask; the chunked path must
    # give the same numbers from a (B, 1, S) key mask alone.
    ids = np.array([[5, 3, 7, 2, 9, 4, 0, 0], [6, 1, 8, 0, 0, 0, 0, 0]], "int32")
    embedding = keras.layers.Embedding(10, 6, mask_zero=True)
    x = embedding(ids)
    mask = to_np(embedding.compute_mask(ids))
    dense, chunked = multi_head_pair()
    dense(x)
    chunked(x)
    chunked.set_weights(dense.get_weights())
    seen = []
    real = ka.chunked.chunked_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(kwargs.get("mask"))
        return real(*args, **kwargs)

    monkeypatch.setattr(attn_ops, "chunked_dot_product_attention", spy)
    x_t = tf.constant(to_np(x))
    results = []
    for layer in (dense, chunked):
        with tf.GradientTape() as tape:
            tape.watch(x_t)
            out = layer(x_t, query_mask=mask, use_causal_mask=causal)
            loss = tf.reduce_sum(out * out)
        grads = tape.gradient(loss, [x_t] + layer.trainable_variables)
        results.append((to_np(out), [to_np(g) for g in grads]))
    np.testing.assert_allclose(results[1][0], results[0][0], atol=1e-4)
    for got, want in zip(results[1][1], results[0][1]):
        np.testing.assert_allclose(got, want, atol=1e-4)
    (key_mask,) = seen
    assert key_mask.shape[-2] == 1, key_mask.shape  # (B, 1, 1, S): no query-by-key tensor
    # Padded queries get the output projection of a zero context: its bias, as in dense.
    np.testing.assert_allclose(results[1][0][1, 3:], np.broadcast_to(
        to_np(chunked.output_dense.bias), (5, 7)), atol=1e-6)


@pytest.mark.parametrize("masking", ["none", "lens_and_causal"])
def test_multi_head_dense_fused_path_equals_weights_path(masking):
    """Without returned weights the dense path uses the fused backward: same numbers."""
    rng = np.random.default_rng(8)
    x = tf.constant(rng.normal(size=(2, 6, 8)).astype("float32"))
    layer = ka.MultiHead(num_heads=2, key_dim=3)
    call = {}
    if masking != "none":
        call = {"valid_lens": np.array([6, 0]), "use_causal_mask": True}
    results = []
    for with_weights in (True, False):
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = layer(x, return_attention_scores=with_weights, **call)
            out = out[0] if with_weights else out
            loss = tf.reduce_sum(out * tf.range(8, dtype="float32"))
        grads = tape.gradient(loss, [x] + layer.trainable_variables)
        results.append([to_np(out)] + [to_np(grad) for grad in grads])
    for fused, reference in zip(results[1], results[0]):
        np.testing.assert_allclose(fused, reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("masking", ["none", "lens_and_causal"])
def test_multi_head_fused_dropout_equals_weights_path(masking):
    """In training the fused path drops the same weights as the weights path (same seed) and
    its hand-written backward (dS = D ⊙ dD - P ⊙ rowsum(dO ⊙ O)) equals autodiff's."""
    rng = np.random.default_rng(9)
    x = tf.constant(rng.normal(size=(2, 6, 8)).astype("float32"))
    layers = [ka.MultiHead(num_heads=2, key_dim=3, dropout=0.4, seed=11) for _ in range(2)]
    for layer in layers:
        layer(x)
    layers[1].set_weights(layers[0].get_weights())
    call = {}
    if masking != "none":
        call = {"valid_lens": np.array([6, 0]), "use_causal_mask": True}
    results = [[], []]
    for _ in range(2):  # a second call draws new masks, the same on both paths
        for result, layer, with_weights in zip(results, layers, (True, False)):
            with tf.GradientTape() as tape:
                tape.watch(x)
                out = layer(x, return_attention_scores=with_weights, training=True, **call)
                out = out[0] if with_weights else out
                loss = tf.reduce_sum(out * tf.range(8, dtype="float32"))
            grads = tape.gradient(loss, [x] + layer.trainable_variables)
            result.append([to_np(out)] + [to_np(grad) for grad in grads])
    for call_fused, call_reference in zip(results[1], results[0]):
        for fused, reference in zip(call_fused, call_reference):  # key bias grads: 0 ± rounding
            np.testing.assert_allclose(fused, reference, rtol=1e-5, atol=5e-5)
    # Dropout did act (without it the outputs differ) and the two calls' masks differ.
    plain = to_np(layers[1](x, training=False, **call))
    assert np.max(np.abs(plain - results[1][0][0])) > 1e-2
    assert np.max(np.abs(results[1][1][0] - results[1][0][0])) > 1e-2


# bfloat16 gradients: the reference differentiates the softmax in bfloat16 steps; eager and XLA
# reference gradients differ from each other by up to 0.016 (two steps of bfloat16 at 1).
@pytest.mark.parametrize("dtype,atol", [("float32", 1e-5), ("bfloat16", 3e-2)])
@pytest.mark.parametrize("mode", ["eager", "graph", "xla"])
def test_fused_dropout_equals_dot_product_attention(dtype, atol, mode):
    """Same dropped weights from the same seed, and the hand-written backward equals autodiff
    through dot_product_attention's dropout, with a sequence that has no key at all."""
    rng = np.random.default_rng(10)
    q, k, v = (tf.cast(rng.normal(size=(2, 3, 7, 4)).astype("float32"), dtype)
               for _ in range(3))
    g = tf.constant(rng.normal(size=(2, 3, 7, 4)).astype("float32"))
    lens = tf.constant([5, 0])
    generators = [keras.random.SeedGenerator(5), keras.random.SeedGenerator(5)]

    def run(fused: bool):
        def fn(q, k, v):
            with tf.GradientTape() as tape:
                tape.watch([q, k, v])
                if fused:
                    out = fused_dot_product_attention(q, k, v, valid_lens=lens, causal=True,
                                                      dropout_rate=0.3, seed=generators[0])
                else:
                    out = attn_ops.dot_product_attention(
                        q, k, v, valid_lens=lens, use_causal_mask=True, dropout_rate=0.3,
                        training=True, seed=generators[1])[0]
                loss = tf.reduce_sum(tf.cast(out, "float32") * g)
            return [out] + tape.gradient(loss, [q, k, v])
        if mode != "eager":
            fn = tf.function(fn, jit_compile=mode == "xla")
        return fn

    fused_fn, reference_fn = run(True), run(False)
    for _ in range(2):  # the generators advance alike: the second call's masks agree too
        fused, reference = fused_fn(q, k, v), reference_fn(q, k, v)
        assert keras.backend.standardize_dtype(fused[0].dtype) == dtype
        np.testing.assert_array_equal(to_np(fused[0])[1], 0.0)  # no keys: zero output
        # Same dropped weights, same product: outputs and dV agree to float32 rounding.
        for got, want in (fused[0], reference[0]), (fused[3], reference[3]):
            np.testing.assert_allclose(to_np(got), to_np(want), atol=1e-6)
        for got, want in zip(fused[1:3], reference[1:3]):
            np.testing.assert_allclose(to_np(got), to_np(want), atol=atol)
    with pytest.raises(ValueError, match="dropout_rate"):
        fused_dot_product_attention(q, k, v, dropout_rate=1.0)


def test_multi_head_chunked_cached_decoding_equals_full_sequence():
    rng = np.random.default_rng(6)
    x = rng.normal(size=(2, 5, 6)).astype("float32")
    dense, chunked = multi_head_pair()
    dense(x)
    chunked(x)
    chunked.set_weights(dense.get_weights())
    full = to_np(dense(x, use_causal_mask=True))
    cache = chunked.init_cache(2, 5)
    steps = []
    for i in range(5):
        out, cache = chunked(x[:, i:i + 1], cache=cache, cache_update_index=i,
                             use_causal_mask=True)
        steps.append(to_np(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)


def test_multi_head_chunked_layer_contract(tmp_path):
    rng = np.random.default_rng(7)
    out = run_layer_test(
        ka.MultiHead,
        {"num_heads": 2, "key_dim": 4, "implementation": "chunked", "chunk_size": 3},
        {"query": rng.normal(size=(2, 7, 6)).astype("float32"),
         "valid_lens": np.array([7, 2], "int32")},
        (2, 7, 6),
        tmp_path,
        call_kwargs={"use_causal_mask": True},
    )
    assert np.all(np.isfinite(out))
    config = ka.MultiHead(2, 4, implementation="chunked", chunk_size=3).get_config()
    assert config["implementation"] == "chunked" and config["chunk_size"] == 3
    revived = ka.MultiHead.from_config(config)
    assert (revived.implementation, revived.chunk_size) == ("chunked", 3)
    config = ka.MultiHead(2, 4).get_config()
    assert config["implementation"] == "dense" and config["chunk_size"] is None


@pytest.mark.parametrize(
    "kwargs,arg",
    [({"implementation": "flash"}, "implementation"), ({"chunk_size": 0}, "chunk_size"),
     ({"implementation": "chunked", "dropout": 0.1}, "implementation")],
)
def test_multi_head_bad_implementation_arguments(kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        ka.MultiHead(num_heads=2, key_dim=4, **kwargs)


def test_multi_head_chunked_refuses_to_return_weights():
    layer = ka.MultiHead(num_heads=2, key_dim=4, implementation="chunked")
    with pytest.raises(ValueError, match="return_attention_scores"):
        layer(np.ones((1, 3, 8), "float32"), return_attention_scores=True)
