"""keras_attn.ops against NumPy written from the formulas, plus hypothesis properties."""

import keras
import numpy as np
import pytest
import reference as ref
from backend_utils import examples, to_np, value_and_grads
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from keras_attn import ops as attn_ops

DTYPES = ("float32", "float16", "bfloat16")
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 2e-2}


def test_sequence_mask_and_causal_mask():
    np.testing.assert_array_equal(
        to_np(attn_ops.sequence_mask(np.array([1, 3, 0]), 4)).astype(bool),
        np.array([[1, 0, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]], bool),
    )
    np.testing.assert_array_equal(
        to_np(attn_ops.causal_mask(3, 4)).astype(bool), np.tril(np.ones((3, 4), bool))
    )
    # Cached decoding: the query at position `offset` sees keys 0..offset.
    np.testing.assert_array_equal(
        to_np(attn_ops.causal_mask(1, 5, offset=2)).astype(bool), [[1, 1, 1, 0, 0]]
    )
    with pytest.raises(ValueError, match="maxlen"):
        attn_ops.sequence_mask([1], -1)


def test_masked_softmax_valid_lens_like_d2l():
    """valid_lens (B,) is shared by every row; (B, T) is per row (d2l's masked_softmax)."""
    x = np.random.rand(2, 2, 4).astype("float32")
    out = to_np(attn_ops.masked_softmax(x, valid_lens=np.array([2, 3])))
    mask = np.arange(4) < np.array([2, 3])[:, None, None]
    np.testing.assert_allclose(out, ref.masked_softmax(x, np.broadcast_to(mask, x.shape)),
                               atol=1e-6)
    assert np.all(out[0, :, 2:] == 0) and np.all(out[1, :, 3:] == 0)

    lens2 = np.array([[1, 3], [2, 4]])
    out2 = to_np(attn_ops.masked_softmax(x, valid_lens=lens2))
    mask2 = np.arange(4) < lens2[..., None]
    np.testing.assert_allclose(out2, ref.masked_softmax(x, mask2), atol=1e-6)


def test_masked_softmax_fully_masked_row_is_zero_with_zero_gradient():
    x = np.random.randn(2, 3, 5).astype("float32")
    lens = np.array([0, 2])
    y, (grad,) = value_and_grads(lambda x: attn_ops.masked_softmax(x, valid_lens=lens), [x],
                                 np.broadcast_to(np.arange(5.0), x.shape))
    assert np.all(y[0] == 0.0)
    np.testing.assert_allclose(y[1].sum(-1), 1.0, atol=1e-6)
    assert np.all(grad[0] == 0.0) and np.all(np.isfinite(grad))


def test_masked_softmax_4d_scores_with_valid_lens():
    x = np.random.rand(2, 3, 4, 6).astype("float32")  # (B, H, T, S)
    lens = np.array([[1, 2, 3, 6], [0, 6, 4, 2]])
    out = to_np(attn_ops.masked_softmax(x, valid_lens=lens))
    mask = (np.arange(6) < lens[:, None, :, None])
    np.testing.assert_allclose(out, ref.masked_softmax(x, np.broadcast_to(mask, x.shape)),
                               atol=1e-6)


def test_valid_lens_shape_is_checked():
    with pytest.raises(ValueError, match="valid_lens"):
        attn_ops.masked_softmax(np.zeros((2, 3, 4)), valid_lens=np.zeros((2, 5), "int32"))
    with pytest.raises(ValueError, match="valid_lens"):
        attn_ops.masked_softmax(np.zeros((2, 3, 4)), valid_lens=np.zeros((2, 3, 1), "int32"))


def test_dot_product_attention_matches_formula_and_checks_depth():
    q = np.random.randn(2, 3, 4).astype("float32")
    k = np.random.randn(2, 5, 4).astype("float32")
    v = np.random.randn(2, 5, 6).astype("float32")
    mask = np.random.rand(2, 3, 5) > 0.4
    mask[0, 1] = False  # a row with nothing to attend to
    out, w = attn_ops.dot_product_attention(q, k, v, mask=mask)
    ref_out, ref_w = ref.attention(q, k, v, mask)
    np.testing.assert_allclose(to_np(w), ref_w, atol=1e-5)
    np.testing.assert_allclose(to_np(out), ref_out, atol=1e-5)
    assert np.all(to_np(out)[0, 1] == 0.0)
    with pytest.raises(ValueError, match="key"):
        attn_ops.dot_product_attention(q, np.zeros((2, 5, 3), "float32"), v)
    with pytest.raises(ValueError, match="dropout_rate"):
        attn_ops.dot_product_attention(q, k, v, dropout_rate=1.5)
    for implementation in ("dense", "chunked"):
        with pytest.raises(ValueError, match="`mask`.*Received: mask.shape=\\(4, 4\\)"):
            attn_ops.dot_product_attention(q, k, v, mask=np.ones((4, 4), bool),
                                           implementation=implementation)


