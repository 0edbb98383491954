"""Each switch of `keras_attn.tuning`, on against off, on the workload it was made for.

A switch changes how fast attention runs, never what it computes; this script measures whether
it still pays on the machine at hand. Every workload is a forward + backward pass under
`tf.function` (or XLA where the switch is about XLA), traced once with the switch on and once
with it off, and the two run in alternating rounds in one process (medians). Memory-bound
switches (`loop_parallelism`, `block_budget`) are measured for peak memory by
`long_sequence_memory.py --tuning NAME=VALUE`, which runs each setting in its own process.

    python benchmarks/tuning_switches.py
    python benchmarks/tuning_switches.py --rounds 31 --only fold_row_terms
"""

from __future__ import annotations

import argparse

from _common import header, median, sync, time_alternating

WORKLOADS = {
    # switch: [(description, builder name, off value)]
    "fold_row_terms": [("dense kernel, fused backward: B4 H8 T1024 d32, causal", "fused", False),
                       ("blockwise kernel: B1 H1 T8192 d64, chunk 1024", "blockwise", False)],
    "squeeze_single_matrix": [("blockwise kernel: B1 H1 T8192 d64, chunk 1024", "blockwise",
                               False)],
    "loop_parallelism": [("blockwise kernel: B1 H1 T8192 d64, chunk 1024 (1 vs 2)", "blockwise",
                          1),
                         ("blockwise kernel: B1 H1 T8192 d64, chunk 1024 (TF's 10 vs 2)",
                          "blockwise", None)],
    "xla_barriers": [("MultiHead under XLA: B4 T1024 d256 h8", "multi_head_xla_long", False),
                     ("MultiHead under XLA: B32 T128 d256 h8", "multi_head_xla_short", False)],
    "xla_dense_projections": [("MultiHead under XLA: B32 T128 d256 h8", "multi_head_xla_short",
                               False)],
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21, help="timed rounds (medians)")
    parser.add_argument("--only", nargs="+", choices=sorted(WORKLOADS),
                        help="measure these switches only")
    return parser.parse_args(argv)


def builders():
    """Workload name -> a function of no argument returning a traced-on-first-call step."""
    import tensorflow as tf

    from keras_attn import ops as attn_ops
    from keras_attn.layers import MultiHead

    def attention(shape, implementation, chunk_size=None):
        q, k, v = (tf.random.normal(shape) for _ in range(3))
        extra = {"chunk_size": chunk_size} if implementation == "chunked" else {}

        def make():
            @tf.function
            def step():
                with tf.GradientTape() as tape:
                    tape.watch([q, k, v])
                    causal = attn_ops.AttentionMask.build(shape[-2], shape[-2],
                                                          use_causal_mask=True)
                    out, _ = attn_ops.dot_product_attention(
                        q, k, v, causal, implementation=implementation, return_weights=False,
                        **extra)
                    loss = tf.reduce_sum(out * out)
                return tape.gradient(loss, [q, k, v])
            return step
        return make

    def multi_head(batch, length):
        x = tf.random.normal((batch, length, 256))
        layer = MultiHead(num_heads=8, key_dim=32)
        layer(x)

        def make():
            @tf.function(jit_compile=True)
            def step():
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    y = layer(x, use_causal_mask=True)
                    loss = tf.reduce_sum(y * y)
                return tape.gradient(loss, [x] + layer.trainable_variables)
            return step
        return make

    return {
        "fused": attention((4, 8, 1024, 32), "dense"),
        "blockwise": attention((1, 1, 8192, 64), "chunked", 1024),
        "multi_head_xla_long": multi_head(4, 1024),
        "multi_head_xla_short": multi_head(32, 128),
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    from keras_attn import tuning

    header("keras_attn.tuning: each switch on (the default) against off, forward + backward")
    print(f"{args.rounds} alternating rounds per row (medians)")
    print("| switch | workload | default ms | changed ms | changed / default |")
    print("|---|---|---|---|---|")
    makers = builders()
    for switch, workloads in WORKLOADS.items():
        if args.only and switch not in args.only:
            continue
        default = getattr(tuning.SWITCHES, switch)
        for description, workload, changed in workloads:
            steps = {}
            for name, value in (("default", default), ("changed", changed)):
                step = makers[workload]()
                with tuning.configure(**{switch: value}):
                    sync(step())  # traced with the switch set
                steps[name] = step
            times = time_alternating(steps, args.rounds, warmup=0)
            on, off = median(times["default"]), median(times["changed"])
            print(f"| `{switch}`: {default} → {changed} | {description} | {on * 1e3:.1f} | "
                  f"{off * 1e3:.1f} | {off / on:.2f} |", flush=True)


if __name__ == "__main__":
    main()
