"""The one NumPy reference for the attention kernels and the modern blocks.

Every function here is written straight from its formula, in float64 NumPy, with small
shapes in mind: clarity over speed. Nothing here imports keras, TensorFlow or torch;
``tests/test_reference.py`` checks these functions against torch, keras and keras-hub.

Shape letters: ``T`` queries, ``S`` keys, ``d`` query/key depth, ``dv`` value depth,
``H`` heads, ``B`` batch, ``V`` vocabulary. Leading axes written ``...`` broadcast.

Conventions fixed here (the tests pin each one):

* Masks are boolean, ``True`` = attend. A query row with no visible key gets all-zero
  weights and a zero output (never NaN, never uniform), and zero gradients.
* Masked positions contribute exactly nothing, even when ``k``/``v`` hold NaN or inf there.
* ALiBi: ``alibi_bias`` is ``slope * (j - (i + offset))`` for every key ``j``, i.e. the
  paper's ``-slope * (i - j)`` on the keys at or before the query, extended linearly past
  it (a causal mask removes those). The paper's code and ``keras_hub.layers.AlibiBias``
  add the same linear function shifted by a per-row constant, which softmax ignores.
* Top-k keeps exactly the indices ``np.argsort(-logits, kind="stable")[:k]`` (ties go to
  the lower index); top-p then keeps the shortest sorted prefix whose mass reaches ``p``.
* GELU is the exact erf form unless ``approximate=True`` (the tanh form).
* RoPE is the "rotate half" layout of ``keras_hub.layers.RotaryEmbedding``;
  ``rope_interleaved`` is the RoFormer paper's pairing of dims ``(2i, 2i + 1)``.
"""

import math

import numpy as np

__all__ = [
    "alibi_bias",
    "alibi_slopes",
    "attention",
    "attention_grads",
    "band_mask",
    "causal_mask",
    "combined_mask",
    "gated_ffn",
    "gelu",
    "gnmt_length_penalty",
    "keras_hub_alibi_bias",
    "keras_sliding_window_mask",
    "layer_norm",
    "length_mask",
    "linear_attention",
    "local_band",
    "masked_softmax",
    "multi_head_attention",
    "pretrained_transformer",
    "repetition_penalized",
    "rms_norm",
    "rope",
    "rope_frequencies",
    "rope_interleaved",
    "sampling_distribution",
    "sum_to_shape",
    "t5_bias",
    "t5_relative_position_bucket",
    "torch_multihead_attention",
]


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------


def _f64(x):
    return np.asarray(x, dtype=np.float64)


def sum_to_shape(x, shape):
    """Sums ``x`` over the axes that broadcasting added or stretched, back to ``shape``."""
    shape = tuple(shape)
    x = np.sum(x, axis=tuple(range(x.ndim - len(shape)))) if x.ndim > len(shape) else x
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    return np.sum(x, axis=stretched, keepdims=True) if stretched else x


