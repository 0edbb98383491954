"""The fused kernel (the backend's own attention op) against the NumPy reference and the dense
kernel, the fallbacks `kernel_for` chooses, `implementation="auto"`, `flash_attention` and
soft-capping.

Every mask kind, grouped-query heads, biases and cache offsets run through
`dot_product_attention(implementation="fused")`, which must call the fused kernel (a counter
checks it did not fall back) and give the reference's outputs and gradients in float32. In
bfloat16 and float16 the fused path must be as accurate as the dense kernel (scores and softmax
in float32): both are compared with the float64 reference on the same rounded inputs, and the
fused error may not exceed twice the dense kernel's plus one unit of the dtype's rounding.
"""

import keras
import numpy as np
import pytest
import reference as ref
from backend_utils import to_np, value_and_grads

from keras_attn import ops as attn_ops
from keras_attn import tuning
from keras_attn.layers import MultiHead
from keras_attn.ops import AttentionMask, dispatch
from keras_attn.ops.kernels import fused

B, T, S, D = 2, 5, 7, 4
MASKS = ref.mask_kinds(B, T, S)
# Machine epsilon: one unit of rounding in each dtype.
EPS = {"float32": 2.0**-23, "bfloat16": 2.0**-7, "float16": 2.0**-10}


@pytest.fixture
def fused_calls(monkeypatch):
    """How many times the dispatch ran the fused kernel."""
    calls = []
    run = dispatch.fused_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return run(*args, **kwargs)

    monkeypatch.setattr(dispatch, "fused_attention", counted)
    return calls


def run(q, k, v, build, implementation, bias=None, dtype="float32", d_out=None, **options):
    """Outputs and gradients of `dot_product_attention` on `q`, `k`, `v` (and `bias`) cast to
    `dtype`, as float32 NumPy arrays."""
    query_len, key_len = q.shape[-2], k.shape[-2]

    def fn(q, k, v, *bias):
        mask = (AttentionMask.build(query_len, key_len, q.shape[0], **build) if build
                else None)
        q, k, v = (keras.ops.cast(x, dtype) for x in (q, k, v))
        out, _ = attn_ops.dot_product_attention(
            q, k, v, mask, bias=bias[0] if bias else None, implementation=implementation,
            return_weights=False, **options)
        return keras.ops.cast(out, "float32")

    inputs = [q, k, v] + ([bias] if bias is not None else [])
    if d_out is None:
        return to_np(fn(*inputs)), None
    return value_and_grads(fn, inputs, d_out)


