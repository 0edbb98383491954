"""Transformer training step time: float32 against mixed_bfloat16, side by side.

Two copies of `keras_attn.models.transformer_seq2seq` (same sizes, same data), one built under
the `float32` policy and one under `mixed_bfloat16` (bfloat16 matmuls, float32 variables), are
compiled with Adam and the masked sequence loss and trained with `train_on_batch` in
alternating rounds on one fixed batch of synthetic token ids (a padded tail on every
sequence). Reports the median step times and the ratio float32 / mixed_bfloat16, next to the
float32 and bfloat16 GEMM rates measured in the same rounds (the ceiling of the speed-up).

    python benchmarks/bf16_training.py
    python benchmarks/bf16_training.py --layers 4 --dim 512 --heads 8 --ffn 2048 --xla
    python benchmarks/bf16_training.py --keras-dropout   # masks from keras.random.dropout

`--keras-dropout` swaps `keras_attn.ops.dropout` (16 random bits per element) for
`keras.random.dropout` (one float uniform per element), to measure what the cheaper mask buys.
"""

from __future__ import annotations

import argparse

from _common import gemm, header, median, time_alternating


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2, help="encoder and decoder blocks")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--ffn", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=4000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=64, help="source and target length")
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--xla", action="store_true", help="compile with jit_compile=True")
    parser.add_argument("--keras-dropout", action="store_true",
                        help="draw dropout masks with keras.random.dropout instead")
    return parser.parse_args(argv)


def synthetic_batch(args, seed: int = 0):
    """Token ids in [4, vocab) with a padded (id 0) tail of random length per sequence."""
    import numpy as np

    rng = np.random.default_rng(seed)

    def ids():
        x = rng.integers(4, args.vocab, size=(args.batch, args.length), dtype="int32")
        lengths = rng.integers(args.length // 2, args.length + 1, size=(args.batch, 1))
        return np.where(np.arange(args.length) < lengths, x, 0).astype("int32")

    source, target = ids(), ids()
    target_in = np.concatenate([np.full((args.batch, 1), 2, "int32"), target[:, :-1]], axis=1)
    return [source, target_in], target


def build(policy: str, args):
    import keras

    from keras_attn.metrics import masked_sparse_categorical_crossentropy
    from keras_attn.models.transformer import transformer_seq2seq

    keras.config.set_dtype_policy(policy)
    try:
        keras.utils.set_random_seed(0)
        model = transformer_seq2seq(args.vocab, args.vocab, num_layers=args.layers,
                                    hidden_dim=args.dim, num_heads=args.heads,
                                    intermediate_dim=args.ffn, dropout=args.dropout)
        model.compile(optimizer=keras.optimizers.Adam(1e-4),
                      loss=masked_sparse_categorical_crossentropy, jit_compile=args.xla)
    finally:
        keras.config.set_dtype_policy("float32")
    return model


def main(argv=None) -> None:
    args = parse_args(argv)
    header("Transformer training step: float32 vs mixed_bfloat16")
    print(f"transformer_seq2seq: {args.layers}+{args.layers} layers, d={args.dim}, "
          f"heads={args.heads}, ffn={args.ffn}, vocab={args.vocab}, batch={args.batch}, "
          f"length={args.length}, dropout={args.dropout} "
          f"({'keras.random.dropout' if args.keras_dropout else 'keras_attn.ops.dropout'}), "
          f"{'XLA' if args.xla else 'tf.function'}; {args.rounds} alternating rounds, medians")
    if args.keras_dropout:
        import keras

        import keras_attn.layers.dropout
        import keras_attn.ops.kernels.dense

        def keras_dropout(x, rate, seed=None):
            return keras.random.dropout(x, rate, seed=seed)

        # Every caller of keras_attn.ops.dropout: the Dropout layer and the dense kernel.
        keras_attn.layers.dropout.attn_ops.dropout = keras_dropout
        keras_attn.ops.kernels.dense.dropout = keras_dropout
    x, y = synthetic_batch(args)
    models = {policy: build(policy, args) for policy in ("float32", "mixed_bfloat16")}
    losses = {}
    fns = {}
    for policy, model in models.items():
        fns[policy] = (lambda m=model, p=policy: losses.__setitem__(p, m.train_on_batch(x, y)))
    matmul32, flops = gemm(2048, "float32")
    matmul16, _ = gemm(2048, "bfloat16")
    fns["gemm float32"] = matmul32
    fns["gemm bfloat16"] = matmul16
    times = time_alternating(fns, args.rounds, warmup=2)
    med = {name: median(t) for name, t in times.items()}
    print("| policy | step ms | final loss |")
    print("|---|---|---|")
    for policy in models:
        print(f"| {policy} | {med[policy] * 1e3:.1f} | {float(losses[policy]):.3f} |")
    rate32 = flops / med["gemm float32"] / 1e9
    rate16 = flops / med["gemm bfloat16"] / 1e9
    print(f"GEMM 2048^3: float32 {rate32:.0f} GFLOP/s, bfloat16 {rate16:.0f} GFLOP/s "
          f"(x{rate16 / rate32:.2f})")
    print(f"speed-up float32 / mixed_bfloat16 step time: "
          f"**x{med['float32'] / med['mixed_bfloat16']:.2f}**")


if __name__ == "__main__":
    main()
