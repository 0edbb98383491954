"""Peak memory and time of attention forward + backward at long sequence lengths.

One self-attention layer at batch 1, 1 head, head size 64 (float32), differentiated with respect
to its input and weights under `tf.function`, for T = 4k ... 64k:

- dense:   `MultiHead(1, 64)`, the (T, T) weights in memory;
- chunked: `MultiHead(1, 64, implementation="chunked")`, blockwise over keys, O(T) memory;
- keras:   `keras.layers.MultiHeadAttention(1, 64)`.

Every (implementation, length) runs in its own subprocess, so the peak resident set size
(VmHWM, as `resource.getrusage` reports it) is that run's alone; the baseline is the RSS after
building the layer, before the first call. Each cell runs in `--children` subprocesses, taken
in turns with the other implementations of the same length (dense, chunked, keras, dense, ...)
so that a slow spell of the shared machine does not fall on one of them only; the table gives
the median of their times, the largest of their peaks (with the range), the baseline of the
child with that peak and the largest rise above a child's own baseline. The parent polls each
child's RSS and kills it past `--max-rss-gib`, and kills it past `--time-limit` seconds; a
length whose (T, T) float32 matrices would not fit (estimated) is skipped and recorded, not
run.

    python benchmarks/long_sequence_memory.py
    python benchmarks/long_sequence_memory.py --lengths 4096 16384 --impls dense chunked
    python benchmarks/long_sequence_memory.py --lengths 16384 --impls dense chunked \
        --children 7
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from _common import GIB, header, median, rss_bytes, run_measured

IMPLS = ("dense", "chunked", "keras")
# Peak bytes above the baseline of forward + backward per (T, T) entry, as measured here at
# T = 16k (keras.layers.MultiHeadAttention 16.7, MultiHead dense 12-13): used only to skip the
# runs that cannot fit under --max-rss-gib.
DENSE_BYTES_PER_ENTRY = 17.0


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+",
                        default=[4096, 8192, 16384, 32768, 65536])
    parser.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS)
    parser.add_argument("--dim", type=int, default=64, help="model size = head size")
    parser.add_argument("--chunk-size", type=int, default=None,
                        help="chunked: keys per block (default: the layer's, sized by T)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs after one warm-up")
    parser.add_argument("--children", type=int, default=3,
                        help="subprocesses per cell, in turns with the other implementations")
    parser.add_argument("--padding", type=float, default=0.0,
                        help="fraction of the sequence that is padding, passed as a query mask "
                             "(keys masked alike: self-attention)")
    parser.add_argument("--max-rss-gib", type=float, default=12.0,
                        help="kill a child whose RSS exceeds this (the machine is shared)")
    parser.add_argument("--time-limit", type=float, default=900.0, help="seconds per child")
    parser.add_argument("--tuning", nargs="+", default=[], metavar="NAME=VALUE",
                        help="keras_attn.tuning switches for every child, e.g. "
                             "loop_parallelism=None block_budget=16777216")
    parser.add_argument("--worker", nargs=2, metavar=("IMPL", "LENGTH"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def tuning_switches(pairs) -> dict:
    """`["name=value", ...]` -> `{name: value}` with ints, None, True and False read as such."""
    switches = {}
    for pair in pairs:
        name, _, text = pair.partition("=")
        value = {"None": None, "True": True, "False": False}.get(text, text)
        switches[name] = int(value) if isinstance(value, str) else value
    return switches


def worker(impl: str, length: int, args) -> None:
    """Child process: build, run forward + backward, print one JSON line."""
    import keras
    import tensorflow as tf

    from keras_attn import tuning
    from keras_attn.layers import MultiHead

    tuning.configure(**tuning_switches(args.tuning))
    x = tf.random.normal((1, length, args.dim))
    if impl == "keras":
        layer = keras.layers.MultiHeadAttention(num_heads=1, key_dim=args.dim)
        layer.build((1, length, args.dim), (1, length, args.dim))
    else:
        blocks = {"chunk_size": args.chunk_size} if impl == "chunked" else {}
        layer = MultiHead(num_heads=1, key_dim=args.dim, implementation=impl, **blocks)
        layer.build((1, length, args.dim))

    masks = {}
    if args.padding:
        valid = tf.sequence_mask([round(length * (1.0 - args.padding))], length)  # (1, T)
        masks = ({"query_mask": valid, "value_mask": valid} if impl == "keras"
                 else {"query_mask": valid})

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, x, **masks) if impl == "keras" else layer(x, **masks)
            loss = tf.reduce_sum(y * y)
        return tape.gradient(loss, [x] + layer.trainable_variables)

    baseline = rss_bytes()
    start = time.perf_counter()
    step(x)[0].numpy()  # trace + first run
    first = time.perf_counter() - start
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        step(x)[0].numpy()
        times.append(time.perf_counter() - start)
    print(json.dumps({"peak": rss_bytes(field="VmHWM"), "baseline": baseline,
                      "first": first, "median": median(times) if times else first}), flush=True)


def run_child(impl: str, length: int, args) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", impl, str(length),
           "--dim", str(args.dim), "--repeats", str(args.repeats),
           "--padding", str(args.padding)]
    if args.chunk_size is not None:
        cmd += ["--chunk-size", str(args.chunk_size)]
    if args.tuning:
        cmd += ["--tuning", *args.tuning]
    return run_measured(cmd, args.max_rss_gib, args.time_limit)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), args)
        return
    header(f"Attention forward + backward at long lengths: B1 h1 d{args.dim}, float32")
    print(f"{args.children} subprocesses per cell, in turns; peak RSS = VmHWM of a child (the "
          f"largest of the children, their range in brackets); time = median over the children "
          f"of the median of {args.repeats} runs after a warm-up; chunk_size="
          f"{args.chunk_size or 'the default (auto_chunk_size(T))'}; children killed "
          f"past {args.max_rss_gib:g} GiB RSS or {args.time_limit:g} s"
          + (f"; last {args.padding:.0%} of every sequence is padding (query mask)"
             if args.padding else ""))
    print("| T | implementation | peak RSS GiB | baseline RSS GiB | peak - baseline GiB | "
          "time s | time / dense |")
    print("|---|---|---|---|---|---|---|")
    from keras_attn.tuning import auto_chunk_size
    for length in args.lengths:
        results, failed = {}, {}
        for impl in args.impls:
            estimate = DENSE_BYTES_PER_ENTRY * float(length) ** 2
            if impl != "chunked" and estimate > args.max_rss_gib * GIB:
                failed[impl] = (f"skipped: about {estimate / GIB:.0f} GiB of (T, T) matrices > "
                                f"{args.max_rss_gib:g} GiB")
            else:
                results[impl] = []
        for _ in range(args.children):
            for impl in list(results):
                result = run_child(impl, length, args)
                if result["status"] != "ok":
                    failed[impl] = f"{result['status']} (polled peak {result['peak'] / GIB:.2f})"
                    del results[impl]
                else:
                    results[impl].append(result)
        times = {impl: median([r["median"] for r in runs]) for impl, runs in results.items()}
        for impl in args.impls:
            if impl in failed:
                print(f"| {length} | {impl} | {failed[impl]} | | | | |", flush=True)
                continue
            runs = results[impl]
            peaks = [r["peak"] / GIB for r in runs]
            worst = max(runs, key=lambda r: r["peak"])  # its own baseline with it
            baseline = worst["baseline"] / GIB
            name = impl
            if impl == "chunked":
                name += f" (chunk {args.chunk_size or auto_chunk_size(length)})"
            spread = f" ({min(peaks):.2f}-{max(peaks):.2f})" if len(runs) > 1 else ""
            ratio = f"{times[impl] / times['dense']:.2f}" if "dense" in times else "-"
            above = max((r["peak"] - r["baseline"]) / GIB for r in runs)
            print(f"| {length} | {name} | {max(peaks):.2f}{spread} | {baseline:.2f} | "
                  f"{above:.2f} | {times[impl]:.2f} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
