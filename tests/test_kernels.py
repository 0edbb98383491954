"""Every attention kernel, forward and backward, against the one NumPy reference.

`keras_attn.ops.dot_product_attention` runs the dense kernel (weights returned, differentiated
by the backend), the dense kernel's fused backward (weights kept), the blockwise kernel (with and
without query blocks) and the local kernel; each is compared with `reference.attention` and
`reference.attention_grads` (float64, written from the formulas) on random shapes and every kind
of mask, with biases, shared key/value heads, fully masked rows and non-finite numbers at hidden
positions.
"""

import keras
import numpy as np
import pytest
import reference as ref
from backend_utils import examples, to_np, value_and_grads
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_attn import ops as attn_ops
from keras_attn.ops import AttentionMask

KERNELS = {
    "dense": {"implementation": "dense", "return_weights": True},
    "fused": {"implementation": "dense", "return_weights": False},
    "blockwise": {"implementation": "chunked", "chunk_size": 3},
    "blockwise_rows": {"implementation": "chunked", "chunk_size": 4, "query_chunk_size": 3},
}


@st.composite
def problems(draw):
    batch = draw(st.integers(1, 2))
    kv_heads, group = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    query_len, key_len = draw(st.integers(1, 9)), draw(st.integers(1, 11))
    depth, value_depth = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    parts = draw(st.sets(st.sampled_from(
        ["lens", "lens2d", "causal", "window", "dense", "key_mask", "query_mask", "bias"])))
    return {
        "shape": (batch, kv_heads, group, query_len, key_len, depth, value_depth),
        "parts": parts,
        "offset": draw(st.integers(0, 3)),
        "window": draw(st.integers(0, 4)),
        "num_global": draw(st.integers(0, 2)),
        "seed": draw(st.integers(0, 2**16)),
        "kernel": draw(st.sampled_from(sorted(KERNELS))),
    }


def make_problem(problem):
    batch, kv_heads, group, query_len, key_len, depth, value_depth = problem["shape"]
    parts, rng = problem["parts"], np.random.default_rng(problem["seed"])
    # Shared key/value heads: q (B, H_kv, G, T, d) against k, v (B, H_kv, 1, S, ·).
    q = rng.normal(size=(batch, kv_heads, group, query_len, depth)).astype("float32")
    k = rng.normal(size=(batch, kv_heads, 1, key_len, depth)).astype("float32")
    v = rng.normal(size=(batch, kv_heads, 1, key_len, value_depth)).astype("float32")
    build, spec = {}, {}
    if "lens2d" in parts:
        build["valid_lens"] = spec["lens"] = rng.integers(0, key_len + 1, (batch, query_len))
    elif "lens" in parts:
        build["valid_lens"] = spec["lens"] = rng.integers(0, key_len + 1, (batch,))
    if "causal" in parts:
        build["use_causal_mask"] = spec["causal"] = True
    if "causal" in parts or "window" in parts:
        build["causal_offset"] = spec["offset"] = problem["offset"]
    if "window" in parts:
        build["window"] = spec["window"] = problem["window"]
        build["num_global"] = spec["num_global"] = problem["num_global"]
    if "dense" in parts:
        build["attention_mask"] = spec["dense"] = rng.random((batch, query_len, key_len)) < 0.7
    if "query_mask" in parts:
        build["query_mask"] = spec["query_valid"] = rng.random((batch, query_len)) < 0.8
    if "key_mask" in parts:
        build["key_mask"] = spec["key_valid"] = rng.random((batch, key_len)) < 0.8
    bias = None
    if "bias" in parts:
        bias = rng.normal(size=(1, kv_heads, group, query_len, key_len)).astype("float32")
    allowed = ref.combined_mask(batch, query_len, key_len, **spec)[:, None, None]  # (B, 1, 1, T, S)
    return q, k, v, bias, build, allowed