def _inputs(heads, kv_heads, query_len=T, key_len=S, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    q = scale * rng.normal(size=(B, heads, query_len, D))
    k = scale * rng.normal(size=(B, kv_heads, key_len, D))
    v = rng.normal(size=(B, kv_heads, key_len, D))
    d_out = rng.normal(size=(B, heads, query_len, D))
    return [x.astype("float32") for x in (q, k, v)] + [d_out]


@pytest.mark.parametrize(("mask", "kv_heads"), [(mask, 2) for mask in sorted(MASKS)] + [
    (mask, kv_heads) for mask in ("lengths", "causal_cache_offset") for kv_heads in (4, 1)])
def test_fused_kernel_equals_the_reference_for_every_mask(mask, kv_heads, fused_calls):
    """Values and gradients for every mask kind with 4 query heads against 2 key/value heads
    (grouped), and against 4 (one each) and 1 (multi-query) for two kinds."""
    q, k, v, d_out = _inputs(4, kv_heads)
    out, grads = run(q, k, v, MASKS[mask], "fused", d_out=d_out)
    assert fused_calls, "the fused kernel did not run"
    allowed = ref.mask_of(MASKS[mask], B, T, S)
    want, want_grads = ref.grouped_attention(q, k, v, allowed, d_out=d_out)
    np.testing.assert_allclose(out, want, atol=2e-5)
    for name, got, expected in zip(("dq", "dk", "dv"), grads, want_grads):
        np.testing.assert_allclose(got, expected, atol=5e-5, err_msg=name)


def test_fused_kernel_takes_a_causal_mask_as_the_ops_is_causal(fused_calls):
    """As many queries as keys, no offset: the op's own causal mask (no (T, S) tensor)."""
    q, k, v, d_out = _inputs(4, 2, query_len=S)
    build = {"use_causal_mask": True}
    mask = AttentionMask.build(S, S, B, **build)
    assert fused.causal_only(mask, keras.ops.ones((B, 4, S, D)), keras.ops.ones((B, 2, S, D)))
    out, grads = run(q, k, v, build, "fused", d_out=d_out)
    allowed = ref.mask_of(build, B, S, S)
    want, want_grads = ref.grouped_attention(q, k, v, allowed, d_out=d_out)
    np.testing.assert_allclose(out, want, atol=2e-5)
    for got, expected in zip(grads, want_grads):
        np.testing.assert_allclose(got, expected, atol=5e-5)
    assert fused_calls


@pytest.mark.parametrize("bias_shape", [(1, 4, T, S), (B, 1, T, S), (T, S)])
def test_fused_kernel_adds_a_bias_and_differentiates_it(bias_shape, fused_calls):
    q, k, v, d_out = _inputs(4, 2)
    bias = np.random.default_rng(5).normal(size=bias_shape).astype("float32")
    build = MASKS["lengths"]
    out, grads = run(q, k, v, build, "fused", bias=bias, d_out=d_out)
    full = np.broadcast_to(bias, (B, 4, T, S))
    allowed = ref.mask_of(build, B, T, S)
    want, want_grads = ref.grouped_attention(q, k, v, allowed, full, d_out)
    np.testing.assert_allclose(out, want, atol=2e-5)
    want_grads[3] = ref.sum_to_shape(want_grads[3], bias_shape)
    for name, got, expected in zip(("dq", "dk", "dv", "dbias"), grads, want_grads):
        np.testing.assert_allclose(got, expected, atol=5e-5, err_msg=name)
    assert fused_calls


def test_fused_kernel_takes_single_head_inputs(fused_calls):
    """`(B, T, d)` inputs and a `(B, T, S)` bias are one head."""
    q, k, v, _ = _inputs(1, 1)
    bias = np.random.default_rng(2).normal(size=(B, T, S)).astype("float32")
    out, _ = run(q[:, 0], k[:, 0], v[:, 0], MASKS["lengths"], "fused", bias=bias)
    want, _ = run(q[:, 0], k[:, 0], v[:, 0], MASKS["lengths"], "dense", bias=bias)
    assert out.shape == (B, T, D)
    np.testing.assert_allclose(out, want, atol=2e-6)
    assert fused_calls


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("mask", ["causal_cache_offset", "empty_rows", "dense"])
def test_fused_kernel_is_as_accurate_as_the_dense_kernel_in_16_bits(dtype, mask):
    """Against the float64 reference on the rounded inputs, the fused error is at most twice
    the dense kernel's plus one unit of rounding: a softmax or scores in 16 bits would be
    several times worse. Inputs scaled by 3 put the scores in the tens, and float16 scores
    formed in float16 would overflow nowhere here but lose digits."""
    q, k, v, d_out = _inputs(4, 2, scale=3.0)
    bias = np.random.default_rng(4).normal(size=(1, 4, T, S)).astype("float32")
    q16, k16, v16 = (to_np(keras.ops.cast(x, dtype)) for x in (q, k, v))
    allowed = ref.mask_of(MASKS[mask], B, T, S)
    want, want_grads = ref.grouped_attention(q16, k16, v16, allowed, bias, d_out)
    results = {impl: run(q, k, v, MASKS[mask], impl, bias, dtype, d_out)
               for impl in ("dense", "fused")}
    for i, name in enumerate(("outputs", "dq", "dk", "dv", "dbias")):
        expected = want if i == 0 else want_grads[i - 1]
        errors = {}
        for impl, (out, grads) in results.items():
            got = out if i == 0 else grads[i - 1]
            assert np.isfinite(got).all(), (impl, name)
            errors[impl] = np.max(np.abs(got - expected))
        unit = EPS[dtype] * np.max(np.abs(expected))
        assert errors["fused"] <= 2 * errors["dense"] + unit, (name, errors)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_rows_that_see_no_key_are_zero_without_nan(dtype):
    """Fully masked rows (no valid key, a padded query) and non-finite numbers behind the
    mask: zero outputs, finite gradients, as the dense kernel gives."""
    q, k, v, d_out = _inputs(4, 2, scale=30.0)  # float16 scores in the thousands
    k[0, :, 3:] = np.inf
    v[0, :, 3:] = np.nan
    build = {"valid_lens": [3, 0], "query_mask": [[1, 1, 0, 1, 1], [1] * 5]}
    out, grads = run(q, k, v, build, "fused", dtype=dtype, d_out=d_out)
    dense_out = run(q, k, v, build, "dense", dtype=dtype)[0]
    assert np.isfinite(out).all() and all(np.isfinite(g).all() for g in grads)
    np.testing.assert_array_equal(out[1], 0.0)
    np.testing.assert_array_equal(out[0, :, 2], 0.0)
    np.testing.assert_array_equal(grads[0][1], 0.0)
    # Scores in the thousands make the gradients ill-conditioned in 16 bits: they are checked
    # finite and zero where they must be; the outputs against the dense kernel's.
    tol = 50 * EPS[dtype] * np.max(np.abs(dense_out))
    np.testing.assert_allclose(out, dense_out, atol=tol)


@pytest.mark.parametrize("position", ["alibi", "relative"])
def test_multi_head_fused_equals_dense_with_position_biases_and_a_cache(position):
    """MultiHead with ALiBi or T5 buckets (the bias formed densely for the op) under a
    causal mask, then one cached step at an offset: outputs and the gradients of every weight
    (the learned T5 table included) equal the dense kernel's."""
    x = np.random.default_rng(0).normal(size=(B, 6, 16)).astype("float32")
    layers = {impl: MultiHead(4, 4, num_key_value_heads=2, position_encoding=position,
                              implementation=impl) for impl in ("dense", "fused")}
    layers["dense"](x)
    layers["fused"](x)
    layers["fused"].set_weights(layers["dense"].get_weights())
    results = {}
    for impl, layer in layers.items():
        def fn(x, layer=layer):
            return layer(x, use_causal_mask=True, key_mask=np.array([[1] * 6, [1] * 4 + [0] * 2]))
        out, _ = value_and_grads(fn, [x], np.ones((B, 6, 16)))
        cache = layer.init_cache(B, 6)
        cache = layer(x[:, :4], cache=cache, cache_update_index=0)[1]
        step = layer(x[:, 4:5], cache=cache, cache_update_index=4)[0]
        results[impl] = (out, to_np(step), _weight_grads(layer, x))
    for got, want in zip(results["fused"], results["dense"]):
        for g, w in zip(got if isinstance(got, list) else [got],
                        want if isinstance(want, list) else [want]):
            np.testing.assert_allclose(g, w, atol=2e-5)


def _weight_grads(layer, x):
    """The gradients of `sum(layer(x, causal))` with respect to the layer's weights."""
    backend = keras.backend.backend()
    weights = layer.trainable_variables
    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x, use_causal_mask=True))
        return [to_np(g) for g in tape.gradient(loss, weights)]
    if backend == "jax":
        import jax

        values = [w.value for w in weights]

        def loss(values):
            out, _ = layer.stateless_call(values, [w.value for w in layer.non_trainable_weights],
                                          x, use_causal_mask=True)
            return out.sum()

        return [to_np(g) for g in jax.grad(loss)(values)]
    loss = layer(x, use_causal_mask=True).sum()
    loss.backward()
    grads = [to_np(w.value.grad) for w in weights]
    for w in weights:
        w.value.grad = None
    return grads