def test_dot_product_attention_dropout_only_in_training():
    q = np.random.randn(1, 4, 8).astype("float32")
    out_eval, _ = attn_ops.dot_product_attention(q, q, q, dropout_rate=0.5, training=False)
    want, _ = ref.attention(q, q, q, np.ones((1, 4, 4), bool))
    np.testing.assert_allclose(to_np(out_eval), want, atol=1e-5)
    out_train, _ = attn_ops.dot_product_attention(q, q, q, dropout_rate=0.5, training=True,
                                                  seed=3)
    assert not np.allclose(to_np(out_train), want, atol=1e-3)


@st.composite
def scores_and_mask(draw):
    batch = draw(st.integers(1, 3))
    rows = draw(st.integers(1, 5))
    cols = draw(st.integers(1, 7))
    scores = draw(hnp.arrays(np.float32, (batch, rows, cols),
                             elements=st.floats(-30, 30, width=32)))
    mask = draw(hnp.arrays(np.bool_, (batch, rows, cols)))
    if draw(st.booleans()):
        mask[0, 0] = False  # force a fully masked row
    return scores, mask


@pytest.mark.parametrize("dtype", DTYPES)
@settings(max_examples=examples(25), deadline=None)
@given(data=scores_and_mask())
def test_masked_softmax_properties(dtype, data):
    scores, mask = data
    x = keras.ops.cast(scores, dtype)
    assert keras.ops.dtype(attn_ops.masked_softmax(x, mask=mask)) == dtype
    y32, (g32,) = value_and_grads(lambda x: attn_ops.masked_softmax(x, mask=mask), [x],
                                  np.ones(scores.shape))
    assert np.all(np.isfinite(y32)) and np.all(np.isfinite(g32))
    assert np.all(y32[~mask] == 0.0)
    row_sums = y32.sum(-1)
    expected = mask.any(-1).astype(np.float32)
    np.testing.assert_allclose(row_sums, expected, atol=TOL[dtype] * scores.shape[-1])
    want = ref.masked_softmax(to_np(x), mask)
    np.testing.assert_allclose(y32, want, atol=TOL[dtype] * 2)


@st.composite
def attention_inputs(draw):
    batch, heads = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    t, s, d, dv = (draw(st.integers(1, 6)) for _ in range(4))
    arrays = [
        draw(hnp.arrays(np.float32, shape, elements=st.floats(-3, 3, width=32)))
        for shape in ((batch, heads, t, d), (batch, heads, s, d), (batch, heads, s, dv))
    ]
    mask = draw(hnp.arrays(np.bool_, (batch, t, s)))
    return (*arrays, mask)


@pytest.mark.parametrize("dtype", DTYPES)
@settings(max_examples=examples(20), deadline=None)
@given(data=attention_inputs())
def test_dot_product_attention_properties(dtype, data):
    q, k, v, mask = data
    tq, tk, tv = (keras.ops.cast(a, dtype) for a in (q, k, v))
    w32 = to_np(attn_ops.dot_product_attention(tq, tk, tv, mask=mask[:, None])[1])
    out32, grads = value_and_grads(
        lambda q, k, v: attn_ops.dot_product_attention(q, k, v, mask=mask[:, None])[0],
        [tq, tk, tv], np.ones(q.shape[:-1] + v.shape[-1:]))
    assert np.all(np.isfinite(out32)) and np.all(np.isfinite(w32))
    for g in grads:
        assert np.all(np.isfinite(to_np(g)))
    empty_rows = ~mask.any(-1)  # (B, T): these attend nowhere -> zero outputs
    assert np.all(out32.transpose(0, 2, 1, 3)[empty_rows] == 0.0)
    ref_out, ref_w = ref.attention(*(to_np(a) for a in (tq, tk, tv)), mask[:, None])
    np.testing.assert_allclose(w32, ref_w, atol=TOL[dtype] * 4)
    np.testing.assert_allclose(out32, ref_out, atol=TOL[dtype] * 20)