def run_kernel(kernel, q, k, v, bias, build, d_out, **extra):
    """Outputs, weights and gradients (q, k, v[, bias]) of one kernel."""
    query_len, key_len = q.shape[-2], k.shape[-2]
    options = dict(KERNELS[kernel], **extra)
    weights = []

    def fn(q, k, v, *bias):
        mask = AttentionMask.build(query_len, key_len, q.shape[0], **build) if build else None
        out, w = attn_ops.dot_product_attention(q, k, v, mask, bias=bias[0] if bias else None,
                                                **options)
        weights.append(w)
        return out

    inputs = [q, k, v] + ([bias] if bias is not None else [])
    out, grads = value_and_grads(fn, inputs, d_out)
    fn(*inputs)  # the weights again, outside the gradient trace (JAX's are tracers there)
    return out, to_np(weights[-1]), grads


@settings(max_examples=examples(60), deadline=None)
@given(problems())
def test_kernels_equal_the_reference_values_and_gradients(problem):
    q, k, v, bias, build, allowed = make_problem(problem)
    d_out = np.random.default_rng(1).normal(size=q.shape[:-1] + v.shape[-1:])
    out, weights, grads = run_kernel(problem["kernel"], q, k, v, bias, build, d_out)
    want_out, want_weights = ref.attention(q, k, v, allowed, bias)
    dq, dk, dv, dbias = ref.attention_grads(q, k, v, d_out, allowed, bias)
    np.testing.assert_allclose(out, want_out, atol=2e-5)
    if weights is not None:
        np.testing.assert_allclose(weights, want_weights, atol=2e-6)
    want_grads = [dq, dk, dv] + ([ref.sum_to_shape(dbias, bias.shape)] if bias is not None
                                 else [])
    for name, got, want in zip(["dq", "dk", "dv", "dbias"], grads, want_grads):
        np.testing.assert_allclose(got, want, atol=5e-5, err_msg=name)


@pytest.mark.parametrize("kernel", sorted(KERNELS) + ["local"])
def test_non_finite_numbers_at_hidden_positions_never_reach_outputs_or_gradients(kernel):
    """NaN and inf in keys and values behind key padding and lengths, and in padded queries:
    outputs and gradients equal those of the same inputs with zeros there."""
    rng = np.random.default_rng(7)
    q, k, v = (rng.normal(size=(2, 2, 8, 4)).astype("float32") for _ in range(3))
    lens = np.array([8, 5])
    key_valid = np.ones((2, 8), bool)
    key_valid[0, 2] = False
    query_valid = np.array([[True] * 8, [True] * 6 + [False] * 2])
    build = {"valid_lens": lens, "key_mask": key_valid, "query_mask": query_valid}
    if kernel == "local":
        build.update(window=2, use_causal_mask=True)
    hidden_keys = ~(key_valid & (np.arange(8)[None] < lens[:, None]))  # (B, S)
    dirty_k, dirty_v, dirty_q = k.copy(), v.copy(), q.copy()
    dirty_k[:, :, :][np.broadcast_to(hidden_keys[:, None], (2, 2, 8))] = np.nan
    dirty_v[np.broadcast_to(hidden_keys[:, None], (2, 2, 8))] = np.inf
    dirty_q[np.broadcast_to(~query_valid[:, None], (2, 2, 8))] = np.nan
    d_out = rng.normal(size=(2, 2, 8, 4))
    options = {"implementation": "local"} if kernel == "local" else dict(KERNELS[kernel])

    def run(q, k, v):
        def fn(q, k, v):
            mask = AttentionMask.build(8, 8, 2, **build)
            return attn_ops.dot_product_attention(q, k, v, mask, **options)[0]
        return value_and_grads(fn, [q, k, v], d_out)

    clean_out, clean_grads = run(q * ~np.isnan(dirty_q), np.nan_to_num(dirty_k, nan=0.0),
                                 np.where(np.isinf(dirty_v), 0.0, v).astype("float32"))
    out, grads = run(dirty_q, dirty_k, dirty_v)
    assert np.all(np.isfinite(out)) and all(np.all(np.isfinite(g)) for g in grads)
    np.testing.assert_array_equal(out, clean_out)
    for got, want in zip(grads, clean_grads):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window,num_global", [(0, 0), (1, 0), (3, 0), (2, 2), (5, 1)])
