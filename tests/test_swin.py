"""Swin pieces: the shifted-window mask against an explicit construction, window attention
against a per-window NumPy reference with the relative position bias, whole blocks with and
without shift against NumPy, patch embedding and merging, and the layer contract."""

import numpy as np
import pytest
import reference as ref
from backend_utils import rand, to_np
from layer_test_utils import run_layer_test

import keras_attn as ka
from keras_attn.layers.swin import (
    relative_position_index,
    shifted_window_mask,
    window_partition,
    window_reverse,
)

rng = np.random.default_rng(0)


def np_windows(x, m):
    """(B, H, W, C) -> list over (b, window row, window col) of (M², C), plain loops."""
    b, h, w, _ = x.shape
    return [x[i, r:r + m, c:c + m].reshape(m * m, -1)
            for i in range(b) for r in range(0, h, m) for c in range(0, w, m)]


def np_shift_mask(h, w, m, s):
    """Each token of the grid shifted by -s remembers whether its row / column wrapped around;
    two tokens of a window may attend iff they wrapped alike on both axes."""
    label = np.zeros((h, w), int)
    for i in range(h):
        for j in range(w):
            label[i, j] = 2 * int(i + s >= h) + int(j + s >= w)
    windows = np_windows(label[None, :, :, None], m)
    n = m * m
    mask = np.zeros((len(windows), n, n), bool)
    for k, win in enumerate(windows):
        for a in range(n):
            for b in range(n):
                mask[k, a, b] = win[a, 0] == win[b, 0]
    return mask


@pytest.mark.parametrize("h,w,m,s", [(8, 8, 4, 2), (6, 9, 3, 1), (4, 8, 4, 3), (8, 4, 2, 0)])
def test_shifted_window_mask_matches_explicit_construction(h, w, m, s):
    np.testing.assert_array_equal(shifted_window_mask(h, w, m, s), np_shift_mask(h, w, m, s))


def test_window_partition_matches_loops_and_reverses():
    x = rand(2, 6, 9, 3)
    windows = to_np(window_partition(x, 3))
    np.testing.assert_array_equal(windows, np.stack(np_windows(x, 3)))
    np.testing.assert_array_equal(to_np(window_reverse(windows, 3, 6, 9)), x)


def np_softmax(z, mask):
    z = np.where(mask, z, -np.inf)
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_window_attention(layer, windows, mask=None):
    """Per window, per head: softmax(q kᵀ/√d + B) v, B read from the table by explicit
    relative coordinates."""
    m, heads = layer.window_size, layer.num_heads
    table = to_np(layer.relative_position_bias_table)
    wq, bq, wk, bk, wv, bv, wo, bo = (to_np(v) for v in (
        layer.query_dense.kernel, layer.query_dense.bias, layer.key_dense.kernel,
        layer.key_dense.bias, layer.value_dense.kernel, layer.value_dense.bias,
        layer.output_dense.kernel, layer.output_dense.bias))
    n, d = m * m, wq.shape[1] // heads
    bias = np.zeros((heads, n, n))
    for a in range(n):
        for b in range(n):
            (ya, xa), (yb, xb) = divmod(a, m), divmod(b, m)
            bias[:, a, b] = table[(ya - yb + m - 1) * (2 * m - 1) + (xa - xb + m - 1)]
    out = []
    for k, win in enumerate(windows):
        q, kk, v = win @ wq + bq, win @ wk + bk, win @ wv + bv
        heads_out = []
        for h in range(heads):
            sl = slice(h * d, (h + 1) * d)
            scores = q[:, sl] @ kk[:, sl].T / np.sqrt(d) + bias[h]
            keep = np.ones((n, n), bool) if mask is None else mask[k]
            heads_out.append(np_softmax(scores, keep) @ v[:, sl])
        out.append(np.concatenate(heads_out, -1) @ wo + bo)
    return np.stack(out)


def test_relative_position_index_values():
    index = relative_position_index(3)
    assert index.shape == (9, 9) and index.min() == 0 and index.max() == 24
    np.testing.assert_array_equal(np.diag(index), 12)  # offset (0, 0) is the centre of 5 × 5
    assert index[0, 8] == 0 and index[8, 0] == 24  # (-2, -2) and (+2, +2)


def test_window_attention_matches_numpy_with_bias():
    layer = ka.WindowAttention(num_heads=2, window_size=3)
    windows = rand(4, 9, 6)
    layer(windows)
    layer.relative_position_bias_table.assign(rand(25, 2))
    mask = rng.random((4, 9, 9)) < 0.7
    mask[:, np.arange(9), np.arange(9)] = True
    np.testing.assert_allclose(to_np(layer(windows, attention_mask=mask)),
                               np_window_attention(layer, windows, mask), rtol=1e-4, atol=1e-5)


def np_layer_norm(x, layer):
    return ref.layer_norm(x, to_np(layer.gamma), to_np(layer.beta), layer.epsilon)


