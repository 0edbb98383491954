"""Greedy decoding with the static key/value cache vs recomputing the prefix every step.

Both searches run as one compiled `tf.function` over a `tf.while_loop` and produce the same
tokens (asserted):

- cached: `keras_attn.decoding.generate` (greedy), one token per step through
  `TransformerDecoder.decode_step`, keys/values written in place into caches preallocated to
  the full length;
- uncached: the encoder once, then at step i the full decoder forward pass over the whole
  prefix `(B, i + 1)` (all positions, all logits), keeping the last position's argmax.

Each search emits exactly `--new-tokens` tokens (the end token is set outside the
vocabulary, so no sequence stops early). Timings alternate between the two in one process
after a warm-up (tracing) call; the script prints the medians and their ratio.

    python benchmarks/cached_decoding.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf

from keras_attn import decoding
from keras_attn.models import transformer_seq2seq

BOS = 2


def uncached_greedy(model, max_length: int):
    """A compiled greedy search that reruns the decoder on the whole prefix at every step."""
    encoder, decoder = model.get_layer("encoder"), model.get_layer("decoder")

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)])
    def search(source_ids):
        batch_size = tf.shape(source_ids)[0]
        encoder_outputs = encoder(source_ids)
        source_mask = tf.not_equal(source_ids, 0)
        tokens = tf.concat(
            [tf.fill([batch_size, 1], BOS), tf.zeros([batch_size, max_length], tf.int32)], 1
        )  # (B, 1 + L)

        def body(i, tokens):
            logits = decoder(tokens[:, : i + 1], encoder_outputs,
                             encoder_padding_mask=source_mask)  # (B, i + 1, V)
            next_token = tf.argmax(logits[:, -1], axis=-1, output_type=tf.int32)  # (B,)
            at = tf.equal(tf.range(max_length + 1), i + 1)[None, :]  # (1, 1 + L)
            return i + 1, tf.where(at, next_token[:, None], tokens)

        _, tokens = tf.while_loop(lambda i, _: i < max_length, body, (tf.constant(0), tokens))
        return tokens[:, 1:]

    return search


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--source-length", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--vocab-size", type=int, default=4000)
    parser.add_argument("--num-layers", type=int, default=3)
    parser.add_argument("--embed-dim", type=int, default=256)
    parser.add_argument("--num-heads", type=int, default=8)
    parser.add_argument("--ffn-dim", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--jit-compile", action="store_true",
                        help="compile the cached search with XLA")
    args = parser.parse_args()

    keras.utils.set_random_seed(0)
    model = transformer_seq2seq(
        args.vocab_size, args.vocab_size, num_layers=args.num_layers,
        hidden_dim=args.embed_dim, num_heads=args.num_heads, intermediate_dim=args.ffn_dim,
        dropout=0.0,
    )
    # Random Transformers predict nearly one token everywhere. A unit-variance target
    # embedding tied (through a permutation) to the output projection makes the next token
    # depend on the history, so that the equality check below compares varied sequences.
    decoder = model.get_layer("decoder")
    rng = np.random.default_rng(0)
    table = rng.standard_normal((args.vocab_size, args.embed_dim)).astype("float32")
    decoder.token_embedding.embeddings.assign(table)
    decoder.output_dense.kernel.assign(table[rng.permutation(args.vocab_size)].T)
    source = rng.integers(4, args.vocab_size, (args.batch_size, args.source_length))
    lengths = rng.integers(args.source_length // 2, args.source_length + 1, args.batch_size)
    source = np.where(np.arange(args.source_length) < lengths[:, None], source, 0)
    source = tf.constant(source, tf.int32)
    never = None  # no end token: every sequence gets all its tokens

    def cached():
        return decoding.generate(model, source, args.new_tokens, stop_token_ids=never,
                                 jit_compile=args.jit_compile)

    uncached_search = uncached_greedy(model, args.new_tokens)

    def uncached():
        return uncached_search(source)

    start = time.perf_counter()
    cached_tokens = cached().numpy()
    trace_cached = time.perf_counter() - start
    start = time.perf_counter()
    uncached_tokens = uncached().numpy()
    trace_uncached = time.perf_counter() - start
    np.testing.assert_array_equal(cached_tokens, uncached_tokens)
    times = {"cached": [], "uncached": []}
    for _ in range(args.repeats):
        for name, fn in (("cached", cached), ("uncached", uncached)):
            start = time.perf_counter()
            fn().numpy()
            times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(t) for name, t in times.items()}

    print(f"keras {keras.__version__}, tensorflow {tf.__version__}, "
          f"devices {[d.device_type for d in tf.config.list_logical_devices()]}")
    print(f"model: {args.num_layers}+{args.num_layers} layers, d={args.embed_dim}, "
          f"heads={args.num_heads}, ffn={args.ffn_dim}, vocab={args.vocab_size}; "
          f"batch={args.batch_size}, source length={args.source_length}, "
          f"new tokens={args.new_tokens}, jit_compile={args.jit_compile}")
    print(f"same tokens: yes ({len(np.unique(cached_tokens))} distinct token ids)")
    print(f"first call (trace + run): cached {trace_cached:.2f} s, uncached "
          f"{trace_uncached:.2f} s")
    for name in ("cached", "uncached"):
        runs = ", ".join(f"{t:.3f}" for t in times[name])
        print(f"{name:>8}: median {median[name]:.3f} s over {args.repeats} runs ({runs})")
    print(f"speed-up of the cache: {median['uncached'] / median['cached']:.1f}x")


if __name__ == "__main__":
    main()