def test_local_kernel_equals_the_reference(window, num_global, causal):
    rng = np.random.default_rng(window * 10 + num_global)
    q, k, v = (rng.normal(size=(2, 3, 11, 4)).astype("float32") for _ in range(3))
    key_valid = rng.random((2, 11)) < 0.8
    query_valid = rng.random((2, 11)) < 0.9
    lens = np.array([11, 7])
    build = {"window": window, "num_global": num_global, "use_causal_mask": causal,
             "valid_lens": lens, "key_mask": key_valid, "query_mask": query_valid}
    allowed = ref.combined_mask(2, 11, 11, lens, causal, 0, window, num_global, None, query_valid,
                      key_valid)[:, None]
    d_out = rng.normal(size=(2, 3, 11, 4))

    def fn(q, k, v):
        mask = AttentionMask.build(11, 11, 2, **build)
        return attn_ops.dot_product_attention(q, k, v, mask, implementation="local")[0]

    out, grads = value_and_grads(fn, [q, k, v], d_out)
    np.testing.assert_allclose(out, ref.attention(q, k, v, allowed)[0], atol=2e-5)
    for got, want in zip(grads, ref.attention_grads(q, k, v, d_out, allowed)[:3]):
        np.testing.assert_allclose(got, want, atol=5e-5)


@pytest.mark.parametrize("kernel", sorted(KERNELS) + ["local"])
def test_zero_keys_give_zero_outputs_on_every_kernel(kernel):
    q = np.ones((2, 3, 0, 4), "float32") if kernel == "local" else np.ones((2, 3, 5, 4),
                                                                           "float32")
    k = np.ones((2, 3, 0, 4), "float32")
    v = np.ones((2, 3, 0, 6), "float32")
    options = dict(KERNELS.get(kernel, {}))
    mask = None
    if kernel == "local":
        options = {"implementation": "local"}
        mask = AttentionMask.build(0, 0, 2, window=2)
    out, weights = attn_ops.dot_product_attention(q, k, v, mask, **options)
    assert tuple(out.shape) == q.shape[:-1] + (6,)
    np.testing.assert_array_equal(to_np(out), 0.0)
    if weights is not None:
        assert tuple(weights.shape) == q.shape[:-1] + (0,)


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("dtype,atol", [("float16", 5e-3), ("bfloat16", 3e-2)])
def test_16_bit_inputs_keep_their_dtype_and_accuracy(kernel, dtype, atol):
    rng = np.random.default_rng(3)
    q, k, v = (rng.normal(size=(2, 2, 9, 8)).astype("float32") for _ in range(3))
    lens = np.array([0, 6])
    out, _ = attn_ops.dot_product_attention(
        *(keras.ops.cast(x, dtype) for x in (q, k, v)),
        AttentionMask.build(9, 9, 2, valid_lens=lens, use_causal_mask=True),
        **KERNELS[kernel])
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    allowed = ref.combined_mask(2, 9, 9, lens, True)[:, None]
    np.testing.assert_allclose(to_np(out), ref.attention(q, k, v, allowed)[0], atol=atol)


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_float16_scores_of_inputs_in_the_hundreds_do_not_overflow(kernel):
    """|q · k| reaches 300 · 300 · 32 ≈ 3e6 here, far past float16's 65504: the scores are a
    float32 product, so outputs and gradients are finite and follow the reference."""
    rng = np.random.default_rng(4)
    q, k = (300.0 * rng.normal(size=(1, 2, 6, 32)) for _ in range(2))
    v = 100.0 * rng.normal(size=(1, 2, 6, 8))
    d_out = rng.normal(size=(1, 2, 6, 8))
    inputs = [keras.ops.convert_to_numpy(keras.ops.cast(x, "float16")) for x in (q, k, v)]

    def fn(q, k, v):
        return attn_ops.dot_product_attention(q, k, v, AttentionMask.build(6, 6, 1,
                                                                           use_causal_mask=True),
                                              **KERNELS[kernel])[0]

    out, grads = value_and_grads(fn, inputs, d_out)
    assert np.all(np.isfinite(out)) and all(np.all(np.isfinite(g)) for g in grads)
    q16, k16, v16 = (x.astype("float64") for x in inputs)
    want = ref.attention(q16, k16, v16, ref.causal_mask(6, 6))[0]
    np.testing.assert_allclose(out, want, rtol=2e-2, atol=0.5)


