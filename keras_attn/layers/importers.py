"""Building a `MultiHead` from the weights of Keras' and torch's multi-head attention.

An importer reproduces its source exactly or raises a ValueError naming the option it cannot
reproduce; it never drops one silently.
"""

from __future__ import annotations

import keras
import numpy as np

from keras_attn._checks import check_positive_int


def _refuse(option: str, value, reason: str) -> None:
    raise ValueError(
        f"Argument `layer` has `{option}={value!r}`, which MultiHead does not reproduce: "
        f"{reason}."
    )


def _input_rank(einsum_dense) -> int:
    """The rank of the input of a Keras `EinsumDense` projection, from its equation."""
    return len(einsum_dense.equation.split(",")[0])


def from_keras(cls, layer, **kwargs):
    """A built `cls` (a `MultiHead`) with the weights and options of a built
    `keras.layers.MultiHeadAttention` or `keras.layers.GroupQueryAttention`.

    Keras stores per-head kernels as `(in_dim, H, head_dim)`; they are flattened to
    `(in_dim, H * head_dim)`, which splits back into the same heads. Dropout, seed, the gate,
    the sliding window, the output shape, regularizers and constraints are carried over.

    Raises:
        ValueError: for an option whose effect the result would not reproduce (attention over
            axes other than the sequence).
    """
    grouped = isinstance(layer, keras.layers.GroupQueryAttention)
    if not (grouped or isinstance(layer, keras.layers.MultiHeadAttention)) or not layer.built:
        raise ValueError(
            "Argument `layer` must be a built keras.layers.MultiHeadAttention or "
            f"GroupQueryAttention. Received: layer={layer!r}"
        )
    if not grouped and (_input_rank(layer._query_dense) != 3
                        or tuple(layer._attention_axes or (1,)) != (1,)):
        _refuse("attention_axes", layer._attention_axes,
                "it attends over the sequence axis of (batch, length, dim) inputs only")
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
    else:
        heads = {"num_heads": layer.num_heads, "key_dim": layer.key_dim,
                 "value_dim": layer.value_dim}
        use_gate, sliding_window = layer._use_gate, layer._sliding_window
    mha = cls(
        **heads,
        output_shape=tuple(out_kernel.shape[2:]),
        dropout=layer.dropout,
        use_bias=layer.use_bias,
        seed=layer.seed,
        use_gate=use_gate,
        sliding_window=sliding_window,
        **options,
        **kwargs,
    )
    mha.build(
        (None, None, layer._query_dense.kernel.shape[0]),
        (None, None, layer._key_dense.kernel.shape[0]),
        (None, None, layer._value_dense.kernel.shape[0]),
    )
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
        output_dim=embed_dim,
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