@pytest.mark.parametrize("soft_cap", [0.5, 2.0])
@pytest.mark.parametrize("kernel", [{"implementation": "dense", "return_weights": True},
                                    {"implementation": "dense", "return_weights": False},
                                    {"implementation": "chunked", "chunk_size": 3},
                                    {"implementation": "chunked", "chunk_size": 2,
                                     "query_chunk_size": 3},
                                    {"implementation": "fused"},
                                    {"implementation": "local", "return_weights": False}])
def test_soft_cap_equals_the_reference(soft_cap, kernel):
    """`c · tanh(scores / c)` before the bias and the mask, values and gradients (bias
    included), on every kernel that takes it (the fused and local ones hand it to the dense
    kernel)."""
    q, k, v, d_out = _inputs(4, 2, scale=2.0)
    bias = np.random.default_rng(6).normal(size=(1, 4, T, S)).astype("float32")
    build = {"valid_lens": [6, 0], "use_causal_mask": True, "causal_offset": 1}
    if kernel["implementation"] == "local":
        build = {"window": 2}
    options = dict(kernel, soft_cap=soft_cap)
    implementation = options.pop("implementation")
    options.pop("return_weights", None)

    def fn(q, k, v, bias):
        mask = AttentionMask.build(T, S, B, **build)
        out, _ = attn_ops.dot_product_attention(
            q, k, v, mask, bias=bias, implementation=implementation,
            return_weights=kernel.get("return_weights"), **options)
        return out

    out, grads = value_and_grads(fn, [q, k, v, bias], d_out)
    allowed = ref.mask_of(build, B, T, S)
    want, want_grads = ref.grouped_attention(q, k, v, allowed, bias, d_out, soft_cap)
    np.testing.assert_allclose(out, want, atol=2e-5)
    for name, got, expected in zip(("dq", "dk", "dv", "dbias"), grads, want_grads):
        np.testing.assert_allclose(got, expected, atol=5e-5, err_msg=name)


def test_soft_cap_is_refused_where_it_means_nothing():
    q = keras.ops.ones((1, 2, 3, 4))
    for bad in (0.0, -1.0, float("inf"), True):
        with pytest.raises(ValueError, match="soft_cap"):
            attn_ops.dot_product_attention(q, q, q, soft_cap=bad)
    with pytest.raises(ValueError, match="soft_cap"):
        attn_ops.dot_product_attention(q, q, q, soft_cap=1.0, implementation="linear")


