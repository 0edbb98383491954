"""Peak memory and step time of a causal language model's training step at long lengths,
dense attention against the chunked kernel.

`keras_attn.models.causal_lm` (LLaMA-style defaults: RoPE, RMSNorm, SwiGLU; 2 layers, d 128,
4 heads, FFN 512, vocabulary 1024, float32), batch 1, one `train_on_batch` (forward, loss,
backward, Adam update) at T = 4k ... 32k. Every (implementation, length) runs in a fresh
subprocess, so the peak resident set size (VmHWM) is that run's alone; the time is the median
of `--repeats` steps after a warm-up step. Every child runs under two limits, so that a run
that does not fit fails alone instead of taking the shared machine down: an address-space
limit (`RLIMIT_AS`, `--max-rss-gib` plus `--address-headroom-gib` for what TensorFlow maps
without touching), under which an allocation that does not fit fails at once, and the parent's
RSS polling (killed past `--max-rss-gib` or `--time-limit`). The table gives the limit a run
hit, never an estimate.

    python benchmarks/lm_long_context.py
    python benchmarks/lm_long_context.py --lengths 16384 --impls chunked
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

from _common import GIB, header, median, rss_bytes, run_measured

IMPLS = ("dense", "chunked")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384, 32768])
    parser.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ffn-dim", type=int, default=512)
    parser.add_argument("--vocab-size", type=int, default=1024)
    parser.add_argument("--chunk-size", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3, help="timed steps after a warm-up")
    parser.add_argument("--max-rss-gib", type=float, default=8.0)
    parser.add_argument("--address-headroom-gib", type=float, default=6.0,
                        help="address space a child may map beyond --max-rss-gib")
    parser.add_argument("--time-limit", type=float, default=1200.0, help="seconds per child")
    parser.add_argument("--worker", nargs=2, metavar=("IMPL", "LENGTH"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def worker(impl: str, length: int, args) -> None:
    """Child process: build, train one step (warm-up), time `repeats` steps, print JSON."""
    limit = int((args.max_rss_gib + args.address_headroom_gib) * GIB)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import keras
    import numpy as np

    from keras_attn.models import causal_lm

    model = causal_lm(args.vocab_size, args.num_layers, args.dim, args.heads, args.ffn_dim,
                      implementation=impl,
                      chunk_size=args.chunk_size if impl == "chunked" else None)
    model.compile(keras.optimizers.Adam(1e-4),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ids = np.random.default_rng(0).integers(1, args.vocab_size, (1, length + 1)).astype("int32")
    x, y = ids[:, :-1], ids[:, 1:]
    baseline = rss_bytes()
    try:
        start = time.perf_counter()
        loss = model.train_on_batch(x, y)
        first = time.perf_counter() - start
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            loss = model.train_on_batch(x, y)
            times.append(time.perf_counter() - start)
    except Exception as error:  # only running out of memory is a result; the rest raises
        if "ResourceExhausted" not in type(error).__name__ and not isinstance(error,
                                                                             MemoryError):
            raise
        print(json.dumps({"out_of_memory": f"{type(error).__name__}: "
                                           f"{str(error).strip().splitlines()[0][:100]}",
                          "peak": rss_bytes(field="VmHWM"), "baseline": baseline}), flush=True)
        return
    print(json.dumps({"peak": rss_bytes(field="VmHWM"), "baseline": baseline, "first": first,
                      "median": median(times) if times else first, "loss": float(loss)}),
          flush=True)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), args)
        return
    header("causal_lm training step at long lengths: dense vs chunked attention")
    print(f"batch 1, {args.num_layers} layers, d {args.dim}, {args.heads} heads, FFN "
          f"{args.ffn_dim}, vocab {args.vocab_size}, float32; one fresh subprocess per cell; "
          f"peak RSS = VmHWM; time = median of {args.repeats} steps after a warm-up; "
          f"chunk_size={args.chunk_size or 'auto'}; killed past {args.max_rss_gib:g} GiB")
    print(f"address space of each child limited to {args.max_rss_gib + args.address_headroom_gib:g}"
          " GiB (RLIMIT_AS)")
    print("| T | implementation | peak RSS GiB | peak - baseline GiB | step s | step / dense |")
    print("|---|---|---|---|---|---|")
    for length in args.lengths:
        results = {}
        for impl in args.impls:
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", impl, str(length)]
            for name in ("num_layers", "dim", "heads", "ffn_dim", "vocab_size", "repeats",
                         "chunk_size", "max_rss_gib", "address_headroom_gib"):
                value = getattr(args, name)
                if value is not None:
                    cmd += [f"--{name.replace('_', '-')}", str(value)]
            results[impl] = run_measured(cmd, args.max_rss_gib, args.time_limit)
            if "out_of_memory" in results[impl]:
                results[impl]["status"] = (
                    f"does not fit: an allocation was refused under the "
                    f"{args.max_rss_gib + args.address_headroom_gib:g} GiB address-space limit "
                    f"(peak RSS {results[impl]['peak'] / GIB:.2f} GiB before it; "
                    f"{results[impl]['out_of_memory']})")
        for impl, result in results.items():
            label = impl
            if impl == "chunked":
                from keras_attn.tuning import auto_chunk_size

                label += (f" (chunk {args.chunk_size})" if args.chunk_size else
                          f" (chunk auto: {auto_chunk_size(length, length, args.heads)})")
            if result["status"] != "ok":
                print(f"| {length} | {label} | {result['status']} | | | |", flush=True)
                continue
            dense = results.get("dense", {})
            ratio = (f"{result['median'] / dense['median']:.2f}"
                     if dense.get("status") == "ok" else "-")
            print(f"| {length} | {label} | {result['peak'] / GIB:.2f} | "
                  f"{(result['peak'] - result['baseline']) / GIB:.2f} | {result['median']:.2f} | "
                  f"{ratio} |", flush=True)


if __name__ == "__main__":
    main()
