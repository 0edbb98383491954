"""Generation speed: `keras_attn.models.causal_lm` against `keras_hub.models.GPT2CausalLM`.

Both are GPT-2-shaped decoders of the same size built from a config (random weights, no
download): learned positions, LayerNorm, GELU FFN, tied embeddings. Both generate greedily from
the same prompts to the same length with a static key/value cache, as one compiled function
(`tf.function`; `--xla` compiles both with XLA), and no sequence stops early (the end token is
outside the vocabulary). Calls alternate after a warm-up (tracing) call; the table gives the
median tokens per second of each and their ratio.

    python benchmarks/generation_speed.py
    python benchmarks/generation_speed.py --batch 1 --new-tokens 64 --xla
"""

from __future__ import annotations

import argparse

from _common import header, median, sync, time_alternating


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ffn", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=5000)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    parser.add_argument("--new-tokens", type=int, default=112)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--xla", action="store_true", help="jit_compile=True for both")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    import keras_hub
    import numpy as np
    import tensorflow as tf

    import keras_attn as ka

    header("Greedy generation: keras_attn causal_lm vs keras_hub GPT2CausalLM (float32)")
    total = args.prompt + args.new_tokens
    print(f"{args.layers} layers, d {args.dim}, {args.heads} heads, ffn {args.ffn}, vocab "
          f"{args.vocab}; prompt {args.prompt} + {args.new_tokens} new tokens; "
          f"{'XLA' if args.xla else 'tf.function'}; {args.rounds} alternating rounds")
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=args.vocab, num_layers=args.layers, num_heads=args.heads,
        hidden_dim=args.dim, intermediate_dim=args.ffn, dropout=0.0,
        max_sequence_length=total)
    hub = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    hub.compile(sampler="greedy", jit_compile=args.xla)
    ours = ka.models.causal_lm(
        args.vocab, num_layers=args.layers, hidden_dim=args.dim, num_heads=args.heads,
        intermediate_dim=args.ffn, position_encoding="learned", max_sequence_length=total,
        norm="layer", activation="gelu", tie_word_embeddings=True)
    print("| batch | keras_hub tokens/s | keras_attn tokens/s | keras_attn / keras_hub |")
    print("|---|---|---|---|")
    for batch in args.batch:
        rng = np.random.default_rng(0)
        prompt = rng.integers(4, args.vocab, (batch, args.prompt)).astype("int32")
        padded = np.zeros((batch, total), "int32")
        padded[:, :args.prompt] = prompt
        hub_inputs = {"token_ids": tf.constant(padded),
                      "padding_mask": tf.constant(padded != 0)}
        fns = {
            "keras_hub": lambda hub_inputs=hub_inputs: hub.generate(
                hub_inputs, stop_token_ids=None),
            "keras_attn": lambda prompt=prompt: ka.decoding.generate(
                ours, prompt, total, stop_token_ids=None, jit_compile=args.xla),
        }
        for fn in fns.values():
            sync(fn())
        times = time_alternating(fns, args.rounds, warmup=0)
        rate = {name: batch * args.new_tokens / median(t) for name, t in times.items()}
        print(f"| {batch} | {rate['keras_hub']:.0f} | {rate['keras_attn']:.0f} | "
              f"**{rate['keras_attn'] / rate['keras_hub']:.2f}** |", flush=True)



if __name__ == "__main__":
    main()
