"""Building a `MultiHead` from the weights of Keras' and torch's multi-head attention.

An importer reproduces its source exactly or raises a ValueError naming the option it cannot
reproduce; it never drops one silently.
"""

from __future__ import annotations

import keras
import numpy as np

from keras_attn._checks import check_positive_int


def from_keras(cls, layer, **kwargs):
    """A built `cls` (a `MultiHead`) with the weights and options of a built
    `keras.layers.MultiHeadAttention` or `keras.layers.GroupQueryAttention`.

    Keras stores per-head kernels as `(in_dim, H, head_dim)`; they are flattened to
    `(in_dim, H * head_dim)`, which splits back into the same heads. Dropout, seed, the gate,
    the sliding window, the output shape, the attention axes (inputs of any rank), the dtype
    policy, regularizers and constraints are carried over.

    Raises:
        ValueError: for a layer that is not a built Keras attention layer.
    """
    grouped = isinstance(layer, keras.layers.GroupQueryAttention)
    if not (grouped or isinstance(layer, keras.layers.MultiHeadAttention)) or not layer.built:
        raise ValueError(
            "Argument `layer` must be a built keras.layers.MultiHeadAttention or "
            f"GroupQueryAttention. Received: layer={layer!r}"
        )
    options = {}
    for option in ("kernel_regularizer", "bias_regularizer", "activity_regularizer",
                   "kernel_constraint", "bias_constraint"):
        value = getattr(layer, f"_{option}", getattr(layer, option, None))
        if value is not None:
            options[option] = value
    out_kernel = layer._output_dense.kernel  # (H, dv, *output_shape)
    if grouped:
        heads = {"num_heads": layer.num_query_heads, "key_dim": layer.head_dim,
                 "num_key_value_heads": layer.num_key_value_heads}
        use_gate, sliding_window = layer.use_gate, layer.sliding_window
        rank, attention_axes = 3, None
    else:
        heads = {"num_heads": layer.num_heads, "key_dim": layer.key_dim,
                 "value_dim": layer.value_dim}
        use_gate, sliding_window = layer._use_gate, layer._sliding_window
        # The query projection's equation names the input's axes: "abc,cde->abde" is rank 3.
        rank = len(layer._query_dense.equation.split(",")[0])
        attention_axes = layer._attention_axes
    options.setdefault("dtype", layer.dtype_policy)
    options.update(
        heads,
        output_shape=tuple(out_kernel.shape[2:]),
        dropout=layer.dropout,
        use_bias=layer.use_bias,
        seed=layer.seed,
        use_gate=use_gate,
        sliding_window=sliding_window,
        attention_axes=None if attention_axes is None else tuple(attention_axes),
    )
    mha = cls(**{**options, **kwargs})  # the caller's arguments (e.g. a window) win
    widths = [d.kernel.shape[0] for d in (layer._query_dense, layer._key_dense,
                                          layer._value_dense)]
    mha.build(*((None,) * (rank - 1) + (width,) for width in widths))
    pairs = [(mha.query_dense, layer._query_dense), (mha.key_dense, layer._key_dense),
             (mha.value_dense, layer._value_dense), (mha.output_dense, layer._output_dense)]
    if use_gate:
        pairs.append((mha.gate_dense, layer._gate_dense))
    for ours, theirs in pairs:
        weights = [keras.ops.convert_to_numpy(w) for w in theirs.weights]
        ours.set_weights([np.reshape(w, ours_w.shape) for w, ours_w in
                          zip(weights, ours.weights)])
    return mha


def from_torch_state_dict(cls, state_dict, num_heads: int, add_zero_attn: bool = False,
                          **kwargs):
    """A built `cls` (a `MultiHead`) equal to a `torch.nn.MultiheadAttention` with this state
    dict.

    Args:
        state_dict: mapping of names to arrays (NumPy arrays, or anything `np.asarray`
            accepts), as `module.state_dict()` gives them: `in_proj_weight` or
            `q_proj_weight`/`k_proj_weight`/`v_proj_weight`, optional `in_proj_bias`,
            `bias_k`, `bias_v`, `out_proj.weight`, optional `out_proj.bias`.
        num_heads: int, the torch module's `num_heads`.
        add_zero_attn: bool, the torch module's `add_zero_attn` (it has no weight, so the
            state dict cannot tell). Defaults to `False`.
        **kwargs: further `MultiHead` arguments, e.g. `dropout`.

    torch computes `x Wᵀ + b`, so each kernel is the transposed torch weight. Note torch's
    masks are the other way round: its boolean `attn_mask` and `key_padding_mask` are True
    where attention is *not* allowed; keras_attn's are True where it is.
    """
    sd = {k: np.asarray(v, dtype="float32") for k, v in state_dict.items()}
    if "out_proj.weight" not in sd:
        raise ValueError(
            "Argument `state_dict` has no `out_proj.weight`. "
            f"Received keys: {sorted(sd)}"
        )
    embed_dim = sd["out_proj.weight"].shape[0]
    check_positive_int("num_heads", num_heads)
    if embed_dim % num_heads:
        raise ValueError(
            f"Argument `num_heads` must divide embed_dim={embed_dim}. "
            f"Received: num_heads={num_heads}"
        )
    if "in_proj_weight" in sd:
        w_q, w_k, w_v = np.split(sd["in_proj_weight"], 3, axis=0)
    else:
        w_q, w_k, w_v = (sd[f"{n}_proj_weight"] for n in "qkv")
    use_bias = "in_proj_bias" in sd
    mha = cls(
        num_heads=num_heads,
        key_dim=embed_dim // num_heads,
        output_shape=embed_dim,
        use_bias=use_bias,
        add_bias_kv="bias_k" in sd,
        add_zero_attn=add_zero_attn,
        **kwargs,
    )
    mha.build((None, None, w_q.shape[1]), (None, None, w_k.shape[1]),
              (None, None, w_v.shape[1]))
    biases = np.split(sd["in_proj_bias"], 3) if use_bias else [None] * 3
    for dense, w, b in zip((mha.query_dense, mha.key_dense, mha.value_dense),
                           (w_q, w_k, w_v), biases):
        dense.set_weights([w.T] if b is None else [w.T, b])
    out_w = [sd["out_proj.weight"].T]
    if use_bias:
        out_w.append(sd["out_proj.bias"])
    mha.output_dense.set_weights(out_w)
    if mha.add_bias_kv:
        mha.bias_k.assign(sd["bias_k"].reshape(-1))
        mha.bias_v.assign(sd["bias_v"].reshape(-1))
    return mha