@pytest.mark.parametrize("shift", [0, 2])
def test_swin_block_matches_numpy(shift):
    x = rand(2, 8, 4, 8)
    block = ka.SwinBlock(num_heads=2, window_size=4, shift_size=shift)
    block(x)
    block.attention.relative_position_bias_table.assign(rand(49, 2))
    out = to_np(block(x))
    h = np.roll(np_layer_norm(x, block.norm1), (-shift, -shift), axis=(1, 2))
    mask = np.tile(np_shift_mask(8, 4, 4, shift), (2, 1, 1))  # all True when shift = 0
    attended = np_window_attention(block.attention, np_windows(h, 4), mask)
    h = np.roll(to_np(window_reverse(attended, 4, 8, 4)), (shift, shift), axis=(1, 2))
    x1 = x + h
    expected = x1 + to_np(block.mlp(np_layer_norm(x1, block.norm2)))
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_zero_shift_equals_plain_window_attention():
    x = rand(2, 8, 8, 8)
    block = ka.SwinBlock(num_heads=2, window_size=4, shift_size=0)
    _, weights = block(x, return_attention_scores=True)
    windows = window_partition(block.norm1(x), 4)
    _, plain = block.attention(windows, return_attention_scores=True)
    np.testing.assert_allclose(to_np(weights), to_np(plain).reshape(2, 4, 2, 16, 16), atol=1e-6)


def test_shifted_block_keeps_wrapped_tokens_apart():
    block = ka.SwinBlock(num_heads=2, window_size=4, shift_size=2)
    _, weights = block(rand(1, 8, 8, 8), return_attention_scores=True)
    weights = to_np(weights)[0]  # (nW, H, 16, 16)
    forbidden = ~shifted_window_mask(8, 8, 4, 2)[:, None]
    assert forbidden.any()
    np.testing.assert_array_equal(np.where(forbidden, weights, 0), 0)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)


def test_patch_embedding_is_a_linear_map_per_patch():
    images = rand(2, 8, 6, 3)
    layer = ka.PatchEmbedding(patch_size=2, hidden_dim=5, use_norm=False)
    out = to_np(layer(images))
    kernel, bias = (to_np(w) for w in layer.projection.weights)  # (2, 2, 3, 5), (5,)
    patches = images.reshape(2, 4, 2, 3, 2, 3).transpose(0, 1, 3, 2, 4, 5)  # (B, 4, 3, p, p, c)
    expected = patches.reshape(2, 4, 3, 12) @ kernel.reshape(12, 5) + bias
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_patch_merging_matches_numpy():
    x = rand(2, 4, 6, 3)
    layer = ka.PatchMerging(output_dim=5)
    out = to_np(layer(x))
    merged = np.concatenate([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2],
                             x[:, 1::2, 1::2]], -1)  # (2, 2, 3, 12)
    expected = np_layer_norm(merged, layer.norm) @ to_np(layer.reduction.kernel)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


CONTRACT_CASES = [
    ("window_attention", ka.WindowAttention, {"num_heads": 2, "window_size": 2, "dropout": 0.1},
     {"query": rand(6, 4, 8), "attention_mask": shifted_window_mask(4, 6, 2, 1)}, (6, 4, 8)),
    ("swin_block_shifted", ka.SwinBlock, {"num_heads": 2, "window_size": 2, "shift_size": 1,
                                          "mlp_ratio": 2.0, "dropout": 0.1},
     {"inputs": rand(2, 4, 4, 8)}, (2, 4, 4, 8)),
    ("patch_embedding", ka.PatchEmbedding, {"patch_size": 2, "hidden_dim": 8},
     {"inputs": rand(2, 4, 6, 1)}, (2, 2, 3, 8)),
    ("patch_merging", ka.PatchMerging, {"output_dim": 6}, {"inputs": rand(2, 4, 4, 4)},
     (2, 2, 2, 6)),
]


@pytest.mark.parametrize("layer_cls,init_kwargs,inputs,expected",
                         [c[1:] for c in CONTRACT_CASES], ids=[c[0] for c in CONTRACT_CASES])
def test_layer_contract(layer_cls, init_kwargs, inputs, expected, tmp_path):
    run_layer_test(layer_cls, init_kwargs, inputs, expected, tmp_path)


@pytest.mark.parametrize(
    "make,name",
    [(lambda: ka.SwinBlock(2, 4, shift_size=4), "shift_size"),
     (lambda: ka.SwinBlock(2, 0), "window_size"),
     (lambda: ka.SwinBlock(2, 4, mlp_ratio=0), "mlp_ratio"),
     (lambda: ka.WindowAttention(0, 4), "num_heads"),
     (lambda: ka.PatchEmbedding(0, 8), "patch_size"),
     (lambda: ka.SwinBlock(2, 3)(np.zeros((1, 4, 4, 8), "float32")), "window_size=3"),
     (lambda: ka.SwinBlock(3, 2)(np.zeros((1, 4, 4, 8), "float32")), "num_heads"),
     (lambda: ka.WindowAttention(2, 2)(np.zeros((1, 5, 8), "float32")), "window_size")],
)
def test_bad_arguments(make, name):
    with pytest.raises(ValueError, match=name):
        make()