def _masked_matmul(a, b, mask):
    """``a @ b`` over the key axis, skipping masked keys entirely.

    a: ``(..., T, S)``, b: ``(..., S, n)``, mask: ``(..., T, S)`` bool -> ``(..., T, n)``.
    A masked term is dropped, not multiplied by zero, so NaN/inf in ``b`` there is harmless.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        terms = a[..., :, :, None] * b[..., None, :, :]
    return np.where(mask[..., :, :, None], terms, 0.0).sum(axis=-2)


def _prepare(q, k, v, mask, bias, scale):
    q, k, v = _f64(q), _f64(k), _f64(v)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    score_shape = np.broadcast_shapes(q.shape[:-1] + (1,), k.shape[:-2] + (1, k.shape[-2]))
    if bias is not None:
        bias = _f64(bias)
        score_shape = np.broadcast_shapes(score_shape, bias.shape)
    if mask is None:
        mask = np.ones(score_shape, dtype=bool)
    else:
        mask = np.asarray(mask, dtype=bool)
        score_shape = np.broadcast_shapes(score_shape, mask.shape)
    mask = np.broadcast_to(mask, score_shape)
    return q, k, v, mask, bias, float(scale)


def _attention_weights(q, k, mask, bias, scale, soft_cap=None):
    with np.errstate(invalid="ignore", over="ignore"):
        scores = scale * (q @ np.swapaxes(k, -1, -2))
        if soft_cap is not None:
            scores = soft_cap * np.tanh(scores / soft_cap)
    if bias is not None:
        scores = scores + bias
    scores = np.where(mask, scores, -np.inf)  # masked entries replaced before exp
    row_max = np.max(scores, axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)  # fully masked rows
    e = np.where(mask, np.exp(scores - row_max), 0.0)
    total = np.sum(e, axis=-1, keepdims=True)
    return e / np.where(total > 0, total, 1.0)  # a row with no visible key stays all-zero


# ---------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------


def attention(q, k, v, mask=None, bias=None, scale=None, soft_cap=None):
    """Scaled dot-product attention, softmax(scale * q k^T + bias) v, with a boolean mask;
    with ``soft_cap`` c, softmax(c * tanh(scale * q k^T / c) + bias) v (Gemma's soft-capping).

    Args:
        q: ``(..., T, d)``; k: ``(..., S, d)``; v: ``(..., S, dv)``. Leading axes
            broadcast, so grouped-query attention is a group axis: q ``(B, Hkv, G, T, d)``
            against k, v ``(B, Hkv, 1, S, d)``.
        mask: bool, broadcastable to ``(..., T, S)``; True = attend. None = all visible.
        bias: float, broadcastable to ``(..., T, S)``, added to the scaled scores.
        scale: multiplies ``q k^T``; defaults to ``1 / sqrt(d)``.

    Returns:
        ``(outputs, weights)``: ``(..., T, dv)`` and ``(..., T, S)``. A row with no True
        in the mask has zero weights and a zero output. Masked keys contribute nothing
        even where ``k``/``v`` are NaN or inf.
    """
    q, k, v, mask, bias, scale = _prepare(q, k, v, mask, bias, scale)
    weights = _attention_weights(q, k, mask, bias, scale, soft_cap)
    return _masked_matmul(weights, v, mask), weights


def attention_grads(q, k, v, d_out, mask=None, bias=None, scale=None, soft_cap=None):
    """Analytic gradients of ``sum(attention(q, k, v, mask, bias, scale)[0] * d_out)``.

    With P the weights and dO = ``d_out`` ``(..., T, dv)``::

        dV = P^T dO,   dP = dO V^T,   dS = P * (dP - rowsum(dP * P)),
        dQ = scale * dS K,   dK = scale * dS^T Q,   dbias = dS,

    and with ``soft_cap`` c, dS is first multiplied by ``1 - tanh(scale * q k^T / c)^2``
    for dQ and dK (not for dbias, added after the cap).

    Each gradient is summed over broadcast axes back to its input's shape. Returns
    ``(dq, dk, dv, dbias)``; with ``bias=None``, dbias is dS at the full score shape
    ``(..., T, S)`` (the gradient an additive score bias would get). Fully masked rows
    give zero gradients; every sum skips masked (query, key) entries, so NaN/inf in a
    masked key/value, or in a fully masked query row (or its ``d_out``), leaks into nothing.
    """
    q, k, v, mask, bias, scale = _prepare(q, k, v, mask, bias, scale)
    d_out = _f64(d_out)
    p = _attention_weights(q, k, mask, bias, scale, soft_cap)
    with np.errstate(invalid="ignore", over="ignore"):
        dp = np.where(mask, d_out @ np.swapaxes(v, -1, -2), 0.0)
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    ds_raw = ds
    if soft_cap is not None:
        with np.errstate(invalid="ignore", over="ignore"):
            ds_raw = ds * (1.0 - np.tanh(scale * (q @ np.swapaxes(k, -1, -2)) / soft_cap) ** 2)
        ds_raw = np.where(mask, ds_raw, 0.0)
    mask_t = np.swapaxes(mask, -1, -2)  # (..., S, T): the same entries, summed over T
    dv = _masked_matmul(np.swapaxes(p, -1, -2), d_out, mask_t)
    dq = scale * _masked_matmul(ds_raw, k, mask)
    dk = scale * _masked_matmul(np.swapaxes(ds_raw, -1, -2), q, mask_t)
    dbias = ds if bias is None else sum_to_shape(ds, bias.shape)
    return (
        sum_to_shape(dq, q.shape),
        sum_to_shape(dk, k.shape),
        sum_to_shape(dv, v.shape),
        dbias,
    )


def grouped_attention(q, k, v, allowed, bias=None, d_out=None, soft_cap=None):
    """``attention`` (and, given ``d_out``, ``attention_grads``) of ``(B, H, T, d)`` queries
    against ``(B, H_kv, S, d)`` keys and values, ``H_kv`` dividing ``H`` (grouped-query
    attention), under a ``(B, T, S)`` boolean mask and a bias ``(·, H, T, S)``.

    Returns:
        ``(outputs (B, H, T, dv), [dq, dk, dv(, dbias)] or None)``.
    """
    heads, kv_heads = q.shape[1], k.shape[1]
    grouped = q.reshape((q.shape[0], kv_heads, heads // kv_heads) + q.shape[2:])
    mask = np.asarray(allowed)[:, None, None]
    group_bias = None if bias is None else np.reshape(
        bias, bias.shape[:1] + (kv_heads, heads // kv_heads) + bias.shape[2:])
    args = (grouped, k[:, :, None], v[:, :, None])
    out = attention(*args, mask, group_bias, soft_cap=soft_cap)[0].reshape(
        q.shape[:-1] + v.shape[-1:])
    if d_out is None:
        return out, None
    dq, dk, dv, dbias = attention_grads(*args, d_out.reshape(grouped.shape[:-1] + (-1,)),
                                        mask, group_bias, soft_cap=soft_cap)
    grads = [dq.reshape(q.shape), dk[:, :, 0], dv[:, :, 0]]
    if bias is not None:
        grads.append(dbias.reshape(bias.shape))
    return out, grads


def log_softmax(x, axis=-1):
    """log softmax along `axis`, in float64: ``x - max - log(sum(exp(x - max)))``."""
    x = _f64(x)
    x = x - x.max(axis=axis, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=axis, keepdims=True))


def masked_softmax(scores, mask=None):
    """Softmax over the last axis restricted to ``mask`` (True = keep); rows with no True
    give zeros, never NaN."""
    scores = _f64(scores)
    eye = np.eye(scores.shape[-1])
    return _attention_weights(scores, eye, np.broadcast_to(
        True if mask is None else np.asarray(mask, bool), scores.shape), None, 1.0)


def multi_head_attention(query, key, value, weights, num_heads, mask=None, num_kv_heads=None):
    """Multi-head attention from the formula, one head at a time: ``h_i = attention(q W_i^q,
    k W_i^k, v W_i^v)``, ``out = [h_1 .. h_H] W_o``.

    Args:
        query ``(B, T, dq)``, key ``(B, S, dk)``, value ``(B, S, dv)``.
        weights: dict of ``(kernel, bias)`` pairs under ``"query"``, ``"key"``, ``"value"``,
            ``"output"`` (bias None for none); kernels ``(in, units)`` as ``x @ kernel``.
        num_heads: ``H``; ``num_kv_heads`` key/value heads, each serving ``H / num_kv_heads``
            consecutive query heads (grouped-query attention). Defaults to ``H``.
        mask: bool broadcastable to ``(B, T, S)`` (or ``(B, H, T, S)``).

    Returns:
        ``(outputs (B, T, units_out), weights (B, H, T, S))``.
    """
    def dense(name, x):
        kernel, bias = weights[name]
        return _f64(x) @ _f64(kernel) + (0.0 if bias is None else _f64(bias))

    num_kv_heads = num_kv_heads or num_heads
    q, k, v = dense("query", query), dense("key", key), dense("value", value)
    dk, dv = q.shape[-1] // num_heads, v.shape[-1] // num_kv_heads
    group = num_heads // num_kv_heads
    if mask is not None:
        mask = np.asarray(mask, bool)
        mask = mask[:, None] if mask.ndim == 3 else mask  # (B, 1 | H, T, S)
    heads, all_weights = [], []
    for h in range(num_heads):
        kv = h // group
        head_mask = None if mask is None else mask[:, h if mask.shape[1] > 1 else 0]
        out, w = attention(q[..., h * dk:(h + 1) * dk], k[..., kv * dk:(kv + 1) * dk],
                           v[..., kv * dv:(kv + 1) * dv], head_mask)
        heads.append(out)
        all_weights.append(w)
    return dense("output", np.concatenate(heads, -1)), np.stack(all_weights, 1)


def torch_multihead_attention(state_dict, q, k, v, num_heads, key_padding_mask=None,
                              add_zero_attn=False):
    """``torch.nn.MultiheadAttention``'s documented forward (``batch_first``): ``state_dict``
    as ``module.state_dict()`` gives it (NumPy arrays), ``key_padding_mask`` ``(B, S)`` True
    where a key is padding (torch's sense)."""
    sd = {name: _f64(value) for name, value in state_dict.items()}
    e = sd["out_proj.weight"].shape[0]
    if "in_proj_weight" in sd:
        wq, wk, wv = np.split(sd["in_proj_weight"], 3)
    else:
        wq, wk, wv = sd["q_proj_weight"], sd["k_proj_weight"], sd["v_proj_weight"]
    bq, bk, bv = np.split(sd.get("in_proj_bias", np.zeros(3 * e)), 3)
    qp, kp, vp = _f64(q) @ wq.T + bq, _f64(k) @ wk.T + bk, _f64(v) @ wv.T + bv
    allowed = np.ones(kp.shape[:2], bool) if key_padding_mask is None else ~np.asarray(
        key_padding_mask, bool)
    extras = []
    if "bias_k" in sd:
        extras.append((sd["bias_k"].reshape(1, 1, e), sd["bias_v"].reshape(1, 1, e)))
    if add_zero_attn:
        extras.append((np.zeros((1, 1, e)), np.zeros((1, 1, e))))
    for extra_k, extra_v in extras:
        b = qp.shape[0]
        kp = np.concatenate([kp, np.broadcast_to(extra_k, (b, 1, e))], 1)
        vp = np.concatenate([vp, np.broadcast_to(extra_v, (b, 1, e))], 1)
        allowed = np.concatenate([allowed, np.ones((b, 1), bool)], 1)
    hd = e // num_heads

    def split(x):
        return x.reshape(x.shape[0], x.shape[1], num_heads, hd).transpose(0, 2, 1, 3)

    ctx, _ = attention(split(qp), split(kp), split(vp), allowed[:, None, None, :])
    ctx = ctx.transpose(0, 2, 1, 3).reshape(qp.shape[0], qp.shape[1], e)
    return ctx @ sd["out_proj.weight"].T + sd.get("out_proj.bias", 0.0)


def linear_attention(q, k, v, key_mask=None, causal=False):
    """Linear attention (Katharopoulos et al., 2020) written as an explicit ``(T, S)`` form:
    ``A = φ(Q) φ(K)ᵀ ∘ M`` with ``φ(x) = elu(x) + 1``, ``out = A V / A 1`` (0 where
    ``A 1 = 0``). q ``(B, H, T, d)``, k ``(B, H, S, d)``, v ``(B, H, S, dv)``, key_mask
    ``(B, S)``."""
    def phi(x):
        x = _f64(x)
        return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0)))

    t, s = q.shape[-2], k.shape[-2]
    scores = np.einsum("bhtd,bhsd->bhts", phi(q), phi(k))
    mask = np.ones((q.shape[0], 1, t, s), bool)
    if key_mask is not None:
        mask &= np.asarray(key_mask, bool)[:, None, None, :]
    if causal:
        mask &= np.tril(np.ones((t, s), bool))
    scores = np.where(mask, scores, 0.0)
    norm = scores.sum(-1, keepdims=True)
    return np.where(norm > 0, scores @ _f64(v) / np.where(norm > 0, norm, 1), 0.0)


