"""MultiHead against keras.layers.MultiHeadAttention: forward + backward time, side by side.

Both layers hold the same weights (`MultiHead.from_keras`), see the same float32 input and are
differentiated with respect to the input and every weight, on the backend `KERAS_BACKEND` names,
as training runs there (`_common.forward_backward`): under `tf.function` ("graph") and with XLA
("xla", `jit_compile=True`) on TensorFlow, `jax.jit(jax.grad(...))` ("jit") on JAX, eagerly
("eager") on torch. MultiHead runs twice: with the dense kernel ("dense") and with the backend's
fused op ("fused"); `implementation="auto"` runs the one `keras_attn.tuning.AUTO_KERNELS` names
for the backend and device (printed in the header). In each round every contender runs once
(order rotated), with a plain float32 GEMM as the machine's ceiling; the table gives medians
over the rounds, the ratios to Keras of the medians, their spread (the ratios of the rounds'
25th and 75th percentiles), and the achieved GFLOP/s (matmul FLOPs of forward + backward, 3x the
forward's) as a share of the GEMM rate measured in the same rounds.

    python benchmarks/attention_speed.py
    KERAS_BACKEND=jax python benchmarks/attention_speed.py --rounds 11
    KERAS_BACKEND=torch python benchmarks/attention_speed.py --rounds 11
    python benchmarks/attention_speed.py --shapes 32x128x256x8 --modes graph --rounds 41
    python benchmarks/attention_speed.py --dropout 0.1 --unfused --modes graph
    python benchmarks/attention_speed.py --kv-heads 2 --modes graph

`--kv-heads N` compares grouped-query attention instead: `keras.layers.GroupQueryAttention`
(`num_key_value_heads=N`) against `MultiHead(num_key_value_heads=N)` with its weights.

`--dropout RATE` builds both layers with dropout on the attention weights and runs them with
`training=True`, as in training. `--unfused` also times MultiHead called with
`return_attention_scores=True`, which takes the path that forms the weights for the caller and
lets autodiff differentiate the softmax, instead of the fused backward.
"""

from __future__ import annotations

import argparse

from _common import forward_backward, gemm, header, median, time_alternating

DEFAULT_SHAPES = ("32x128x256x8", "4x1024x256x8")
MODES = {"tensorflow": ("graph", "xla"), "jax": ("jit",), "torch": ("eager",)}


def _backend() -> str:
    import keras

    return keras.backend.backend()


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES),
                        help="BxTxDxH: batch, length, model size, heads (self-attention)")
    parser.add_argument("--modes", nargs="+", default=None,
                        choices=sorted({m for modes in MODES.values() for m in modes}),
                        help="TensorFlow: graph and/or xla (default both); JAX: jit; torch: "
                             "eager")
    parser.add_argument("--rounds", type=int, default=21, help="timed rounds per shape and mode")
    parser.add_argument("--chunked", action="store_true",
                        help="also time MultiHead(implementation='chunked')")
    parser.add_argument("--chunk-size", type=int, default=None,
                        help="keys per block for --chunked (default: the layer's, sized by T)")
    parser.add_argument("--gemm-size", type=int, default=2048, help="n of the n x n GEMM")
    parser.add_argument("--dropout", type=float, default=0.0,
                        help="dropout on the attention weights, run with training=True")
    parser.add_argument("--unfused", action="store_true",
                        help="also time MultiHead with return_attention_scores=True")
    parser.add_argument("--also", default=None, metavar="SWITCH=VALUE",
                        help="also time MultiHead (dense and fused) with this keras_attn.tuning "
                             "switch set (True/False/int)")
    parser.add_argument("--kv-heads", type=int, default=None,
                        help="grouped-query attention: keras.layers.GroupQueryAttention with "
                             "this many key/value heads against MultiHead")
    args = parser.parse_args(argv)
    if args.dropout > 0 and args.chunked:
        parser.error("--chunked does not support --dropout (the chunked path has no dropout)")
    allowed = MODES.get(_backend(), ("eager",))
    args.modes = list(args.modes or allowed)
    if set(args.modes) - set(allowed):
        parser.error(f"--modes on {_backend()}: {' '.join(allowed)}. Received: {args.modes}")
    return args


def attention_flops(batch: int, length: int, dim: int, heads: int,
                    kv_heads: int | None = None) -> float:
    """Matmul FLOPs of forward + backward for self-attention with H * head_dim = dim.

    Forward: four (B·T, D) x (D, D) projections and two (T, d) x (d, T) products per head;
    backward: two products of the same size per forward product (input and weight gradients).
    """
    kv_share = (kv_heads or heads) / heads  # key and value projections of grouped heads
    projections = (2 + 2 * kv_share) * 2.0 * batch * length * dim * dim
    attention = 2 * 2.0 * batch * length * length * dim  # scores and context, all heads
    return 3.0 * (projections + attention)


def make_step(layer, x, mode: str, keras_layer: bool, training: bool = False,
              with_weights: bool = False):
    """Forward + backward of one contender (`_common.forward_backward`)."""

    def call(layer, x):
        if keras_layer:
            return layer(x, x, training=training)
        if with_weights:
            return layer(x, training=training, return_attention_scores=True)[0]
        return layer(x, training=training)

    return forward_backward(layer, call, x, mode)