@pytest.mark.parametrize("kernel", ["dense", "fused"])
def test_dropout_on_the_weights_is_the_same_on_both_dense_paths(kernel):
    """The fused backward drops the same weights as the weights path from the same seed, and
    its gradient equals the backend's differentiation of that path."""
    rng = np.random.default_rng(10)
    q, k, v = (rng.normal(size=(2, 3, 7, 4)).astype("float32") for _ in range(3))
    d_out = rng.normal(size=(2, 3, 7, 4))
    lens_and_causal = AttentionMask.build(7, 7, 2, valid_lens=np.array([5, 0]),
                                          use_causal_mask=True)
    results = []
    for return_weights in (True, False):
        generator = keras.random.SeedGenerator(5)

        def fn(q, k, v, return_weights=return_weights, generator=generator):
            return attn_ops.dot_product_attention(
                q, k, v, lens_and_causal, dropout_rate=0.3,
                training=True, seed=generator, return_weights=return_weights)[0]

        results.append(value_and_grads(fn, [q, k, v], d_out))
    (out_w, grads_w), (out_f, grads_f) = results
    np.testing.assert_allclose(out_f, out_w, atol=1e-6)
    np.testing.assert_array_equal(out_f[1], 0.0)  # no keys: zero output
    for got, want in zip(grads_f, grads_w):
        np.testing.assert_allclose(got, want, atol=1e-5)
    plain = to_np(attn_ops.dot_product_attention(q, k, v, lens_and_causal)[0])
    assert np.max(np.abs(plain - out_w)) > 1e-2  # dropout did act


@pytest.mark.parametrize(
    "kwargs,arg",
    [({"implementation": "flash"}, "implementation"),
     ({"chunk_size": 0, "implementation": "chunked"}, "chunk_size"),
     ({"chunk_size": 4}, "chunk_size"),
     ({"query_chunk_size": -1, "implementation": "chunked"}, "query_chunk_size"),
     ({"implementation": "chunked", "dropout_rate": 0.1, "training": True}, "implementation"),
     ({"implementation": "chunked", "return_weights": True}, "return_weights"),
     ({"dropout_rate": 1.5}, "dropout_rate"),
     ({"scale": float("nan")}, "scale"),
     ({"scale": float("inf")}, "scale"),
     ({"valid_lens": np.ones((2, 3, 4), "int32")}, "valid_lens"),
     ({"valid_lens": np.ones((2, 5), "int32")}, "valid_lens"),
     ({"valid_lens": np.array([1.0, 2.0])}, "valid_lens"),
     ({"valid_lens": np.array([1, 9])}, "valid_lens"),
     ({"valid_lens": np.array([1, 2, 3])}, "valid_lens"),
     ({"mask": np.ones((4, 4), bool)}, "mask"),
     ({"mask": np.ones((2, 3, 3), "float32")}, "attention_bias"),
     ({"mask": np.ones((2, 2, 3, 3), bool)}, "mask"),
     ({"bias": np.ones((3, 4), "float32")}, "attention_bias"),
     ({"bias": np.ones((2, 3, 3), "int32")}, "attention_bias")],
)
def test_bad_arguments_name_the_argument(kwargs, arg):
    x = np.ones((2, 3, 4), "float32")
    with pytest.raises(ValueError, match=arg):
        attn_ops.dot_product_attention(x, x, x, **kwargs)


@pytest.mark.parametrize(
    "shapes,arg",
    [(((2, 3, 4), (2, 3, 5), (2, 3, 4)), "key"),
     (((2, 3, 4), (2, 3, 4), (2, 5, 4)), "value"),
     (((2, 3, 4), (2, 4), (2, 4)), "rank"),
     (((2, 3, 4), (3, 3, 4), (3, 3, 4)), "axis 0")],
)
def test_bad_tensors_name_the_argument(shapes, arg):
    q, k, v = (np.ones(shape, "float32") for shape in shapes)
    with pytest.raises(ValueError, match=arg):
        attn_ops.dot_product_attention(q, k, v)