# ---------------------------------------------------------------------------------------
# Masks (boolean, True = attend)
# ---------------------------------------------------------------------------------------


def causal_mask(T, S, offset=0):
    """``(T, S)``: key j visible to query i when ``j <= i + offset``.

    ``offset = S - T`` aligns the last query with the last key (queries appended to a cache).
    """
    i = np.arange(T)[:, None]
    j = np.arange(S)[None, :]
    return j <= i + offset


def length_mask(lens, T, S):
    """Key-padding mask from lengths: key j visible when ``j < len``.

    lens ``(B,)`` -> ``(B, 1, S)`` (one length per sequence, broadcast over queries);
    lens ``(B, T)`` -> ``(B, T, S)`` (one length per query).
    """
    lens = np.asarray(lens)
    j = np.arange(S)
    if lens.ndim == 1:
        return j[None, None, :] < lens[:, None, None]
    if lens.ndim == 2 and lens.shape[1] == T:
        return j[None, None, :] < lens[:, :, None]
    raise ValueError(f"lens must be (B,) or (B, {T}); got {lens.shape}")


def band_mask(T, S, window, offset=0):
    """``(T, S)``: key j visible to query i when ``|i + offset - j| <= window``."""
    i = np.arange(T)[:, None]
    j = np.arange(S)[None, :]
    return np.abs(i + offset - j) <= window


