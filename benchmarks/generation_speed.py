"""Generation speed on any Keras backend: keras_attn against keras-hub and transformers.

`keras_attn.models.causal_lm`, `keras_hub.models.GPT2CausalLM` and (torch) transformers'
`GPT2LMHeadModel`, all GPT-2-small-shaped by default (12 layers, d 768, 12 heads, ffn 3072,
vocabulary 50,257, 1,024 positions; learned positions, LayerNorm, GELU, tied embeddings) and
built from a config with random weights (no download). Each generates greedily from the same
prompts (16 tokens) for the same number of new tokens (32), with nothing stopping early:
keras_attn with `stop_token_ids=None`, keras-hub with `stop_token_ids=None`, transformers with
`min_new_tokens` equal to `max_new_tokens`. Calls alternate in one process after a warm-up call
each (tracing, compiling); the table gives median tokens per second and the ratios.

On torch, keras_attn runs twice: its default (`jit_compile=None`: eager on a CPU, the compiled
step on a GPU) and with `jit_compile=True` (the step under `torch.compile`), with the time of
the first, compiling call printed.

    python benchmarks/generation_speed.py --backend torch
    python benchmarks/generation_speed.py --backend jax --batch 8 --rounds 3
    python benchmarks/generation_speed.py --backend tensorflow --layers 4 --dim 256 --ffn 1024
"""

from __future__ import annotations

import argparse
import os
import time


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("tensorflow", "jax", "torch"),
                        default=os.environ.get("KERAS_BACKEND", "tensorflow"))
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--ffn", type=int, default=3072)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--positions", type=int, default=1024)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-transformers", action="store_true",
                        help="leave transformers out (torch)")
    parser.add_argument("--no-compile", action="store_true",
                        help="leave keras_attn's jit_compile=True out (torch)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch: torch.set_num_threads(N) for every contender (0: "
                             "torch's default; 1 avoids the stalls of 2 threads on a loaded "
                             "2-core machine)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="torch: after the timings, profile one call of each contender "
                             "(torch.profiler) and print its N costliest ops by self time")
    return parser.parse_args(argv)


def _transformers_model(args):
    import torch
    import transformers

    config = transformers.GPT2Config(
        vocab_size=args.vocab, n_positions=args.positions, n_embd=args.dim,
        n_layer=args.layers, n_head=args.heads, n_inner=args.ffn, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_new")
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


def main(argv=None) -> None:
    args = parse_args(argv)
    os.environ["KERAS_BACKEND"] = args.backend
    import keras_hub
    import numpy as np
    from _common import header, median, sync, time_alternating

    import keras_attn as ka

    header(f"Greedy generation on {args.backend}: keras_attn causal_lm, keras_hub "
           "GPT2CausalLM" + (", transformers GPT2LMHeadModel" if args.backend == "torch" else "")
           + " (float32)")
    total = args.prompt + args.new_tokens
    print(f"{args.layers} layers, d {args.dim}, {args.heads} heads, ffn {args.ffn}, vocab "
          f"{args.vocab}; prompt {args.prompt} + {args.new_tokens} new tokens; "
          f"{args.rounds} alternating rounds"
          + (f"; torch threads {args.threads}" if args.threads else ""))
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=args.vocab, num_layers=args.layers, num_heads=args.heads,
        hidden_dim=args.dim, intermediate_dim=args.ffn, dropout=0.0,
        max_sequence_length=args.positions)
    hub = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    hub.compile(sampler="greedy")
    ours = ka.models.causal_lm(
        args.vocab, num_layers=args.layers, hidden_dim=args.dim, num_heads=args.heads,
        intermediate_dim=args.ffn, position_encoding="learned",
        max_sequence_length=args.positions, norm="layer", activation="gelu",
        tie_word_embeddings=True)
    torch_backend = args.backend == "torch"
    if torch_backend and args.threads:
        import torch

        torch.set_num_threads(args.threads)
    hf = _transformers_model(args) if torch_backend and not args.no_transformers else None
    names = ["keras_hub", "keras_attn"]
    if torch_backend and not args.no_compile:
        names.append("keras_attn compiled")
    if hf is not None:
        names.append("transformers")
    print("| batch | " + " | ".join(f"{name} tokens/s" for name in names)
          + " | keras_attn / keras_hub" + (" | keras_attn / transformers" if hf else "") + " |")
    print("|---" * (len(names) + 2 + (hf is not None)) + "|")
    first_calls, profiles = {}, {}
    for batch in args.batch:
        rng = np.random.default_rng(0)
        prompt = rng.integers(4, args.vocab, (batch, args.prompt)).astype("int32")
        padded = np.zeros((batch, total), "int32")
        padded[:, :args.prompt] = prompt
        hub_inputs = {"token_ids": padded, "padding_mask": padded != 0}
        fns = {
            "keras_hub": lambda hub_inputs=hub_inputs: hub.generate(
                hub_inputs, stop_token_ids=None),
            "keras_attn": lambda prompt=prompt: ka.decoding.generate(
                ours, prompt, total, stop_token_ids=None),
        }
        if "keras_attn compiled" in names:
            fns["keras_attn compiled"] = lambda prompt=prompt: ka.decoding.generate(
                ours, prompt, total, stop_token_ids=None, jit_compile=True)
        if hf is not None:
            import torch

            ids = torch.tensor(prompt, dtype=torch.long)

            def hf_generate(ids=ids):
                with torch.inference_mode():
                    return hf.generate(ids, attention_mask=torch.ones_like(ids),
                                       max_new_tokens=args.new_tokens,
                                       min_new_tokens=args.new_tokens, do_sample=False,
                                       pad_token_id=0)

            fns["transformers"] = hf_generate
        for name, fn in fns.items():
            start = time.perf_counter()
            sync(fn())
            first_calls.setdefault(name, time.perf_counter() - start)
        times = time_alternating(fns, args.rounds, warmup=0)
        rate = {name: batch * args.new_tokens / median(t) for name, t in times.items()}
        best = max(rate[name] for name in names if name.startswith("keras_attn"))
        cells = [f"{rate[name]:.1f}" for name in names] + [f"**{best / rate['keras_hub']:.2f}**"]
        if hf is not None:
            cells.append(f"**{best / rate['transformers']:.2f}**")
        print(f"| {batch} | " + " | ".join(cells) + " |", flush=True)
        if args.profile and torch_backend:
            profiles[batch] = {name: _profile(fn, args.profile) for name, fn in fns.items()}
    print("first call (trace / compile + one generation), s: " + ", ".join(
        f"{name} {seconds:.1f}" for name, seconds in first_calls.items()))
    print("keras_attn / peer: the faster of keras_attn's rows.")
    for batch, tables in profiles.items():
        for name, table in tables.items():
            print(f"\n### batch {batch}, {name}: one call's costliest ops (self CPU time)\n")
            print(table)


def _profile(fn, top: int) -> str:
    """One call of `fn` under torch.profiler: its `top` ops by self CPU time, as a table."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)


if __name__ == "__main__":
    main()
