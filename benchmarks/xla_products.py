"""The four batched products of attention, under tf.function and under XLA, side by side.

Forward + backward of attention multiplies four ways: `Q Kᵀ` (scores), `P V` (context) and, in
the backward, `dS K` and the transposed-weights products `Pᵀ dO` and `dSᵀ Q`. This script times
one of each shape, `(BH, T, T) x (BH, T, d)` and friends, under `tf.function` and with
`jit_compile=True`, in alternating rounds. It shows where XLA on this CPU loses to the
TensorFlow (oneDNN) kernels: the product whose big left operand is contracted over its first
axis (`Pᵀ dO`), which keras.layers.MultiHeadAttention and MultiHead both need in the backward.
The row after it is the form MultiHead's backward uses for it, `(dOᵀ P)ᵀ` with the inner
product behind `keras_attn.tuning.xla_barrier`. The last two rows are `dP - δ` (`δ` a
`(T, 1)` column) as a product and a subtraction, and as one product with the column folded in,
`[dO, -δ] [V, 1]ᵀ`, which MultiHead's backward uses outside XLA.

A second table does the same for the kernel gradient of a Dense layer, `xᵀ dy` over the
`B·T` rows, as TensorFlow's gradient writes it and as `keras_attn.tuning.xla_dense` computes it
under XLA, `(xᵀ) dy` with a transposed copy of `x` behind a barrier; shapes `ROWSxMxN` are the
rows, the input size and the units.

    python benchmarks/xla_products.py
    python benchmarks/xla_products.py --batch-heads 256 --length 128
    python benchmarks/xla_products.py --dense-shapes 4096x256x256
"""

from __future__ import annotations

import argparse

from _common import header, median, time_alternating


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-heads", type=int, default=32, help="B·H, the batch of products")
    parser.add_argument("--length", type=int, default=1024, help="T = S")
    parser.add_argument("--depth", type=int, default=32, help="head size d")
    parser.add_argument("--dense-shapes", nargs="*", default=["4096x256x256", "2048x256x1024",
                                                              "2048x1024x256"],
                        help="ROWSxMxN of the Dense kernel gradients (none: skip that table)")
    parser.add_argument("--rounds", type=int, default=11)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    import tensorflow as tf

    from keras_attn.tuning import xla_barrier

    args = parse_args(argv)
    header("Attention's batched products: tf.function vs XLA (float32)")
    n, t, d = args.batch_heads, args.length, args.depth
    print(f"BH={n}, T=S={t}, d={d}; {args.rounds} alternating rounds, medians")
    weights = tf.random.normal((n, t, t))
    small = tf.random.normal((n, t, d))
    other = tf.random.normal((n, t, d))
    products = {
        "scores Q Kᵀ (T,d)x(d,S)": lambda: tf.matmul(small, other, transpose_b=True),
        "context P V (T,S)x(S,d)": lambda: tf.matmul(weights, small),
        "dS K, same form as P V": lambda: tf.matmul(weights, other),
        "Pᵀ dO (S,T)x(T,d)": lambda: tf.matmul(weights, small, transpose_a=True),
        # What keras_attn computes instead: (dOᵀ P)ᵀ, the product kept as written under XLA by
        # an optimization barrier (XLA would otherwise fold it back into the form above).
        "(dOᵀ P)ᵀ behind xla_barrier": lambda: tf.transpose(
            xla_barrier(tf.matmul(small, weights, transpose_a=True)), (0, 2, 1)),
    }
    column = tf.random.normal((n, t, 1))
    products["dO Vᵀ - δ, two passes"] = lambda: tf.matmul(small, other, transpose_b=True) - column
    products["[dO, -δ] [V, 1]ᵀ, folded"] = lambda: tf.matmul(
        tf.concat([small, -column], -1), tf.concat([other, tf.ones_like(column)], -1),
        transpose_b=True)
    flops = 2.0 * n * t * t * d
    _table("product", {name: (fn, flops) for name, fn in products.items()}, args.rounds)
    if not args.dense_shapes:
        return
    print()
    print("Dense kernel gradient xᵀ dy, x (ROWS, M), dy (ROWS, N):")
    forms = {}
    for shape in args.dense_shapes:
        rows, m, units = (int(part) for part in shape.split("x"))
        x, dy = tf.random.normal((rows, m)), tf.random.normal((rows, units))
        flops = 2.0 * rows * m * units
        forms[f"{shape} xᵀ dy (TensorFlow's gradient)"] = (
            lambda x=x, dy=dy: tf.matmul(x, dy, transpose_a=True), flops)
        forms[f"{shape} (xᵀ) dy, copy behind xla_barrier"] = (
            lambda x=x, dy=dy: tf.matmul(xla_barrier(tf.transpose(x)), dy), flops)
    _table("kernel gradient", forms, args.rounds)


def _table(what: str, products: dict, rounds: int) -> None:
    """Time each `(fn, flops)` under tf.function and XLA in alternating rounds; print a table."""
    import tensorflow as tf

    fns = {}
    for name, (fn, _) in products.items():
        fns[(name, "graph")] = tf.function(fn)
        fns[(name, "xla")] = tf.function(fn, jit_compile=True)
    times = time_alternating(fns, rounds)
    print(f"| {what} | tf.function ms | XLA ms | XLA / tf.function | XLA GFLOP/s |")
    print("|---|---|---|---|---|")
    for name, (_, flops) in products.items():
        graph, xla = median(times[(name, "graph")]), median(times[(name, "xla")])
        print(f"| {name} | {graph * 1e3:.1f} | {xla * 1e3:.1f} | {xla / graph:.2f} | "
              f"{flops / xla / 1e9:.0f} |")


if __name__ == "__main__":
    main()