def keras_sliding_window_mask(T, S, sliding_window):
    """``(T, S)``: ``keras.layers.MultiHeadAttention(sliding_window=w)``'s band, ``|i - j| < w``.

    Keras builds it as ``(1, T, S)`` from the positions 0.. of query and value (no cache
    offset), so it is ``band_mask(T, S, w - 1)``; AND it with ``causal_mask`` for the
    causal sliding window.
    """
    i = np.arange(T)[:, None]
    j = np.arange(S)[None, :]
    return np.abs(i - j) < sliding_window


def local_band(T, S, window, causal=False, num_global=0, offset=0):
    """``(T, S)`` sliding-window band, one entry at a time from the definition: the query at
    ``p = i + offset`` sees key j when ``|p - j| <= window``, or when p or j is one of the
    first ``num_global`` (global) positions; ``causal`` hides every ``j > p``."""
    mask = np.zeros((T, S), bool)
    for i in range(T):
        p = i + offset
        for j in range(S):
            near = abs(p - j) <= window
            glob = num_global > 0 and (p < num_global or j < num_global)
            mask[i, j] = (near or glob) and (not causal or j <= p)
    return mask


def combined_mask(batch, T, S, lens=None, causal=False, offset=0, window=None, num_global=0,
                  dense=None, query_valid=None, key_valid=None):
    """``(B, T, S)``: every way a mask comes in, ANDed (``keras_attn.ops.AttentionMask``'s
    parts): lengths, causality, a window with global tokens, a dense block, query and key
    padding."""
    allowed = np.ones((batch, T, S), bool)
    if lens is not None:
        allowed &= length_mask(np.asarray(lens), T, S)
    if causal:
        allowed &= causal_mask(T, S, offset)
    if window is not None:
        allowed &= local_band(T, S, window, False, num_global, offset)
    if dense is not None:
        allowed &= np.broadcast_to(dense, allowed.shape)
    if query_valid is not None:
        allowed &= np.asarray(query_valid, bool)[:, :, None]
    if key_valid is not None:
        allowed &= np.asarray(key_valid, bool)[:, None, :]
    return allowed


# ---------------------------------------------------------------------------------------
# ALiBi (Press et al., 2022, "Train Short, Test Long", arXiv:2108.12409)
# ---------------------------------------------------------------------------------------


