"""A causal language model's training step against keras-hub's GPT2CausalLM of the same shape.

One `train_on_batch` (forward, loss, backward, Adam update) of `keras_attn.models.causal_lm`
built GPT-2-style (learned positions, LayerNorm, tanh GELU, tied embeddings, pre-norm, biases)
and of `keras_hub.models.GPT2CausalLM` (backbone of the same sizes, no preprocessor), both with
sparse cross-entropy on the logits and no metric, on the backend `KERAS_BACKEND` names, as `fit`
runs there (TensorFlow: `jit_compile=False`, Keras' default on CPU, `--jit` for XLA; JAX: always
jitted; torch: eager), timed in alternating rounds in one process (`_common.time_alternating`).
keras_attn runs once per `--implementation` (by default the dense kernel and the backend's fused
op). The table gives the median step time of each and their ratios (keras_attn / keras-hub:
below 1 is faster) with their spread (25th-75th percentile of the per-round ratios).

    python benchmarks/lm_training_speed.py
    KERAS_BACKEND=torch python benchmarks/lm_training_speed.py --rounds 7
    python benchmarks/lm_training_speed.py --lengths 128 1024 --rounds 15 --implementation chunked
    python benchmarks/lm_training_speed.py --rounds 15 --also fused_norm_gelu=False

`--also SWITCH=VALUE` adds a third contender in the same rounds: keras_attn's model traced
with that `keras_attn.tuning` switch changed (what a switch is worth, side by side).
"""

from __future__ import annotations

import argparse

import numpy as np
from _common import header, median, time_alternating


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--tokens", type=int, default=2048,
                        help="tokens per batch: batch size = max(1, tokens // length)")
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ffn-dim", type=int, default=512)
    parser.add_argument("--implementation", nargs="+", default=["dense", "fused"],
                        choices=["dense", "chunked", "fused", "auto"])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--jit", action="store_true", help="compile both steps with XLA")
    parser.add_argument("--also", default=None, metavar="SWITCH=VALUE",
                        help="also time keras_attn with this tuning switch (True/False/int)")
    parser.add_argument("--hub-accuracy", action="store_true",
                        help="keep keras-hub's default accuracy metric (keras_attn has none)")
    return parser.parse_args(argv)


def models(length: int, args, implementation: str = "dense"):
    """keras_attn's model with `implementation` and keras-hub's, compiled."""
    import keras
    import keras_hub

    from keras_attn.models import causal_lm

    ours = causal_lm(args.vocab_size, args.num_layers, args.dim, args.heads, args.ffn_dim,
                     position_encoding="learned", max_sequence_length=length,
                     norm="layer", activation="gelu_tanh", tie_word_embeddings=True,
                     implementation=implementation)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=args.vocab_size, num_layers=args.num_layers, num_heads=args.heads,
        hidden_dim=args.dim, intermediate_dim=args.ffn_dim, dropout=0.0,
        max_sequence_length=length)
    hub = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    for model in (ours, hub):
        # No metric on either side: `GPT2CausalLM.compile` would add a token accuracy
        # (`weighted_metrics="auto"`), an argmax over the logits that `causal_lm` is not asked
        # for (`--hub-accuracy` keeps it, as the earlier tables did).
        metrics = "auto" if model is hub and args.hub_accuracy else None
        model.compile(optimizer=keras.optimizers.Adam(1e-4),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      weighted_metrics=metrics, jit_compile=args.jit)
    return ours, hub


def main(argv=None) -> None:
    args = parse_args(argv)

    header("causal_lm training step vs keras-hub GPT2CausalLM (same shape)")
    print(f"{args.num_layers} layers, d {args.dim}, {args.heads} heads, FFN {args.ffn_dim}, "
          f"vocab {args.vocab_size}, float32, {args.tokens} tokens per batch, "
          f"jit_compile={args.jit}, keras-hub accuracy "
          f"metric {'on' if args.hub_accuracy else 'off'}; median of "
          f"{args.rounds} alternating rounds after two warm-up steps")
    from keras_attn import tuning

    print(f"implementation=\"auto\" runs {tuning.auto_kernel()!r} here "
          f"({tuning.device_kind()})")
    names = list(args.implementation)
    print("| T | batch | " + " | ".join(f"{name} ms" for name in names) + " | keras-hub ms | "
          + " | ".join(f"{name} / keras-hub (IQR)" for name in names) + " |")
    print("|---|---|" + "---|" * (2 * len(names) + 1))
    rng = np.random.default_rng(0)
    for length in args.lengths:
        batch = max(1, args.tokens // length)
        ids = rng.integers(1, args.vocab_size, (batch, length + 1)).astype("int32")
        x, y = ids[:, :-1], ids[:, 1:]
        fns = {}
        for name in names:
            ours, hub = models(length, args, name)
            fns[name] = lambda ours=ours, x=x, y=y: ours.train_on_batch(x, y)
        hub_x = {"token_ids": x, "padding_mask": np.ones_like(x, dtype="bool")}
        fns["keras_hub"] = lambda hub=hub, x=hub_x, y=y: hub.train_on_batch(x, y)
        if args.also:
            fns["also"] = switched_step(length, args, x, y)
        times = time_alternating(fns, rounds=args.rounds, warmup=2)
        b = median(times["keras_hub"])
        row = (f"| {length} | {batch} | "
               + " | ".join(f"{median(times[name]) * 1e3:.1f}" for name in names)
               + f" | {b * 1e3:.1f} | "
               + " | ".join(f"**{median(times[name]) / b:.2f}** "
                            f"({_spread(times[name], times['keras_hub'])})" for name in names)
               + " |")
        if args.also:
            c = median(times["also"])
            row += f" {args.also}: {c * 1e3:.1f} ms, {c / b:.2f} |"
        print(row, flush=True)


def _spread(times: list[float], reference: list[float]) -> str:
    """The 25th-75th percentiles of the per-round ratios."""
    ratios = np.asarray(times) / np.asarray(reference)
    return f"{np.percentile(ratios, 25):.2f}-{np.percentile(ratios, 75):.2f}"


def switched_step(length: int, args, x, y):
    """keras_attn's training step traced with the `--also` switch set (a switch is read
    when the step is traced, so the first step runs inside `tuning.configure`)."""
    from keras_attn import tuning

    name, value = args.also.split("=", 1)
    value = {"True": True, "False": False, "None": None}.get(value, value)
    value = int(value) if isinstance(value, str) else value
    with tuning.configure(**{name: value}):
        ours, _ = models(length, args, args.implementation[0])
        ours.train_on_batch(x, y)
    return lambda: ours.train_on_batch(x, y)


if __name__ == "__main__":
    main()