def test_integer_tensors_are_refused_by_the_op():
    x = np.ones((2, 3, 4), "int32")
    with pytest.raises(ValueError, match="query.*floating"):
        attn_ops.dot_product_attention(x, x, x)


def test_the_local_kernel_gives_way_to_the_dense_one_for_what_it_cannot_apply():
    """A dense mask, a bias, the weights, a causal offset: the dense kernel runs, with the
    window in its mask (`keras_attn.ops.kernel_for`); without a window there is no band."""
    rng = np.random.default_rng(2)
    q, k, v = (rng.normal(size=(2, 1, 6, 4)).astype("float32") for _ in range(3))
    dense_mask = rng.random((2, 6, 6)) < 0.7
    bias = rng.normal(size=(6, 6)).astype("float32")
    for build, extra in [({"attention_mask": dense_mask}, {}), ({}, {"bias": bias}),
                         ({}, {"return_weights": True}),
                         ({"use_causal_mask": True, "causal_offset": 2}, {})]:
        mask = AttentionMask.build(6, 6, 2, window=1, **build)
        assert attn_ops.kernel_for("local", mask, q, k, extra.get("bias"),
                                   extra.get("return_weights")) == "dense"
        got, _ = attn_ops.dot_product_attention(q, k, v, mask, implementation="local", **extra)
        want, _ = attn_ops.dot_product_attention(q, k, v, mask, **extra)
        np.testing.assert_allclose(to_np(got), to_np(want), atol=1e-6)
    assert attn_ops.kernel_for("local", AttentionMask.build(6, 6, 2, window=1), q, k) == "local"
    with pytest.raises(ValueError, match="window"):
        attn_ops.dot_product_attention(q, k, v, implementation="local")


@pytest.mark.parametrize("causal", [False, True])
def test_the_backends_fused_attention_agrees_except_where_a_query_sees_no_key(causal):
    """`keras.ops.dot_product_attention` (the backend's own attention: cuDNN or flash kernels on
    a GPU) equals the dense kernel wherever a query sees at least one key. A query that sees
    none gets zeros from keras_attn and an average of the values from the backend, so the
    dispatch does not hand off to it (README, "Backends")."""
    rng = np.random.default_rng(0)
    batch, heads, query_len, key_len, depth = 2, 2, 5, 6, 4
    q, k, v = (rng.normal(size=(batch, heads, n, depth)).astype("float32")
               for n in (query_len, key_len, key_len))
    mask = rng.random((batch, 1, query_len, key_len)) < 0.6
    mask[..., 0] = True
    mask[0, 0, 3, :] = False  # query 3 of the first sequence sees no key
    build = {"attention_mask": mask, "use_causal_mask": causal}
    ours, _ = attn_ops.dot_product_attention(
        q, k, v, AttentionMask.build(query_len, key_len, batch, **build))
    theirs = keras.ops.dot_product_attention(
        *(np.swapaxes(x, 1, 2) for x in (q, k, v)), mask=mask, is_causal=causal)
    ours, theirs = to_np(ours), np.swapaxes(to_np(theirs), 1, 2)  # both (B, H, T, dv)
    allowed = mask & (np.tri(query_len, key_len, dtype=bool) if causal else True)
    seen = np.broadcast_to(allowed.any(-1), ours.shape[:-1])  # (B, H, T)
    assert not seen.all()
    np.testing.assert_allclose(ours[seen], theirs[seen], atol=1e-5)
    np.testing.assert_array_equal(ours[~seen], 0.0)
    assert np.abs(theirs[~seen]).max() > 1e-3


# ---- the dispatch: grouped heads, linear attention, the one mask ------------------------------