def mask_kinds(batch, T, S, seed=3):
    """Every kind of mask ``keras_attn.ops.AttentionMask.build`` takes, as its arguments for
    ``batch`` sequences of ``T`` queries and ``S >= T`` keys (``batch`` >= 2): lengths (per
    sequence and per query), a causal mask at a cache offset, windows (with a global token),
    a dense block, key and query padding, and rows that see no key."""
    rng = np.random.default_rng(seed)
    lens = [S] + [max(1, S // 2)] * (batch - 1)
    per_query = rng.integers(0, S + 1, (batch, T))
    key_mask = rng.random((batch, S)) < 0.7
    key_mask[:, 1] = True
    query_mask = rng.random((batch, T)) < 0.8
    return {
        "none": {},
        "lengths": {"valid_lens": lens},
        "lengths_per_query": {"valid_lens": per_query},
        "causal_cache_offset": {"use_causal_mask": True, "causal_offset": S - T},
        "window": {"window": 1, "causal_offset": 1},
        "window_global": {"window": 1, "num_global": 1},
        "dense": {"attention_mask": rng.random((batch, T, S)) < 0.6},
        "key_padding": {"key_mask": key_mask},
        "query_padding": {"query_mask": query_mask},
        "empty_rows": {"valid_lens": [0] + lens[1:], "use_causal_mask": True},
    }


def mask_of(build, batch, T, S):
    """The ``(B, T, S)`` boolean mask of ``AttentionMask.build(T, S, batch, **build)``, from
    ``combined_mask``."""
    names = {"valid_lens": "lens", "use_causal_mask": "causal", "causal_offset": "offset",
             "window": "window", "num_global": "num_global", "attention_mask": "dense",
             "key_mask": "key_valid", "query_mask": "query_valid"}
    spec = {}
    for name, value in build.items():
        value = np.asarray(value)
        spec[names[name]] = value.astype(bool) if name.endswith("_mask") else value
    return combined_mask(batch, T, S, **spec)


def alibi_slopes(num_heads, max_bias=8.0):
    """``(H,)`` head slopes, as the paper's reference code builds them.

    For ``n`` a power of two: the geometric sequence ``2^(-max_bias * (h + 1) / n)``,
    ``h = 0..n-1`` (start and ratio ``2^(-8/n)`` with the paper's ``max_bias = 8``).
    Otherwise: the slopes for the closest lower power of two ``c``, followed by every
    other slope of ``2c`` (``[0::2]``), the first ``n - c`` of them.
    ``max_bias`` is keras-hub's ``alibi_bias_max``.
    """

    def power_of_two(n):
        return [2.0 ** (-max_bias * (h + 1) / n) for h in range(n)]

    n = int(num_heads)
    if n & (n - 1) == 0:
        slopes = power_of_two(n)
    else:
        c = 2 ** math.floor(math.log2(n))
        slopes = power_of_two(c) + power_of_two(2 * c)[0::2][: n - c]
    return np.array(slopes, dtype=np.float64)


def alibi_bias(num_heads, T, S, offset=0, symmetric=False, max_bias=8.0):
    """``(H, T, S)`` ALiBi bias added to the scaled scores; query i sits at ``i + offset``.

    symmetric=False (default): ``slope_h * (j - (i + offset))`` for every key j. On the keys
        at or before the query this is the paper's ``-slope_h * (i + offset - j)``; past
        the query it continues linearly (positive), which a causal mask removes. Each row
        differs from the paper code's ``slope_h * j`` and from ``keras_hub_alibi_bias`` by
        a per-row constant, which softmax ignores.
    symmetric=True: ``-slope_h * |i + offset - j|`` (the bidirectional variant; not a
        per-row shift of the other).
    """
    m = alibi_slopes(num_heads, max_bias)[:, None, None]
    rel = np.arange(S)[None, :] - (np.arange(T)[:, None] + offset)  # j - (i + offset)
    rel = rel.astype(np.float64)[None]
    return -m * np.abs(rel) if symmetric else m * rel


def keras_hub_alibi_bias(num_heads, S, alibi_bias_max=8):
    """``(1, H, 1, S)``: exactly what ``keras_hub.layers.AlibiBias`` adds to its input scores.

    ``slope_h * (j - (S - 1))`` for key j, the same for every query row; it equals
    ``alibi_bias(H, T, S, offset)[h, i, j] + slope_h * (i + offset - (S - 1))``, so it is
    zero-shifted for the query at position ``S - 1`` and otherwise a per-row constant away.
    """
    m = alibi_slopes(num_heads, alibi_bias_max)[:, None]
    rel = np.arange(1 - S, 1, dtype=np.float64)[None, :]
    return (m * rel)[None, :, None, :]


# ---------------------------------------------------------------------------------------
# T5 relative position buckets (Raffel et al., 2020)
# ---------------------------------------------------------------------------------------


def t5_relative_position_bucket(
    relative_position, bidirectional=True, num_buckets=32, max_distance=128
):
    """T5's bucket of ``relative_position = key_pos - query_pos`` (int array, any shape).

    As mesh_tensorflow ``_relative_position_bucket`` / HF ``T5Attention``:
    bidirectional: half the buckets for keys after the query (``rel > 0``, upper half),
    half for keys at or before it, on ``n = |rel|``; unidirectional: ``n = max(-rel, 0)``
    (keys after the query share bucket 0). Within ``nb`` buckets, ``n < nb // 2`` is its
    own bucket; larger ``n`` go to ``nb//2 + int(log(n / (nb//2)) / log(max_distance /
    (nb//2)) * (nb - nb//2))``, capped at ``nb - 1`` (so ``n >= max_distance`` share the
    last bucket). Computed in float64; the float32 of the reference code gives the same
    buckets for every tested setting.
    """
    rel = np.asarray(relative_position, dtype=np.int64)
    buckets = np.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (rel > 0).astype(np.int64) * num_buckets
        n = np.abs(rel)
    else:
        n = -np.minimum(rel, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    n_large = np.maximum(n, max_exact).astype(np.float64)  # small n never use this branch
    if_large = max_exact + (
        np.log(n_large / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).astype(np.int64)
    if_large = np.minimum(if_large, num_buckets - 1)
    return buckets + np.where(is_small, n, if_large)


def t5_bias(table, T, S, bidirectional=True, num_buckets=32, max_distance=128, offset=0):
    """``(H, T, S)`` T5 bias: ``table[bucket(j - (i + offset)), h]``, table ``(num_buckets, H)``."""
    rel = np.arange(S)[None, :] - (np.arange(T)[:, None] + offset)
    buckets = t5_relative_position_bucket(rel, bidirectional, num_buckets, max_distance)
    return np.moveaxis(_f64(table)[buckets], -1, 0)


# ---------------------------------------------------------------------------------------
# Rotary position embedding (Su et al., 2021, RoFormer)
# ---------------------------------------------------------------------------------------


def _rope_angles(positions, d, max_wavelength, scaling_factor):
    """``(..., T, d/2)`` angles ``pos * max_wavelength^(-2i/d) / scaling_factor``."""
    if d % 2:
        raise ValueError(f"rotary depth must be even, got {d}")
    inv_freq = max_wavelength ** (-np.arange(0, d, 2, dtype=np.float64) / d) / scaling_factor
    return _f64(positions)[..., None] * inv_freq


def rope(x, positions, max_wavelength=10000, scaling_factor=1.0):
    """Rotary embedding, "rotate half" layout, as ``keras_hub.layers.RotaryEmbedding``.

    x ``(..., T, d)``, positions ``(T,)`` (or broadcastable to ``x.shape[:-1]``). Dim i
    of the first half pairs with dim ``i + d/2``, rotated by ``theta_i = pos *
    max_wavelength^(-2i/d) / scaling_factor``::

        out[:d/2] = x1 cos - x2 sin,   out[d/2:] = x2 cos + x1 sin.

    keras-hub's ``start_index=s`` is ``positions = s + arange(T)``.
    """
    x = _f64(x)
    theta = _rope_angles(positions, x.shape[-1], max_wavelength, scaling_factor)
    cos, sin = np.cos(theta), np.sin(theta)
    x1, x2 = np.split(x, 2, axis=-1)
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def rope_interleaved(x, positions, max_wavelength=10000, scaling_factor=1.0):
    """Rotary embedding as in the RoFormer paper: dims ``(2i, 2i + 1)`` rotate by theta_i.

    Same angles as ``rope``; ``rope(x[..., perm]) == rope_interleaved(x)[..., perm]`` with
    ``perm = concat(arange(0, d, 2), arange(1, d, 2))``.
    """
    x = _f64(x)
    theta = _rope_angles(positions, x.shape[-1], max_wavelength, scaling_factor)
    cos, sin = np.cos(theta), np.sin(theta)
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty(np.broadcast_shapes(x.shape, theta.shape[:-1] + (x.shape[-1],)))
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


# ---------------------------------------------------------------------------------------
# Normalization
# ---------------------------------------------------------------------------------------


def rms_norm(x, scale=None, epsilon=1e-6, axis=-1):
    """``x / sqrt(mean(x^2) + epsilon) * scale``, as ``keras.layers.RMSNormalization``.

    epsilon sits inside the square root (the layer's default is 1e-6); the weight is
    named ``scale``. No centering, no offset.
    """
    x = _f64(x)
    out = x / np.sqrt(np.mean(x * x, axis=axis, keepdims=True) + epsilon)
    return out if scale is None else out * _f64(scale)


def numeric_gradient(loss, x, step=1e-6):
    """Central differences of the scalar `loss(x)` with respect to every element of `x`,
    in float64: `(loss(x + h e_i) - loss(x - h e_i)) / 2h`."""
    x = np.asarray(x, dtype="float64")
    grad = np.zeros(x.shape)
    for index in np.ndindex(x.shape):
        shift = np.zeros(x.shape)
        shift[index] = step
        grad[index] = (loss(x + shift) - loss(x - shift)) / (2 * step)
    return grad


def layer_norm(x, gamma=None, beta=None, epsilon=1e-3, axis=-1):
    """``(x - mean) / sqrt(var + epsilon) * gamma + beta`` with the population variance.

    As ``keras.layers.LayerNormalization`` (default epsilon 1e-3, inside the root).
    """
    x = _f64(x)
    mean = np.mean(x, axis=axis, keepdims=True)
    var = np.mean((x - mean) ** 2, axis=axis, keepdims=True)
    out = (x - mean) / np.sqrt(var + epsilon)
    if gamma is not None:
        out = out * _f64(gamma)
    if beta is not None:
        out = out + _f64(beta)
    return out


# ---------------------------------------------------------------------------------------
# Gated feed-forward (Shazeer, 2020, "GLU Variants Improve Transformer")
# ---------------------------------------------------------------------------------------

_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu(x, approximate=False):
    """Exact ``x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))``; ``approximate=True``: the tanh form
    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``."""
    x = _f64(x)
    if approximate:
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _activation(name, approximate):
    if name in ("swish", "silu"):
        return lambda z: z / (1.0 + np.exp(-z))
    if name == "gelu":
        return lambda z: gelu(z, approximate)
    if name == "relu":
        return lambda z: np.maximum(z, 0.0)
    if name == "sigmoid":
        return lambda z: 1.0 / (1.0 + np.exp(-z))
    if name == "linear":
        return lambda z: z
    raise ValueError(f"unknown activation {name!r}")


def gated_ffn(
    x,
    w_gate,
    w_up,
    w_down,
    activation="swish",
    b_gate=None,
    b_up=None,
    b_down=None,
    approximate=False,
):
    """``(act(x W_gate + b_gate) * (x W_up + b_up)) W_down + b_down``.

    x ``(..., d)``, w_gate and w_up ``(d, f)``, w_down ``(f, d_out)``; biases optional.
    activation: "swish"/"silu" (SwiGLU), "gelu" (GEGLU; exact erf unless
    ``approximate=True``), "relu" (ReGLU), "sigmoid" (GLU), "linear" (bilinear).
    """
    x = _f64(x)
    act = _activation(activation, approximate)

    def affine(z, w, b):
        out = z @ _f64(w)
        return out if b is None else out + _f64(b)

    hidden = act(affine(x, w_gate, b_gate)) * affine(x, w_up, b_up)
    return affine(hidden, w_down, b_down)


# ---------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------


def sampling_distribution(logits, temperature=1.0, top_k=None, top_p=None, min_p=None):
    """``(..., V)``: the distribution a correct sampler draws the next token from.

    In order: ``logits / temperature``; top-k keeps exactly the indices
    ``np.argsort(-logits, kind="stable")[:k]`` (ties go to the lower index); top-p
    (nucleus, Holtzman et al., 2020) on the top-k renormalized distribution keeps the
    shortest prefix of the sorted tokens whose cumulative probability reaches ``p`` (the
    token that crosses ``p`` is kept, and always at least one token), i.e. the sorted
    token r is kept when the mass strictly before it is ``< p``; min-p (Nguyen et al., 2024)
    keeps the tokens whose probability is at least ``min_p`` times the largest; then
    renormalize. ``temperature=0`` is greedy: one-hot at the first argmax.
    """
    logits = _f64(logits)
    if temperature < 0:
        raise ValueError("temperature must be >= 0")
    if top_k is not None and top_k < 1:
        raise ValueError("top_k must be >= 1 or None")
    order = np.argsort(-logits, axis=-1, kind="stable")
    keep = np.ones(logits.shape, dtype=bool)  # in sorted order
    if temperature == 0:
        keep[..., 1:] = False
        scaled = np.zeros(logits.shape)
    else:
        scaled = np.take_along_axis(logits, order, axis=-1) / temperature
    if top_k is not None:
        keep[..., top_k:] = False

    def renormalized(keep):
        top = np.max(np.where(keep, scaled, -np.inf), axis=-1, keepdims=True)
        e = np.where(keep, np.exp(scaled - top), 0.0)
        return e / np.sum(e, axis=-1, keepdims=True)

    probs = renormalized(keep)
    if top_p is not None:
        cumulative = np.cumsum(probs, axis=-1)
        before = np.concatenate([np.zeros_like(probs[..., :1]), cumulative[..., :-1]], axis=-1)
        keep = keep & (before < top_p)
        keep[..., 0] = True
        probs = renormalized(keep)
    if min_p is not None:
        keep = keep & (probs >= min_p * probs[..., :1])  # sorted: the largest comes first
        probs = renormalized(keep)
    out = np.zeros(logits.shape)
    np.put_along_axis(out, order, probs, axis=-1)
    return out


def repetition_penalized(logits, seen, penalty):
    """``(..., V)`` logits with those of the ids in ``seen`` (any iterable of ints) divided
    by ``penalty`` where positive and multiplied by it where not (Keskar et al., 2019, as
    Hugging Face's ``RepetitionPenaltyLogitsProcessor``)."""
    logits = _f64(logits).copy()
    ids = sorted({int(i) for i in seen})
    values = logits[..., ids]
    logits[..., ids] = np.where(values < 0, values * penalty, values / penalty)
    return logits


def greedy_tokens(logits, never_emitted=(0, 2)):
    """The greedy choice of `keras_attn.decoding.generate` at every position of `(..., V)`
    logits: the argmax over the tokens it may emit (padding and `<bos>` never are)."""
    logits = np.array(logits, np.float64)
    logits[..., list(never_emitted)] = -np.inf
    return logits.argmax(-1)


def gnmt_length_penalty(length, alpha):
    """GNMT length penalty (Wu et al., 2016): ``((5 + length) / 6) ** alpha``."""
    return ((5.0 + _f64(length)) / 6.0) ** alpha


# ---------------------------------------------------------------------------------------
# Pretrained Transformers (keras_attn.checkpoints' canonical weights)
# ---------------------------------------------------------------------------------------


def _spec_activation(name):
    return {"silu": lambda z: z / (1.0 + np.exp(-z)), "relu": lambda z: np.maximum(z, 0.0),
            "gelu": gelu, "gelu_tanh": lambda z: gelu(z, approximate=True)}[name]


def _canonical_norm(x, weights, prefix, spec, epsilon=None):
    epsilon = spec.layer_norm_epsilon if epsilon is None else epsilon
    if spec.norm == "rms":
        return rms_norm(x, weights[f"{prefix}/scale"], epsilon)
    return layer_norm(x, weights[f"{prefix}/scale"], weights[f"{prefix}/offset"], epsilon)


def _dense(x, weights, prefix):
    out = x @ _f64(weights[f"{prefix}/kernel"])
    bias = weights.get(f"{prefix}/bias")
    return out if bias is None else out + _f64(bias)


def rope_frequencies(x, positions, inv_freq, attention_scaling=1.0):
    """Rotary embedding, "rotate half" layout, with explicit inverse frequencies
    ``(d/2,)``: ``rope(x, positions, w, s)`` is ``inv_freq = w^(-2i/d) / s``; cos and sin
    are multiplied by ``attention_scaling`` (YaRN's)."""
    x = _f64(x)
    theta = _f64(positions)[..., None] * _f64(inv_freq)
    cos, sin = attention_scaling * np.cos(theta), attention_scaling * np.sin(theta)
    x1, x2 = np.split(x, 2, axis=-1)
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def pretrained_transformer(spec, weights, ids, token_type_ids=None, padding_mask=None):
    """The outputs of a pretrained Transformer from its canonical weights and spec, as
    ``keras_attn.checkpoints.canonical`` documents them (the formulas of its table).

    ids ``(B, T)``; token_type_ids ``(B, T)`` (default zeros); padding_mask ``(B, T)`` bool,
    True = a real token (padded keys are masked; default all real). Positions count from 0.
    Returns the logits ``(B, T, V)`` of a ``causal_lm`` or ``masked_lm`` spec, and for an
    ``encoder`` the pair ``(hidden (B, T, D), pooled (B, D) or None)``.
    """
    ids = np.asarray(ids)
    B, T = ids.shape
    positions = np.arange(T)
    x = _f64(weights["token_embedding/embeddings"])[ids]
    if spec.position == "learned":
        x = x + _f64(weights["position_embedding/embeddings"])[positions]
    if spec.num_segments:
        types = np.zeros_like(ids) if token_type_ids is None else np.asarray(token_type_ids)
        x = x + _f64(weights["token_type_embedding/embeddings"])[types]
    if spec.embedding_norm:
        x = _canonical_norm(x, weights, "embedding_norm", spec)
    mask = np.ones((T, T), dtype=bool)
    if spec.causal:
        mask &= causal_mask(T, T)
    if spec.sliding_window is not None:
        mask &= positions[:, None] - positions[None, :] < spec.sliding_window
    mask = np.broadcast_to(mask, (B, 1, 1, T, T))
    if padding_mask is not None:
        mask = mask & np.asarray(padding_mask, dtype=bool)[:, None, None, None, :]
    groups = spec.num_heads // spec.num_key_value_heads
    act = _spec_activation(spec.activation)
    for i in range(spec.num_layers):
        p = f"layers/{i}"
        h = _canonical_norm(x, weights, f"{p}/attention_norm", spec) if spec.normalize_first else x
        q = _dense(h, weights, f"{p}/attention/query").reshape(
            B, T, spec.num_key_value_heads, groups, spec.head_dim).transpose(0, 2, 3, 1, 4)
        k, v = (_dense(h, weights, f"{p}/attention/{name}").reshape(
            B, T, spec.num_key_value_heads, 1, spec.head_dim).transpose(0, 2, 3, 1, 4)
            for name in ("key", "value"))  # (B, K, 1, T, d)
        if spec.position == "rope":
            inv_freq = spec.rope_inverse_frequencies()
            q = rope_frequencies(q, positions, inv_freq, spec.rope_attention_scaling)
            k = rope_frequencies(k, positions, inv_freq, spec.rope_attention_scaling)
        context, _ = attention(q, k, v, mask)  # (B, K, G, T, d)
        context = context.transpose(0, 3, 1, 2, 4).reshape(B, T, spec.num_heads * spec.head_dim)
        out = _dense(context, weights, f"{p}/attention/output")
        if spec.normalize_first:
            x = x + out
            h = _canonical_norm(x, weights, f"{p}/ffn_norm", spec)
        else:
            x = h = _canonical_norm(x + out, weights, f"{p}/attention_norm", spec)
        if spec.gated_ffn:
            inner = act(_dense(h, weights, f"{p}/ffn/gate")) * _dense(h, weights, f"{p}/ffn/hidden")
        else:
            inner = act(_dense(h, weights, f"{p}/ffn/hidden"))
        out = _dense(inner, weights, f"{p}/ffn/output")
        x = x + out if spec.normalize_first else _canonical_norm(x + out, weights, f"{p}/ffn_norm", spec)
    if spec.final_norm:
        x = _canonical_norm(x, weights, "final_norm", spec)
    embedding_t = _f64(weights["token_embedding/embeddings"]).T
    if spec.task == "causal_lm":
        return x @ _f64(weights.get("lm_head/kernel", embedding_t))
    if spec.task == "masked_lm":
        t = _spec_activation(spec.head_activation)(_dense(x, weights, "mlm_head/dense"))
        t = layer_norm(t, weights["mlm_head/norm/scale"], weights["mlm_head/norm/offset"],
                       spec.head_layer_norm_epsilon)
        return t @ _f64(weights.get("mlm_head/decoder/kernel", embedding_t)) + _f64(
            weights["mlm_head/bias"])
    pooled = np.tanh(_dense(x[:, 0], weights, "pooler")) if spec.pooler else None
    return x, pooled
