"""Speculative decoding against plain greedy decoding, on a measured pair of models.

A 4-layer character-level target and a 1-layer draft, both trained briefly on The Time
Machine (`../shared/data/timemachine.txt`, read as `examples/char_lm.py` reads it: lowercase
letters and spaces), the draft then distilled on the target's own greedy continuations (so it
learns to propose what the target will keep). Each decodes held-out prompts greedily to the
same length with nothing stopping early: the target alone (`keras_attn.decoding.generate`) and
the target verifying the draft's proposals (`generate(..., draft=draft, draft_tokens=k)`),
whose tokens must be the same (checked). Calls alternate in one process after a warm-up call
each (tracing); the table gives the share of drafted tokens the target kept, median tokens per
second and the speed-up (plain time / speculative time).

    python benchmarks/speculative_decoding.py
    python benchmarks/speculative_decoding.py --draft-tokens 2 4 6 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import time

from _common import example_module, header, median, time_alternating


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=None, help="the book (default: char_lm.py's)")
    parser.add_argument("--dim", type=int, default=64, help="width of both models")
    parser.add_argument("--steps", type=int, default=250, help="training steps of the target")
    parser.add_argument("--draft-steps", type=int, default=100,
                        help="training steps of the draft on the book")
    parser.add_argument("--distill-steps", type=int, default=300,
                        help="steps of the draft on the target's greedy continuations")
    parser.add_argument("--batch", type=int, default=1, help="prompts decoded at once")
    parser.add_argument("--prompt", type=int, default=32, help="prompt characters")
    parser.add_argument("--new-tokens", type=int, default=160)
    parser.add_argument("--draft-tokens", type=int, nargs="+", default=[3, 5])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    import keras
    import numpy as np

    import keras_attn as ka
    from keras_attn.tokens import BOS_ID, RESERVED_TOKENS

    header("Speculative decoding: a 1-layer draft verified by a 4-layer target")
    char_lm = example_module("char_lm")
    keras.utils.set_random_seed(args.seed)
    text = char_lm.read_book(os.path.normpath(args.data or char_lm.DEFAULT_DATA))
    vocabulary = list(RESERVED_TOKENS) + sorted(set(text))
    index = {c: i for i, c in enumerate(vocabulary)}
    ids = np.array([index[c] for c in text], "int32")
    split = int(0.9 * len(ids))
    train_ids, held_out = ids[:split], ids[split:]
    length, batch_size = 64, 32
    rng = np.random.default_rng(args.seed)

    def windows(count):
        """`<bos>` and `length - 1` characters in, the next `length` characters out."""
        starts = rng.integers(0, len(train_ids) - length, count)
        inputs = np.stack([np.concatenate([[BOS_ID], train_ids[s:s + length - 1]])
                           for s in starts])
        return inputs.astype("int32"), np.stack([train_ids[s:s + length] for s in starts])

    def fit(model, x, y, steps):
        model.compile(optimizer=keras.optimizers.AdamW(2e-3, weight_decay=0.01),
                      loss=ka.metrics.MaskedSequenceLoss())
        start = time.perf_counter()
        history = model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0, shuffle=False)
        print(f"  {model.name}: {steps} steps in {time.perf_counter() - start:.0f} s, "
              f"final loss {history.history['loss'][-1]:.3f}")

    target, draft = (ka.models.causal_lm(len(vocabulary), num_layers=layers,
                                         hidden_dim=args.dim, num_heads=4,
                                         intermediate_dim=4 * args.dim, seed=args.seed + seed,
                                         name=name)
                     for layers, seed, name in ((4, 0, "target"), (1, 1, "draft")))
    print(f"training on {len(train_ids):,} characters ({len(vocabulary) - 4} distinct), "
          f"windows of {length}, batch {batch_size}:")
    x, y = windows(args.steps * batch_size)
    fit(target, x, y, args.steps)
    fit(draft, x[:args.draft_steps * batch_size], y[:args.draft_steps * batch_size],
        args.draft_steps)
    if args.distill_steps:  # the draft on the target's greedy continuations of book windows
        half = length // 2
        prompts = windows(args.distill_steps * batch_size)[0][:, :half]
        continued = np.concatenate([keras.ops.convert_to_numpy(ka.decoding.generate(
            target, prompts[i:i + 800], length + 1, stop_token_ids=None))
            for i in range(0, len(prompts), 800)])
        fit(draft, continued[:, :length], continued[:, 1:], args.distill_steps)

    starts = np.linspace(0, len(held_out) - args.prompt - 1, args.batch).astype(int)
    prompt_ids = np.stack([np.concatenate([[BOS_ID], held_out[s:s + args.prompt]])
                           for s in starts]).astype("int32")
    max_length = prompt_ids.shape[1] + args.new_tokens
    new = args.batch * args.new_tokens

    def plain():
        return ka.decoding.generate(target, prompt_ids, max_length, stop_token_ids=None)

    def speculative(k):
        return lambda: ka.decoding.generate(target, prompt_ids, max_length, draft=draft,
                                            draft_tokens=k, stop_token_ids=None)

    calls = {"plain": plain}
    calls.update({f"k={k}": speculative(k) for k in args.draft_tokens})
    first = {}
    for name, fn in calls.items():  # the first, tracing call of each, timed
        start = time.perf_counter()
        keras.ops.convert_to_numpy(fn())
        first[name] = time.perf_counter() - start
    reference = keras.ops.convert_to_numpy(plain())
    acceptance = {}
    for k in args.draft_tokens:
        tokens, acceptance[k] = ka.decoding.generate(
            target, prompt_ids, max_length, draft=draft, draft_tokens=k, stop_token_ids=None,
            return_acceptance=True)
        if not np.array_equal(keras.ops.convert_to_numpy(tokens), reference):
            raise SystemExit(f"draft_tokens={k}: the speculative tokens differ from the plain "
                             "greedy ones")
    times = time_alternating(calls, args.rounds, warmup=0)
    plain_time = median(times["plain"])
    print(f"\nbatch {args.batch}, prompt {prompt_ids.shape[1]} ids (<bos> + {args.prompt} "
          f"held-out characters), {args.new_tokens} new tokens, greedy, rounds "
          f"{args.rounds}; outputs identical to plain greedy: yes")
    print(f"sample: {''.join(vocabulary[t] for t in reference[0] if t >= 4)!r}")
    print("\n| decoding | draft tokens | acceptance | tokens/s | speed-up | first call s |")
    print("|---|---|---|---|---|---|")
    print(f"| plain greedy (target) | – | – | {new / plain_time:.1f} | 1.00 | "
          f"{first['plain']:.1f} |")
    for k in args.draft_tokens:
        seconds = median(times[f"k={k}"])
        print(f"| speculative | {k} | {acceptance[k]:.3f} | {new / seconds:.1f} | "
              f"{plain_time / seconds:.2f} | {first[f'k={k}']:.1f} |")


if __name__ == "__main__":
    main()
