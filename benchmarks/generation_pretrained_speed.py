"""Greedy generation at pretrained sizes, side by side in one process: keras_attn's `causal_lm`
with `keras_attn.decoding.generate` against keras-hub's `GPT2CausalLM` / `LlamaCausalLM`.

Two shapes, random weights (no download): the GPT-2-small shape (12 layers, d 768, 12 heads,
FFN 3,072, vocab 50,257, learned positions, LayerNorm, gelu_tanh, tied embeddings) and a Llama
shape (12 layers, d 768, 12 query / 4 key-value heads, FFN 2,048, vocab 32,000, RoPE, SwiGLU,
RMSNorm, untied). Prompt 16 + 48 new tokens, greedy, no early stop. keras_attn runs in float32
and with the same weights in bfloat16 (`dtype="bfloat16"`) and int8 (`model.quantize("int8")`),
each as a `tf.function` and (`-xla`) XLA-compiled (`generate(..., jit_compile=True)`). Calls alternate after a warm-up
(tracing) call; the table gives median tokens per second and the ratios to keras-hub (float32,
its default compiled `generate`).

Agreement of the reduced-precision greedy tokens with float32, two ways: "free" compares the
48 generated tokens position by position (one early difference changes everything after it);
"forced" feeds the float32 continuation to both models and compares their argmax at each of the
48 positions (the per-step decision, independent of earlier ones).

    flock /work/heavy.lock python benchmarks/generation_pretrained_speed.py
    python benchmarks/generation_pretrained_speed.py --shapes gpt2 --batch 1 --rounds 3
"""

from __future__ import annotations

import argparse
import warnings

from _common import header, median, sync, time_alternating
from pretrained_generation import keras_hub_generate

SHAPES = {
    "gpt2": {"vocab_size": 50257, "num_layers": 12, "embed_dim": 768, "num_heads": 12,
             "ffn_dim": 3072, "position_encoding": "learned", "max_length": 1024,
             "norm": "layer", "activation": "gelu_tanh", "tie_embeddings": True},
    "llama": {"vocab_size": 32000, "num_layers": 12, "embed_dim": 768, "num_heads": 12,
              "ffn_dim": 2048, "num_key_value_heads": 4, "position_encoding": "rope",
              "norm": "rms", "activation": "swiglu", "tie_embeddings": False,
              "use_bias": False},
}


VARIANTS = ("float32", "float32-xla", "bfloat16", "bfloat16-xla", "int8", "int8-xla")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS,
                        help="keras_attn's weights (float32, bfloat16, int8), with `-xla`: "
                             "generate(jit_compile=True)")
    parser.add_argument("--no-hub", action="store_true", help="keras_attn only")
    return parser.parse_args(argv)


def keras_attn_models(shape: str, variants) -> dict:
    """The float32 model and, with its weights, the bfloat16 and int8 ones asked for."""
    import keras

    import keras_attn as ka

    config = SHAPES[shape]
    variants = {variant.removesuffix("-xla") for variant in variants}
    models = {"float32": ka.models.causal_lm(**config, name=f"{shape}_float32")}
    if "bfloat16" in variants:
        models["bfloat16"] = ka.models.causal_lm(**config, dtype="bfloat16",
                                                 name=f"{shape}_bfloat16")
        models["bfloat16"].set_weights(models["float32"].get_weights())
    if "int8" in variants:
        models["int8"] = keras.models.clone_model(models["float32"])
        models["int8"].set_weights(models["float32"].get_weights())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            models["int8"].quantize("int8")
    return models


def agreement(models: dict, prompt, total: int, new_tokens: int) -> dict:
    """`{variant: (free, forced)}` shares of the `new_tokens` greedy positions equal to
    float32's (module docstring)."""
    import numpy as np

    import keras_attn as ka

    reference = np.asarray(ka.decoding.generate(models["float32"], prompt, total, eos_id=None))
    start = prompt.shape[1]
    want = np.asarray(models["float32"].predict(reference[:, :-1], verbose=0)).argmax(-1)
    result = {}
    for name, model in models.items():
        if name == "float32":
            continue
        tokens = np.asarray(ka.decoding.generate(model, prompt, total, eos_id=None))
        free = (tokens[:, start:] == reference[:, start:]).mean()
        got = np.asarray(model.predict(reference[:, :-1], verbose=0)).argmax(-1)
        forced = (got[:, start - 1:] == want[:, start - 1:]).mean()
        result[name] = (free, forced)
    return result


def main(argv=None) -> None:
    args = parse_args(argv)
    import numpy as np
    import tensorflow as tf

    import keras_attn as ka

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    header("Greedy generation at pretrained sizes: keras_attn vs keras-hub")
    total = args.prompt + args.new_tokens
    print(f"prompt {args.prompt} + {args.new_tokens} new tokens, greedy, no early stop; "
          f"{args.rounds} alternating rounds after a warm-up call; {args.threads} threads")
    print("| shape | batch | contender | tokens/s | / keras-hub | agreement free / forced |")
    print("|---|---|---|---|---|---|")
    for shape in args.shapes:
        models = keras_attn_models(shape, args.variants)
        for batch in args.batch:
            rng = np.random.default_rng(0)
            prompt = rng.integers(10, SHAPES[shape]["vocab_size"],
                                  (batch, args.prompt)).astype("int32")
            fns = {}
            if not args.no_hub:  # the same keras-hub model as benchmarks/pretrained_generation.py
                fns["keras-hub float32"] = keras_hub_generate(shape, prompt, args.new_tokens,
                                                              args.threads)[0]
            for variant in args.variants:
                model, xla = models[variant.removesuffix("-xla")], variant.endswith("-xla")
                fns[f"keras_attn {variant}"] = (
                    lambda model=model, prompt=prompt, xla=xla:
                    ka.decoding.generate(model, prompt, total, eos_id=None, jit_compile=xla))
            for fn in fns.values():
                sync(fn())
            times = time_alternating(fns, args.rounds, warmup=0)
            rates = {name: batch * args.new_tokens / median(t) for name, t in times.items()}
            agree = agreement(models, prompt, total, args.new_tokens)
            base = rates.get("keras-hub float32")
            for name, rate in rates.items():
                ratio = "-" if base is None else f"{rate / base:.2f}"
                variant = name.split()[-1].removesuffix("-xla")
                shares = (f"{agree[variant][0]:.1%} / {agree[variant][1]:.1%}"
                          if name.startswith("keras_attn") and variant in agree else "-")
                print(f"| {shape} | {batch} | {name} | {rate:.1f} | {ratio} | {shares} |",
                      flush=True)


if __name__ == "__main__":
    main()