def _quartile_ratio(times: list[float], reference: list[float]) -> str:
    """The spread of a ratio: the 25th and 75th percentiles of the per-round ratios."""
    import numpy as np

    ratios = np.asarray(times) / np.asarray(reference)
    return f"{np.percentile(ratios, 25):.2f}-{np.percentile(ratios, 75):.2f}"


def switch(also: str | None) -> dict:
    """`--also SWITCH=VALUE` as `{SWITCH: value}` (empty without it)."""
    if not also:
        return {}
    name, value = also.split("=", 1)
    value = {"True": True, "False": False, "None": None}.get(value, value)
    return {name: int(value) if isinstance(value, str) else value}


def _switched(step, switches: dict):
    """`step` run with `keras_attn.tuning` switches set (read when traced, or on every eager
    call)."""
    from keras_attn import tuning

    def run():
        with tuning.configure(**switches):
            return step()

    return run


def run_shape(spec: str, modes, rounds: int, with_chunked: bool, chunk_size: int,
              gemm_size: int, dropout: float = 0.0, unfused: bool = False,
              kv_heads: int | None = None, also: str | None = None) -> list[str]:
    import keras
    import numpy as np

    from keras_attn.layers import MultiHead

    batch, length, dim, heads = (int(v) for v in spec.lower().split("x"))
    if dim % heads:
        raise ValueError(f"Argument `--shapes`: heads must divide dim. Received: {spec}")
    x = keras.random.normal((batch, length, dim))
    if kv_heads:
        reference = keras.layers.GroupQueryAttention(head_dim=dim // heads,
                                                     num_query_heads=heads,
                                                     num_key_value_heads=kv_heads,
                                                     dropout=dropout)
    else:
        reference = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=dim // heads,
                                                    dropout=dropout)
    reference(x, x)  # build
    contenders = {"keras": reference, "MultiHead": MultiHead.from_keras(reference),
                  "fused": MultiHead.from_keras(reference, implementation="fused")}
    if unfused:
        contenders["unfused"] = contenders["MultiHead"]
    if with_chunked:
        contenders["chunked"] = MultiHead.from_keras(reference, implementation="chunked",
                                                   chunk_size=chunk_size)
    switches = switch(also)
    if switches:
        contenders["dense+"] = MultiHead.from_keras(reference)
        contenders["fused+"] = MultiHead.from_keras(reference, implementation="fused")
    want = keras.ops.convert_to_numpy(reference(x, x))
    for name, layer in contenders.items():
        if name not in ("keras", "unfused"):
            err = float(np.max(np.abs(keras.ops.convert_to_numpy(layer(x)) - want)))
            assert err < 1e-4, f"{name} differs from Keras by {err}"
    matmul, gemm_flops = gemm(gemm_size)
    flops = attention_flops(batch, length, dim, heads, kv_heads)
    rows = []
    for mode in modes:
        fns = {name: make_step(layer, x, mode, name == "keras", dropout > 0,
                               name == "unfused")
               for name, layer in contenders.items()}
        for name in ("dense+", "fused+"):
            if name in fns:
                fns[name] = _switched(fns[name], switches)
        fns["gemm"] = matmul
        times = time_alternating(fns, rounds)
        med = {name: median(t) for name, t in times.items()}
        gemm_rate = gemm_flops / med["gemm"] / 1e9
        cells = [f"B{batch} T{length} d{dim} h{heads}", mode, f"{gemm_rate:.0f}"]
        for name in contenders:
            rate = flops / med[name] / 1e9
            cells += [f"{med[name] * 1e3:.1f}", f"{rate:.0f} ({100 * rate / gemm_rate:.0f}%)"]
        for name in list(contenders)[1:]:
            cells.append(f"**{med[name] / med['keras']:.2f}** "
                         f"({_quartile_ratio(times[name], times['keras'])})")
        rows.append("| " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)
    return rows


def main(argv=None) -> None:
    args = parse_args(argv)
    reference = (f"keras.layers.GroupQueryAttention ({args.kv_heads} key/value heads)"
                 if args.kv_heads else "keras.layers.MultiHeadAttention")
    header(f"MultiHead vs {reference}, forward + backward (float32)")
    from keras_attn import tuning

    print(f"implementation=\"auto\" runs {tuning.auto_kernel()!r} here "
          f"({_backend()}, {tuning.device_kind()})")
    print(f"rounds: {args.rounds} per shape and mode (medians); GEMM: {args.gemm_size}^3 "
          "float32, timed in the same rounds"
          + (f"; chunked: chunk_size={args.chunk_size}" if args.chunked else "")
          + (f"; dropout {args.dropout}, training=True" if args.dropout > 0 else "")
          + ("; unfused: MultiHead with return_attention_scores=True" if args.unfused else ""))
    names = (["keras", "MultiHead", "fused"] + (["unfused"] if args.unfused else [])
             + (["chunked"] if args.chunked else [])
             + ([f"dense+{args.also}", f"fused+{args.also}"] if args.also else []))
    columns = ["shape", "mode", "GEMM GFLOP/s"]
    for name in names:
        columns += [f"{name} ms", f"{name} GFLOP/s (% GEMM)"]
    columns += [f"{'dense' if name == 'MultiHead' else name} / keras (IQR)"
                for name in names[1:]]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for spec in args.shapes:
        run_shape(spec, args.modes, args.rounds, args.chunked, args.chunk_size, args.gemm_size,
                  args.dropout, args.unfused, args.kv_heads, args.also)


if __name__ == "__main__":
    main()