@pytest.mark.parametrize("kernel", sorted(KERNELS) + ["local"])
def test_the_dispatch_regroups_fewer_key_value_heads(kernel):
    """Queries (B, H, T, d) against keys and values (B, H_kv, S, ·): the dispatch regroups
    them itself, with a per-head dense mask and an (H, T, S) bias following the query heads;
    values and gradients as the reference's grouped form."""
    rng = np.random.default_rng(5)
    batch, kv_heads, group, length, depth = 2, 2, 3, 7, 4
    heads = kv_heads * group
    q = rng.normal(size=(batch, heads, length, depth)).astype("float32")
    k, v = (rng.normal(size=(batch, kv_heads, length, depth)).astype("float32")
            for _ in range(2))
    per_head = rng.random((batch, heads, length, length)) < 0.7
    bias = rng.normal(size=(heads, length, length)).astype("float32")
    local = kernel == "local"
    build = ({"window": 2, "use_causal_mask": True} if local
             else {"attention_mask": per_head, "valid_lens": np.array([7, 4])})
    options = {"implementation": "local"} if local else dict(KERNELS[kernel], bias=bias)
    d_out = rng.normal(size=q.shape)

    def fn(q, k, v):
        mask = AttentionMask.build(length, length, batch, **build)
        return attn_ops.dot_product_attention(q, k, v, mask, **options)[0]

    out, grads = value_and_grads(fn, [q, k, v], d_out)
    if local:
        allowed = ref.combined_mask(batch, length, length, causal=True, window=2)[:, None, None]
        want_bias = None
    else:
        allowed = (per_head & ref.length_mask([7, 4], length, length)[:, None]).reshape(
            batch, kv_heads, group, length, length)
        want_bias = bias.reshape(kv_heads, group, length, length)
    grouped = (q.reshape(batch, kv_heads, group, length, depth), k[:, :, None], v[:, :, None])
    want_out, _ = ref.attention(*grouped, allowed, want_bias)
    dq, dk, dv, _ = ref.attention_grads(*grouped, d_out.reshape(grouped[0].shape), allowed,
                                        want_bias)
    np.testing.assert_allclose(out, want_out.reshape(q.shape), atol=2e-5)
    for got, want in zip(grads, (dq.reshape(q.shape), dk[:, :, 0], dv[:, :, 0])):
        np.testing.assert_allclose(got, want, atol=5e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_is_an_implementation_of_the_dispatch(causal):
    rng = np.random.default_rng(6)
    q, k, v = (rng.normal(size=(2, 2, 9, 4)).astype("float32") for _ in range(3))
    key_valid = np.arange(9)[None] < np.array([[9], [5]])
    mask = AttentionMask.build(9, 9, 2, use_causal_mask=causal, key_mask=key_valid)
    out, weights = attn_ops.dot_product_attention(q, k, v, mask, implementation="linear",
                                                  chunk_size=4, return_weights=True)
    want = ref.linear_attention(q, k, v, key_valid, causal)
    np.testing.assert_allclose(to_np(out), want, atol=1e-5)
    np.testing.assert_allclose(to_np(weights) @ v, want, atol=1e-5)
    for extra in ({"scale": 0.5}, {"bias": np.zeros((9, 9), "float32")},
                  {"dropout_rate": 0.1, "training": True}):
        with pytest.raises(ValueError, match=next(iter(extra))):
            attn_ops.dot_product_attention(q, k, v, mask, implementation="linear", **extra)


def test_the_loose_mask_arguments_still_work_with_a_deprecation_warning():
    rng = np.random.default_rng(8)
    q, k, v = (rng.normal(size=(2, 5, 4)).astype("float32") for _ in range(3))
    lens = np.array([5, 2])
    with pytest.warns(DeprecationWarning, match="AttentionMask.build"):
        old, _ = attn_ops.dot_product_attention(q, k, v, valid_lens=lens,
                                                use_causal_mask=True, zero_masked_inputs=False)
    new, _ = attn_ops.dot_product_attention(
        q, k, v, AttentionMask.build(5, 5, 2, valid_lens=lens, use_causal_mask=True))
    np.testing.assert_array_equal(to_np(old), to_np(new))
    with pytest.raises(ValueError, match="unexpected arguments"):
        attn_ops.dot_product_attention(q, k, v, window=2)
    with pytest.raises(ValueError, match="AttentionMask"):
        attn_ops.dot_product_attention(q, k, v, AttentionMask.build(5, 5), valid_lens=lens)
