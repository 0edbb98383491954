"""Self-tests of tests/reference.py against torch, keras, keras-hub and hand-worked values."""

import ast
import math
from pathlib import Path

import keras
import numpy as np
import pytest
import reference as ref

torch = pytest.importorskip("torch")
F = torch.nn.functional


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Overrides conftest's per-test fixture: these tests seed their own generators, and
    one ``clear_session`` per module (below) replaces one per test, each costing a full
    garbage collection (~0.4 s with torch loaded)."""
    keras.config.set_dtype_policy("float32")
    yield


@pytest.fixture(autouse=True, scope="module")
def _clear_keras_once():
    yield
    keras.config.set_dtype_policy("float32")
    keras.backend.clear_session()


def _rng(seed=0):
    return np.random.default_rng(seed)


def _t(x, grad=False):
    return torch.tensor(np.asarray(x, dtype=np.float64), requires_grad=grad)


def _torch_attention(q, k, v, d_out, mask=None, bias=None, scale=None, enable_gqa=False):
    """torch SDPA outputs and autograd gradients of sum(out * d_out) (dbias None without bias)."""
    tq, tk, tv = _t(q, True), _t(k, True), _t(v, True)
    tb = _t(bias, True) if bias is not None else None
    attn_mask = None
    if mask is not None:
        attn_mask = torch.tensor(mask)
        if tb is not None:
            attn_mask = tb.masked_fill(~attn_mask, float("-inf"))
    elif tb is not None:
        attn_mask = tb
    out = F.scaled_dot_product_attention(
        tq, tk, tv, attn_mask=attn_mask, scale=scale, enable_gqa=enable_gqa
    )
    (out * _t(d_out)).sum().backward()
    grads = [t.grad.numpy() for t in (tq, tk, tv)]
    return out.detach().numpy(), grads, (tb.grad.numpy() if tb is not None else None)


def _qkvo(rng, lead, T, S, d, dv):
    return (
        rng.standard_normal(lead + (T, d)),
        rng.standard_normal(lead + (S, d)),
        rng.standard_normal(lead + (S, dv)),
        rng.standard_normal(lead + (T, dv)),
    )


# ---------------------------------------------------------------------------------------
# Attention and its gradients
# ---------------------------------------------------------------------------------------

B, H, T, S, D, DV = 2, 3, 5, 7, 4, 6


@pytest.mark.parametrize("use_mask", [False, True])
@pytest.mark.parametrize("use_bias", [False, True])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_attention_and_grads_match_torch(use_mask, use_bias, scale):
    rng = _rng(1)
    q, k, v, d_out = _qkvo(rng, (B, H), T, S, D, DV)
    mask = bias = None
    if use_mask:  # (B, 1, T, S): shared by heads; every row keeps its diagonal visible
        mask = rng.random((B, 1, T, S)) < 0.5
        mask |= np.eye(T, S, dtype=bool)
    if use_bias:  # (H, T, S): shared by the batch, so dbias sums over it
        bias = rng.standard_normal((H, T, S))
    out, w = ref.attention(q, k, v, mask=mask, bias=bias, scale=scale)
    grads = ref.attention_grads(q, k, v, d_out, mask=mask, bias=bias, scale=scale)
    t_out, t_grads, t_dbias = _torch_attention(q, k, v, d_out, mask, bias, scale)
    np.testing.assert_allclose(out, t_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-12)
    for mine, theirs in zip(grads[:3], t_grads, strict=True):
        assert mine.shape == theirs.shape
        np.testing.assert_allclose(mine, theirs, rtol=1e-9, atol=1e-11)
    if use_bias:
        assert grads[3].shape == bias.shape
        np.testing.assert_allclose(grads[3], t_dbias, rtol=1e-9, atol=1e-11)
    else:
        assert grads[3].shape == (B, H, T, S)


def test_attention_rows_with_visible_keys_match_torch_with_fully_masked_rows():
    rng = _rng(2)
    q, k, v, _ = _qkvo(rng, (B, H), T, S, D, DV)
    mask = rng.random((B, H, T, S)) < 0.4
    mask[0, 1, 2] = False
    mask[1, :, 4] = False
    out, w = ref.attention(q, k, v, mask=mask)
    t_out = F.scaled_dot_product_attention(_t(q), _t(k), _t(v), attn_mask=torch.tensor(mask))
    visible = mask.any(-1)
    np.testing.assert_allclose(out[visible], t_out.numpy()[visible], rtol=1e-10, atol=1e-12)
    assert np.all(out[~visible] == 0.0) and np.all(w[~visible] == 0.0)


def test_grouped_query_attention_matches_torch_enable_gqa():
    rng = _rng(3)
    hq, hkv = 8, 2
    g = hq // hkv
    q, _, _, d_out = _qkvo(rng, (B, hq), T, S, D, DV)
    _, k, v, _ = _qkvo(rng, (B, hkv), T, S, D, DV)
    mask = np.broadcast_to(ref.causal_mask(T, S, offset=S - T), (B, 1, T, S))
    t_out, (t_dq, t_dk, t_dv), _ = _torch_attention(q, k, v, d_out, mask, enable_gqa=True)

    # Query head h reads kv head h // g: the group axis sits after the kv-head axis.
    def grouped(x):
        return x.reshape(B, hkv, g, *x.shape[2:])

    kg, vg, mg = k[:, :, None], v[:, :, None], mask[:, :, None]
    out, _ = ref.attention(grouped(q), kg, vg, mask=mg)
    dq, dk, dv, _ = ref.attention_grads(grouped(q), kg, vg, grouped(d_out), mask=mg)
    np.testing.assert_allclose(out.reshape(B, hq, T, DV), t_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dq.reshape(B, hq, T, D), t_dq, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(dk[:, :, 0], t_dk, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(dv[:, :, 0], t_dv, rtol=1e-9, atol=1e-11)


def test_fully_masked_row_is_zero_and_adds_no_gradient():
    rng = _rng(4)
    q, k, v, d_out = _qkvo(rng, (B,), T, S, D, DV)
    mask = np.ones((B, T, S), dtype=bool)
    mask[:, 1] = False
    out, w = ref.attention(q, k, v, mask=mask)
    dq, dk, dv, ds = ref.attention_grads(q, k, v, d_out, mask=mask)
    for x in (out[:, 1], w[:, 1], dq[:, 1], ds[:, 1]):
        assert np.all(x == 0.0)
    # dk, dv are those of the same attention without the dead query row.
    keep = [i for i in range(T) if i != 1]
    _, dk2, dv2, _ = ref.attention_grads(q[:, keep], k, v, d_out[:, keep])
    np.testing.assert_allclose(dk, dk2, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(dv, dv2, rtol=1e-12, atol=1e-14)
    # An all-masked input gives zeros everywhere, never NaN and never uniform weights.
    out0, w0 = ref.attention(q, k, v, mask=np.zeros((T, S), dtype=bool))
    assert np.all(out0 == 0.0) and np.all(w0 == 0.0)


@pytest.mark.parametrize("poison", [np.nan, np.inf])
def test_non_finite_values_at_masked_keys_change_nothing(poison):
    rng = _rng(5)
    q, k, v, d_out = _qkvo(rng, (B, H), T, S, D, DV)
    lens = np.array([4, 6])
    mask = ref.length_mask(lens, T, S)[:, None]  # (B, 1, 1, S)
    bias = rng.standard_normal((1, H, T, S))
    clean = ref.attention(q, k, v, mask, bias), ref.attention_grads(q, k, v, d_out, mask, bias)
    kp, vp = k.copy(), v.copy()
    for b, n in enumerate(lens):
        kp[b, :, n:] = poison
        vp[b, :, n:] = poison
    dirty = ref.attention(q, kp, vp, mask, bias), ref.attention_grads(q, kp, vp, d_out, mask, bias)
    for c, p in zip(clean[0] + clean[1], dirty[0] + dirty[1], strict=True):
        assert np.all(np.isfinite(p))
        np.testing.assert_array_equal(c, p)
    dk, dv = dirty[1][1], dirty[1][2]
    for b, n in enumerate(lens):
        assert np.all(dk[b, :, n:] == 0.0) and np.all(dv[b, :, n:] == 0.0)


def test_non_finite_query_rows_that_see_nothing_change_nothing():
    rng = _rng(16)
    q, k, v, d_out = _qkvo(rng, (B,), T, S, D, DV)
    mask = np.ones((B, T, S), dtype=bool)
    mask[:, 3] = False  # padded query row
    clean = ref.attention(q, k, v, mask) + ref.attention_grads(q, k, v, d_out, mask)
    qp, dp = q.copy(), d_out.copy()
    qp[:, 3] = np.nan
    dp[:, 3] = np.inf
    dirty = ref.attention(qp, k, v, mask) + ref.attention_grads(qp, k, v, dp, mask)
    for c, p in zip(clean, dirty, strict=True):
        assert np.all(np.isfinite(p))
        np.testing.assert_array_equal(c, p)


@pytest.mark.parametrize("soft_cap", [None, 0.7])
def test_grads_match_finite_differences(soft_cap):
    rng = _rng(6)
    q, k, v, d_out = _qkvo(rng, (), 3, 4, 2, 3)
    q = 3.0 * q  # scores past the soft cap's linear range
    bias = rng.standard_normal((3, 4))
    mask = ref.causal_mask(3, 4, offset=1)

    def loss(q, k, v, bias):
        return np.sum(ref.attention(q, k, v, mask, bias, soft_cap=soft_cap)[0] * d_out)

    args = [q, k, v, bias]
    grads = ref.attention_grads(q, k, v, d_out, mask, bias, soft_cap=soft_cap)
    eps = 1e-6
    for a, g in zip(range(4), grads, strict=True):
        num = ref.numeric_gradient(lambda t, a=a: loss(*args[:a], t, *args[a + 1:]), args[a], eps)
        np.testing.assert_allclose(g, num, rtol=1e-6, atol=1e-8)


# ---------------------------------------------------------------------------------------
# Masks
# ---------------------------------------------------------------------------------------


def test_mask_builders():
    np.testing.assert_array_equal(ref.causal_mask(4, 4), np.tril(np.ones((4, 4), bool)))
    np.testing.assert_array_equal(ref.causal_mask(2, 5, offset=3), np.tril(np.ones((2, 5)), 3) > 0)
    lm = ref.length_mask(np.array([0, 2, 5]), 3, 5)
    assert lm.shape == (3, 1, 5)
    np.testing.assert_array_equal(lm.sum(-1)[:, 0], [0, 2, 5])
    lm2 = ref.length_mask(np.array([[1, 2, 3], [3, 3, 0]]), 3, 4)
    assert lm2.shape == (2, 3, 4)
    np.testing.assert_array_equal(lm2.sum(-1), [[1, 2, 3], [3, 3, 0]])
    band = ref.band_mask(5, 7, window=1, offset=2)
    assert band[0].tolist() == [False, True, True, True, False, False, False]
    np.testing.assert_array_equal(ref.keras_sliding_window_mask(5, 7, 2), ref.band_mask(5, 7, 1))


@pytest.mark.parametrize("T,S,w", [(5, 5, 2), (4, 7, 3), (6, 3, 1)])
def test_keras_sliding_window_mask_matches_multi_head_attention(T, S, w):
    layer = keras.layers.MultiHeadAttention(num_heads=1, key_dim=2, sliding_window=w)
    rng = _rng(7)
    query = rng.standard_normal((1, T, 3)).astype("float32")
    value = rng.standard_normal((1, S, 3)).astype("float32")
    _, scores = layer(query, value, return_attention_scores=True)
    visible = keras.ops.convert_to_numpy(scores)[0, 0] > 0
    np.testing.assert_array_equal(visible, ref.keras_sliding_window_mask(T, S, w))


# ---------------------------------------------------------------------------------------
# ALiBi
# ---------------------------------------------------------------------------------------


def test_alibi_slopes_follow_the_paper_code():
    np.testing.assert_array_equal(ref.alibi_slopes(8), 2.0 ** -np.arange(1, 9))
    # 6 heads: the 4-head slopes, then every other 8-head slope (2^-1, 2^-3).
    six = [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]
    # 12 heads: the 8-head slopes, then 16-head slopes 2^(-0.5 (h+1)) at h = 0, 2, 4, 6.
    twelve = [2.0**-h for h in range(1, 9)] + [2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5]
    np.testing.assert_allclose(ref.alibi_slopes(6), six, rtol=1e-15)
    np.testing.assert_allclose(ref.alibi_slopes(12), twelve, rtol=1e-15)
    assert ref.alibi_slopes(1).tolist() == [2**-8]


def test_alibi_bias_convention():
    slopes = ref.alibi_slopes(4)
    causal = ref.alibi_bias(4, 3, 6, offset=3)
    i, j = 1, 2  # query at position 4 sees key 2 at distance 2
    np.testing.assert_allclose(causal[:, i, j], -slopes * 2)
    assert np.all(causal[:, 2, 5] == 0.0)  # the key at the query's own position
    sym = ref.alibi_bias(4, 3, 6, offset=0, symmetric=True)
    np.testing.assert_allclose(sym[:, 0, 5], -slopes * 5)
    # The paper code's bias slope * j is a per-row constant away.
    paper = slopes[:, None, None] * np.arange(6)
    diff = causal - paper
    np.testing.assert_allclose(diff, diff[..., :1] * np.ones(6), atol=1e-12)


@pytest.mark.parametrize("num_heads", [4, 6])
def test_alibi_matches_keras_hub_up_to_row_constant(num_heads):
    keras_hub = pytest.importorskip("keras_hub")
    T_, S_ = 3, 6
    rng = _rng(8)
    scores = rng.standard_normal((2, num_heads, T_, S_)).astype("float32")
    layer = keras_hub.layers.AlibiBias()
    theirs = keras.ops.convert_to_numpy(layer(scores)) - scores
    kh = ref.keras_hub_alibi_bias(num_heads, S_)
    assert kh.shape == (1, num_heads, 1, S_)
    np.testing.assert_allclose(theirs, np.broadcast_to(kh, theirs.shape), rtol=1e-6, atol=1e-6)
    ours = ref.alibi_bias(num_heads, T_, S_, offset=S_ - T_)
    np.testing.assert_allclose(ours[:, -1], kh[0, :, 0], atol=1e-12)  # last query: no shift

    def softmax(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    np.testing.assert_allclose(softmax(scores + kh), softmax(scores + ours), rtol=1e-12)
    mask = ref.causal_mask(T_, S_, offset=S_ - T_)
    q, k, v = (rng.standard_normal((2, num_heads, n, 4)) for n in (T_, S_, S_))
    np.testing.assert_allclose(
        ref.attention(q, k, v, mask, bias=kh)[0],
        ref.attention(q, k, v, mask, bias=ours)[0],
        rtol=1e-12,
    )


# ---------------------------------------------------------------------------------------
# T5 relative position buckets
# ---------------------------------------------------------------------------------------


def test_t5_buckets_hand_values():
    def bucket(rel, **kw):
        return int(ref.t5_relative_position_bucket(np.array(rel), **kw))

    # bidirectional, 32 buckets -> 16 per direction, 8 exact distances each.
    assert bucket(0) == 0
    assert bucket(-1) == 1 and bucket(-7) == 7
    assert bucket(1) == 17 and bucket(7) == 23  # keys after the query: upper half
    assert bucket(-8) == 8  # 8 + int(log(1) ...)
    assert bucket(-12) == 8 + int(math.log(12 / 8) / math.log(128 / 8) * 8) == 9
    assert bucket(-128) == bucket(-1000) == 15 and bucket(1000) == 31
    # unidirectional: keys after the query share bucket 0; 16 exact distances.
    assert bucket(5, bidirectional=False) == 0
    assert bucket(-5, bidirectional=False) == 5
    assert bucket(-20, bidirectional=False) == 16 + int(math.log(20 / 16) / math.log(8) * 16)
    assert bucket(-20, bidirectional=False) == 17
    assert bucket(-200, bidirectional=False) == 31


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 64)])
def test_t5_buckets_monotonic_and_in_range(bidirectional, num_buckets, max_distance):
    n = np.arange(0, 400)
    before = ref.t5_relative_position_bucket(-n, bidirectional, num_buckets, max_distance)
    assert np.all(np.diff(before) >= 0) and before.max() == (num_buckets // (1 + bidirectional)) - 1
    assert np.all(before[n >= max_distance] == before.max())
    if bidirectional:
        after = ref.t5_relative_position_bucket(n, True, num_buckets, max_distance)
        assert np.all(np.diff(after[1:]) >= 0)
        assert np.all(after[1:] >= num_buckets // 2) and after.max() == num_buckets - 1


def test_t5_bias_gathers_the_table():
    rng = _rng(9)
    table = rng.standard_normal((32, 3))
    bias = ref.t5_bias(table, 4, 6, bidirectional=True, offset=2)
    assert bias.shape == (3, 4, 6)
    for i, j in [(0, 0), (1, 5), (3, 2)]:
        rel = j - (i + 2)
        np.testing.assert_array_equal(bias[:, i, j], table[ref.t5_relative_position_bucket(rel)])


# ---------------------------------------------------------------------------------------
# RoPE
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("start_index", [0, 5])
@pytest.mark.parametrize("max_wavelength,scaling_factor", [(10000, 1.0), (100, 2.5)])
def test_rope_matches_keras_hub(start_index, max_wavelength, scaling_factor):
    keras_hub = pytest.importorskip("keras_hub")
    rng = _rng(10)
    layer = keras_hub.layers.RotaryEmbedding(
        max_wavelength=max_wavelength, scaling_factor=scaling_factor
    )
    positions = start_index + np.arange(6)
    x = rng.standard_normal((2, 6, 8)).astype("float32")
    theirs = keras.ops.convert_to_numpy(layer(x, start_index=start_index))
    mine = ref.rope(x, positions, max_wavelength, scaling_factor)
    np.testing.assert_allclose(mine, theirs, atol=1e-5)
    # (B, T, heads, d): the layer's default sequence axis 1, ours -2.
    x4 = rng.standard_normal((2, 6, 3, 8)).astype("float32")
    theirs4 = keras.ops.convert_to_numpy(layer(x4, start_index=start_index))
    mine4 = np.swapaxes(
        ref.rope(np.swapaxes(x4, 1, 2), positions, max_wavelength, scaling_factor), 1, 2
    )
    np.testing.assert_allclose(mine4, theirs4, atol=1e-5)


def test_rope_rotates_pairs_and_matches_interleaved_after_permutation():
    rng = _rng(11)
    d = 10
    x = rng.standard_normal((3, 7, d))
    pos = np.arange(7) + 3
    y = ref.rope(x, pos)
    h = d // 2

    def pair_norms(z):
        return np.hypot(z[..., :h], z[..., h:])

    np.testing.assert_allclose(pair_norms(y), pair_norms(x), rtol=1e-12)
    np.testing.assert_allclose(ref.rope(x, np.zeros(7)), x)  # position 0 is the identity
    # Relative property: <rope(q, m), rope(k, n)> depends on m - n only.
    q, k = rng.standard_normal((2, d))
    dot = [np.dot(ref.rope(q[None], [m])[0], ref.rope(k[None], [m - 2])[0]) for m in (2, 9)]
    np.testing.assert_allclose(dot[0], dot[1], rtol=1e-12)
    perm = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])
    np.testing.assert_allclose(ref.rope(x[..., perm], pos), ref.rope_interleaved(x, pos)[..., perm])


# ---------------------------------------------------------------------------------------
# Normalization
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [1e-6, 0.5])
def test_rms_norm_matches_keras(epsilon):
    rng = _rng(12)
    x = rng.standard_normal((2, 3, 8)).astype("float32")
    scale = rng.standard_normal(8).astype("float32")
    layer = keras.layers.RMSNormalization(epsilon=epsilon)
    layer.build(x.shape)
    layer.scale.assign(scale)
    theirs = keras.ops.convert_to_numpy(layer(x))
    np.testing.assert_allclose(ref.rms_norm(x, scale, epsilon), theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("epsilon", [1e-3, 0.5])
def test_layer_norm_matches_keras(epsilon):
    rng = _rng(13)
    x = rng.standard_normal((2, 3, 8)).astype("float32") * 3 + 1
    gamma, beta = rng.standard_normal((2, 8)).astype("float32")
    layer = keras.layers.LayerNormalization(epsilon=epsilon)
    layer.build(x.shape)
    layer.gamma.assign(gamma)
    layer.beta.assign(beta)
    theirs = keras.ops.convert_to_numpy(layer(x))
    mine = ref.layer_norm(x, gamma, beta, epsilon)
    np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------
# Gated FFN
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "activation,approximate",
    [("swish", False), ("silu", False), ("gelu", False), ("gelu", True)],
)
@pytest.mark.parametrize("with_bias", [False, True])
def test_gated_ffn_matches_torch(activation, approximate, with_bias):
    rng = _rng(14)
    d, f, do = 6, 10, 5
    x = rng.standard_normal((2, 3, d))
    wg, wu, wd = (
        rng.standard_normal((d, f)),
        rng.standard_normal((d, f)),
        rng.standard_normal((f, do)),
    )
    bg, bu, bd = (rng.standard_normal(n) for n in (f, f, do)) if with_bias else (None,) * 3
    mine = ref.gated_ffn(x, wg, wu, wd, activation, bg, bu, bd, approximate=approximate)

    def lin(z, w, b):
        return F.linear(z, _t(w).T, None if b is None else _t(b))

    if activation == "gelu":
        act = lambda z: F.gelu(z, approximate="tanh" if approximate else "none")
    else:
        act = F.silu
    tx = _t(x)
    theirs = lin(act(lin(tx, wg, bg)) * lin(tx, wu, bu), wd, bd).numpy()
    np.testing.assert_allclose(mine, theirs, rtol=1e-12, atol=1e-12)


def test_gelu_variants_differ_and_erf_is_exact():
    z = np.linspace(-4, 4, 17)
    np.testing.assert_allclose(ref.gelu(z), F.gelu(_t(z)).numpy(), rtol=1e-14, atol=1e-15)
    assert np.max(np.abs(ref.gelu(z) - ref.gelu(z, approximate=True))) > 1e-5


# ---------------------------------------------------------------------------------------
# Sampling and length penalty
# ---------------------------------------------------------------------------------------


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_sampling_distribution_properties():
    rng = _rng(15)
    logits = rng.standard_normal((4, 11)) * 2
    argmax = np.argmax(logits, -1)
    onehot = np.eye(11)[argmax]
    for kw in [{}, {"top_k": 3}, {"top_p": 0.7}, {"top_k": 5, "top_p": 0.5, "temperature": 0.7}]:
        p = ref.sampling_distribution(logits, **kw)
        np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-12)
        assert np.all(p >= 0)
    np.testing.assert_array_equal(ref.sampling_distribution(logits, top_k=1), onehot)
    np.testing.assert_array_equal(ref.sampling_distribution(logits, top_p=1e-9), onehot)
    np.testing.assert_array_equal(ref.sampling_distribution(logits, temperature=0), onehot)
    np.testing.assert_allclose(ref.sampling_distribution(logits, temperature=1e-4), onehot)
    for temp in (0.5, 1.0, 3.0):
        np.testing.assert_allclose(
            ref.sampling_distribution(logits, temperature=temp, top_k=11, top_p=1.0),
            _softmax(logits / temp),
            rtol=1e-12,
        )
    # top-k keeps exactly k, the k largest.
    p3 = ref.sampling_distribution(logits, top_k=3)
    assert np.all((p3 > 0).sum(-1) == 3)
    np.testing.assert_array_equal(
        np.sort(np.argsort(-p3)[:, :3]), np.sort(np.argsort(-logits)[:, :3])
    )


def test_sampling_distribution_hand_values():
    # Ties at the k-th place go to the lower index.
    p = ref.sampling_distribution(np.array([1.0, 3.0, 1.0, 1.0]), top_k=2)
    assert (p > 0).tolist() == [True, True, False, False]
    # Nucleus: probabilities 0.5, 0.3, 0.2 (listed out of order).
    logits = np.log(np.array([0.2, 0.5, 0.3]))
    np.testing.assert_allclose(ref.sampling_distribution(logits, top_p=0.5), [0, 1, 0], atol=1e-15)
    np.testing.assert_allclose(ref.sampling_distribution(logits, top_p=0.6), [0, 0.625, 0.375])
    np.testing.assert_allclose(ref.sampling_distribution(logits, top_p=0.81), [0.2, 0.5, 0.3])
    # top-p works on the top-k renormalized distribution: top-2 of (.4, .3, .2, .1) is
    # (4/7, 3/7); with p = 0.55 the first token already reaches p.
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1]))
    np.testing.assert_allclose(ref.sampling_distribution(logits, top_k=2), [4 / 7, 3 / 7, 0, 0])
    np.testing.assert_allclose(
        ref.sampling_distribution(logits, top_k=2, top_p=0.55), [1, 0, 0, 0], atol=1e-15
    )
    # Masked vocabulary entries (-inf) stay at zero.
    p = ref.sampling_distribution(np.array([0.0, -np.inf, 1.0]), temperature=2.0)
    assert p[1] == 0.0 and abs(p.sum() - 1) < 1e-12


def test_gnmt_length_penalty():
    assert ref.gnmt_length_penalty(1, 1.0) == 1.0
    np.testing.assert_allclose(ref.gnmt_length_penalty(7, 0.6), 2**0.6)
    np.testing.assert_allclose(ref.gnmt_length_penalty(np.array([1, 7]), 0.0), [1.0, 1.0])


def test_reference_imports_numpy_only():
    tree = ast.parse(Path(ref.__file__).read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module.split(".")[0])
    assert names <= {"math", "numpy"}, names