def _kernel(implementation="fused", *, shape=(B, 4, T, D), key_shape=None, dtype="float32",
            **options):
    q = keras.ops.zeros(shape, dtype)
    k = keras.ops.zeros(key_shape or shape, dtype)
    return attn_ops.kernel_for(implementation, options.pop("mask", None), q, k,
                               options.pop("bias", None), options.pop("return_weights", None),
                               value=k, **options)


def test_fused_falls_back_to_the_dense_kernel_for_what_the_op_cannot_compute():
    assert _kernel() == "fused"
    assert _kernel(shape=(B, 4, T, D), key_shape=(B, 2, S, D)) == "fused"
    assert _kernel(mask=AttentionMask.build(T, S, B, window=1)) == "fused"
    assert _kernel(return_weights=True) == "dense"
    assert _kernel(dropout_rate=0.1) == "dense"
    assert _kernel(soft_cap=5.0) == "dense"
    assert _kernel(shape=(B, 2, 4, T, D)) == "dense"  # rank 5
    assert _kernel(shape=(B, 4, T, D), key_shape=(1, 4, S, D)) == "dense"  # shared keys
    assert _kernel(shape=(B, 4, T, D), key_shape=(B, 4, 0, D)) == "dense"  # no keys
    backend = keras.backend.backend()
    bias = keras.ops.zeros((T, S))
    assert _kernel(dtype="float16") == ("dense" if backend == "tensorflow" else "fused")
    assert _kernel(dtype="bfloat16", bias=bias) == (
        "dense" if backend == "tensorflow" else "fused")


def test_auto_runs_the_measured_kernel_of_this_backend_and_device():
    backend, device = keras.backend.backend(), tuning.device_kind()
    rows = [row for row in tuning.AUTO_KERNELS if (row.backend, row.device) == (backend, device)]
    expected = rows[0].kernel if rows else "dense"
    assert _kernel("auto") == expected
    assert _kernel("auto", return_weights=True) == "dense"
    for row in tuning.AUTO_KERNELS:
        assert row.kernel in dispatch.IMPLEMENTATIONS and row.measured
    assert {"auto", "fused"} <= set(dispatch.IMPLEMENTATIONS)


def test_flash_attention_true_is_refused_where_no_flash_kernel_can_run():
    q = keras.ops.ones((1, 2, 4, 8))
    with pytest.raises(ValueError, match="flash_attention"):  # a CPU has none
        attn_ops.dot_product_attention(q, q, q, implementation="fused", flash_attention=True)
    with pytest.raises(ValueError, match="flash_attention"):
        attn_ops.dot_product_attention(q, q, q, implementation="dense", flash_attention=True)
    with pytest.raises(ValueError, match="flash_attention"):
        attn_ops.dot_product_attention(q, q, q, implementation="auto", flash_attention=True,
                                       return_weights=True)
    with pytest.raises(ValueError, match="flash_attention"):
        attn_ops.dot_product_attention(q, q, q, flash_attention="yes")
    out, _ = attn_ops.dot_product_attention(q, q, q, implementation="fused",
                                            flash_attention=False)
    np.testing.assert_allclose(to_np(out), np.ones((1, 2, 4, 8)), atol=1e-6)


def test_multi_head_takes_fused_auto_and_flash_attention_as_keras_does():
    with pytest.raises(ValueError, match="flash_attention"):
        MultiHead(2, 4, implementation="dense", flash_attention=True)  # no flash
    with pytest.raises(ValueError, match="flash_attention"):
        MultiHead(2, 4, implementation="fused", flash_attention=True, dropout=0.1)
    with pytest.raises(ValueError, match="flash_attention"):
        MultiHead(2, 4, implementation="auto", flash_attention=1)
    layer = MultiHead(2, 4, implementation="auto", flash_attention=False)
    config = layer.get_config()
    # The attention fields a layer was given travel in its configuration; "auto" is the default.
    assert config["attention"] == {"flash_attention": False}
    again = MultiHead.from_config(config)
    assert again.implementation == "auto" and again.flash_attention is False


def test_a_float16_model_trains_compiled_with_the_fused_kernel():
    """`model.fit` compiles the step (XLA on JAX): float16 attention through the fused kernel
    must compile there too. JAX's op asks for float16 products summed in float32, which XLA on
    the CPU refuses inside `jax.jit`; the kernel runs those sums in float32 instead."""
    x = np.random.default_rng(0).normal(size=(B, 6, 16)).astype("float32")
    inputs = keras.Input((6, 16))
    hidden = MultiHead(2, 8, implementation="fused", dtype="mixed_float16")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    model.compile("sgd", "mse", jit_compile=keras.backend.backend() != "torch")
    history = model.fit(x, np.zeros((B, 6, 1)), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert model.layers[1].compute_dtype == "float16"
